"""Running totals over 1,000,000 keys and dedup over 1,000,000 ids (issue 52's second and third
benchmarks): txstream exactly-once against Spark Structured Streaming's same query and Kafka
Streams exactly_once_v2, side by side in one run, through benchmarks/windowed.py's harness.

    python -m benchmarks --stateful totals --keys 1000000        # what `make bench` runs
    python -m benchmarks --stateful dedup --keys 1000000
    python -m benchmarks --stateful totals --quick               # smoke run: 20,000 keys, 1 round
    python -m benchmarks.stateful totals ...                     # the same

The work, in Structured Streaming's words:

- `totals` (processors/running_totals.py, update mode): orders with amount > 0,
  `groupBy(customer_id).agg(count, sum(amount), max(amount))`; a customer's new totals whenever
  a batch changed them. The input: `--records` orders (default 2 x keys) whose customer_id takes
  `--keys` distinct values (order i's customer is i mod keys, so each customer's orders are keys
  orders apart, in different batches, on any partition: the aggregation crosses batches and
  partitions). Contenders: `txstream-totals` (`txstream run processors/running_totals.py:RunningTotals`),
  `spark-ss-totals` (contenders/spark_ss_stateful.py --kind totals, outputMode update),
  `kafka-streams-totals` (kstreams/.../RunningTotals.java: groupByKey through a repartition topic,
  aggregate into a KTable, its updates to the output). Check: per customer, the last value read
  (read_committed) equals the exact (orders, amount, largest); every customer with an order
  there, no other; for the exactly-once contenders a customer's order counts strictly increase
  from update to update (no update twice).
- `dedup` (processors/unique_orders.py, append mode): `withWatermark("created_at", "10 minutes")
  .dropDuplicatesWithinWatermark(["id"])`. The input: `--keys` distinct orders, and a copy of every
  tenth one (`--duplicate-every`) 5,000 orders after it, with the same key and value (a checkout
  that retried), so records = keys x 1.1; created_at advances 1 ms per order (1,000,000 ids span
  17 minutes; a copy is 5 s of event time after its first). Contenders: `txstream-dedup`,
  `spark-ss-dedup` (--kind dedup, outputMode append), `kafka-streams-dedup` (kstreams/.../Dedup.java:
  Confluent's event-deduplication pattern, a processor with a changelogged window store of the
  ids seen, 10 minutes). Check: every id exactly once (a duplicate fails the exactly-once
  contenders and is counted for Spark's at-least-once sink), no id that is not in the input.

Measured as the windowed benchmark measures (benchmarks/windowed.py's docstring): records/s over
wall time, first output, steady records/s from the first output to completion, CPU per M input
records, peak RSS, other work on the machine. Done: txstream when it exits (`--until-caught-up`);
the others once they have read all input and the output is complete (totals: every customer's
order count summed over its latest value reaches the orders; dedup: the count of output records
reaches the ids). Results: benchmarks/results/<timestamp>-<totals|dedup>[-quick].{json,md}; at the end
docs/performance.md's figures are rewritten (`--no-figures` skips it).
"""
from __future__ import annotations

import argparse
import random
import sys

from benchmarks.common import ORDER_SCHEMA, ORDER_SCHEMA_PATH, REPO, decode, encode, make_order, producer_config
from benchmarks.windowed import MASTER, Workload, _iso, _same_sum, log
from benchmarks.windowed import main as run_workload

EVENT_START_MS = 1_767_225_600_000     # 2026-01-01T00:00:00Z
DUPLICATE_LAG = 5_000                  # a copy follows its first this many orders later


class StatefulInput:
    """What the harness wrote and what the output must be (per customer, or the ids)."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.records = 0
        self.input_bytes = 0
        self.totals: dict[str, list] = {}      # totals: customer -> [orders, amount, largest]
        self.ids: set[str] = set()             # dedup: the distinct ids
        self.duplicates = 0


def _writer(bootstrap: str, topic: str, out: StatefulInput):
    from confluent_kafka import Producer

    producer = Producer(producer_config(bootstrap))

    def produce(key: bytes, value: bytes) -> None:
        out.records += 1
        out.input_bytes += len(key) + len(value)
        while True:
            try:
                producer.produce(topic, value=value, key=key)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    return producer, produce


def _flush(producer) -> None:
    remaining = producer.flush(120)
    if remaining:
        raise RuntimeError(f"{remaining} seed records were not delivered")


def seed_totals(bootstrap: str, topic: str, records: int, keys: int, seed: int = 7) -> StatefulInput:
    """`records` orders (benchmarks/common.py make_order, same seed), order i's customer i mod keys."""
    rng = random.Random(seed)
    out = StatefulInput(topic)
    producer, produce = _writer(bootstrap, topic, out)
    for i in range(records):
        order = make_order(rng, i, EVENT_START_MS + i)
        order["customer_id"] = f"customer-{i % keys:09d}"
        produce(order["id"].encode(), encode(ORDER_SCHEMA, order))
        if order["amount"] > 0:
            t = out.totals.setdefault(order["customer_id"], [0, 0.0, order["amount"]])
            t[0], t[1], t[2] = t[0] + 1, t[1] + order["amount"], max(t[2], order["amount"])
        if (i + 1) % max(1, records // 10) == 0:
            log(f"  seeded {i + 1:,}/{records:,}")
    _flush(producer)
    return out


def seed_dedup(bootstrap: str, topic: str, ids: int, every: int, seed: int = 7) -> StatefulInput:
    """`ids` distinct orders, created_at +1 ms each; a copy (same key and value) of every `every`th
    one DUPLICATE_LAG orders after it (the last ones' copies at the end)."""
    rng = random.Random(seed)
    out = StatefulInput(topic)
    producer, produce = _writer(bootstrap, topic, out)
    pending: dict[int, tuple[bytes, bytes]] = {}
    for i in range(ids):
        order = make_order(rng, i, EVENT_START_MS + i)
        key, value = order["id"].encode(), encode(ORDER_SCHEMA, order)
        produce(key, value)
        out.ids.add(order["id"])
        if i % every == 0:
            pending[i] = (key, value)
        copy = pending.pop(i - DUPLICATE_LAG, None)
        if copy is not None:
            produce(*copy)
            out.duplicates += 1
        if (i + 1) % max(1, ids // 10) == 0:
            log(f"  seeded {i + 1:,}/{ids:,} ids")
    for key, value in pending.values():
        produce(key, value)
        out.duplicates += 1
    _flush(producer)
    return out


# ---------------------------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------------------------

def check_totals(records, want: dict[str, list], exactly_once: bool, schema) -> dict:
    """Per customer the last value read equals its exact totals; exactly-once: its order counts
    strictly increase from one update to the next."""
    last: dict[str, tuple] = {}
    undecodable = bad_keys = not_increasing = repeats = 0
    for record in records:
        try:
            v = decode(schema, record.value)
        except Exception:
            undecodable += 1
            continue
        customer = v["customer_id"]
        if record.key != customer.encode():
            bad_keys += 1
        before = last.get(customer)
        if before is not None and v["orders"] <= before[0]:
            if (v["orders"], v["amount"], v["largest"]) == before:
                repeats += 1
            else:
                not_increasing += 1
        last[customer] = (v["orders"], v["amount"], v["largest"])
    wrong, examples = 0, []
    for customer, got in last.items():
        expected = want.get(customer)
        if expected is None:
            continue
        if got[0] != expected[0] or not _same_sum(got[1], expected[1]) or got[2] != expected[2]:
            wrong += 1
            if len(examples) < 3:
                examples.append(f"{customer}: {got} (want {tuple(expected)})")
    missing = [c for c in want if c not in last]
    unexpected = [c for c in last if c not in want]
    problems = []
    if not records:
        problems.append("no output")
    if missing:
        problems.append(f"{len(missing)} of {len(want)} customers missing (first {min(missing)})")
    if unexpected:
        problems.append(f"{len(unexpected)} customers that ordered nothing (first {min(unexpected)})")
    if wrong:
        problems.append(f"{wrong} customers' last totals wrong, e.g. " + "; ".join(examples))
    if undecodable:
        problems.append(f"{undecodable} values do not decode as CustomerRunningTotal")
    if bad_keys:
        problems.append(f"{bad_keys} keys differ from their customer_id")
    if not_increasing:
        problems.append(f"{not_increasing} updates whose order count did not increase")
    if repeats and exactly_once:
        problems.append(f"{repeats} updates repeated")
    return {"ok": not problems, "problems": problems, "output_records": len(records), "emitted": len(last),
            "expected": len(want), "missing": len(missing), "unexpected": len(unexpected), "wrong": wrong,
            "duplicates": repeats, "not_increasing": not_increasing}


def check_dedup(records, ids: set[str], exactly_once: bool, schema) -> dict:
    """Every id exactly once (at-least-once: again is counted, not failed); no id not in the input."""
    seen: dict[str, int] = {}
    undecodable = bad_keys = 0
    for record in records:
        try:
            order = decode(schema, record.value)
        except Exception:
            undecodable += 1
            continue
        if record.key != order["id"].encode():
            bad_keys += 1
        seen[order["id"]] = seen.get(order["id"], 0) + 1
    duplicates = sum(n - 1 for n in seen.values())
    missing = len(ids) - sum(1 for i in seen if i in ids)
    unexpected = sum(1 for i in seen if i not in ids)
    problems = []
    if not records:
        problems.append("no output")
    if missing:
        problems.append(f"{missing} of {len(ids)} ids missing")
    if unexpected:
        problems.append(f"{unexpected} ids not in the input")
    if undecodable:
        problems.append(f"{undecodable} values do not decode as Order")
    if bad_keys:
        problems.append(f"{bad_keys} keys differ from their order id")
    if duplicates and exactly_once:
        problems.append(f"{duplicates} ids emitted more than once")
    return {"ok": not problems, "problems": problems, "output_records": len(records), "emitted": len(seen),
            "expected": len(ids), "missing": missing, "unexpected": unexpected, "duplicates": duplicates}


# ---------------------------------------------------------------------------------------------
# The two workloads
# ---------------------------------------------------------------------------------------------

class Stateful(Workload):
    """What totals and dedup share: --keys, no event-time options, txstream's dead-letter topic
    counted, their own topics."""

    prog = "python -m benchmarks --stateful"
    self_exiting: set[str] = set()
    update_mode: set[str] = set()
    spark_module = "benchmarks.contenders.spark_ss_stateful"

    def add_arguments(self, ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--keys", type=int, default=None,
                        help="distinct customers (totals) or ids (dedup) (default 1000000; 20000 with --quick)")

    def finish_arguments(self, ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        if args.keys is None:
            args.keys = 20_000 if args.quick else 1_000_000
        if args.keys <= 0:
            ap.error("--keys takes a positive number")

    def extra_topics(self, app_id: str) -> list[str]:
        return [f"{app_id}.units", f"{app_id}.state", *(f"{app_id}-{name}" for name in self.kstreams_topics)]

    def kstreams_args(self, contender: str, args: argparse.Namespace) -> list[str]:
        return []

    def spark_args(self) -> list[str]:
        return ["--kind", self.mode]

    def txstream_available(self) -> str | None:
        path = self.processor.partition(":")[0]
        if not (REPO / path).exists():
            return f"{path} is not in this tree"
        try:
            from txstream.driver import stateful  # noqa: F401  (the engine issue 52 adds)
        except ImportError as exc:
            return f"this txstream has no stateful engine ({exc})"
        return None

    def _head(self, meta: dict, title: str, what: str) -> list[str]:
        args, inp, hw = meta["args"], meta.get("input", {}), meta["hardware"]
        return [f"# {title}: {inp.get('records', 0):,} orders, {args['partitions']} partitions, "
                f"{args['runs']} round(s)", "",
                f"{what} Batches of {inp.get('records_per_batch', 0):,} records (txstream; Spark's "
                f"maxOffsetsPerTrigger). Machine: {hw.get('cpu_model')}, {hw.get('logical_cores')} cores (shared), "
                f"load {hw['loadavg_at_start'][0]:.2f} at start, {hw.get('loadavg_at_end', [0])[0]:.2f} at end. "
                f"Started {meta['started_at']}; git {meta.get('git_at_start')}."]

    def _notes(self, spark_query: str, kstreams: str, check: str) -> list[str]:
        return [f"- txstream: `python -m txstream.cli run {self.processor} --master {MASTER} --until-caught-up "
                "--max-records-per-partition N --dead-letter-topic D` (exactly-once; state in Kafka).",
                f"- Spark SS: `benchmarks/contenders/spark_ss_stateful.py --kind {self.mode}`, {spark_query} on "
                "Spark's Kafka source and sink (at-least-once), from_avro/to_avro, processingTime 0 trigger, "
                "maxOffsetsPerTrigger = txstream's batch, shuffle partitions 8, HDFS-backed state store.",
                f"- Kafka Streams: `benchmarks/contenders/kstreams/src/main/java/txstream/bench/kstreams/{kstreams}; "
                "exactly_once_v2, 2 stream threads.", f"- Check: {check} CPU: the contender's process tree."]

    def rate_note(self) -> str:
        return ("records/s = input records / wall seconds (start-up included; txstream to its exit, the others to "
                "the moment they had read all input and their output was complete); steady = the output after the "
                "first, scaled to input records, / (done - first output); txstream vs: txstream's figure / the "
                "other's (records/s: > 1 is faster; CPU: > 1 uses more).")


class Totals(Stateful):
    mode = "totals"
    contenders = {
        "txstream-totals": "txstream exactly-once (groupBy(customer).agg, update)",
        "spark-ss-totals": "Spark SS groupBy.agg update mode, Kafka sink (at-least-once)",
        "kafka-streams-totals": "Kafka Streams exactly_once_v2, groupByKey().aggregate into a KTable",
    }
    default_contenders = list(contenders)
    baseline = "txstream-totals"
    exactly_once = {"txstream-totals", "kafka-streams-totals"}
    self_exiting = {"txstream-totals"}
    processor = "processors/running_totals.py:RunningTotals"
    output_schema_path = REPO / "schemas" / "customer_running_total.avsc"
    topic_prefix = "bench-totals"
    unit = "customers"
    kstreams_main = "txstream.bench.kstreams.RunningTotals"
    kstreams_topics = ("by-customer-repartition", "customer-totals-changelog")

    def finish_arguments(self, ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        super().finish_arguments(ap, args)
        if args.records is None:    # each customer's orders in two batches at least
            args.records = 2 * args.keys

    def seed(self, bootstrap: str, topic: str, args: argparse.Namespace):
        log(f"seeding {args.records:,} orders of {args.keys:,} customers into {topic} ...")
        return seed_totals(bootstrap, topic, args.records, args.keys)

    def input_meta(self, inp, args: argparse.Namespace) -> dict:
        orders = sum(t[0] for t in inp.totals.values())
        log(f"seeded: {len(inp.totals):,} customers with {orders:,} orders of amount > 0")
        return {"keys": args.keys, "customers_with_orders": len(inp.totals), "orders_counted": orders}

    def target(self, inp, contender: str) -> int:
        return sum(t[0] for t in inp.totals.values())

    def weight(self, contender: str, schema):
        """An update counts the orders it adds to its customer's last update: the sum reaches the
        orders counted when every customer's latest totals are there (a repeat adds 0)."""
        last: dict[str, int] = {}

        def added(value: bytes) -> int:
            v = decode(schema, value)
            before = last.get(v["customer_id"], 0)
            last[v["customer_id"]] = max(before, v["orders"])
            return max(0, v["orders"] - before)
        return added

    def check(self, output, inp, contender: str, ctx: dict) -> dict:
        return check_totals(output, inp.totals, contender in self.exactly_once, ctx["output_schema"])

    def headline(self, meta: dict) -> list[str]:
        inp = meta.get("input", {})
        return self._head(meta, f"Running totals over {inp.get('keys', 0):,} customers",
                          f"`groupBy(customer_id).agg(count, sum(amount), max(amount))` of orders with amount > 0, "
                          f"update mode; {inp.get('customers_with_orders', 0):,} customers with "
                          f"{inp.get('orders_counted', 0):,} such orders (order i's customer: i mod keys).")

    def notes(self, meta: dict) -> list[str]:
        return self._notes("the same query (update mode)",
                           "RunningTotals.java`: decode, key by customer, groupByKey (repartition topic), aggregate "
                           "(count, sum, largest) into a KTable (changelogged store, record cache flushed at each "
                           "100 ms commit), its updates to the output",
                           "per customer the last update read_committed equals its exact orders, amount (1e-9 "
                           "relative) and largest; every customer with an order there, no other; exactly-once: order "
                           "counts strictly increase from update to update.")


class Dedup(Stateful):
    mode = "dedup"
    contenders = {
        "txstream-dedup": "txstream exactly-once (dropDuplicatesWithinWatermark, append)",
        "spark-ss-dedup": "Spark SS dropDuplicatesWithinWatermark, Kafka sink (at-least-once)",
        "kafka-streams-dedup": "Kafka Streams exactly_once_v2, processor + window store of seen ids",
    }
    default_contenders = list(contenders)
    baseline = "txstream-dedup"
    exactly_once = {"txstream-dedup", "kafka-streams-dedup"}
    self_exiting = {"txstream-dedup"}
    processor = "processors/unique_orders.py:UniqueOrders"
    output_schema_path = ORDER_SCHEMA_PATH
    topic_prefix = "bench-dedup"
    unit = "ids"
    kstreams_main = "txstream.bench.kstreams.Dedup"
    kstreams_topics = ("seen-ids-changelog",)

    def add_arguments(self, ap: argparse.ArgumentParser) -> None:
        super().add_arguments(ap)
        ap.add_argument("--duplicate-every", type=int, default=10,
                        help="a copy of every Nth order follows it 5,000 orders later (default 10)")

    def finish_arguments(self, ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        super().finish_arguments(ap, args)
        if args.duplicate_every <= 0:
            ap.error("--duplicate-every takes a positive number")
        args.records = args.keys + args.keys // args.duplicate_every + (args.keys % args.duplicate_every > 0)

    def seed(self, bootstrap: str, topic: str, args: argparse.Namespace):
        log(f"seeding {args.keys:,} ids and a copy of every {args.duplicate_every}th into {topic} ...")
        return seed_dedup(bootstrap, topic, args.keys, args.duplicate_every)

    def input_meta(self, inp, args: argparse.Namespace) -> dict:
        log(f"seeded: {len(inp.ids):,} ids, {inp.duplicates:,} copies, {inp.records:,} records")
        return {"keys": args.keys, "ids": len(inp.ids), "duplicates": inp.duplicates,
                "event_span_s": round(args.keys / 1000, 1), "last_event": _iso(EVENT_START_MS + args.keys)}

    def target(self, inp, contender: str) -> int:
        return len(inp.ids)

    def weight(self, contender: str, schema):
        return None

    def check(self, output, inp, contender: str, ctx: dict) -> dict:
        return check_dedup(output, inp.ids, contender in self.exactly_once, ctx["output_schema"])

    def headline(self, meta: dict) -> list[str]:
        inp = meta.get("input", {})
        return self._head(meta, f"Dedup over {inp.get('ids', 0):,} ids",
                          f"`withWatermark(created_at, 10 minutes).dropDuplicatesWithinWatermark([id])`, append "
                          f"mode; {inp.get('ids', 0):,} distinct orders and {inp.get('duplicates', 0):,} copies "
                          f"(same key and value, {DUPLICATE_LAG:,} orders after the first), created_at +1 ms per "
                          f"order.")

    def notes(self, meta: dict) -> list[str]:
        return self._notes("the same query (append mode)",
                           "Dedup.java`: Confluent's event-deduplication pattern, a processor with a changelogged "
                           "window store of the ids seen (10 minutes of created_at), the first copy forwarded",
                           "every id exactly once (duplicates fail the exactly-once contenders and are counted for "
                           "Spark's), no id that is not in the input; key = the order id.")


WORKLOADS = {"totals": Totals(), "dedup": Dedup()}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in WORKLOADS:
        print(f"usage: python -m benchmarks.stateful {{{','.join(WORKLOADS)}}} [options]  (--help after the kind)",
              file=sys.stderr)
        return 2
    return run_workload(argv[1:], WORKLOADS[argv[0]])


if __name__ == "__main__":
    sys.exit(main())
