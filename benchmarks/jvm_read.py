"""Issue 55, the gating measurement: the READ+DECODE phase alone, today's reader against Spark's own
Kafka batch source + from_avro in the JVM, side by side in one Spark session, alternating.

    python -m benchmarks.jvm_read [--records 1000000] [--partitions 4] [--rounds 2]
        [--small-batches 20] [--small-records 200] [--full-jit] [--bootstrap-servers B]

Paths, each over the same planned ranges of the seeded orders (benchmarks/common.py seed_input),
forced by one sink that touches every value column (a global aggregate, so neither side can prune
the decode away, and whose figures must agree between the paths):
  a    today: driver/jobs.py range_frame (task/reading.py read_planned_range: librdkafka and the
       columnar Avro codec in a Python worker, Arrow into the JVM), one reading task per slot of
       two ranges, as a 4-partition run on local[2] reads them
  b    spark.read.format("kafka") with per-partition startingOffsets/endingOffsets,
       kafka.isolation.level=read_committed, + from_avro (PERMISSIVE) in the JVM
  a+h  a, then a mapInArrow that only receives the decoded rows in Python (today's second crossing,
       the hand-off to the publisher), nothing produced
  b+h  b, then the same receiving mapInArrow: the one crossing a JVM read path keeps

Per phase: wall seconds, and CPU seconds of the Spark JVM, its Python workers, the driver's own
Python process and the broker (benchmarks/measure.py TreeSampler roles), the load average and the
CPU other processes used meanwhile (ForeignLoad). Then the per-batch cost of a small batch
(`--small-batches` of `--small-records` records): today's job is built once and run again with each
batch's ranges in a local property (task/spec.py FromJob); Spark's source takes the offsets as
options, so its DataFrame is planned again every batch.

The Spark session is txstream's own (spark/session.py build_spark: C1 only, serial collector,
the class archive, txstream's Arrow batch settings); `--full-jit` lets the JVM use C2 too.
Results: benchmarks/results/<timestamp>-jvm-read[-fulljit]/ (results.json, README.md).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import psutil

from benchmarks.common import ORDER_SCHEMA_PATH, RunBroker, create_topics, seed_input, warm_up_broker
from benchmarks.contenders.spark_ss import connector_jars
from benchmarks.measure import ForeignLoad, TreeSampler

RESULTS = Path(__file__).resolve().parent / "results"
GROUP = "jvm-read-bench"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---------------------------------------------------------------------------------------------
# The paths
# ---------------------------------------------------------------------------------------------

def sink(frame):
    """Every value column touched, one row back: the decode cannot be pruned, and both paths'
    rows can be compared. Undecoded values (the `-raw` paths): their bytes counted."""
    from pyspark.sql import functions as F

    if dict(frame.dtypes)["value"] == "binary":
        return frame.agg(F.count(F.lit(1)).alias("rows"), F.sum(F.length("value")).alias("value_bytes"),
                         F.sum(F.length("key")).alias("key_bytes"), F.sum("offset").alias("offsets"))

    return frame.agg(
        F.count(F.lit(1)).alias("rows"), F.sum("value.amount").alias("amount"),
        F.sum(F.length("value.id")).alias("id_chars"), F.sum(F.length("value.customer_id")).alias("customer_chars"),
        F.sum(F.length("value.currency")).alias("currency_chars"), F.max("value.created_at").alias("created_at"),
        F.sum("value.items").alias("items"), F.count("value.note").alias("notes"),
        F.sum(F.length("key")).alias("key_bytes"), F.sum("offset").alias("offsets"))


def narrow_sink(frame):
    """The small batches' sink: each row's place and a value field, collected. No shuffle, as in
    a txstream batch's job: a job with one (the global aggregate) run again would reuse the
    shuffle's map output and skip the read altogether."""
    from pyspark.sql import functions as F

    return frame.select("partition", "offset", F.length("value.id").alias("id_chars"))


def receive(batches):
    """The publisher's side of the hand-off without the publishing: the rows arrive in Python."""
    import pyarrow as pa

    rows = 0
    for batch in batches:
        rows += batch.num_rows
    yield pa.RecordBatch.from_pydict({"rows": [rows]})


def handed_off(frame):
    from pyspark.sql import functions as F

    out = frame.select("key", "value", "topic", "partition", "offset", "timestamp", "headers")
    return out.mapInArrow(receive, "rows long").agg(F.sum("rows").alias("rows"))


def plans_of(topic: str, ranges: dict[int, tuple[int, int]]):
    from txstream.task.spec import PartitionPlan

    return [PartitionPlan(topic, p, start, end, None, f"{GROUP}-{p}") for p, (start, end) in sorted(ranges.items())]


def read_spec(bootstrap: str, value_schema: dict, side_dir: str):
    from txstream.kafka.config import KafkaClients
    from txstream.task.spec import ReadSpec

    return ReadSpec(clients=KafkaClients(bootstrap), app_id=GROUP, side_dir=side_dir, value_schema=value_schema)


def slot_layout(partitions: int, cores: int = 2) -> tuple[tuple[int, ...], int]:
    """Partition p in slot p % cores, as driver/slots.py lays them out; the slots' ranges read
    together (per-slot reading)."""
    width = -(-partitions // cores)
    layout: list[int] = []
    for slot in range(cores):
        members = [p for p in range(partitions) if p % cores == slot]
        layout += members + [-1] * (width - len(members))
    return tuple(layout), width


def today_frame(spark, spec, topic: str, ranges: dict[int, tuple[int, int]], from_job: bool = False):
    from txstream.driver.jobs import range_frame

    layout, width = slot_layout(len(ranges))
    batch = spec.with_batch(0, plans_of(topic, ranges), layout, width)
    return range_frame(spark, batch, None, per_slot=True, from_job=from_job)


# Spark's Kafka source as it comes (b), and with larger polls (bt, bt8). Its reader asks the
# broker for the partition's earliest and latest offsets (two ListOffsets requests, the buffered
# fetch dropped) on every poll (KafkaDataConsumer.fetch -> getAvailableOffsetRange), and a poll
# returns at most max.poll.records (the Java consumer's default 500): a request triple per 500 records.
KAFKA_VARIANTS = {
    "b": {},
    "bt": {"kafka.max.poll.records": "100000"},
    "bt8": {"kafka.max.poll.records": "100000", "kafka.max.partition.fetch.bytes": str(8 << 20)},
}


def kafka_frame(spark, bootstrap: str, topic: str, ranges: dict[int, tuple[int, int]], schema_json: str,
                variant: str = "b", decode: bool = True):
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    starting = {topic: {str(p): start for p, (start, _) in ranges.items()}}
    ending = {topic: {str(p): end for p, (_, end) in ranges.items()}}
    source = (spark.read.format("kafka")
              .option("kafka.bootstrap.servers", bootstrap)
              .option("assign", json.dumps({topic: sorted(ranges)}))
              .option("startingOffsets", json.dumps(starting))
              .option("endingOffsets", json.dumps(ending))
              .option("kafka.isolation.level", "read_committed")
              .option("includeHeaders", "true")
              # A fixed group id per variant: Spark's consumer pool is keyed by it and refuses other
              # parameters under the same id (its default, a fresh id per query, would give every
              # batch new consumers).
              .option("kafka.group.id", f"{GROUP}-{variant}")
              .options(**KAFKA_VARIANTS[variant])
              .load())
    value = from_avro(F.col("value"), schema_json, {"mode": "PERMISSIVE"}) if decode else F.col("value")
    return source.select("key", value.alias("value"),
                         "topic", "partition", "offset", "timestamp", "headers")


# ---------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------

class Meter:
    """CPU seconds by role over a phase: the Spark JVM's tree (JVM, Python workers), this process
    (the driver's Python), the broker's JVM."""

    def __init__(self, spark_pid: int, broker_pids: list[int]) -> None:
        self.spark = TreeSampler(0.1)
        self.spark.add_root(spark_pid)
        self.spark.start()
        self.broker_pids = broker_pids
        self.me = psutil.Process()

    def _broker_cpu(self) -> float:
        total = 0.0
        for pid in self.broker_pids:
            try:
                t = psutil.Process(pid).cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total

    def snapshot(self) -> dict[str, float]:
        self.spark.sample()
        roles = self.spark.cpu_by_role
        mine = self.me.cpu_times()
        return {"jvm": roles.get("JVM", 0.0), "python_workers": roles.get("Python workers", 0.0),
                "driver_python": mine.user + mine.system, "broker": self._broker_cpu()}

    def measure(self, action):
        foreign = ForeignLoad().start()
        load_before = os.getloadavg()[0]
        before = self.snapshot()
        started = time.perf_counter()
        result = action()
        wall = time.perf_counter() - started
        after = self.snapshot()
        load = foreign.stop()
        cpu = {k: round(after[k] - before[k], 3) for k in before}
        return result, {"wall_s": round(wall, 3), "cpu_s": cpu, "load_avg_1m": [load_before, os.getloadavg()[0]],
                        "foreign_cores": round(load["foreign_cores"], 2), "foreign_top": load["foreign_top"]}


def rows_dict(rows) -> dict:
    out = rows[0].asDict()
    return {k: (v.isoformat() if hasattr(v, "isoformat") else (round(v, 2) if isinstance(v, float) else v))
            for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--paths", default="a,b,a+h,b+h")
    ap.add_argument("--small-batches", type=int, default=20)
    ap.add_argument("--small-records", type=int, default=200)
    ap.add_argument("--small-variant", default="b", choices=sorted(KAFKA_VARIANTS),
                    help="the Kafka source's settings in the small batches")
    ap.add_argument("--full-jit", action="store_true", help="the JVM with C2 (txstream's session uses C1 only)")
    ap.add_argument("--bootstrap-servers")
    ap.add_argument("--results-dir", default=str(RESULTS))
    args = ap.parse_args(argv)
    paths = args.paths.split(",")
    started_at = datetime.now(timezone.utc)

    broker = RunBroker.start(args.bootstrap_servers, log, "jvm-read-")
    try:
        return run(args, paths, broker, started_at)
    finally:
        broker.stop(log)


def run(args, paths: list[str], broker: RunBroker, started_at: datetime) -> int:
    from confluent_kafka import Consumer, TopicPartition

    from txstream.serde.avro import load_schema
    from txstream.spark.arrow_batches import MAX_BYTES_KEY, MAX_ROWS_KEY, NO_BYTE_CHECK, rows_per_batch
    from txstream.spark.session import build_spark, send_jvm_output_to, stop_spark
    from txstream.task.spec import JOB_SPEC_PROPERTY, PublishSpec
    from txstream.task.spec import encode as encode_job_spec

    bootstrap = broker.bootstrap
    log(f"warming up the broker: {warm_up_broker(bootstrap, load_s=10):.0f}s")
    topic = f"jvm-read-{int(time.time())}"
    create_topics(bootstrap, [topic], args.partitions)
    seeded = seed_input(bootstrap, topic, args.records, progress=log)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "jvm-read-watermarks"})
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(args.partitions)}
    consumer.close()
    log(f"seeded {args.records:,} orders, end offsets {ends}")
    whole = {p: (0, end) for p, end in ends.items()}

    jars, chosen = connector_jars(log)
    logs = Path(f"/tmp/jvm-read-{started_at:%Y%m%d-%H%M%S}.spark.log")
    send_jvm_output_to(logs)
    conf = {"spark.jars": ",".join(jars), "spark.sql.shuffle.partitions": "1"}
    if args.full_jit:
        conf["spark.driver.extraJavaOptions"] = "-XX:+TieredCompilation"
    spark = build_spark("local[2]", "jvm-read", conf)
    # txstream's Arrow settings after a clean batch (spark/arrow_batches.py), for both paths.
    spark.conf.set(MAX_BYTES_KEY, NO_BYTE_CHECK)
    spark.conf.set(MAX_ROWS_KEY, str(rows_per_batch(seeded.avg_record_size * 2)))
    from pyspark import SparkContext

    spark_pid = SparkContext._gateway.proc.pid  # noqa: SLF001 (the spark-submit script execs the JVM)
    broker_pids = broker.cluster.alive_pids() if broker.cluster is not None else []
    meter = Meter(spark_pid, broker_pids)
    value_schema = load_schema(str(ORDER_SCHEMA_PATH))
    schema_json = ORDER_SCHEMA_PATH.read_text()
    spec = read_spec(bootstrap, value_schema, f"jvm-read-side-{os.getpid()}")
    raw_spec = read_spec(bootstrap, None, f"jvm-read-side-{os.getpid()}")

    def frame_of(path: str, ranges):
        # "<a|b|bt|bt8>[-raw][+h]": -raw reads without decoding (values as bytes).
        name = path.removesuffix("+h")
        raw = name.endswith("-raw")
        name = name.removesuffix("-raw")
        base = today_frame(spark, raw_spec if raw else spec, topic, ranges) if name == "a" else \
            kafka_frame(spark, bootstrap, topic, ranges, schema_json, name, decode=not raw)
        return handed_off(base) if path.endswith("+h") else sink(base)

    results: dict = {"kind": "jvm-read", "issue": 55, "started_at": started_at.isoformat(), "settings": vars(args),
                     "topic_end_offsets": ends, "input_bytes": seeded.input_bytes,
                     "avg_record_bytes": seeded.avg_record_size,
                     "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                     "versions": {"spark_connectors": chosen}, "spark_log": str(logs), "phases": [], "small": []}
    import pyspark

    results["versions"]["pyspark"] = pyspark.__version__

    # Warm-up, not counted: every path once over a tenth of the input (classes, workers, JIT).
    tenth = {p: (0, max(1, end // 10)) for p, end in ends.items()}
    for path in paths:
        _, m = meter.measure(lambda path=path: frame_of(path, tenth).collect())
        log(f"warm-up {path}: {m['wall_s']:.2f}s")

    answers: dict[str, dict] = {}
    for rnd in range(args.rounds):
        order = paths if rnd % 2 == 0 else list(reversed(paths))
        for path in order:
            rows, m = meter.measure(lambda path=path: frame_of(path, whole).collect())
            got = rows_dict(rows)
            if got["rows"] != args.records:
                raise SystemExit(f"{path} read {got['rows']} rows, not {args.records}")
            kind = ("raw" if "-raw" in path else "decoded") + ("+h" if path.endswith("+h") else "")
            answers.setdefault(kind, {})[path] = got
            cpu_total = sum(v for k, v in m["cpu_s"].items() if k != "broker")
            entry = {"round": rnd + 1, "path": path, **m, "records_per_s": round(args.records / m["wall_s"]),
                     "cpu_s_per_million": {k: round(v * 1e6 / args.records, 2) for k, v in m["cpu_s"].items()},
                     "cpu_s_per_million_spark_and_driver": round(cpu_total * 1e6 / args.records, 2)}
            results["phases"].append(entry)
            log(f"round {rnd + 1} {path:4}: {m['wall_s']:.2f}s {entry['records_per_s']:,} rec/s  "
                f"CPU/M {entry['cpu_s_per_million']}  load {m['load_avg_1m'][0]:.2f} foreign {m['foreign_cores']}")
    for kind, by_path in answers.items():
        if len({json.dumps(v, sort_keys=True) for v in by_path.values()}) > 1:
            raise SystemExit(f"the paths disagree ({kind}): {by_path}")
    results["answers"] = answers

    # Per-batch cost of small batches: today's job kept (its ranges in the job's local property),
    # Spark's source planned again each batch.
    per_partition = max(1, args.small_records // args.partitions)
    kept = narrow_sink(today_frame(spark, spec, topic, whole, from_job=True))
    sc = spark.sparkContext

    def today_batch(ranges):
        layout, width = slot_layout(len(ranges))
        read = spec.with_batch(0, plans_of(topic, ranges), layout, width)
        sc.setLocalProperty(JOB_SPEC_PROPERTY, encode_job_spec(PublishSpec(read, "exactly_once", 60.0, None)))
        try:
            return kept.collect()
        finally:
            sc.setLocalProperty(JOB_SPEC_PROPERTY, None)

    planning: list[float] = []   # Spark's source: seconds to a physical plan (its offsets fetched there)
    rerun: list[float] = []      # ... and the same DataFrame's job run again: its execution alone
    last: list = []

    def kafka_batch(ranges):
        frame = narrow_sink(kafka_frame(spark, bootstrap, topic, ranges, schema_json, args.small_variant))
        started = time.perf_counter()
        frame._jdf.queryExecution().executedPlan()  # noqa: SLF001 (KafkaRelation.buildScan runs here)
        planning.append(time.perf_counter() - started)
        last[:] = [frame]
        return frame.collect()

    variant = args.small_variant
    small: dict[str, list] = {"a": [], variant: []}
    for i in range(args.small_batches):
        ranges = {p: (i * per_partition, (i + 1) * per_partition) for p in ends}
        for path in (("a", variant) if i % 2 == 0 else (variant, "a")):
            rows, m = meter.measure(lambda path=path, ranges=ranges: (today_batch if path == "a" else kafka_batch)(ranges))
            if path != "a":   # outside the batch's figures
                started = time.perf_counter()
                last[0].collect()
                rerun.append(time.perf_counter() - started)
            got = sorted((row["partition"], row["offset"]) for row in rows)
            if got != [(p, o) for p in sorted(ranges) for o in range(*ranges[p])]:
                raise SystemExit(f"small batch {i} {path}: not the records of {ranges} ({len(got)} rows)")
            small[path].append({"batch": i, **m})
    for path, runs in small.items():
        steady = runs[2:]   # the first two pay the kept job's build and the pool's first consumers
        walls = [r["wall_s"] for r in steady]
        summary = {"path": path, "batches": len(runs), "records_per_batch": per_partition * args.partitions,
                   "first_wall_s": runs[0]["wall_s"], "median_wall_s": round(statistics.median(walls), 3),
                   "mean_wall_s": round(statistics.mean(walls), 3),
                   "mean_cpu_s": {k: round(statistics.mean(r["cpu_s"][k] for r in steady), 3) for k in runs[0]["cpu_s"]}}
        if path != "a":
            summary["median_planning_s"] = round(statistics.median(planning[2:]), 3)
            summary["median_rerun_s"] = round(statistics.median(rerun[2:]), 3)
        results["small"].append({"summary": summary, "runs": runs})
        log(f"small batches {path}: {summary}")
    stop_spark(spark)
    results["finished_at"] = datetime.now(timezone.utc).isoformat()
    write_results(results, Path(args.results_dir), started_at, args.full_jit)
    return 0


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------

LABELS = {"a": "a: today (librdkafka + columnar codec in Python)",
          "b": "b: Spark Kafka source + from_avro (JVM), Spark's defaults",
          "bt": "bt: b with kafka.max.poll.records=100000",
          "bt8": "bt8: bt with kafka.max.partition.fetch.bytes=8 MB",
          "a+h": "a+h: today + hand-off to Python", "b+h": "b+h: b + hand-off to Python",
          "bt+h": "bt+h: bt + hand-off to Python", "bt8+h": "bt8+h: bt8 + hand-off to Python",
          "a-raw": "a-raw: today's reader, values not decoded", "b-raw": "b-raw: b, values not decoded",
          "bt-raw": "bt-raw: bt, values not decoded", "bt8-raw": "bt8-raw: bt8, values not decoded"}


def summary_rows(results: dict) -> list[dict]:
    rows = []
    for path in dict.fromkeys(p["path"] for p in results["phases"]):
        runs = [p for p in results["phases"] if p["path"] == path]
        rows.append({"path": path, "runs": len(runs), "wall_s": statistics.mean(r["wall_s"] for r in runs),
                     "records_per_s": statistics.mean(r["records_per_s"] for r in runs),
                     **{k: statistics.mean(r["cpu_s_per_million"][k] for r in runs) for k in runs[0]["cpu_s_per_million"]}})
    return rows


def write_results(results: dict, root: Path, started_at: datetime, full_jit: bool) -> Path:
    out = root / f"{started_at:%Y%m%d-%H%M%S}-jvm-read{'-fulljit' if full_jit else ''}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    s = results["settings"]
    lines = ["# Read + decode alone: today's reader against Spark's Kafka source + from_avro (issue 55)", "",
             f"{s['records']:,} orders ({results['avg_record_bytes']} B a record with its key), {s['partitions']} "
             f"partitions, local broker, Spark local[2] ({'C1 + C2' if full_jit else 'txstream session: C1 only, serial GC'}), "
             f"{s['rounds']} rounds alternating; started {results['started_at']}, finished {results['finished_at']}; "
             f"pyspark {results['versions']['pyspark']}, connectors {results['versions']['spark_connectors']}.", "",
             "Mean over the rounds. CPU seconds per million records; 'Spark+driver' = JVM + Python workers + the "
             "driver's Python (the broker apart).", "",
             "| path | wall s | records/s | JVM | Python workers | driver Python | Spark+driver | broker |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in summary_rows(results):
        total = r["jvm"] + r["python_workers"] + r["driver_python"]
        lines.append(f"| {LABELS.get(r['path'], r['path'])} | {r['wall_s']:.2f} | {r['records_per_s']:,.0f} | "
                     f"{r['jvm']:.2f} | {r['python_workers']:.2f} | {r['driver_python']:.2f} | {total:.2f} | {r['broker']:.2f} |")
    lines += ["", "Each run (load average at its start, other processes' CPU in cores meanwhile):", "",
              "| round | path | wall s | records/s | Spark+driver CPU s/M | load | foreign cores |",
              "|---:|---|---:|---:|---:|---:|---:|"]
    for p in results["phases"]:
        lines.append(f"| {p['round']} | {p['path']} | {p['wall_s']:.2f} | {p['records_per_s']:,} | "
                     f"{p['cpu_s_per_million_spark_and_driver']:.2f} | {p['load_avg_1m'][0]:.2f} | {p['foreign_cores']} |")
    lines += ["", f"Small batches ({s['small_batches']} of {s['small_records']} records, alternating; the first two of "
              "each left out of the means): wall and CPU seconds per batch", "",
              "| path | first batch s | median s | mean s | of which planning (median) s | the same job run again (median) s | JVM | Python workers | driver Python |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for entry in results["small"]:
        m = entry["summary"]
        c = m["mean_cpu_s"]
        lines.append(f"| {LABELS[m['path']]} | {m['first_wall_s']:.3f} | {m['median_wall_s']:.3f} | "
                     f"{m['mean_wall_s']:.3f} | {m.get('median_planning_s', '(job kept)')} | {m.get('median_rerun_s', '')} | {c['jvm']:.3f} | {c['python_workers']:.3f} | {c['driver_python']:.3f} |")
    (out / "README.md").write_text("\n".join(lines) + "\n")
    log(f"results in {out}")
    return out


if __name__ == "__main__":
    sys.exit(main())
