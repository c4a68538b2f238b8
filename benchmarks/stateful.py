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

from benchmarks.common import (
    ORDER_SCHEMA,
    ORDER_SCHEMA_PATH,
    REPO,
    decode,
    decode_all,
    encode,
    make_order,
    produce_waiting,
    producer_config,
)
from benchmarks.windowed import Workload, _iso, _same_sum, log, machine_line, txstream_note
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
        produce_waiting(producer, topic, key, value)
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

def _verdict(found: dict, problems: list[tuple[bool, str]], records) -> dict:
    """`found` with `ok` and the problems whose condition holds ("no output" first)."""
    named = [text for holds, text in [(not records, "no output"), *problems] if holds]
    return {"ok": not named, "problems": named, "output_records": len(records), **found}


def check_totals(records, want: dict[str, list], exactly_once: bool, schema) -> dict:
    """Per customer the last value read equals its exact totals; exactly-once: its order counts
    strictly increase from one update to the next."""
    last: dict[str, tuple] = {}
    repeats = not_increasing = 0
    values, undecodable, bad_keys = decode_all(records, schema, "customer_id")
    for v in values:
        now, before = (v["orders"], v["amount"], v["largest"]), last.get(v["customer_id"])
        if before is not None and now[0] <= before[0]:
            repeats += now == before
            not_increasing += now != before
        last[v["customer_id"]] = now
    wrong = [f"{c}: {got} (want {tuple(want[c])})" for c, got in last.items() if c in want and (
        got[0] != want[c][0] or not _same_sum(got[1], want[c][1]) or got[2] != want[c][2])]
    missing = sorted(c for c in want if c not in last)
    unexpected = sorted(c for c in last if c not in want)
    return _verdict(
        {"emitted": len(last), "expected": len(want), "missing": len(missing), "unexpected": len(unexpected),
         "wrong": len(wrong), "duplicates": repeats, "not_increasing": not_increasing},
        [(bool(missing), f"{len(missing)} of {len(want)} customers missing (first {missing[:1]})"),
         (bool(unexpected), f"{len(unexpected)} customers that ordered nothing (first {unexpected[:1]})"),
         (bool(wrong), f"{len(wrong)} customers' last totals wrong, e.g. " + "; ".join(wrong[:3])),
         (undecodable > 0, f"{undecodable} values do not decode as CustomerRunningTotal"),
         (bad_keys > 0, f"{bad_keys} keys differ from their customer_id"),
         (not_increasing > 0, f"{not_increasing} updates whose order count did not increase"),
         (repeats > 0 and exactly_once, f"{repeats} updates repeated")], records)


def check_dedup(records, ids: set[str], exactly_once: bool, schema) -> dict:
    """Every id exactly once (at-least-once: again is counted, not failed); no id not in the input."""
    seen: dict[str, int] = {}
    values, undecodable, bad_keys = decode_all(records, schema, "id")
    for order in values:
        seen[order["id"]] = seen.get(order["id"], 0) + 1
    duplicates = sum(n - 1 for n in seen.values())
    missing = len(ids) - sum(1 for i in seen if i in ids)
    unexpected = len(seen) - (len(ids) - missing)
    return _verdict(
        {"emitted": len(seen), "expected": len(ids), "missing": missing, "unexpected": unexpected,
         "duplicates": duplicates},
        [(missing > 0, f"{missing} of {len(ids)} ids missing"),
         (unexpected > 0, f"{unexpected} ids not in the input"),
         (undecodable > 0, f"{undecodable} values do not decode as Order"),
         (bad_keys > 0, f"{bad_keys} keys differ from their order id"),
         (duplicates > 0 and exactly_once, f"{duplicates} ids emitted more than once")], records)


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

    def __init__(self) -> None:
        # the contenders are txstream-<mode>, spark-ss-<mode>, kafka-streams-<mode>; all run by default
        self.contenders = dict(zip((f"txstream-{self.mode}", f"spark-ss-{self.mode}", f"kafka-streams-{self.mode}"),
                                   self.labels, strict=True))
        self.default_contenders = list(self.contenders)
        self.baseline = f"txstream-{self.mode}"
        self.exactly_once = {self.baseline, f"kafka-streams-{self.mode}"}
        self.self_exiting = {self.baseline}
        self.topic_prefix = f"bench-{self.mode}"

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

    def check(self, output, inp, contender: str, ctx: dict) -> dict:
        want = getattr(inp, self.want)     # what the checker compares the output with
        return self.checker(output, want, contender in self.exactly_once, ctx["output_schema"])

    def title(self, inp: dict) -> tuple[str, str]:
        """The report's title and its first sentence, from the results' `input`."""
        raise NotImplementedError

    def headline(self, meta: dict) -> list[str]:
        args, inp = meta["args"], meta.get("input", {})
        title, what = self.title(inp)
        return [f"# {title}: {inp.get('records', 0):,} orders, {args['partitions']} partitions, "
                f"{args['runs']} round(s)", "", f"{what} {machine_line(meta)}"]

    def notes(self, meta: dict) -> list[str]:
        return [txstream_note(self.processor),
                f"- Spark SS: `benchmarks/contenders/spark_ss_stateful.py --kind {self.mode}`, the same query "
                f"({self.spark_mode} mode) on Spark's Kafka source and sink (at-least-once), from_avro/to_avro, "
                "processingTime 0 trigger, maxOffsetsPerTrigger = txstream's batch, shuffle partitions 8, HDFS-backed "
                "state store.",
                "- Kafka Streams: `benchmarks/contenders/kstreams/src/main/java/txstream/bench/kstreams/"
                f"{self.kstreams_note}; exactly_once_v2, 2 stream threads.",
                f"- Check: {self.check_note} CPU: the contender's process tree."]

    def rate_note(self) -> str:
        return ("records/s = input records / wall seconds (start-up included; txstream to its exit, the others to "
                "the moment they had read all input and their output was complete); steady = the output after the "
                "first, scaled to input records, / (done - first output); txstream vs: txstream's figure / the "
                "other's (records/s: > 1 is faster; CPU: > 1 uses more).")


class Totals(Stateful):
    mode = "totals"
    labels = ("txstream exactly-once (groupBy(customer).agg, update)",
              "Spark SS groupBy.agg update mode, Kafka sink (at-least-once)",
              "Kafka Streams exactly_once_v2, groupByKey().aggregate into a KTable")
    processor = "processors/running_totals.py:RunningTotals"
    output_schema_path = REPO / "schemas" / "customer_running_total.avsc"
    unit = "customers"
    kstreams_main = "txstream.bench.kstreams.RunningTotals"
    kstreams_topics = ("by-customer-repartition", "customer-totals-changelog")
    checker, want = staticmethod(check_totals), "totals"
    spark_mode = "update"
    kstreams_note = ("RunningTotals.java`: decode, key by customer, groupByKey (repartition topic), aggregate (count, "
                     "sum, largest) into a KTable (changelogged store, record cache flushed at each 100 ms commit), "
                     "its updates to the output")
    check_note = ("per customer the last update read_committed equals its exact orders, amount (1e-9 relative) and "
                  "largest; every customer with an order there, no other; exactly-once: order counts strictly "
                  "increase from update to update.")

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

    def title(self, inp: dict) -> tuple[str, str]:
        return (f"Running totals over {inp.get('keys', 0):,} customers",
                f"`groupBy(customer_id).agg(count, sum(amount), max(amount))` of orders with amount > 0, update "
                f"mode; {inp.get('customers_with_orders', 0):,} customers with {inp.get('orders_counted', 0):,} such "
                "orders (order i's customer: i mod keys).")


class Dedup(Stateful):
    mode = "dedup"
    labels = ("txstream exactly-once (dropDuplicatesWithinWatermark, append)",
              "Spark SS dropDuplicatesWithinWatermark, Kafka sink (at-least-once)",
              "Kafka Streams exactly_once_v2, processor + window store of seen ids")
    processor = "processors/unique_orders.py:UniqueOrders"
    output_schema_path = ORDER_SCHEMA_PATH
    unit = "ids"
    kstreams_main = "txstream.bench.kstreams.Dedup"
    kstreams_topics = ("seen-ids-changelog",)
    checker, want = staticmethod(check_dedup), "ids"
    spark_mode = "append"
    kstreams_note = ("Dedup.java`: Confluent's event-deduplication pattern, a processor with a changelogged window "
                     "store of the ids seen (10 minutes of created_at), the first copy forwarded")
    check_note = ("every id exactly once (duplicates fail the exactly-once contenders and are counted for Spark's), "
                  "no id that is not in the input; key = the order id.")

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

    def title(self, inp: dict) -> tuple[str, str]:
        return (f"Dedup over {inp.get('ids', 0):,} ids",
                f"`withWatermark(created_at, 10 minutes).dropDuplicatesWithinWatermark([id])`, append mode; "
                f"{inp.get('ids', 0):,} distinct orders and {inp.get('duplicates', 0):,} copies (same key and value, "
                f"{DUPLICATE_LAG:,} orders after the first), created_at +1 ms per order.")


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
