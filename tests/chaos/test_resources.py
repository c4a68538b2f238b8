"""Resource hygiene (issue 5): a long run leaves its process tree flat.

`txstream run` processes a steady input, batch after batch, while the test samples its whole
process tree (driver, Spark's JVM, Spark's Python daemon and workers) from /proc: how many
processes, how many open file descriptors (every Kafka client holds sockets and pipes, so a
leaked producer or consumer shows here), how many threads (librdkafka starts one per broker per
client), and resident memory. After a warm-up, the first and the last samples must agree:
no more processes, threads or descriptors than at the warm-up (a small slack for a client that
is mid-replacement at a sampling instant). The one exception is the Python workers' Kafka
clients, a per-worker cache that fills as Spark moves roles between workers: their count must stay
within the cache's bound, and the workers' other threads and descriptors flat. Memory is
reported, not asserted against a bound: the JVM heap and the Python allocators settle at their
own pace.

CI runs a few minutes; `TXSTREAM_SOAK=1` runs an hour and prints the memory slope per process
kind (the figures quoted in docs/testing.md come from such a run).
"""
from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.chaos import harness as h
from tests.support.running import App, Run, session_pids
from tests.support.waiting import wait_until

PARTITIONS = 4
SLOTS = 2
# Descriptors a librdkafka client holds against this one-broker cluster: a socket to the
# bootstrap address and one to the broker, and a wake-up pipe for its main thread and each of
# its three broker threads (measured: 3 clients more, 24 descriptors more).
FDS_PER_CLIENT = 8


@dataclass
class Sample:
    at: float
    batches: int
    processes: dict[str, int]    # kind -> count
    fds: dict[str, int]
    threads: dict[str, int]
    rss_mb: dict[str, float]
    thread_names: dict[str, Counter]   # kind -> thread name -> count (which kind of thread grew)


def _kind(cmdline: str) -> str:
    if "txstream.cli" in cmdline:
        return "driver"
    if "java" in cmdline.split(" ")[0]:
        return "jvm"
    if "pyspark.sql.worker." in cmdline:
        return "planning"  # short-lived: Spark asks the Python data source for its schema and partitions
    if "pyspark.daemon" in cmdline or "txstream.spark.worker_daemon" in cmdline:
        return "python-workers"  # the daemon and the workers it forks share its command line
    return "other"


def sample(run: Run, batches: int) -> Sample:
    processes: dict[str, int] = {}
    fds: dict[str, int] = {}
    threads: dict[str, int] = {}
    rss: dict[str, float] = {}
    names: dict[str, Counter] = {}
    for pid in session_pids(run.pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            status = Path(f"/proc/{pid}/status").read_text()
            open_fds = len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            continue  # exited between listing and reading
        kind = _kind(cmdline)
        if kind == "other":
            continue  # the /bin/sh that exec'ed the CLI is gone; nothing else belongs here
        processes[kind] = processes.get(kind, 0) + 1
        fds[kind] = fds.get(kind, 0) + open_fds
        own = _thread_names(pid)
        threads[kind] = threads.get(kind, 0) + sum(own.values())
        names.setdefault(kind, Counter()).update(own)
        rss[kind] = rss.get(kind, 0.0) + int(re.search(r"^VmRSS:\s+(\d+)", status, re.M).group(1)) / 1024
    return Sample(time.monotonic(), batches, processes, fds, threads, rss, names)


def _thread_names(pid: int) -> Counter:
    """Threads of `pid` by name (librdkafka names its threads `rdk:main`, `rdk:broker<id>`...),
    without Spark's bounded cached pools: the BlockManager's `block-manager-ask-thread-pool` and
    `-storage-async-thread-pool` grow to 100 threads each as the ContextCleaner removes every
    batch's broadcasts, then stay there (Spark's own cap)."""
    names: Counter = Counter()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        except OSError:
            continue
        if not name.startswith("block-manager-"):
            names[name] += 1
    return names


def _clients(s: Sample, kind: str) -> int:
    """librdkafka clients (producers and consumers): each runs one `rdk:main` thread."""
    return s.thread_names.get(kind, Counter())["rdk:main"]


def _librdkafka_threads(s: Sample, kind: str) -> int:
    return sum(n for name, n in s.thread_names.get(kind, Counter()).items() if name.startswith("rdk:"))


def _counts(s: Sample) -> dict:
    return {k: v for k, v in s.__dict__.items() if k != "thread_names"}


def batches_done(app: App) -> int:
    return len(app.events().batches)


@pytest.mark.timeout(5400 if h.SOAK else 1200)
def test_long_run_leaves_the_process_tree_flat(bootstrap_servers, make_topic):
    duration = h.scale(150, 3600)        # seconds measured after the warm-up
    warmup_batches = 20
    rate = h.scale(400, 200)             # records/s, well below saturation
    trigger = h.scale(1, 5)              # seconds between batch starts (the soak shares the machine)
    source, sink = make_topic("soak-in", PARTITIONS), make_topic("soak-out", PARTITIONS)
    app = App(bootstrap_servers, source, sink, PARTITIONS, cap=2_000,
                extra=["--trigger-interval", str(trigger), "--task-slots", str(SLOTS)])
    feeder = h.Feeder(bootstrap_servers, source, PARTITIONS, rate, first=0)
    samples: list[Sample] = []
    try:
        feeder.start()
        run = app.start(until_caught_up=False)
        wait_until(lambda: batches_done(app) >= warmup_batches, 600,
                   f"{warmup_batches} batches (warm-up)", every=1, run=run)
        assert run.poll() is None, f"txstream run ended during the warm-up\n{run.tail()}"
        began = time.monotonic()
        samples.append(sample(run, batches_done(app)))
        while time.monotonic() - began < duration:
            # Sampling cadence, not a wait for a condition: the run goes on in between.
            time.sleep(10)
            assert run.poll() is None, f"txstream run ended on its own\n{run.tail()}"
            samples.append(sample(run, batches_done(app)))
        first, last = samples[0], samples[-1]
        report = {
            "seconds": round(last.at - first.at), "batches": last.batches - first.batches,
            "first": _counts(first), "last": _counts(last),
            "threads_grown": {k: dict(last.thread_names.get(k, Counter()) - first.thread_names.get(k, Counter()))
                              for k in last.thread_names},
            "rss_mb_growth": {k: round(last.rss_mb.get(k, 0) - first.rss_mb.get(k, 0), 1) for k in last.rss_mb},
            "rss_mb_peak": {k: round(max(s.rss_mb.get(k, 0) for s in samples), 1) for k in last.rss_mb},
        }
        print("\nresources " + json.dumps(report, default=str))
        assert last.batches - first.batches >= 20, f"too few batches to judge a leak: {report}"
        for kind in ("driver", "jvm", "python-workers"):
            assert first.processes.get(kind), f"no {kind} process sampled: the sampler lost sight of it: {report}"
        # A sample can catch a worker being replaced or a client mid-close: compare the most of
        # the first three samples with the least of the last three.
        def grew(what: str, kind: str, of=lambda x, kind: 0) -> tuple[int, int]:
            before = max(getattr(x, what).get(kind, 0) - of(x, kind) for x in samples[:3])
            after = min(getattr(x, what).get(kind, 0) - of(x, kind) for x in samples[-3:])
            return before, after

        for kind in ("driver", "jvm", "python-workers"):
            before, after = grew("processes", kind)
            assert after <= before, f"{kind} processes grew from {before} to {after}: {report}"
            before, after = grew("threads", kind, of=_librdkafka_threads)
            assert after <= before + 8, f"{kind} threads other than librdkafka's grew from {before} to {after}: {report}"
        for kind in ("driver", "jvm"):
            for what, slack in (("threads", 8), ("fds", 16)):
                before, after = grew(what, kind)
                assert after <= before + slack, f"{kind} {what} grew from {before} to {after}: {report}"
        # A Python worker keeps its clients across tasks (docs/architecture.md §3.4): an idle
        # reading consumer, a committed-offsets reader, and a producer for each slot it published
        # for. Spark hands a task to whichever worker is idle, so a worker takes up a role (and its
        # client) whenever the tasks' order shifts, late in a run too: the count fills up to that
        # bound and stays there. A leak passes it.
        workers = last.processes["python-workers"] - 1   # the daemon forks them
        bound = workers * (2 + SLOTS)
        peak = max(_clients(x, "python-workers") for x in samples)
        assert peak <= bound, f"{peak} librdkafka clients in {workers} Python workers, at most {bound} expected: {report}"
        before, after = grew("fds", "python-workers", of=lambda x, kind: FDS_PER_CLIENT * _clients(x, kind))
        assert after <= before + 16, (f"python-workers descriptors besides their clients' grew from {before} "
                                      f"to {after}: {report}")
        code = run.terminate()
        assert code == 0, run.tail()
        app.passed()
    finally:
        feeder.finish()
        app.destroy_all()
