"""Windowed count per currency per minute (issue 52's first benchmark): txstream exactly-once
against Spark Structured Streaming's own windowed aggregation and Kafka Streams exactly_once_v2.

    python -m benchmarks --windowed --records 1000000            # what `make bench` runs
    python -m benchmarks --windowed --records 100000 --runs 1
    python -m benchmarks --windowed --contenders kafka-streams-windowed,spark-ss-windowed
    python -m benchmarks --windowed --quick                      # smoke run: 20000 records, 1 round
    python -m benchmarks.windowed ...                            # the same

The work, in Structured Streaming's words (processors/orders_per_currency.py):

    batch.select("value.created_at", "value.currency", "value.amount")
         .withWatermark("created_at", "30 seconds")
         .groupBy(F.window("created_at", "1 minute"), "currency")
         .agg(F.count("*").alias("orders"), F.sum("amount").alias("amount"))      append mode

Contenders, all on one input topic, each into its own fresh output topic, rounds interleaved (the
order rotates each round):

- `txstream-windowed`: `txstream run processors/orders_per_currency.py:OrdersPerCurrency
  --until-caught-up --master local[2] --max-records-per-partition N` (exactly-once, state in Kafka,
  late orders to the dead-letter topic). "unavailable" on a tree without that processor or without
  txstream's stateful engine (issue 52), and the other contenders' runs go on.
- `spark-ss-windowed`: benchmarks/contenders/spark_ss_windowed.py, the same query on Spark's own
  Kafka source and sink (at-least-once), `from_avro`/`to_avro` from spark-avro,
  `trigger(processingTime="0 seconds")` (as fast as it goes), `maxOffsetsPerTrigger` = txstream's
  batch, `local[2]`.
- `kafka-streams-windowed`: benchmarks/contenders/kstreams/.../CurrencyWindows.java, exactly_once_v2,
  2 stream threads: event time from created_at (a TimestampExtractor), key by currency (a
  repartition topic), `TimeWindows.ofSizeAndGrace(1 min, 30 s)`, count and sum, then
  `suppress(untilWindowCloses)`: final results, as append mode.
- `kafka-streams-windowed-update` (not run unless named): the same without suppress, Spark's update
  mode; its check is on the last value of each (window, currency).
- `kafka-streams-windowed-1t` (not run unless named): `kafka-streams-windowed` with one stream
  thread: its consumer fetches every input partition at once, so its tasks stay closer in event
  time than two threads' (which start and run apart), and it drops fewer orders as late (below).

The input (`seed_windowed`): the throughput benchmark's orders (benchmarks/common.py make_order,
same seed), but order i's created_at is 2026-01-01T00:00:00Z + i x `--event-ms-per-record` (2 ms: 500
orders per second of event time, so 1,000,000 orders span 33 minutes and 100,000 span 200 s;
10 ms with --quick, so that windows close at 20,000): deterministic, in partition order within
each partition, spread over the partitions by key. The final watermark is the last created_at
minus 30 s; every window ending at or before it closes. The harness computes each (window,
currency)'s count and sum from what it wrote.

Measured as benchmarks/wide.py measures: records/s = input records / wall seconds (process start to
exit for txstream, which exits by itself after its no-data batch; Spark SS and Kafka Streams run until
stopped: to the moment their output held every window the input closes, or to their last output
when it stops coming for `--stall-seconds`); first output; steady records/s = the orders in the
windows emitted after the first output, scaled to input records, / (done - first output); CPU s
of the process tree and CPU s per M input records; peak RSS; other work on the machine.

Check (every run): the output read back (read_committed), decoded (schemas/currency_window.avsc);
every window ending more than 5 s before the final watermark must be there once with its exact
count and its sum (to 1e-9 relative: the sums are added in different orders), none ending after
the final watermark (emitted early), windows ending within 5 s before it may be there or not (Kafka
Streams' stream time is per task); key = currency; duplicates are failures for the exactly-once
contenders and counted for Spark's. txstream's dead-letter topic is counted (late orders), and so
are Kafka Streams' dropped records (its dropped-records-total metric at shutdown).
Results: benchmarks/results/<timestamp>-windowed[-quick].{json,md} ("mode": "windowed"); at the end
docs/performance.md's figures are rewritten (`--no-figures` skips it).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import resource
import shutil
import signal
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from benchmarks.common import (
    ORDER_SCHEMA,
    ORDER_SCHEMA_PATH,
    REPO,
    RunBroker,
    create_topics,
    decode,
    decode_all,
    delete_topics,
    encode,
    load_schema,
    make_order,
    produce_waiting,
    producer_config,
    warm_up_broker,
)
from benchmarks.wide import _foreign_work, _median, _tail

PROCESSOR = "processors/orders_per_currency.py:OrdersPerCurrency"
WINDOW_SCHEMA_PATH = REPO / "schemas" / "currency_window.avsc"
RESULTS = REPO / "benchmarks" / "results"
MASTER = "local[2]"
WINDOW_MS = 60_000
DELAY_MS = 30_000
EVENT_START_MS = 1_767_225_600_000     # 2026-01-01T00:00:00Z, a window boundary
BOUNDARY_MS = 5_000                    # windows ending this close before the final watermark may or may not close
CONTENDERS = {
    "txstream-windowed": "txstream exactly-once (Structured Streaming query, append)",
    "spark-ss-windowed": "Spark SS withWatermark + window, Kafka sink (at-least-once)",
    "kafka-streams-windowed": "Kafka Streams exactly_once_v2, windowed aggregate + suppress",
    "kafka-streams-windowed-update": "Kafka Streams exactly_once_v2, windowed aggregate, no suppress (update)",
    "kafka-streams-windowed-1t": "Kafka Streams exactly_once_v2, windowed aggregate + suppress, 1 stream thread",
}
DEFAULT_CONTENDERS = ["txstream-windowed", "spark-ss-windowed", "kafka-streams-windowed"]
BASELINE = "txstream-windowed"
EXACTLY_ONCE = {"txstream-windowed", "kafka-streams-windowed", "kafka-streams-windowed-update",
                "kafka-streams-windowed-1t"}
SELF_EXITING = {"txstream-windowed"}      # the others run until the harness stops them
UPDATE_MODE = {"kafka-streams-windowed-update"}
KSTREAMS_MAIN = "txstream.bench.kstreams.CurrencyWindows"
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
T0 = time.monotonic()


def log(message: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {message}", flush=True)


# ---------------------------------------------------------------------------------------------
# The input and what the output must be
# ---------------------------------------------------------------------------------------------

@dataclass
class WindowedInput:
    topic: str
    records: int
    step_ms: float
    input_bytes: int = 0
    max_event_ms: int = 0
    windows: dict[tuple[int, str], list] = field(default_factory=dict)   # (start ms, currency) -> [count, sum]

    @property
    def final_watermark_ms(self) -> int:
        return self.max_event_ms - DELAY_MS


def event_time_ms(i: int, step_ms: float) -> int:
    return EVENT_START_MS + math.floor(i * step_ms)


def seed_windowed(bootstrap: str, topic: str, records: int, step_ms: float, seed: int = 7,
                  progress=lambda _m: None) -> WindowedInput:
    """Write `records` orders whose created_at advances by `step_ms` per order from EVENT_START_MS,
    and count each (window, currency): the same rng and orders as benchmarks/common.py seed_input."""
    from confluent_kafka import Producer

    rng = random.Random(seed)
    producer = Producer(producer_config(bootstrap))
    out = WindowedInput(topic=topic, records=records, step_ms=step_ms)
    step = max(1, records // 10)
    for i in range(records):
        created = event_time_ms(i, step_ms)
        order = make_order(rng, i, created)
        key, value = order["id"].encode(), encode(ORDER_SCHEMA, order)
        out.input_bytes += len(key) + len(value)
        out.max_event_ms = max(out.max_event_ms, created)
        totals = out.windows.setdefault((created - created % WINDOW_MS, order["currency"]), [0, 0.0])
        totals[0] += 1
        totals[1] += order["amount"]
        produce_waiting(producer, topic, key, value)
        if (i + 1) % step == 0:
            progress(f"  seeded {i + 1:,}/{records:,}")
    remaining = producer.flush(120)
    if remaining:
        raise RuntimeError(f"{remaining} seed records were not delivered")
    return out


def expected_windows(inp: WindowedInput, update: bool = False) -> tuple[dict, dict]:
    """(must, may): the windows the output must hold, and those it may hold or not. Append mode:
    must = windows ending at least BOUNDARY_MS before the final watermark, may = the ones ending
    in the last BOUNDARY_MS before it. Update mode: every window, at its final value."""
    if update:
        return dict(inp.windows), {}
    wm = inp.final_watermark_ms
    must = {k: v for k, v in inp.windows.items() if k[0] + WINDOW_MS <= wm - BOUNDARY_MS}
    may = {k: v for k, v in inp.windows.items() if wm - BOUNDARY_MS < k[0] + WINDOW_MS <= wm}
    return must, may


def _ms(value) -> int:
    if isinstance(value, datetime):
        return (value - EPOCH) // timedelta(milliseconds=1)
    return int(value)


def _same_sum(got: float, want: float) -> bool:
    return abs(got - want) <= 1e-9 * max(1.0, abs(want)) + 1e-6


def check_windows(records, must: dict, may: dict, exactly_once: bool, update: bool, schema) -> dict:
    """Decode every output record and compare it with the input's windows; `ok` when they match.
    Append mode: each emitted once (at-least-once: again only with the same value); update mode:
    the last value of each (window, currency) is compared."""
    emitted: dict[tuple[int, str], list[tuple[int, float]]] = {}
    bad_bounds = 0
    values, undecodable, bad_keys = decode_all(records, schema, "currency")
    for w in values:
        start, end = _ms(w["start"]), _ms(w["end"])
        if end - start != WINDOW_MS or start % WINDOW_MS:
            bad_bounds += 1
        emitted.setdefault((start, w["currency"]), []).append((w["orders"], w["amount"]))
    duplicates = conflicting = wrong_counts = wrong_sums = 0
    examples: list[str] = []
    for key, values in emitted.items():
        if not update and len(values) > 1:
            duplicates += len(values) - 1
            conflicting += len(set(values)) > 1
        want = must.get(key) or may.get(key)
        if want is None:
            continue
        orders, amount = values[-1]
        if orders != want[0]:
            wrong_counts += 1
        if not _same_sum(amount, want[1]):
            wrong_sums += 1
        if (orders != want[0] or not _same_sum(amount, want[1])) and len(examples) < 3:
            examples.append(f"{_iso(key[0])} {key[1]}: {orders} orders, {amount:.2f} (want {want[0]}, {want[1]:.2f})")
    missing = [k for k in must if k not in emitted]
    unexpected = [k for k in emitted if k not in must and k not in may]
    problems = []
    if not records:
        problems.append("no output")
    if missing:
        problems.append(f"{len(missing)} of {len(must)} closed windows missing (first {_iso(min(missing)[0])} "
                        f"{min(missing)[1]})")
    if unexpected:
        problems.append(f"{len(unexpected)} windows emitted that the final watermark does not close "
                        f"(first {_iso(min(unexpected)[0])} {min(unexpected)[1]})")
    if wrong_counts:
        problems.append(f"{wrong_counts} windows with a wrong count")
    if wrong_sums:
        problems.append(f"{wrong_sums} windows with a wrong sum")
    if examples:
        problems.append("e.g. " + "; ".join(examples))
    if undecodable:
        problems.append(f"{undecodable} values do not decode as CurrencyWindow")
    if bad_keys:
        problems.append(f"{bad_keys} keys differ from their currency")
    if bad_bounds:
        problems.append(f"{bad_bounds} windows not 1 minute on a minute boundary")
    if conflicting:
        problems.append(f"{conflicting} windows emitted twice with different values")
    if duplicates and exactly_once:
        problems.append(f"{duplicates} duplicate window records")
    orders_out = sum(v[-1][0] for k, v in emitted.items())
    return {"ok": not problems, "problems": problems, "output_records": len(records),
            "windows_expected": len(must), "windows_optional": len(may), "windows_emitted": len(emitted),
            "missing": len(missing), "unexpected": len(unexpected), "wrong_counts": wrong_counts,
            "wrong_sums": wrong_sums, "duplicates": duplicates, "orders_in_output": orders_out,
            "orders_expected": sum(v[0] for v in must.values())}


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%H:%M:%S")


# ---------------------------------------------------------------------------------------------
# The workload: what this module's harness (run_one, main, the report) asks of a query
# ---------------------------------------------------------------------------------------------

class Workload:
    """One stateful query with its contenders, its input and its check. The harness below runs any
    of them (benchmarks/stateful.py adds running totals and dedup); this class is the windowed
    count. A subclass sets the class attributes and overrides the methods that differ."""

    mode = "windowed"                       # the results files' kind (<stamp>-<mode>.json)
    prog = "python -m benchmarks --windowed"
    contenders = CONTENDERS
    default_contenders = DEFAULT_CONTENDERS
    baseline = BASELINE
    exactly_once = EXACTLY_ONCE
    self_exiting = SELF_EXITING
    update_mode = UPDATE_MODE
    processor = PROCESSOR
    output_schema_path = WINDOW_SCHEMA_PATH
    topic_prefix = "bench-win"
    unit = "windows"                        # what the runs table counts in the output
    kstreams_main = KSTREAMS_MAIN
    spark_module = "benchmarks.contenders.spark_ss_windowed"

    def kstreams_args(self, contender: str, args: argparse.Namespace) -> list[str]:
        return ["--suppress", "false" if contender in self.update_mode else "true",
                "--max-partition-fetch-bytes", str(args.kstreams_fetch_bytes)]

    def spark_args(self) -> list[str]:
        return []

    def txstream_args(self) -> list[str]:
        return []

    def add_arguments(self, ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--event-ms-per-record", type=float, default=None,
                        help="created_at advances this many ms per order (default 2; 10 with --quick)")
        ap.add_argument("--kstreams-fetch-bytes", type=int, default=65536,
                        help="Kafka Streams: its consumer's max.partition.fetch.bytes (default 65536; Kafka's is "
                             "1048576, a whole partition of a small run in one fetch: see the module's docstring)")

    def finish_arguments(self, ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        if args.event_ms_per_record is None:
            args.event_ms_per_record = 5.0 if args.quick else 2.0
        if args.event_ms_per_record <= 0:
            ap.error("--event-ms-per-record takes a positive number")

    def seed(self, bootstrap: str, topic: str, args: argparse.Namespace):
        log(f"seeding {args.records:,} orders into {topic} ({args.partitions} partitions, created_at "
            f"+{args.event_ms_per_record:g} ms per order) ...")
        return seed_windowed(bootstrap, topic, args.records, args.event_ms_per_record, progress=log)

    def input_meta(self, inp, args: argparse.Namespace) -> dict:
        must, may = expected_windows(inp)
        meta = {"event_ms_per_record": args.event_ms_per_record,
                "event_span_s": round((inp.max_event_ms - EVENT_START_MS) / 1000, 1),
                "final_watermark": _iso(inp.final_watermark_ms), "windows": len(inp.windows),
                "closed_windows": len(must), "optional_windows": len(may),
                "orders_in_closed_windows": sum(v[0] for v in must.values())}
        log(f"seeded: {meta['event_span_s']:.0f} s of event time, {len(inp.windows)} (window, currency) "
            f"pairs, {len(must)} closed by the final watermark ({len(may)} at its edge)")
        return meta

    def extra_topics(self, app_id: str) -> list[str]:
        return [f"{app_id}.units", f"{app_id}.state", f"{app_id}-by-currency-repartition",
                f"{app_id}-currency-windows-changelog", f"{app_id}-until-window-closes-store-changelog"]

    def target(self, inp, contender: str) -> int:
        """What the output watcher must count to call the output complete (0: it never does; the
        run ends on the stall), in the units `weight` counts."""
        if contender in self.update_mode:
            return 0
        must, _may = expected_windows(inp)
        return sum(v[0] for v in must.values())

    def weight(self, contender: str, schema):
        """Append mode: each window counts the orders it holds, so the count reaches the orders of
        the closed windows when the output is complete."""
        return None if contender in self.update_mode else (lambda value: decode(schema, value)["orders"])

    def check(self, output, inp, contender: str, ctx: dict) -> dict:
        update = contender in self.update_mode
        must, may = expected_windows(inp, update)
        check = check_windows(output, must, may, contender in self.exactly_once, update, ctx["output_schema"])
        check["emitted"], check["expected"] = check["windows_emitted"], check["windows_expected"]
        return check

    def txstream_available(self) -> str | None:
        return txstream_available()

    def headline(self, meta: dict) -> list[str]:
        args, inp = meta["args"], meta.get("input", {})
        return [f"# Windowed count per currency per minute: {inp.get('records', args['records']):,} orders, "
                f"{args['partitions']} partitions, {args['runs']} round(s)", "",
                f"`window(created_at, 1 minute)`, watermark 30 s, count + sum(amount) per currency, append mode. "
                f"created_at +{inp.get('event_ms_per_record', 0):g} ms per order: {inp.get('event_span_s', 0):,.0f} s of "
                f"event time, {inp.get('windows', 0)} (window, currency) pairs, {inp.get('closed_windows', 0)} closed by "
                f"the final watermark ({inp.get('final_watermark')}). {machine_line(meta)}"]

    def notes(self, meta: dict) -> list[str]:
        return [txstream_note(self.processor),
                "- Spark SS: `benchmarks/contenders/spark_ss_windowed.py`, the same query on Spark's Kafka source "
                "and sink (at-least-once), from_avro/to_avro, processingTime 0 trigger, maxOffsetsPerTrigger = "
                "txstream's batch, shuffle partitions 8, state in its checkpoint directory (HDFS-backed store).",
                "- Kafka Streams: `benchmarks/contenders/kstreams/src/main/java/txstream/bench/kstreams/"
                "CurrencyWindows.java`, exactly_once_v2, 2 stream threads, event time from created_at, key by currency "
                "(repartition topic), TimeWindows.ofSizeAndGrace(1 min, 30 s), count + sum, "
                "suppress(untilWindowCloses) (final results). A record for a window its task already closed is "
                "dropped (dropped-records-total).",
                "- Check: every window ending 5 s or more before the final watermark present once with its exact "
                "count and sum (1e-9 relative), none ending after it; key = currency. CPU: the contender's process "
                "tree."]

    def rate_note(self) -> str:
        return ("records/s = input records / wall seconds (start-up included; txstream to its exit after the "
                "no-data batch, the others to the moment their output held every closed window); steady = orders in "
                "the windows emitted after the first output, scaled to input records, / (done - first output); "
                "txstream vs: txstream's figure / the other's (records/s: > 1 is faster; CPU: > 1 uses more).")


WINDOWED = Workload()


def machine_line(meta: dict) -> str:
    """The report's sentence on batches, the machine, its load and the commit."""
    inp, hw = meta.get("input", {}), meta["hardware"]
    return (f"Batches of {inp.get('records_per_batch', 0):,} records (txstream; Spark's maxOffsetsPerTrigger). "
            f"Machine: {hw.get('cpu_model')}, {hw.get('logical_cores')} cores (shared), load "
            f"{hw['loadavg_at_start'][0]:.2f} at start, {hw.get('loadavg_at_end', [0])[0]:.2f} at end. Started "
            f"{meta['started_at']}; git {meta.get('git_at_start')}.")


def txstream_note(processor: str) -> str:
    return (f"- txstream: `python -m txstream.cli run {processor} --master {MASTER} --until-caught-up "
            "--max-records-per-partition N --dead-letter-topic D` (exactly-once; state in Kafka).")


# ---------------------------------------------------------------------------------------------
# The contenders
# ---------------------------------------------------------------------------------------------

def txstream_available() -> str | None:
    """Why txstream-windowed cannot run on this tree (None: it can): the processor and
    txstream's stateful engine (issue 52) must both be there."""
    path, _, cls = PROCESSOR.partition(":")
    if not (REPO / path).exists():
        return f"{path} is not in this tree (txstream's stateful engine, issue 52, is not merged)"
    import importlib.util

    try:
        spec = importlib.util.spec_from_file_location("bench_orders_per_currency", REPO / path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        processor = getattr(module, cls)
    except Exception as exc:
        return f"{PROCESSOR} does not load: {type(exc).__name__}: {exc}"
    if getattr(processor, "output_mode", None) != "append":
        return f"{PROCESSOR} has no output_mode 'append' (this txstream has no stateful engine)"
    try:
        from txstream.driver import stateful  # noqa: F401  (the engine issue 52 adds)
    except ImportError as exc:
        return f"this txstream has no stateful engine ({exc})"
    return None


def _command(contender: str, ctx: dict, out: str, dlq: str, app_id: str, workdir: str) -> list[str]:
    """The command of each kind of contender: txstream running the workload's processor, its
    Kafka Streams application (`kstreams_main`) or its Spark SS query (`spark_module`)."""
    args, work = ctx["args"], ctx.get("workload", WINDOWED)
    if contender.startswith("kafka-streams"):
        from benchmarks.contenders import jvm_collector
        from benchmarks.contenders.kafka_streams import JAR, LIB, THREADS

        return ["java", "-Xmx512m", jvm_collector(), "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                "-cp", f"{JAR}:{LIB}/*", work.kstreams_main, "--bootstrap-servers", ctx["bootstrap"],
                "--input", ctx["source"], "--output", out, "--application-id", app_id, "--state-dir", workdir,
                "--threads", "1" if contender.endswith("-1t") else str(THREADS),
                "--input-schema", str(ORDER_SCHEMA_PATH), "--output-schema", str(work.output_schema_path),
                *work.kstreams_args(contender, args)]
    if contender.startswith("txstream-"):
        return [sys.executable, "-m", "txstream.cli", "run", work.processor, "-b", ctx["bootstrap"], "--app-id", app_id,
                "--input", ctx["source"], "--output", out, "--dead-letter-topic", dlq, "--master", MASTER,
                "--until-caught-up", "--max-records-per-partition", str(args.max_records_per_partition),
                *work.txstream_args()]
    return [sys.executable, "-m", work.spark_module, "--bootstrap-servers", ctx["bootstrap"],
            "--input", ctx["source"], "--output", out, "--group", app_id, "--workdir", workdir,
            "--jars", ",".join(ctx["spark_jars"]), "--input-schema", str(ORDER_SCHEMA_PATH),
            "--output-schema", str(work.output_schema_path), "--master", MASTER,
            "--max-offsets-per-trigger", str(args.max_records_per_partition * args.partitions),
            *work.spark_args()]


SPARK_BATCH = re.compile(r"^spark-batch (\d+)\s+in (\d+)\s+([\d.]+)s", re.M)
# Before close: closing removes the metrics.
KS_DROPPED = re.compile(r"stopping after .*dropped-records-total (-?\d+)\)")


def _batches(contender: str, text: str) -> dict:
    if contender.startswith("kafka-streams"):
        dropped = KS_DROPPED.findall(text)
        return {"batches": None, "in_batch_s": None, "batch_s": [],
                "kstreams_dropped_records": int(dropped[-1]) if dropped else None}
    if contender.startswith("txstream-"):
        from benchmarks import batchlog

        summary = batchlog.summarize(text) or {}
        return {"batches": summary.get("batches", 0), "in_batch_s": summary.get("batch_s_sum"),
                "batch_s": [b["seconds"] for b in batchlog.parse(text)["batches"]],
                "failed_attempts": summary.get("failed_attempts")}
    found = [(int(b), int(n), float(s)) for b, n, s in SPARK_BATCH.findall(text)]
    return {"batches": len(found), "data_batches": sum(1 for _, n, _ in found if n),
            "in_batch_s": sum(s for _, _, s in found) if found else None, "batch_s": [s for _, _, s in found]}


def _input_ends(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-win-ends-{uuid.uuid4().hex[:6]}"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(partitions)}
    finally:
        consumer.close()


def _consumed_check(contender: str, ctx: dict, app_id: str, log_path: Path):
    """A function saying whether the contender has read all its input: Kafka Streams by its
    group's committed offsets (committed with its output, exactly_once_v2), Spark SS by the rows of
    its micro-batches (its log). A window closes before the input's end, so "output complete"
    alone would stop the clock before the last records were read."""
    ends, records = ctx["input_ends"], ctx["input"].records
    if contender.startswith("kafka-streams"):
        from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": ctx["bootstrap"]})
        wanted = [TopicPartition(ctx["source"], p) for p in ends]

        def consumed() -> bool:
            try:
                got = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(app_id, wanted)])[app_id].result(10)
            except Exception:  # not yet a group: not consumed
                return False
            offsets = {tp.partition: tp.offset for tp in got.topic_partitions}
            return all(offsets.get(p, -1) >= end for p, end in ends.items())
        return consumed

    def spark_consumed() -> bool:
        text = log_path.read_text(errors="replace")
        return sum(int(n) for _, n, _ in SPARK_BATCH.findall(text)) >= records
    return spark_consumed


def _wait_done(watcher, proc, deadline: float, stall_s: float, consumed) -> tuple[float | None, str]:
    """When the run was done: (monotonic time, how). One that exits by itself (consumed is None) is
    done when it exits. One that runs until stopped is done once it has read all its input and its
    output holds every window the input closes (watcher.done_at), or, when its output falls short,
    `stall_s` after the later of its last output and the end of its input, at that time (the check
    then says what is missing)."""
    consumed_at = None
    next_check = 0.0
    while time.monotonic() < deadline and watcher.error is None:
        now = time.monotonic()
        if proc.poll() is not None:
            return now, f"process exited ({proc.returncode})"
        if consumed is not None:
            if consumed_at is None and now >= next_check:
                next_check = now + 0.25
                if consumed():
                    consumed_at = time.monotonic()
            if consumed_at is not None:
                if watcher.done_at is not None:
                    return max(watcher.done_at, consumed_at), "input read, output complete"
                last = max(watcher.timeline[-1][0] if watcher.timeline else consumed_at, consumed_at)
                if now - last > stall_s:
                    return last, f"input read, output short ({stall_s:.0f}s without more)"
        time.sleep(0.05)
    return None, "timed out"


def run_one(contender: str, ctx: dict, round_no: int) -> dict:
    from benchmarks.harness import steady_state
    from benchmarks.measure import ForeignLoad, OutputWatcher, TreeSampler, start_process, stop_process
    from tests.support.kafka import read_all

    bootstrap, args, inp, work = ctx["bootstrap"], ctx["args"], ctx["input"], ctx["workload"]
    target = work.target(inp, contender)
    tag = f"{contender}-{round_no}-{uuid.uuid4().hex[:6]}"
    prefix = work.topic_prefix
    out, dlq, app_id = f"{prefix}-out-{tag}", f"{prefix}-out-{tag}-dlq", f"{prefix}-{tag}"
    create_topics(bootstrap, [out, dlq], args.partitions)
    ctx["topics"] += [out, dlq, *work.extra_topics(app_id)]
    workdir = tempfile.mkdtemp(prefix=f"bench-{work.mode}-")
    log_path = ctx["logdir"] / f"{tag}.log"
    argv = _command(contender, ctx, out, dlq, app_id, workdir)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "PYTHONUNBUFFERED": "1"}
    result: dict = {"contender": contender, "round": round_no, "output_topic": out, "log": str(log_path),
                    "loadavg_before": round(os.getloadavg()[0], 2)}
    schema = ctx["output_schema"]
    sampler, foreign = TreeSampler(), ForeignLoad()
    proc = watcher = None
    self_exiting = contender in work.self_exiting
    code = None
    try:
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        # The workload says what the watcher counts (Workload.weight) and to what (target): 0 ends on the stall.
        watcher = OutputWatcher(bootstrap, out, args.partitions, target, weight=work.weight(contender, schema)).start()
        foreign.start()
        started = time.monotonic()
        proc = start_process(argv, env, str(log_path), str(REPO))
        sampler.add_root(proc.pid)
        sampler.start()
        consumed = None if self_exiting else _consumed_check(contender, ctx, app_id, log_path)
        done_at, how = _wait_done(watcher, proc, started + args.timeout, args.stall_seconds, consumed)
        sampler.stop()
        foreign.stop()
        result.update(_foreign_work(foreign, sampler, time.monotonic() - started))
        code = proc.poll()
        if self_exiting and code == 0:
            deadline = time.monotonic() + 30   # a read_committed reader may trail the exit
            while watcher.done_at is None and time.monotonic() < deadline:
                time.sleep(0.05)
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        rusage_cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
        cpu = max(sampler.cpu_seconds, rusage_cpu) if code is not None else sampler.cpu_seconds
        wall = (done_at or time.monotonic()) - started
        result.update(done_by=how, cpu_by_role_s={k: round(v, 1) for k, v in sampler.cpu_by_role.items()})
        result["first_output_s"] = round(watcher.first_at - started, 2) if watcher.first_at else None
        if done_at is not None and target:
            steady = steady_state(watcher, done_at, inp.records, target)
            result["steady_records_per_s"] = (round(steady["steady_records_per_s"])
                                              if steady.get("steady_records_per_s") else None)
            result["steady_note"] = steady.get("steady_note")
    finally:
        sampler.stop()
        foreign.stop()
        stop_process(proc)
        if watcher is not None:
            watcher.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    text = log_path.read_text(errors="replace")
    batches = _batches(contender, text)
    records = inp.records
    result.update(exit_code=proc.returncode, seconds=round(wall, 2), records_per_s=round(records / wall),
                  cpu_s=round(cpu, 1), cpu_s_per_m=round(cpu / (records / 1e6), 1),
                  peak_rss_mb=round(sampler.peak_rss / 2**20), loadavg_after=round(os.getloadavg()[0], 2), **batches)
    if batches["in_batch_s"]:
        result["in_batch_s"] = round(batches["in_batch_s"], 2)
        result["in_batch_records_per_s"] = round(records / batches["in_batch_s"])
    failed = done_at is None or (self_exiting and code != 0) or (not self_exiting and how.startswith("process exited"))
    if failed:
        result.update(ok=False, problem=f"{how} after {wall:.0f}s; log {log_path}: {_tail(text)}")
        return result
    output = read_all(bootstrap, out, timeout=300)
    check = work.check(output, inp, contender, ctx)
    if contender == work.baseline:
        check["late_dead_lettered"] = len(read_all(bootstrap, dlq, timeout=120))
    if batches.get("kstreams_dropped_records") is not None:
        check["kstreams_dropped_records"] = batches["kstreams_dropped_records"]
    result["check"] = check
    # Completed: its figures count. Exact: its output matches the input's (Kafka Streams drops the
    # orders of windows its task has already closed, so its figures come with what it got wrong).
    result["completed"] = True
    result["ok"] = check["ok"]
    if not check["ok"]:
        result["problem"] = "output not exact: " + "; ".join(check["problems"])
    return result


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------

def _terminate(_sig, _frame):
    raise KeyboardInterrupt("SIGTERM")


def parse_args(argv: list[str] | None = None, work: Workload = WINDOWED) -> argparse.Namespace:
    doc = sys.modules[type(work).__module__].__doc__ or __doc__
    ap = argparse.ArgumentParser(prog=work.prog, description=doc.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=None, help="input orders (default 200000; 20000 with --quick)")
    ap.add_argument("--partitions", type=int, default=4, help="partitions of every topic (default 4)")
    ap.add_argument("--runs", type=int, default=None,
                    help="rounds; every contender runs once per round (default 2; 1 with --quick)")
    ap.add_argument("--contenders", default=",".join(work.default_contenders),
                    help=f"comma-separated, from: {', '.join(work.contenders)} (default {','.join(work.default_contenders)})")
    ap.add_argument("--quick", action="store_true", help="smoke run: 20000 records, 1 round")
    ap.add_argument("--max-records-per-partition", type=int, default=10_000,
                    help="txstream's batch cap per partition; Spark's maxOffsetsPerTrigger is this x partitions "
                         "(default 10000)")
    ap.add_argument("--stall-seconds", type=float, default=30,
                    help="a contender that runs until stopped is done when its output stops coming for this long "
                         "(default 30)")
    ap.add_argument("--bootstrap-servers", default=os.environ.get("TXSTREAM_BOOTSTRAP_SERVERS"),
                    help="an existing Kafka cluster (default: start a local one)")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds before a run counts as failed (default 1800; 600 with --quick)")
    ap.add_argument("--results-dir", type=Path, default=RESULTS,
                    help="where the results files go (default benchmarks/results; docs/performance.md is only "
                         "rewritten from the default)")
    ap.add_argument("--no-figures", action="store_true", help="do not regenerate docs/performance.md's figures")
    work.add_arguments(ap)
    args = ap.parse_args(argv)
    work.finish_arguments(ap, args)    # first: a workload may set --records' default from its own options
    if args.records is None:
        args.records = 20_000 if args.quick else 200_000
    if args.runs is None:
        args.runs = 1 if args.quick else 2
    if args.timeout is None:
        args.timeout = 600 if args.quick else 1800
    args.contender_names = [n.strip() for n in args.contenders.split(",") if n.strip()]
    unknown = [n for n in args.contender_names if n not in work.contenders]
    if unknown:
        ap.error(f"unknown contender(s) {', '.join(unknown)}; choose from {', '.join(work.contenders)}")
    return args


def _prepare(contenders: list[str], ctx: dict, meta: dict, work: Workload = WINDOWED) -> dict[str, str]:
    """Build or check what each contender needs; {name: why} for those that cannot run."""
    from benchmarks.contenders import Unavailable

    unavailable: dict[str, str] = {}
    for name in contenders:
        try:
            if name.startswith("txstream-"):
                why = work.txstream_available()
                if why:
                    raise Unavailable(why)
            elif name.startswith("spark-ss-"):
                from benchmarks.contenders.spark_ss import connector_jars

                ctx["spark_jars"], meta["spark_connectors"] = connector_jars(log)
            elif name.startswith("kafka-streams"):
                from benchmarks.contenders.kafka_streams import build, java_version
                from txstream.local.cluster import KAFKA_VERSION

                if not shutil.which("java"):
                    raise Unavailable("java is not on PATH")
                build(KAFKA_VERSION, log)
                meta["kafka_streams"] = {"version": KAFKA_VERSION, "java": java_version()}
        except Unavailable as exc:
            unavailable[name] = str(exc)
        except Exception as exc:  # one contender's trouble is its row
            unavailable[name] = f"{type(exc).__name__}: {exc}"
        if name in unavailable:
            log(f"{name} unavailable: {unavailable[name]}")
    return unavailable


def main(argv: list[str] | None = None, work: Workload = WINDOWED) -> int:
    args = parse_args(argv, work)
    signal.signal(signal.SIGTERM, _terminate)
    from benchmarks.harness import git_state, hardware, versions

    logdir = Path(tempfile.mkdtemp(prefix=f"txstream-bench-{work.mode}-logs-"))
    log(f"logs: {logdir}")
    ctx: dict = {"args": args, "logdir": logdir, "topics": [], "workload": work,
                 "output_schema": load_schema(work.output_schema_path)}
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    meta: dict = {"mode": work.mode, "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                  "contenders": {c: work.contenders[c] for c in args.contender_names}, "master": MASTER,
                  "processor": work.processor, "baseline": work.baseline, "hardware": hardware(),
                  "logs": str(logdir), "git_at_start": git_state()}
    results: list[dict] = []
    unavailable = _prepare(args.contender_names, ctx, meta, work)
    contenders = [c for c in args.contender_names if c not in unavailable]
    run_broker: RunBroker | None = None
    try:
        run_broker = RunBroker.start(args.bootstrap_servers, log, f"txstream-bench-{work.mode}-kafka-")
        bootstrap, broker = run_broker.bootstrap, run_broker.description
        ctx["bootstrap"] = bootstrap
        meta["broker_warm_up_s"] = round(warm_up_broker(bootstrap, load_s=5 if args.quick else 30), 1)
        log(f"broker {bootstrap} warmed up in {meta['broker_warm_up_s']}s")
        source = f"{work.topic_prefix}-in-{stamp}-{uuid.uuid4().hex[:6]}"
        create_topics(bootstrap, [source], args.partitions)
        ctx["source"] = source
        ctx["topics"].append(source)
        inp = work.seed(bootstrap, source, args)
        ctx["input"] = inp
        ctx["input_ends"] = _input_ends(bootstrap, source, args.partitions)
        meta["input"] = {"topic": source, "records": inp.records, "bytes": inp.input_bytes,
                         "partitions": args.partitions, **work.input_meta(inp, args),
                         "records_per_batch": args.max_records_per_partition * args.partitions}
        for round_no in range(1, args.runs + 1):
            shift = (round_no - 1) % max(1, len(contenders))
            order = contenders[shift:] + contenders[:shift]
            for contender in order:
                log(f"round {round_no}: {contender} ...")
                try:
                    result = run_one(contender, ctx, round_no)
                except Exception as exc:  # the other contenders' runs go on
                    result = {"contender": contender, "round": round_no, "ok": False, "seconds": 0.0,
                              "records_per_s": 0, "loadavg_before": 0.0, "loadavg_after": 0.0,
                              "problem": f"{type(exc).__name__}: {exc}"}
                results.append(result)
                status = ("output exact" if result.get("ok") else
                          f"{'completed, ' if result.get('completed') else 'FAILED: '}{result.get('problem')}")
                check = result.get("check", {})
                log(f"  {result['seconds']:.1f}s, {result['records_per_s']:,} records/s"
                    + (f", steady {result['steady_records_per_s']:,}" if result.get("steady_records_per_s") else "")
                    + (f", {result.get('cpu_s_per_m')} CPU s per M records" if result.get("cpu_s_per_m") else "")
                    + f", {check.get('emitted', '-')} {work.unit} emitted"
                    + f", other work {result.get('foreign_cores', 0):.2f} cores: {status}")
        meta["versions"] = versions([], broker)
    finally:
        if ctx.get("bootstrap") and args.bootstrap_servers:
            delete_topics(ctx["bootstrap"], ctx["topics"])
        if run_broker is not None:
            run_broker.stop(log)
    meta["hardware"]["loadavg_at_end"] = os.getloadavg()
    meta["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    meta["unavailable"] = unavailable
    summary = summarize(results, args.contender_names, work.baseline)
    report = markdown(meta, results, summary, unavailable, work)
    results_dir = args.results_dir.resolve()
    results_dir.mkdir(parents=True, exist_ok=True)
    out = results_dir / (f"{stamp}-{work.mode}" + ("-quick" if args.quick else ""))
    Path(f"{out}.json").write_text(json.dumps({**meta, "summary": summary, "runs": results}, indent=2, default=str))
    Path(f"{out}.md").write_text(report)
    print(report)
    log(f"written: {out}.json, {out}.md")
    from benchmarks import figures

    figures.update_after_run(results_dir, args.no_figures, log)
    return 0 if any(r.get("ok") for r in results) else 1   # make bench stops when nothing ran exactly


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

SUMMARY_KEYS = ("records_per_s", "seconds", "first_output_s", "steady_records_per_s", "in_batch_records_per_s",
                "batches", "cpu_s", "cpu_s_per_m", "peak_rss_mb", "foreign_cores")


def summarize(results: list[dict], contenders: list[str], baseline: str = BASELINE) -> dict:
    """Medians per contender over its verified runs, and txstream's ratios against each other one
    (records/s, steady records/s: > 1 means txstream is faster; CPU per record: > 1 means it uses more)."""
    out: dict = {}
    for c in contenders:
        runs = [r for r in results if r["contender"] == c]
        ok = [r for r in runs if r.get("completed")]
        entry = {"ok_runs": len(ok), "exact_runs": sum(1 for r in ok if r.get("ok")),
                 "failed_runs": len(runs) - len(ok),
                 "problems": [r.get("problem") for r in runs if not r.get("ok")]}
        dropped = [r["check"].get("kstreams_dropped_records") for r in ok]
        late = [r["check"].get("late_dead_lettered") for r in ok]
        entry["late_records"] = _median([x for x in dropped + late if x is not None])
        for key in SUMMARY_KEYS:
            entry[key] = _median([r.get(key) for r in ok])
        out[c] = entry
    base = out.get(baseline) or {}
    for c, entry in out.items():
        if c == baseline or not base.get("ok_runs") or not entry["ok_runs"]:
            continue
        for key in ("records_per_s", "steady_records_per_s", "cpu_s_per_m"):
            if base.get(key) and entry.get(key):
                entry[f"txstream_vs_{key}"] = round(base[key] / entry[key], 3)
    return out


def output_check(entry: dict) -> str:
    """'exact' or what was wrong, with the late records (txstream: dead-lettered; Kafka Streams: dropped)."""
    late = entry.get("late_records")
    late_note = f"; late records: {late:,.0f}" if late else ""
    if entry.get("exact_runs") == entry.get("ok_runs"):
        return f"exact ({entry['exact_runs']}/{entry['ok_runs']} runs){late_note}"
    why = "; ".join(p or "?" for p in entry.get("problems") or [])[:300].replace("|", "/")
    return f"NOT exact in {entry['ok_runs'] - entry['exact_runs']}/{entry['ok_runs']} runs{late_note}: {why}"


def markdown(meta: dict, results: list[dict], summary: dict, unavailable: dict, work: Workload = WINDOWED) -> str:
    def fmt(value, spec=",.0f", none="-"):
        return none if value is None else format(value, spec)

    lines = [*work.headline(meta), "",
             "| contender | records/s | steady records/s | first output s | CPU s per M records | peak RSS MB | "
             "other work (cores) | txstream vs: records/s | steady | CPU per record | output check |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c, s in summary.items():
        label = work.contenders[c]
        if c in unavailable:
            lines.append(f"| {label} | unavailable: {unavailable[c].replace('|', '/')} | | | | | | | | | |")
            continue
        if not s["ok_runs"]:
            why = "; ".join(p or "?" for p in s["problems"])[:300].replace("|", "/")
            lines.append(f"| {label} | failed: {why} | | | | | | | | | |")
            continue

        def ratio(key: str, c: str = c, s: dict = s) -> str:
            if c == work.baseline:
                return "1 (baseline)"
            return f"{s[f'txstream_vs_{key}']:.2f}x" if f"txstream_vs_{key}" in s else "-"
        lines.append(f"| {label} | {fmt(s['records_per_s'])} | {fmt(s['steady_records_per_s'])} | "
                     f"{fmt(s['first_output_s'], '.1f')} | {fmt(s['cpu_s_per_m'], ',.1f')} | {fmt(s['peak_rss_mb'])} | "
                     f"{fmt(s['foreign_cores'], '.2f')} | {ratio('records_per_s')} | {ratio('steady_records_per_s')} | "
                     f"{ratio('cpu_s_per_m')} | {output_check(s)} |")
    lines += ["", work.rate_note(), "",
              "## Runs", "",
              "| round | contender | wall s | records/s | first output s | steady records/s | CPU s | batches | "
              f"{work.unit} emitted / expected | duplicates | late (txstream DLQ / Kafka Streams dropped) | "
              "load before/after | other work | done by | check |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        check = r.get("check", {})
        late = check.get("late_dead_lettered", check.get("kstreams_dropped_records"))
        status = ("exact" if r.get("ok") else
                  f"{'' if r.get('completed') else 'FAILED: '}{str(r.get('problem', ''))[:400]}".replace("|", "/"))
        lines.append(f"| {r['round']} | {r['contender']} | {r['seconds']:.1f} | {r['records_per_s']:,} | "
                     f"{fmt(r.get('first_output_s'), '.1f')} | {fmt(r.get('steady_records_per_s'))} | "
                     f"{fmt(r.get('cpu_s'), '.1f')} | {fmt(r.get('batches'), 'g')} | "
                     f"{check.get('emitted', '-')} / {check.get('expected', '-')} | "
                     f"{check.get('duplicates', '-')} | {fmt(late, 'g')} | "
                     f"{r['loadavg_before']:.2f}/{r['loadavg_after']:.2f} | {fmt(r.get('foreign_cores'), '.2f')} | "
                     f"{r.get('done_by', '-')} | {status} |")
    lines += ["", "## Notes", "", *work.notes(meta),
              f"- Spark connectors: {meta.get('spark_connectors')}. Kafka Streams: {meta.get('kafka_streams')}. "
              f"Logs: {meta['logs']}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
