"""`python -m benchmarks`: seed orders, run every contender on them, measure, check, report.

See benchmarks/README.md for what each contender is and how the figures are computed.
"""
from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import traceback
import uuid
from datetime import datetime, timezone
from pathlib import Path

import psutil

from benchmarks import batchlog
from benchmarks.common import (
    BENCH_DIR,
    REPO,
    RunBroker,
    create_topics,
    delete_topics,
    digest,
    seed_input,
    start_registry,
    warm_up_broker,
)
from benchmarks.contenders import Contender, Job, Unavailable
from benchmarks.contenders.registry import all_contenders
from benchmarks.measure import ForeignLoad, OutputWatcher, TreeSampler, start_process, stop_process, verify_output

RESULTS = BENCH_DIR / "results"
T0 = time.monotonic()


def log(message: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {message}", flush=True)


# ---------------------------------------------------------------------------------------------
# One throughput run
# ---------------------------------------------------------------------------------------------

def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    text = [t for t in text if t.strip() and "WARN" not in t[:40]] or text
    return " | ".join(t.strip()[:200] for t in text[-lines:])


def run_once(contender: Contender, ctx: dict, run_no: int) -> dict:
    """Start the contender on a fresh output topic and group; measure until done; verify."""
    bootstrap, partitions, seeded = ctx["bootstrap"], ctx["partitions"], ctx["seeded"]
    tag = f"{contender.name}-{ctx['stamp']}{ctx.get('point', '')}-{run_no}"
    out_topic = f"bench-out-{tag}"
    workdir = tempfile.mkdtemp(prefix=f"bench-{contender.name}-")
    log_path = ctx["logdir"] / f"{tag}.log"
    job = Job(bootstrap=bootstrap, input_topic=seeded.topic, output_topic=out_topic,
              partitions=partitions, group=f"bench-{tag}-{uuid.uuid4().hex[:6]}", workdir=workdir,
              records=seeded.records, avg_value_size=seeded.avg_value_size, expected=seeded.expected_count,
              extra=dict(ctx.get("job_extra", {})))
    expected = contender.expected_output(job) if hasattr(contender, "expected_output") else seeded.expected_count
    copies = getattr(contender, "output_kind", "enriched") == "copy"
    topics = [out_topic] + contender.extra_topics(job)
    create_topics(bootstrap, topics, partitions)
    ctx["topics"] += topics
    argv, env = contender.command(job)
    watcher = OutputWatcher(bootstrap, out_topic, partitions, expected,
                            value_fn=digest if copies else getattr(contender, "value_fn", None)).start()
    sampler = TreeSampler()
    foreign = ForeignLoad()
    proc = None
    result: dict = {"run": run_no, "output_topic": out_topic, "log": str(log_path.relative_to(REPO))
                    if log_path.is_relative_to(REPO) else str(log_path), "loadavg_before": os.getloadavg()[0]}
    try:
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        broker0 = broker_cpu_s(ctx)
        started = time.monotonic()
        foreign.start()
        proc = start_process(argv, env, str(log_path), str(REPO))
        sampler.add_root(proc.pid)
        sampler.start()
        deadline = started + ctx["timeout"]
        exited_at = None
        gave_up = None
        last_report = started
        while True:
            now = time.monotonic()
            if watcher.done_at is not None:
                break
            if proc.poll() is not None:
                exited_at = now
                break
            if now > deadline:
                break
            if now - last_report >= 15:
                log(f"    ... {now - started:5.0f}s, {watcher.count:,}/{expected:,} output records")
                last_report = now
                fatal = contender.fatal_in_log(log_path.read_text(errors="replace"))
                if fatal:
                    gave_up = fatal
                    break
            time.sleep(0.05)
        sampler.stop()
        broker1 = broker_cpu_s(ctx)
        if broker0 is not None and broker1 is not None:
            result["broker_cpu_s"] = broker1 - broker0
        result.update(foreign.stop())
        sampled_cpu = sampler.cpu_seconds
        self_exit = proc.poll() is not None
        if self_exit:
            ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            rusage_cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
            cpu = max(sampled_cpu, rusage_cpu)
        else:
            cpu = sampled_cpu
        if watcher.done_at is not None and (exited_at is None or watcher.done_at <= exited_at):
            done = watcher.done_at
            how = "output complete"
        elif exited_at is not None:
            done = exited_at
            how = f"process exited ({proc.returncode})"
        elif gave_up:
            done = time.monotonic()
            how = "gave up"
        else:
            done = time.monotonic()
            how = "timeout"
        by_role = sampler.cpu_by_role
        if len(by_role) > 1:
            result["cpu_by_role_s"] = by_role
        result.update(wall_s=done - started, cpu_s=cpu, peak_rss_mb=sampler.peak_rss / 2**20, done_by=how,
                      first_output_s=(watcher.first_at - started) if watcher.first_at else None)
        result.update(steady_state(watcher, done, seeded.records, expected))
        # Let the watcher see anything still in flight (duplicates, stragglers) before verifying.
        settle = time.monotonic() + (15 if how != "output complete" else 2)
        last = -1
        while time.monotonic() < settle and watcher.count != last:
            last = watcher.count
            time.sleep(1.0)
    finally:
        sampler.stop()
        if "foreign_cpu_s" not in result:
            result.update(foreign.stop())
        stop_process(proc)
        watcher.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    result["exit_code"] = proc.returncode if proc else None
    result["loadavg_after"] = os.getloadavg()[0]
    batches = txstream_batches(contender, log_path)
    if batches:
        result["batches"] = batches
    if watcher.error:
        result.update(ok=False, problem=f"output watcher failed: {watcher.error}")
        return result
    if result["done_by"] == "gave up":
        result.update(ok=False, problem=f"{gave_up} (log {result['log']})")
        return result
    if result["done_by"] == "timeout":
        result.update(ok=False, problem=f"timed out after {ctx['timeout']:.0f}s with {watcher.count:,}/{expected:,} "
                      f"output records; log {result['log']}: {_tail(log_path)}")
        return result
    if copies:
        ok, summary, stats = verify_output(watcher.records, seeded.input_digests, contender.exactly_once,
                                           decoded=False)
    elif getattr(contender, "verify_values", True):
        ok, summary, stats = verify_output(watcher.records, seeded.expected, contender.exactly_once)
    else:
        ok = watcher.count == expected
        summary = "ok" if ok else f"{watcher.count:,} output records, expected {expected:,}"
        stats = {"output_records": watcher.count, "expected_records": expected, "checked": "count only"}
    result["verification"] = stats
    if not ok:
        exit_note = f" (exit code {proc.returncode})" if proc and proc.returncode not in (0, None, -15) else ""
        result.update(ok=False, problem=f"wrong output{exit_note}: {summary}; log {result['log']}: {_tail(log_path)}")
        return result
    result["ok"] = True
    mb = ctx["seeded"].input_bytes / 1e6
    result["records_per_s"] = seeded.records / result["wall_s"]
    result["mb_per_s"] = mb / result["wall_s"]
    result["cpu_s_per_m"] = result["cpu_s"] / (seeded.records / 1e6)
    if "broker_cpu_s" in result:
        result["broker_cpu_s_per_m"] = result["broker_cpu_s"] / (seeded.records / 1e6)
    return result


def broker_cpu_s(ctx: dict) -> float | None:
    """User + system CPU of the local broker's JVM so far (None with a cluster of someone else's):
    the broker's share of a contender's work, e.g. what exactly-once's transactions cost it."""
    pids = ctx.get("broker_pids") or []
    if not pids:
        return None
    try:
        times = [psutil.Process(pid).cpu_times() for pid in pids]
    except psutil.Error:
        return None
    return sum(t.user + t.system for t in times)


STEADY_MIN_WINDOW_S = 2.0   # a shorter window after the first output is one burst, not a rate
STEADY_MIN_SHARE = 0.05     # ... and so is less than this share of the output arriving after it


def steady_state(watcher: OutputWatcher, done: float, records: int, expected: int) -> dict:
    """Records/s once output flows: input records processed after the first output / (done - first output).

    "Processed after the first output" is counted on the output side (records seen after the
    first chunk the watcher read), scaled by input/expected (the filter drops about 10%).
    None when the output came in one burst (e.g. all input in a single txstream batch).
    """
    if watcher.first_at is None or not expected:
        return {"steady_records_per_s": None, "steady_note": "no output"}
    window = done - watcher.first_at
    after = watcher.count_at(done) - watcher.first_count
    if window < STEADY_MIN_WINDOW_S or after < STEADY_MIN_SHARE * expected:
        return {"steady_records_per_s": None, "steady_window_s": window,
                "steady_note": f"output came in one burst ({after:,} records {window:.2f}s after the first)"}
    return {"steady_records_per_s": after * (records / expected) / window, "steady_window_s": window}


SUMMARY_KEYS = ("wall_s", "records_per_s", "mb_per_s", "cpu_s", "cpu_s_per_m", "peak_rss_mb", "first_output_s",
                "steady_records_per_s", "foreign_cores", "broker_cpu_s_per_m")


def summarize(runs: list[dict]) -> dict:
    out = {}
    for key in SUMMARY_KEYS:
        vals = [r[key] for r in runs if r.get(key) is not None]
        if vals:
            out[key] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
    return out


def merge_batches(runs: list[dict]) -> dict | None:
    """The per-run batch figures of a contender, median over its runs (leaf by leaf)."""
    found = [r["batches"] for r in runs if r.get("batches")]
    if not found:
        return None

    def merge(items: list):
        first = items[0]
        if isinstance(first, dict):
            return {k: merge([i[k] for i in items if isinstance(i, dict) and k in i]) for k in first}
        nums = [i for i in items if isinstance(i, (int, float)) and not isinstance(i, bool)]
        if nums and len(nums) == len(items):
            return statistics.median(nums)
        return first

    merged = merge(found)
    merged["runs"] = len(found)
    return merged


OTHER_WORK_CORES = 0.25  # other processes' average CPU during a run above which the run is flagged


def run_contenders(contenders: list[Contender], ctx: dict, runs: int, warmup_run: bool = False) -> dict[str, dict]:
    """Prepare every contender, then run them in rounds (run 1 of each, then run 2 of each...):
    the machine's speed drifts over minutes, and rounds spread the drift over all contenders
    instead of favouring whoever ran in the fast minutes. Their entries in the results, by name.

    `warmup_run`: the first contender runs once more before the rounds, not counted (its entry's
    `warmup_run`): whoever runs first in an invocation pays for what is still cold after the
    broker's warm-up."""
    entries: dict[str, dict] = {}
    ready: list[Contender] = []
    for contender in contenders:
        entry: dict = {"label": contender.label, "runs": []}
        knobs = contender.settings()
        if knobs:
            entry["settings"] = knobs
        entries[contender.name] = entry
        log(f"== {contender.label}: preparing ==")
        try:
            contender.prepare(lambda m: log(m))
        except Unavailable as exc:
            entry["status"] = f"unavailable: {exc}"
            log(f"   {entry['status']}")
            continue
        except Exception as exc:
            entry["status"] = f"unavailable: {type(exc).__name__}: {exc}"
            log(f"   {entry['status']}")
            continue
        ready.append(contender)
    if warmup_run and ready:
        first = ready[0]
        log(f"== {first.label}: warm-up run, not counted ...")
        try:
            res = run_once(first, ctx, 0)
        except Exception as exc:  # the counted runs decide whether the contender works
            res = {"ok": False, "problem": f"{type(exc).__name__}: {exc}"}
        entries[first.name]["warmup_run"] = {k: res[k] for k in ("ok", "problem", "wall_s", "records_per_s") if k in res}
        log(f"   warm-up: {res['records_per_s']:,.0f} rec/s" if res.get("ok") else f"   warm-up failed: {res['problem']}")
    for run_no in range(1, runs + 1):
        for contender in list(ready):
            entry = entries[contender.name]
            log(f"== {contender.label}: run {run_no}/{runs} ...")
            try:
                res = run_once(contender, ctx, run_no)
            except Exception as exc:  # one contender's failure is its row
                res = {"run": run_no, "ok": False, "problem": f"{type(exc).__name__}: {exc}",
                       "traceback": traceback.format_exc()}
            entry["runs"].append(res)
            if not res.get("ok"):
                entry["status"] = f"unavailable: {res['problem']}"
                log(f"   {entry['status']}")
                ready.remove(contender)
                continue
            steady = res.get("steady_records_per_s")
            b = res.get("batches")
            log(f"   {res['wall_s']:.1f}s, {res['records_per_s']:,.0f} rec/s"
                + (f" (steady {steady:,.0f})" if steady else "")
                + f", first output {res['first_output_s'] or 0:.1f}s, {res['cpu_s']:.1f} CPU s, "
                f"peak RSS {res['peak_rss_mb']:.0f} MiB"
                + (f", {b['batches']} batches of median {b['batch_s_median']:.1f}s" if b else "")
                + "; output verified"
                + (f"; OTHER WORK used {res['foreign_cores']:.1f} cores: {'; '.join(res['foreign_top'])[:200]}"
                   if res.get("foreign_cores", 0) >= OTHER_WORK_CORES else ""))
    for contender in ready:
        entry = entries[contender.name]
        entry["status"] = "ok"
        entry["summary"] = summarize(entry["runs"])
        batches = merge_batches(entry["runs"])
        if batches:
            entry["batches"] = batches
    return entries


# ---------------------------------------------------------------------------------------------
# Latency mode
# ---------------------------------------------------------------------------------------------

def txstream_batches(contender: Contender, log_path: Path) -> dict | None:
    """A txstream run's batches from its log (how many, how long, the stages, init_transactions
    paid: batchlog.summarize); None for other contenders or an unreadable log."""
    if not getattr(contender, "txstream", False):
        return None
    try:
        return batchlog.summarize(log_path.read_text(errors="replace"))
    except OSError:
        return None


def run_latency(contender: Contender, ctx: dict) -> dict:
    """Steady input at --rate; p50/p99 of (time seen in the output) - (time produced)."""
    import random

    from confluent_kafka import Producer

    from benchmarks.common import ORDER_SCHEMA, encode, make_order, producer_config

    bootstrap, partitions = ctx["bootstrap"], ctx["partitions"]
    tag = f"{contender.name}-{ctx['stamp']}-lat"
    in_topic, out_topic = f"bench-lat-in-{tag}", f"bench-lat-out-{tag}"
    workdir = tempfile.mkdtemp(prefix=f"bench-lat-{contender.name}-")
    log_path = ctx["logdir"] / f"{tag}.log"
    job = Job(bootstrap=bootstrap, input_topic=in_topic, output_topic=out_topic, partitions=partitions,
              group=f"bench-{tag}-{uuid.uuid4().hex[:6]}", workdir=workdir, mode="latency",
              extra=dict(ctx.get("job_extra", {})))
    topics = [in_topic, out_topic] + contender.extra_topics(job)
    create_topics(bootstrap, topics, partitions)
    ctx["topics"] += topics
    sent: dict[bytes, float] = {}
    window = {"start": None, "end": None}
    latencies: list[float] = []
    seen_in_window: set[bytes] = set()

    def on_record(msg, _mono):
        now = time.time()
        key = msg.key()
        t = sent.get(key)
        if t is None:
            return
        if window["start"] is not None and window["start"] <= t and (window["end"] is None or t < window["end"]):
            if key not in seen_in_window:
                seen_in_window.add(key)
                latencies.append((now - t) * 1000.0)

    stop = threading.Event()
    rate = ctx["rate"]
    produced = {"n": 0}  # records handed to the producer so far (void orders too)

    # --input-transactions-ms: the input is written as an upstream exactly-once processor writes
    # it, in transactions, each leaving a commit marker in every partition it touched.
    transaction_s = (ctx.get("input_transactions_ms") or 0) / 1000

    def produce_loop():
        extra = {"transactional.id": f"bench-upstream-{tag}-{uuid.uuid4().hex[:6]}"} if transaction_s else {}
        producer = Producer(producer_config(bootstrap, **{"linger.ms": 0}, **extra))
        if transaction_s:
            producer.init_transactions(30)
            producer.begin_transaction()
        committed_at = time.monotonic()
        rng = random.Random(11)
        i = 0
        begin = time.monotonic()
        while not stop.is_set():
            if transaction_s and time.monotonic() - committed_at >= transaction_s:
                producer.commit_transaction(30)
                producer.begin_transaction()
                committed_at = time.monotonic()
            due = int((time.monotonic() - begin) * rate)
            while i < due:
                now_ms = int(time.time() * 1000)
                order = make_order(rng, i, now_ms)
                key = order["id"].encode()
                if order["amount"] > 0:  # void orders produce no output: not waited for
                    sent[key] = time.time()
                producer.produce(in_topic, key=key, value=encode(ORDER_SCHEMA, order), timestamp=now_ms)
                i += 1
                produced["n"] = i
            producer.poll(0)
            time.sleep(0.005)
        if transaction_s:
            producer.commit_transaction(30)
        producer.flush(30)

    watcher = OutputWatcher(bootstrap, out_topic, partitions, 0, on_record=on_record).start()
    argv, env = contender.command(job)
    proc = None
    producer_thread = threading.Thread(target=produce_loop, daemon=True)
    result: dict = {"rate": rate, "log": str(log_path)}
    try:
        proc = start_process(argv, env, str(log_path), str(REPO))
        producer_thread.start()
        started = time.monotonic()
        while watcher.first_at is None:
            if proc.poll() is not None:
                raise RuntimeError(f"exited with code {proc.returncode} before any output: {_tail(log_path)}")
            if time.monotonic() - started > ctx["timeout"]:
                raise RuntimeError(f"no output within {ctx['timeout']:.0f}s: {_tail(log_path)}")
            time.sleep(0.1)
        log(f"    first output after {time.monotonic() - started:.1f}s; warming up {ctx['warmup']}s")
        time.sleep(ctx["warmup"])
        window["start"] = time.time()
        n0 = produced["n"]
        time.sleep(ctx["latency_seconds"])
        window["end"] = time.time()
        # What the generator managed: on a busy machine it can fall short of --rate (it shares this
        # process with the output consumer); then the contenders saw less than the rate asked for.
        result["input_rate_achieved"] = (produced["n"] - n0) / (window["end"] - window["start"])
        expected_keys = [k for k, t in list(sent.items()) if window["start"] <= t < window["end"]]
        time.sleep(5.0)
        stop.set()
        producer_thread.join(30)
        if proc.poll() is not None:
            raise RuntimeError(f"exited with code {proc.returncode} during the measurement: {_tail(log_path)}")
    except Exception as exc:  # reported as a row
        return {"ok": False, "problem": str(exc)}
    finally:
        stop.set()
        stop_process(proc)
        watcher.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    if not latencies:
        return {"ok": False, "problem": "no output for records produced in the measurement window"}
    # The run's batches (warm-up included): where a latency difference between two commits comes from.
    batches = txstream_batches(contender, log_path)
    if batches:
        result["batches"] = batches
    latencies.sort()
    result.update(ok=True, produced_in_window=len(expected_keys), measured=len(latencies),
                  p50_ms=percentile(latencies, 50), p90_ms=percentile(latencies, 90),
                  p99_ms=percentile(latencies, 99), p999_ms=percentile(latencies, 99.9),
                  max_ms=latencies[-1], mean_ms=statistics.fmean(latencies),
                  percentiles_ms=percentile_vector(latencies))
    return result


# The latency distribution kept in the JSON (enough for a CDF or a box plot): every whole
# percentile, the tail in finer steps, and the extremes.
PERCENTILES = (0, *range(1, 100), 99.5, 99.9, 100)


def percentile(ordered: list[float], q: float) -> float:
    """The q-th percentile (0..100) of sorted values, linear between closest ranks: the same as
    statistics.quantiles(method="inclusive") at its cut points, and defined for one value."""
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def percentile_vector(ordered: list[float]) -> dict[str, float]:
    """{"0": min, "1": p1, ..., "99": p99, "99.5": ..., "99.9": ..., "100": max}, ms rounded to 0.01."""
    return {f"{q:g}": round(percentile(ordered, q), 2) for q in PERCENTILES}


def rate_tag(rate: float) -> str:
    """The rate in a results file name: 2000 -> "r2000", 2500.5 -> "r2500.5"."""
    return f"r{int(rate)}" if float(rate).is_integer() else f"r{rate:g}"


# ---------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------

def hardware() -> dict:
    import psutil

    model = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        model = platform.processor()
    return {"cpu_model": model, "logical_cores": os.cpu_count(),
            "physical_cores": psutil.cpu_count(logical=False),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "os": platform.platform(), "loadavg_at_start": os.getloadavg()}


def versions(contenders: list[Contender], broker: str) -> dict:
    import subprocess

    import confluent_kafka
    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()
    v = {"python": platform.python_version(), "pyspark": pyspark.__version__,
         "confluent_kafka": confluent_kafka.version(), "librdkafka": confluent_kafka.libversion()[0],
         "kafka_broker": broker, "java": java[0] if java else "unknown"}
    for c in contenders:
        try:
            v.update(c.versions())
        except Exception:
            pass
    v["git"] = git_state()
    return v


def git_state() -> str:
    """The commit measured, and whether txstream/ or processors/ had uncommitted changes (the tree is shared)."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "txstream", "processors"], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.split("\n")
        dirty = [line[3:] for line in dirty if line.strip()]
    except Exception:
        return "unknown"
    return head + (f" + uncommitted changes in {', '.join(dirty)}" if dirty else "")


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


SWEEPS = ("batch", "partitions", "record-size")


def parse_args(argv=None) -> argparse.Namespace:
    names = [c.name for c in all_contenders()]
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    ap.add_argument("--records", type=int, default=None,
                    help="input records (default 200000; 100000 per point with --sweep, ten batches with --sweep "
                         "partitions; 20000 with --quick)")
    ap.add_argument("--partitions", type=int, default=4, help="partitions of every topic (default 4)")
    ap.add_argument("--runs", type=int, default=None, help="runs per contender (default 3; 1 with --sweep or --quick)")
    ap.add_argument("--contenders", default="all",
                    help=f"comma-separated, from: {', '.join(names)} (default all; with --sweep: the sweep's own)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 20000 records, 1 run")
    ap.add_argument("--bootstrap-servers", default=os.environ.get("TXSTREAM_BOOTSTRAP_SERVERS"),
                    help="an existing Kafka cluster (default: start a local one)")
    ap.add_argument("--latency", action="store_true",
                    help="measure end-to-end latency under a steady rate instead of throughput")
    ap.add_argument("--rate", type=float, default=2000, help="latency mode: input records/s (default 2000)")
    ap.add_argument("--latency-seconds", type=float, default=None, help="latency mode: measured window (30; 10 quick)")
    ap.add_argument("--warmup", type=float, default=None, help="latency mode: seconds after first output (10; 3 quick)")
    ap.add_argument("--input-transactions-ms", type=float, default=None,
                    help="latency mode: write the input in transactions committed every this many ms, as an "
                         "upstream exactly-once processor does (latency still counts from each record's produce)")
    ap.add_argument("--no-warmup-run", action="store_true",
                    help="throughput table: no uncounted run of the first contender before the rounds")
    ap.add_argument("--windowed", action="store_true",
                    help="the windowed count per currency per minute instead (benchmarks/windowed.py; "
                         "`python -m benchmarks --windowed --help` lists its options)")
    ap.add_argument("--stateful", choices=("totals", "dedup"), default=None,
                    help="running totals over --keys customers, or dedup over --keys ids, instead "
                         "(benchmarks/stateful.py; `python -m benchmarks --stateful totals --help` lists its options)")
    ap.add_argument("--tables", action="store_true",
                    help="orders enriched from a --keys customer table kept in a compacted topic, instead "
                         "(benchmarks/tables.py; `python -m benchmarks --tables --help` lists its options)")
    ap.add_argument("--sweep", choices=SWEEPS, default=None,
                    help="side-by-side runs over one parameter: batch (records per batch / transaction), "
                         "partitions, record-size; own results files")
    ap.add_argument("--batch-sizes", default="1000,5000,20000,100000",
                    help="--sweep batch: txstream --max-records-per-partition values (default 1000,5000,20000,100000)")
    ap.add_argument("--sweep-batches", type=int, default=None,
                    help="--sweep batch: each point's input is at least this many batches of its size "
                         "(capped by --max-input-mb); --sweep record-size: txstream's batches hold this "
                         "fraction of each point's records (default 5; 2 with --quick)")
    ap.add_argument("--partition-counts", default="4,16,64,256", help="--sweep partitions: values (default 4,16,64,256; 1024 works, slowly)")
    ap.add_argument("--batch-records", type=int, default=None,
                    help="--sweep partitions: records per txstream batch at every point (--max-records-per-partition "
                         "this / partitions, rounded up), so that each point's batches hold the same records "
                         "(default 25000; 2000 with --quick; the default --records is ten batches)")
    ap.add_argument("--value-sizes", default="100,1000,10000",
                    help="--sweep record-size: order value sizes in bytes, padded note (default 100,1000,10000)")
    ap.add_argument("--max-input-mb", type=float, default=300,
                    help="--sweep record-size and batch: fewer records at a point whose input would exceed this "
                         "(default 300)")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds before a run counts as failed (default 900, 300 with --quick)")
    ap.add_argument("--output-prefix", default=None, help="results file name prefix (default: timestamp)")
    ap.add_argument("--results-dir", type=Path, default=RESULTS,
                    help="where the results files go (default benchmarks/results; docs/performance.md is only rewritten "
                         "from the default)")
    ap.add_argument("--no-figures", action="store_true",
                    help="do not regenerate docs/performance.md's figures at the end")
    args = ap.parse_args(argv)
    if args.batch_records is None:
        args.batch_records = 2_000 if args.quick else 25_000
    if args.sweep_batches is None:
        args.sweep_batches = 2 if args.quick else 5
    if args.records is None:
        args.records = (20_000 if args.quick else 10 * args.batch_records if args.sweep == "partitions"
                        else 100_000 if args.sweep else 200_000)
    if args.runs is None:
        args.runs = 1 if (args.quick or args.sweep) else 3
    if args.latency_seconds is None:
        args.latency_seconds = 10 if args.quick else 30
    if args.warmup is None:
        args.warmup = 3 if args.quick else 10
    if args.timeout is None:
        args.timeout = 300 if args.quick else 900
    if args.sweep and args.latency:
        ap.error("--sweep and --latency do not go together")
    if args.input_transactions_ms is not None and (not args.latency or args.input_transactions_ms <= 0):
        ap.error("--input-transactions-ms takes a positive number of ms, with --latency")
    wanted = (names if args.contenders == "all" else
              [n.strip() for n in args.contenders.split(",") if n.strip()])
    unknown = [n for n in wanted if n not in names]
    if unknown:
        ap.error(f"unknown contender(s) {', '.join(unknown)}; choose from {', '.join(names)}")
    args.contender_names = wanted
    args.sweep_contenders = None if args.contenders == "all" else wanted
    for opt in ("batch_sizes", "partition_counts", "value_sizes"):
        try:
            setattr(args, opt, [int(v) for v in getattr(args, opt).split(",") if v.strip()])
        except ValueError:
            ap.error(f"--{opt.replace('_', '-')} takes comma-separated integers")
    return args


def any_ok(results: dict) -> bool:
    """Whether at least one contender (at one point of a sweep) produced a verified result: an
    invocation where every one of them is unavailable exits 1, so `make bench` stops there."""
    groups = [p.get("contenders", {}) for p in results.get("points", [])] or [results.get("contenders", {})]
    return any(e.get("status") == "ok" for g in groups for e in g.values())


def _terminate(_sig, _frame):
    raise KeyboardInterrupt("SIGTERM")


def run_sweep(args, ctx: dict, results: dict) -> list[Contender]:
    """Every point of `args.sweep` (benchmarks/sweep.py says what each sweep varies); fills
    results['sweep'], ['parameter'], ['points']. Returns the contenders used."""
    from benchmarks import sweep

    kind = args.sweep
    names = args.sweep_contenders or sweep.DEFAULTS[kind]
    results.update(sweep=kind, parameter=sweep.PARAMETER[kind], points=[])
    used: list[Contender] = []
    shared_inputs: dict[int, tuple] = {}   # records -> (seeded, partitions, input) of points that share
    for point in sweep.points(args):
        log(f"=== {kind} sweep: {sweep.PARAMETER[kind]} = {point['label']} ===")
        ctx["point"] = f"-{kind}-{point['value']}"
        if point.get("shared_input") and point["records"] in shared_inputs:
            ctx["seeded"], ctx["partitions"], inp = shared_inputs[point["records"]]
        else:
            topic = f"bench-in-{ctx['stamp']}-{kind}-{point['value']}"
            inp = seed(ctx, topic, point["records"], point["partitions"], point["value_size"])
            if point.get("shared_input"):
                shared_inputs[point["records"]] = (ctx["seeded"], ctx["partitions"], inp)
        entry = {"value": point["value"], "label": point["label"], "input": inp, "contenders": {}}
        results["points"].append(entry)
        batch_records = point.get("batch_records", args.batch_records)
        contenders = [sweep.variant(name, kind, point["value"], point["partitions"], batch_records) for name in names]
        used.extend(contenders)
        entry["contenders"] = run_contenders(contenders, ctx, args.runs)
    ctx.pop("point", None)
    return used


def seed(ctx: dict, topic: str, records: int, partitions: int, value_size: int | None = None) -> dict:
    """Create and fill an input topic; ctx['seeded'] is what the runs read and check against."""
    bootstrap = ctx["bootstrap"]
    create_topics(bootstrap, [topic], partitions)
    ctx["topics"].append(topic)
    size = f", values padded to {value_size} B" if value_size else ""
    log(f"seeding {records:,} orders into {topic} ({partitions} partitions{size}) ...")
    t = time.monotonic()
    seeded = seed_input(bootstrap, topic, records, progress=log, value_size=value_size)
    ctx["seeded"] = seeded
    ctx["partitions"] = partitions
    log(f"seeded in {time.monotonic() - t:.1f}s: {seeded.input_bytes / 1e6:.1f} MB, "
        f"avg value {seeded.avg_value_size} B, {seeded.expected_count:,} orders with amount > 0")
    return {"topic": topic, "records": seeded.records, "bytes": seeded.input_bytes, "partitions": partitions,
            "avg_value_bytes": seeded.avg_value_size, "avg_record_bytes": seeded.avg_record_size,
            "expected_output": seeded.expected_count, "value_size_target": value_size}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--windowed" in argv:   # its own runs, options and files (benchmarks/windowed.py)
        from benchmarks import windowed

        return windowed.main([a for a in argv if a != "--windowed"])
    if "--tables" in argv:     # the same harness, a stream joined to a table (benchmarks/tables.py)
        from benchmarks import tables

        return tables.main([a for a in argv if a != "--tables"])
    if "--stateful" in argv:   # the same harness, other queries (benchmarks/stateful.py)
        from benchmarks import stateful

        at = argv.index("--stateful")
        return stateful.main(argv[at + 1:at + 2] + argv[:at] + argv[at + 2:])
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    from benchmarks import report

    # In the order --contenders names them (side-by-side runs alternate which goes first).
    contenders = sorted((c for c in all_contenders() if c.name in args.contender_names),
                        key=lambda c: args.contender_names.index(c.name))
    if args.latency:
        contenders = [c for c in contenders if c.long_running]
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    # Latency files carry their rate (<stamp>-latency-r20000[-quick]): runs at different rates are
    # different kinds for benchmarks/figures.py, which reads the rate from the JSON's settings.
    kind = ((f"-latency-{rate_tag(args.rate)}" if args.latency else "")
            + (f"-txn{args.input_transactions_ms:g}" if args.input_transactions_ms else "")
            + (f"-sweep-{args.sweep}" if args.sweep else ""))
    prefix = args.output_prefix or (stamp + kind + ("-quick" if args.quick else ""))
    results_dir = args.results_dir.resolve()
    results_dir.mkdir(parents=True, exist_ok=True)
    logdir = Path(tempfile.mkdtemp(prefix="txstream-bench-logs-"))
    run_broker: RunBroker | None = None
    registry = None   # a local schema registry, for the registry-framed contender
    ctx: dict = {"stamp": stamp, "partitions": args.partitions, "timeout": args.timeout, "logdir": logdir,
                 "topics": [], "rate": args.rate, "latency_seconds": args.latency_seconds, "warmup": args.warmup,
                 "input_transactions_ms": args.input_transactions_ms}
    results: dict = {"started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                     "mode": "sweep" if args.sweep else ("latency" if args.latency else "throughput"),
                     "settings": {k: v for k, v in vars(args).items()
                                  if k not in ("contender_names", "sweep_contenders")}
                     | {"contenders": args.contender_names},
                     "hardware": hardware(), "logs": str(logdir), "git_at_start": git_state()}
    try:
        run_broker = RunBroker.start(args.bootstrap_servers, log, "txstream-bench-kafka-", timeout=120,
                                     secured=any(getattr(c, "secured", False) for c in contenders))
        bootstrap, broker = run_broker.bootstrap, run_broker.description
        ctx["bootstrap"] = bootstrap
        ctx["job_extra"] = {"secured": run_broker.secured} if run_broker.secured else {}
        if any(getattr(c, "registry", False) for c in contenders):
            registry = start_registry(log)
            ctx["job_extra"]["registry"] = registry.url
        ctx["broker_pids"] = run_broker.cluster.alive_pids() if run_broker.cluster is not None else []
        log(f"broker: {bootstrap}; logs of each run under {logdir}")
        # Internal topics first, so that no contender pays for their creation (see warm_up_broker).
        results["broker_warm_up_s"] = warm_up_broker(bootstrap, load_s=5 if args.quick else 30)
        log(f"broker warmed up in {results['broker_warm_up_s']:.1f}s (transaction state and group offsets loaded, "
            "then transactions under load)")

        if args.sweep:
            used = run_sweep(args, ctx, results)
            results["versions"] = versions(used, broker)
        else:
            results["contenders"] = {}
            if not args.latency:
                results["input"] = seed(ctx, f"bench-in-{stamp}", args.records, args.partitions)
            for contender in contenders:
                if args.latency:
                    entry = {"label": contender.label, "runs": []}
                    results["contenders"][contender.name] = entry
                    log(f"== {contender.label} ==")
                    try:
                        contender.prepare(lambda m: log(m))
                    except Exception as exc:
                        reason = str(exc) if isinstance(exc, Unavailable) else f"{type(exc).__name__}: {exc}"
                        entry["status"] = f"unavailable: {reason}"
                        log(f"   {entry['status']}")
                        continue
                    res = run_latency(contender, ctx)
                    entry["latency"] = res
                    if res.get("batches"):
                        entry["batches"] = res["batches"]
                    if res.get("ok"):
                        entry["status"] = "ok"
                        achieved = res.get("input_rate_achieved") or 0
                        log(f"   p50 {res['p50_ms']:.0f} ms, p99 {res['p99_ms']:.0f} ms "
                            f"({res['measured']:,} records; input {achieved:,.0f} records/s"
                            + (f", SHORT of the {args.rate:,.0f} asked for" if achieved < 0.95 * args.rate else "")
                            + ")")
                    else:
                        entry["status"] = f"unavailable: {res['problem']}"
                        log(f"   {entry['status']}")
                    continue
            if not args.latency:
                results["contenders"] = run_contenders(contenders, ctx, args.runs, warmup_run=not args.no_warmup_run)
            results["versions"] = versions(contenders, broker)
            results["ratios"] = report.ratios(results)
        results["hardware"]["loadavg_at_end"] = os.getloadavg()
        results["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        paths = report.write_all(results, results_dir, prefix)
        print()
        print(report.markdown(results))
        log("wrote " + ", ".join(str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p) for p in paths))
        from benchmarks import figures

        figures.update_after_run(results_dir, args.no_figures, log)
        if not any_ok(results):
            log("FAILED: no contender produced a result (see the statuses above)")
            return 1
        return 0
    finally:
        if ctx.get("bootstrap") and args.bootstrap_servers:
            delete_topics(ctx["bootstrap"], ctx["topics"])
        if run_broker is not None:
            run_broker.stop(log)
        if registry is not None:
            registry.stop()
