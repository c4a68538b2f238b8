"""A wide transform's throughput: per micro-batch groupBy(customer).agg(), txstream's two ways of
publishing it next to Spark Structured Streaming with Spark's own Kafka sink.

    python -m benchmarks.wide --records 200000 --runs 2
    python -m benchmarks.wide --contender txstream-units --contender spark-ss-foreachbatch
    python -m benchmarks.wide --bootstrap-servers localhost:29092   # an existing broker
    python -m benchmarks.wide --quick                                # smoke run: 20000 records, 1 round

Contenders, all on one input topic (the enricher's Avro orders, benchmarks/common.py), each into
its own fresh output topic, rounds interleaved (the order rotates each round):

- `txstream-units`: processors/customer_totals.py:CustomerTotals with `--wide-mode units` (K output
  units, K = the input partitions, each unit its own Kafka transaction);
- `txstream-single-transaction`: the same with `--wide-mode single-transaction` (the driver
  publishes the whole batch and its input offsets in one transaction);
- `spark-ss-foreachbatch`: benchmarks/contenders/spark_ss_wide.py, Spark Structured Streaming,
  `foreachBatch` grouping each micro-batch and writing it with `batch_df.write.format("kafka")`
  (at-least-once), `trigger(availableNow=True)`, `maxOffsetsPerTrigger` = txstream's batch size.
- `kafka-streams`: benchmarks/contenders/kstreams/.../CustomerTotals.java, Kafka Streams with
  `processing.guarantee=exactly_once_v2` and 2 stream threads: decode, keep amount > 0, key by
  customer, `repartition()` through Kafka, add to a changelogged store, and every
  `--kstreams-emit-interval-ms` (wall clock) one CustomerTotals per customer of the interval, the
  store emptied: per interval what the others do per batch. It runs until stopped: the harness
  reads the output (read_committed) and stops it once the output's orders add up to the input's.

The Spark ones run on `local[2]` with batches of `--max-records-per-partition` x partitions records.
records/s = input records / wall seconds from process start to exit (Spark start-up included;
Kafka Streams: to the moment its output was complete);
in-batch records/s = input records / the sum of the batches' seconds (txstream's batch lines,
Spark's `triggerExecution` per micro-batch). Every run's output is read back (read_committed) and
decoded (schemas/customer_totals.avsc): it must be non-empty, the `orders` fields must add up to
the number of input orders with amount > 0, the `items` to their items, `amount` to their amounts
(within the enricher's cent truncation), and every such order's customer must be there.
Results: benchmarks/results/<timestamp>-wide[-quick].{json,md} ("mode": "wide"); at the end docs/performance.md's
figures are rewritten (`python -m benchmarks.figures`; `--no-figures` skips it).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.common import (
    ENRICHED_SCHEMA,
    ORDER_SCHEMA_PATH,
    REPO,
    RunBroker,
    create_topics,
    decode,
    decode_all,
    delete_topics,
    load_schema,
    seed_input,
    warm_up_broker,
)

PROCESSOR = "processors/customer_totals.py:CustomerTotals"
TOTALS_SCHEMA_PATH = REPO / "schemas" / "customer_totals.avsc"
RESULTS = REPO / "benchmarks" / "results"
MASTER = "local[2]"
BASELINE = "txstream-units"
CONTENDERS = {
    "txstream-units": "txstream wide, --wide-mode units (exactly-once)",
    "txstream-single-transaction": "txstream wide, --wide-mode single-transaction (exactly-once)",
    "spark-ss-foreachbatch": "Spark SS foreachBatch + Kafka sink (at-least-once)",
    "kafka-streams": "Kafka Streams exactly_once_v2, repartition + totals per interval",
}
EXACTLY_ONCE = {"txstream-units", "txstream-single-transaction", "kafka-streams"}
RUN_UNTIL_STOPPED = {"kafka-streams"}   # stopped by the harness once its output is complete
KSTREAMS_MAIN = "txstream.bench.kstreams.CustomerTotals"
T0 = time.monotonic()


def log(message: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {message}", flush=True)


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _tail(text: str, lines: int = 4) -> str:
    rows = [t.strip()[:300] for t in text.strip().splitlines() if t.strip() and " WARN " not in t[:40]]
    return " | ".join(rows[-lines:])


# ---------------------------------------------------------------------------------------------
# What the output must add up to
# ---------------------------------------------------------------------------------------------

def expected_totals(seeded) -> dict:
    """From the enricher's expected values (one per order with amount > 0): orders, items, amount
    (the enriched value has amount_cents = long(amount * 100), so amount is known to a cent per
    order) and the set of customers."""
    orders = items = cents = 0
    customers: set[str] = set()
    for value in seeded.expected.values():
        enriched = decode(ENRICHED_SCHEMA, value)
        orders += 1
        items += enriched["items"]
        cents += enriched["amount_cents"]
        customers.add(enriched["customer_id"])
    return {"orders": orders, "items": items, "amount_cents_truncated": cents, "customers": customers}


def verify(records, expected: dict, exactly_once: bool) -> dict:
    """Decode every output record and add it up; `ok` when it matches the input."""
    schema = load_schema(TOTALS_SCHEMA_PATH)
    orders = items = 0
    amount = 0.0
    customers: set[str] = set()
    seen: set[tuple[str, object]] = set()
    duplicates = 0
    values, undecodable, key_mismatches = decode_all(records, schema, "customer_id")
    for totals in values:
        orders += totals["orders"]
        items += totals["items"]
        amount += totals["amount"]
        customers.add(totals["customer_id"])
        ident = (totals["customer_id"], totals["batch_time"])
        if ident in seen:
            duplicates += 1
        seen.add(ident)
    low = expected["amount_cents_truncated"] / 100
    high = low + 0.01 * expected["orders"]
    slack = 1e-6 * max(1.0, abs(high))
    missing = len(expected["customers"] - customers)
    unexpected = len(customers - expected["customers"])
    problems = []
    if not records:
        problems.append("no output")
    if orders != expected["orders"]:
        problems.append(f"sum(orders) {orders:,} != {expected['orders']:,} input orders with amount > 0")
    if items != expected["items"]:
        problems.append(f"sum(items) {items:,} != {expected['items']:,}")
    if not low - slack <= amount <= high + slack:
        problems.append(f"sum(amount) {amount:,.2f} outside [{low:,.2f}, {high:,.2f}]")
    if missing or unexpected:
        problems.append(f"customers: {missing:,} missing, {unexpected:,} unexpected")
    if key_mismatches:
        problems.append(f"{key_mismatches:,} keys differ from their customer_id")
    if undecodable:
        problems.append(f"{undecodable:,} values do not decode as CustomerTotals")
    if duplicates and exactly_once:
        problems.append(f"{duplicates:,} duplicate (customer, batch_time) records")
    return {"ok": not problems, "problems": problems, "output_records": len(records), "sum_orders": orders,
            "sum_items": items, "sum_amount": round(amount, 2), "customers": len(customers),
            "duplicates": duplicates}


# ---------------------------------------------------------------------------------------------
# One run
# ---------------------------------------------------------------------------------------------

def _command(contender: str, ctx: dict, out: str, dlq: str, app_id: str, workdir: str) -> list[str]:
    args = ctx["args"]
    if contender == "kafka-streams":
        from benchmarks.contenders.kafka_streams import JAR, LIB, THREADS

        return ["java", "-Xmx512m", "-XX:+UseG1GC", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                "-cp", f"{JAR}:{LIB}/*", KSTREAMS_MAIN, "--bootstrap-servers", ctx["bootstrap"],
                "--input", ctx["source"], "--output", out, "--application-id", app_id, "--state-dir", workdir,
                "--threads", str(THREADS), "--input-schema", str(ORDER_SCHEMA_PATH),
                "--output-schema", str(TOTALS_SCHEMA_PATH), "--emit-interval-ms", str(args.kstreams_emit_interval_ms)]
    if contender.startswith("txstream-"):
        mode = contender.removeprefix("txstream-")
        return [sys.executable, "-m", "txstream.cli", "run", PROCESSOR, "-b", ctx["bootstrap"], "--app-id", app_id,
                "--input", ctx["source"], "--output", out, "--dead-letter-topic", dlq, "--master", MASTER,
                "--until-caught-up", "--max-records-per-partition", str(args.max_records_per_partition),
                "--wide-mode", mode]
    return [sys.executable, "-m", "benchmarks.contenders.spark_ss_wide", "--bootstrap-servers", ctx["bootstrap"],
            "--input", ctx["source"], "--output", out, "--group", app_id, "--workdir", workdir,
            "--jars", ",".join(ctx["spark_jars"]), "--input-schema", str(ORDER_SCHEMA_PATH),
            "--output-schema", str(TOTALS_SCHEMA_PATH), "--master", MASTER,
            "--max-offsets-per-trigger", str(args.max_records_per_partition * args.partitions)]


SPARK_BATCH = re.compile(r"^spark-batch (\d+)\s+in (\d+)\s+([\d.]+)s$", re.M)
CAUGHT_UP = re.compile(r"caught up: (\d+) batches, (\d+) records in, (\d+) out, (\d+) dead-lettered")


def _until_complete(watcher, proc, deadline: float) -> float | None:
    """When the output's orders first added up to the input's (watcher.done_at), waiting until
    then, until `proc` (if any) exits or until the deadline (None)."""
    while (watcher.done_at is None and (proc is None or proc.poll() is None) and time.monotonic() < deadline
           and watcher.error is None):
        time.sleep(0.05)
    return watcher.done_at


def _batches(contender: str, text: str) -> dict:
    if contender == "kafka-streams":
        return {"batches": None, "in_batch_s": None, "records_in": None, "records_out": None, "batch_s": []}
    if contender.startswith("txstream-"):
        from benchmarks import batchlog

        summary = batchlog.summarize(text) or {}
        caught = CAUGHT_UP.search(text)
        return {"batches": summary.get("batches", 0), "in_batch_s": summary.get("batch_s_sum"),
                "records_in": summary.get("records_in"), "records_out": summary.get("records_out"),
                "batch_s": [b["seconds"] for b in batchlog.parse(text)["batches"]],
                "failed_attempts": summary.get("failed_attempts"), "split_median": summary.get("split_median"),
                "caught_up_line": caught.group(0) if caught else None}
    found = [(int(b), int(n), float(s)) for b, n, s in SPARK_BATCH.findall(text)]
    return {"batches": len(found), "in_batch_s": sum(s for _, _, s in found) if found else None,
            "records_in": sum(n for _, n, _ in found) if found else None, "records_out": None,
            "batch_s": [s for _, _, s in found]}


def _foreign_work(foreign, sampler, elapsed: float) -> dict:
    """ForeignLoad's figures without the contender's own processes.

    ForeignLoad leaves out the processes under this one when it samples; but the contender's JVM
    can outlive its Python parent by a moment, and then the last sample (taken after the exit)
    finds it orphaned, never seen before, and counts all its CPU as other work. Every process the
    tree sampler saw is the contender's: leave those out here.
    """
    ours = set(sampler.cpu)
    used: dict[str, float] = {}
    for key, last in foreign.last.items():
        delta = last - foreign.first[key]
        if key not in ours and delta > 0:
            used[foreign.names[key]] = used.get(foreign.names[key], 0.0) + delta
    total = sum(used.values())
    top = sorted(((v, name) for name, v in used.items() if v >= 0.5), reverse=True)[:3]
    return {"foreign_cpu_s": round(total, 1), "foreign_cores": round(total / elapsed, 2) if elapsed > 0 else 0.0,
            "foreign_top": [f"{name} ({v:.0f} CPU s)" for v, name in top]}


def run_one(contender: str, ctx: dict, round_no: int) -> dict:
    from benchmarks.harness import steady_state
    from benchmarks.measure import ForeignLoad, OutputWatcher, TreeSampler, start_process, stop_process
    from tests.support.kafka import read_all

    bootstrap, args = ctx["bootstrap"], ctx["args"]
    tag = f"{contender}-{round_no}-{uuid.uuid4().hex[:6]}"
    out, dlq, app_id = f"bench-wide-out-{tag}", f"bench-wide-out-{tag}-dlq", f"bench-wide-{tag}"
    create_topics(bootstrap, [out, dlq], args.partitions)
    ctx["topics"] += [out, dlq, f"{app_id}.units", f"{app_id}-by-customer-repartition",
                      f"{app_id}-batch-totals-changelog"]
    workdir = tempfile.mkdtemp(prefix="bench-wide-")
    log_path = ctx["logdir"] / f"{tag}.log"
    argv = _command(contender, ctx, out, dlq, app_id, workdir)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "PYTHONUNBUFFERED": "1"}
    result: dict = {"contender": contender, "round": round_no, "output_topic": out, "log": str(log_path),
                    "loadavg_before": round(os.getloadavg()[0], 2)}
    sampler, foreign = TreeSampler(), ForeignLoad()
    proc = watcher = None
    try:
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        # Every run's output read while it goes on, each totals record counting its orders: the first
        # output, the steady rate (the narrow harness's steady_state) and Kafka Streams' end.
        orders = ctx["expected"]["orders"]
        watcher = OutputWatcher(bootstrap, out, args.partitions, orders, weight=ctx["orders_of"]).start()
        foreign.start()
        started = foreign_from = time.monotonic()
        proc = start_process(argv, env, str(log_path), str(REPO))
        sampler.add_root(proc.pid)
        sampler.start()
        if contender in RUN_UNTIL_STOPPED:
            done_at = _until_complete(watcher, proc, started + args.timeout)
            code = 0 if done_at is not None else proc.poll()   # None: timed out; the process is stopped below
            wall = (done_at or time.monotonic()) - started
        else:
            try:
                code = proc.wait(args.timeout)
            except subprocess.TimeoutExpired:
                code = None
            wall = time.monotonic() - started
        sampler.stop()
        foreign.stop()
        result.update(_foreign_work(foreign, sampler, time.monotonic() - foreign_from))
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        rusage_cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
        exited = code is not None and contender not in RUN_UNTIL_STOPPED
        cpu = max(sampler.cpu_seconds, rusage_cpu) if exited else sampler.cpu_seconds
        if contender not in RUN_UNTIL_STOPPED and code == 0:
            _until_complete(watcher, None, time.monotonic() + 30)   # a read_committed reader may trail the exit
        result["first_output_s"] = round(watcher.first_at - started, 2) if watcher.first_at else None
        if watcher.done_at is not None:
            result["steady_records_per_s"] = steady_state(watcher, watcher.done_at, args.records, orders)[
                "steady_records_per_s"]
    finally:
        sampler.stop()
        foreign.stop()
        stop_process(proc)
        if watcher is not None:
            watcher.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    text = log_path.read_text(errors="replace")
    batches = _batches(contender, text)
    records = args.records
    result.update(exit_code=code, seconds=round(wall, 2), records_per_s=round(records / wall),
                  cpu_s=round(cpu, 1), peak_rss_mb=round(sampler.peak_rss / 2**20),
                  loadavg_after=round(os.getloadavg()[0], 2), **batches)
    if batches["in_batch_s"]:
        result["in_batch_s"] = round(batches["in_batch_s"], 2)
        result["in_batch_records_per_s"] = round(records / batches["in_batch_s"])
    if code != 0:
        why = "timed out" if code is None else f"exited {code}"
        result.update(ok=False, problem=f"{why} after {wall:.0f}s; log {log_path}: {_tail(text)}")
        return result
    output = read_all(bootstrap, out, timeout=300)
    check = verify(output, ctx["expected"], contender in EXACTLY_ONCE)
    result["check"] = check
    result["ok"] = check["ok"]
    if not check["ok"]:
        result["problem"] = "wrong output: " + "; ".join(check["problems"])
    return result


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------

def _terminate(_sig, _frame):
    raise KeyboardInterrupt("SIGTERM")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.wide", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=None, help="input orders [default: 200000; 20000 with --quick]")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--runs", type=int, default=None,
                        help="rounds; every contender runs once per round [default: 2; 1 with --quick]")
    parser.add_argument("--quick", action="store_true", help="smoke run: 20000 records, 1 round")
    parser.add_argument("--max-records-per-partition", type=int, default=20_000,
                        help="txstream's batch cap per partition; Spark's maxOffsetsPerTrigger is this x partitions "
                             "[default: 20000]")
    parser.add_argument("--contender", action="append", choices=list(CONTENDERS),
                        help="contender(s) to run (repeatable) [default: all]")
    parser.add_argument("--bootstrap-servers", default=None,
                        help="an existing Kafka cluster [default: start a local broker for the run]")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds before a run counts as failed")
    parser.add_argument("--results-dir", type=Path, default=RESULTS,
                        help="where the results files go [default: benchmarks/results; docs/performance.md is only rewritten "
                             "from the default]")
    parser.add_argument("--no-figures", action="store_true",
                        help="do not regenerate docs/performance.md's figures at the end")
    parser.add_argument("--kstreams-emit-interval-ms", type=int, default=1000,
                        help="Kafka Streams: how often each task emits its customers' totals (wall clock) "
                             "[default: 1000]")
    args = parser.parse_args(argv)
    if args.records is None:
        args.records = 20_000 if args.quick else 200_000
    if args.runs is None:
        args.runs = 1 if args.quick else 2
    contenders = args.contender or list(CONTENDERS)
    signal.signal(signal.SIGTERM, _terminate)
    sys.path.insert(0, str(REPO))
    from benchmarks.harness import hardware, versions

    logdir = Path(tempfile.mkdtemp(prefix="txstream-bench-wide-logs-"))
    log(f"logs: {logdir}")
    ctx: dict = {"args": args, "logdir": logdir, "topics": []}
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    meta: dict = {"mode": "wide", "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "args": vars(args),
                  "contenders": {c: CONTENDERS[c] for c in contenders}, "master": MASTER,
                  "processor": PROCESSOR, "hardware": hardware(), "logs": str(logdir)}
    results: list[dict] = []
    unavailable: dict[str, str] = {}
    run_broker: RunBroker | None = None
    try:
        if "spark-ss-foreachbatch" in contenders:
            from benchmarks.contenders import Unavailable
            from benchmarks.contenders.spark_ss import connector_jars

            try:
                ctx["spark_jars"], meta["spark_connectors"] = connector_jars(log)
            except Unavailable as exc:
                unavailable["spark-ss-foreachbatch"] = str(exc)
                contenders = [c for c in contenders if c != "spark-ss-foreachbatch"]
                log(f"spark-ss-foreachbatch unavailable: {exc}")
        if "kafka-streams" in contenders:
            from benchmarks.contenders import Unavailable
            from benchmarks.contenders.kafka_streams import build, java_version
            from txstream.local.cluster import KAFKA_VERSION

            try:
                build(KAFKA_VERSION, log)
                meta["kafka_streams"] = {"version": KAFKA_VERSION, "java": java_version(),
                                         "emit_interval_ms": args.kstreams_emit_interval_ms}
            except Unavailable as exc:
                unavailable["kafka-streams"] = str(exc)
                contenders = [c for c in contenders if c != "kafka-streams"]
                log(f"kafka-streams unavailable: {exc}")
        run_broker = RunBroker.start(args.bootstrap_servers, log, "txstream-bench-wide-kafka-")
        bootstrap, broker = run_broker.bootstrap, run_broker.description
        ctx["bootstrap"] = bootstrap
        meta["broker_warm_up_s"] = round(warm_up_broker(bootstrap, load_s=5 if args.quick else 30), 1)
        log(f"broker {bootstrap} warmed up in {meta['broker_warm_up_s']}s")
        source = f"bench-wide-in-{stamp}-{uuid.uuid4().hex[:6]}"
        create_topics(bootstrap, [source], args.partitions)
        ctx["source"] = source
        ctx["topics"].append(source)
        log(f"seeding {args.records:,} orders into {source} ({args.partitions} partitions) ...")
        seeded = seed_input(bootstrap, source, args.records, progress=log)
        expected = expected_totals(seeded)
        ctx["expected"] = expected
        totals_schema = load_schema(TOTALS_SCHEMA_PATH)
        ctx["orders_of"] = lambda value: decode(totals_schema, value)["orders"]
        meta["input"] = {"topic": source, "records": seeded.records, "bytes": seeded.input_bytes,
                         "partitions": args.partitions, "avg_value_bytes": seeded.avg_value_size,
                         "orders_amount_gt_0": expected["orders"], "items": expected["items"],
                         "customers": len(expected["customers"]),
                         "records_per_batch": args.max_records_per_partition * args.partitions}
        log(f"seeded: {expected['orders']:,} orders with amount > 0 from {len(expected['customers']):,} customers")
        for round_no in range(1, args.runs + 1):
            shift = (round_no - 1) % len(contenders)
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
                status = "ok" if result.get("ok") else f"FAILED: {result.get('problem')}"
                in_batch = result.get("in_batch_records_per_s")
                log(f"  {result['seconds']:.1f}s, {result['records_per_s']:,} records/s"
                    + (f", in-batch {in_batch:,} records/s" if in_batch else "")
                    + f", {result.get('batches')} batches, out {result.get('check', {}).get('output_records', '-')}"
                    + f", other work {result.get('foreign_cores', 0):.2f} cores: {status}")
        meta["versions"] = versions([], broker)
        meta["versions"]["spark_connectors"] = meta.get("spark_connectors")
    finally:
        if ctx.get("bootstrap") and args.bootstrap_servers:
            delete_topics(ctx["bootstrap"], ctx["topics"])
        if run_broker is not None:
            run_broker.stop(log)
    meta["hardware"]["loadavg_at_end"] = os.getloadavg()
    meta["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    meta["unavailable"] = unavailable
    summary = summarize(results, contenders)
    report = markdown(meta, results, summary, contenders, unavailable)
    results_dir = args.results_dir.resolve()
    results_dir.mkdir(parents=True, exist_ok=True)
    out = results_dir / (f"{stamp}-wide" + ("-quick" if args.quick else ""))
    Path(f"{out}.json").write_text(json.dumps({**meta, "summary": summary, "runs": results}, indent=2,
                                              default=str))
    Path(f"{out}.md").write_text(report)
    print(report)
    log(f"written: {out}.json, {out}.md")
    from benchmarks import figures

    figures.update_after_run(results_dir, args.no_figures, log)
    return 0 if results and all(r.get("ok") for r in results) and not unavailable else 1


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

def summarize(results: list[dict], contenders: list[str]) -> dict:
    """Medians per contender (ok runs), and ratios against the units mode: of the medians, and the
    median of the per-round ratios (each against the units run of the same round)."""
    out: dict = {}
    ok = [r for r in results if r.get("ok")]
    base_by_round = {r["round"]: r for r in ok if r["contender"] == BASELINE}
    base_rate = _median([r["records_per_s"] for r in base_by_round.values()])
    base_in = _median([r.get("in_batch_records_per_s") for r in base_by_round.values()])
    base_steady = _median([r.get("steady_records_per_s") for r in base_by_round.values()])
    for c in contenders:
        runs = [r for r in ok if r["contender"] == c]
        entry = {"ok_runs": len(runs), "failed_runs": sum(1 for r in results if r["contender"] == c and not r.get("ok"))}
        if runs:
            entry.update(
                records_per_s=_median([r["records_per_s"] for r in runs]),
                seconds=_median([r["seconds"] for r in runs]),
                in_batch_records_per_s=_median([r.get("in_batch_records_per_s") for r in runs]),
                in_batch_s=_median([r.get("in_batch_s") for r in runs]),
                batches=_median([r.get("batches") for r in runs]),
                output_records=_median([r["check"]["output_records"] for r in runs]),
                cpu_s=_median([r["cpu_s"] for r in runs]),
                peak_rss_mb=_median([r["peak_rss_mb"] for r in runs]),
                foreign_cores=_median([r.get("foreign_cores") for r in runs]),
                first_output_s=_median([r.get("first_output_s") for r in runs]),
                steady_records_per_s=_median([r.get("steady_records_per_s") for r in runs]),
            )
            if base_rate:
                entry["vs_units_records_per_s"] = round(entry["records_per_s"] / base_rate, 3)
                per_round = [r["records_per_s"] / base_by_round[r["round"]]["records_per_s"]
                             for r in runs if r["round"] in base_by_round]
                entry["vs_units_records_per_s_per_round"] = [round(x, 3) for x in per_round]
            if base_steady and entry["steady_records_per_s"]:
                entry["vs_units_steady"] = round(entry["steady_records_per_s"] / base_steady, 3)
            if base_in and entry["in_batch_records_per_s"]:
                entry["vs_units_in_batch"] = round(entry["in_batch_records_per_s"] / base_in, 3)
                per_round = [r["in_batch_records_per_s"] / base_by_round[r["round"]]["in_batch_records_per_s"]
                             for r in runs if r["round"] in base_by_round and r.get("in_batch_records_per_s")]
                entry["vs_units_in_batch_per_round"] = [round(x, 3) for x in per_round]
        out[c] = entry
    return out


def markdown(meta: dict, results: list[dict], summary: dict, contenders: list[str], unavailable: dict) -> str:
    args = meta["args"]
    inp = meta.get("input", {})
    hw = meta["hardware"]

    def fmt(value, spec=",.0f", none="-"):
        return none if value is None else format(value, spec)

    lines = [f"# Wide transform (per-batch groupBy/agg): {args['records']:,} orders, {args['partitions']} partitions, "
             f"{args['runs']} round(s)", "",
             f"`{PROCESSOR}` on `{MASTER}`, batches of {args['max_records_per_partition']:,} records per partition "
             f"({inp.get('records_per_batch', 0):,} per batch; Spark `maxOffsetsPerTrigger` the same). "
             f"Input: {inp.get('orders_amount_gt_0', 0):,} orders with amount > 0 from "
             f"{inp.get('customers', 0):,} customers. Machine: {hw.get('cpu_model')}, {hw.get('logical_cores')} cores "
             f"(shared), load {hw['loadavg_at_start'][0]:.2f} at start, {hw.get('loadavg_at_end', [0])[0]:.2f} at end. "
             f"Started {meta['started_at']}; git {meta.get('versions', {}).get('git', '?')}.", "",
             "records/s = input records / wall seconds from process start to exit (JVM and Spark session start-up "
             "included; Kafka Streams: to its output's completion); first output = when the first totals were "
             "readable (read_committed); steady = the input records the first totals did not cover / the seconds from "
             "the first totals to the output's completion (start-up left out, for every contender alike); in-batch = "
             "input records / the sum of the batches' own seconds.", "",
             "| contender | records/s (median) | runs | wall s | first output s | steady records/s | in-batch records/s | "
             "in-batch s | batches | output records | CPU s | peak RSS MB | other work (cores) | vs units: records/s | "
             "vs units: steady | vs units: in-batch |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in contenders:
        s = summary.get(c, {})
        runs = [r for r in results if r["contender"] == c]
        each = ", ".join(f"{r['records_per_s']:,}" + ("" if r.get("ok") else " (failed)") for r in runs)
        if not s.get("ok_runs"):
            lines.append(f"| {CONTENDERS[c]} | failed | {each} | | | | | | | | | | | | | |")
            continue
        ratio = "1 (baseline)" if c == BASELINE else (
            f"{s['vs_units_records_per_s']:.2f}x (per round: "
            f"{', '.join(f'{x:.2f}' for x in s['vs_units_records_per_s_per_round'])})"
            if "vs_units_records_per_s" in s else "-")
        ratio_in = "1 (baseline)" if c == BASELINE else (
            f"{s['vs_units_in_batch']:.2f}x (per round: {', '.join(f'{x:.2f}' for x in s['vs_units_in_batch_per_round'])})"
            if "vs_units_in_batch" in s else "-")
        steady = "1 (baseline)" if c == BASELINE else (f"{s['vs_units_steady']:.2f}x" if "vs_units_steady" in s else "-")
        lines.append(f"| {CONTENDERS[c]} | {fmt(s['records_per_s'])} | {each} | {fmt(s['seconds'], '.1f')} | "
                     f"{fmt(s['first_output_s'], '.1f')} | {fmt(s['steady_records_per_s'])} | "
                     f"{fmt(s['in_batch_records_per_s'])} | {fmt(s['in_batch_s'], '.1f')} | {fmt(s['batches'], 'g')} | "
                     f"{fmt(s['output_records'])} | {fmt(s['cpu_s'], '.0f')} | {fmt(s['peak_rss_mb'])} | "
                     f"{fmt(s['foreign_cores'], '.2f')} | {ratio} | {steady} | {ratio_in} |")
    for c, why in unavailable.items():
        lines.append(f"| {CONTENDERS[c]} | unavailable: {why} | | | | | | | | | | | | | | |")
    lines += ["", "Ratios: contender / units mode (> 1 means faster than the units mode), of the medians and per round "
              "(each against the units run of the same round).", "",
              "## Runs", "",
              "| round | contender | wall s | records/s | first output s | steady records/s | in-batch s | batch seconds | "
              "output records | sum(orders) | duplicates | load before/after | other work | check |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        check = r.get("check", {})
        status = "ok" if r.get("ok") else f"FAILED: {r.get('problem', '')}"
        batch_s = " ".join(f"{s:.2f}" for s in r.get("batch_s", []))
        lines.append(f"| {r['round']} | {r['contender']} | {r['seconds']:.1f} | {r['records_per_s']:,} | "
                     f"{fmt(r.get('first_output_s'), '.1f')} | {fmt(r.get('steady_records_per_s'))} | "
                     f"{fmt(r.get('in_batch_s'), '.2f')} | {batch_s} | {fmt(check.get('output_records'))} | "
                     f"{fmt(check.get('sum_orders'))} | {check.get('duplicates', '-')} | "
                     f"{r['loadavg_before']:.2f}/{r['loadavg_after']:.2f} | {fmt(r.get('foreign_cores'), '.2f')} | "
                     f"{status} |")
    lines += ["", "## Notes", "",
              "- txstream: `python -m txstream.cli run " + PROCESSOR + " --master local[2] --until-caught-up "
              "--max-records-per-partition N --wide-mode units|single-transaction` (exactly-once; txstream's "
              "`spark.sql.shuffle.partitions` 8). Batch seconds from its batch lines.",
              "- Spark SS: `benchmarks/contenders/spark_ss_wide.py`: readStream kafka -> from_avro -> where(amount > 0) "
              "-> foreachBatch(groupBy(customer_id).agg(count, sum(amount), sum(items)) -> to_avro -> "
              "batch_df.write.format(\"kafka\")), trigger(availableNow=True), maxOffsetsPerTrigger = batch size, "
              "shuffle partitions 8 (Spark disables AQE for streaming plans). At-least-once: no transactions. "
              "Batch seconds are each micro-batch's `durationMs.triggerExecution`.",
              "- Kafka Streams: `benchmarks/contenders/kstreams/src/main/java/txstream/bench/kstreams/CustomerTotals.java`, "
              "exactly_once_v2, 2 stream threads, commit.interval.ms at its exactly-once default (100 ms): decode -> "
              "where(amount > 0) -> key by customer -> `repartition()` (a Kafka topic: Kafka Streams' shuffle) -> "
              "a persistent, changelogged store of each customer's totals -> every "
              f"{args.get('kstreams_emit_interval_ms', 1000)} ms (wall clock) one CustomerTotals per customer, the store "
              "emptied. It runs until stopped: its wall time ends when the output's orders (read_committed) add up to "
              "the input's. No batch lines (no batches).",
              "- Check (every run): output non-empty; sum(orders) = input orders with amount > 0; sum(items) and "
              "sum(amount) match; every customer with such an order present; key = customer_id; no duplicate "
              "(customer, batch_time) for the exactly-once contenders.",
              "- CPU s and peak RSS: the contender's process tree (JVM and Python workers included), sampled every "
              "100 ms. Other work (cores): CPU used during the run by processes outside the benchmark (the machine "
              "is shared), over the run's wall time; the busiest are named in the JSON (`foreign_top`).",
              f"- Spark connectors: {meta.get('spark_connectors')}. Logs: {meta['logs']}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
