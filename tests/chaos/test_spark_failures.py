"""Spark task failures and retries, and speculative execution: several attempts of one task (a
retry after a failure at each dangerous point, a speculative copy racing the original) all
publish under the same transactional.id, so the later attempt fences the earlier one and only
one publication of each range is ever committed. A read_committed checker reads the output all
along; afterwards the output must be exactly the input and the audit clean.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.chaos import harness as h

pytestmark = pytest.mark.chaos
PARTITIONS = 4


def _fired(app: h.App) -> list[str]:
    return sorted(p.name for p in Path(app.faults_dir).iterdir())


def test_task_failures_are_retried(bootstrap_servers, make_topic):
    records = h.scale(40_000, 400_000)
    # Each dangerous point fails one task attempt (the n-th attempt to reach it); Spark retries
    # the task (the engine runs local[N] as local[N,2]; a task failing twice fails the batch,
    # which the driver re-plans).
    faults = ("read.end=raise@2,publish.before_produce=raise@3,publish.mid_produce=raise@4,"
              "publish.before_commit=raise@5,publish.after_commit=raise@6")
    source, sink = make_topic("spark-in", PARTITIONS), make_topic("spark-out", PARTITIONS)
    expected = h.seed(bootstrap_servers, source, PARTITIONS, records)
    checker = h.Checker(bootstrap_servers, sink, PARTITIONS)
    app = h.App(bootstrap_servers, source, sink, PARTITIONS, cap=h.scale(2_500, 10_000), faults=faults)
    began = time.monotonic()
    try:
        checker.start()
        code = app.start(until_caught_up=True).wait(600)
        log = app.log_text()
        assert code == 0, log[-3000:]
        fired = _fired(app)
        wanted = {item.split("=")[0] + "." + item.split("@")[1] for item in faults.split(",")}
        assert wanted <= set(fired), f"faults did not fire: {sorted(wanted - set(fired))} ({fired})"
        failures = len(re.findall(r"ERROR Executor: Exception in task", log))
        assert failures >= len(wanted), f"expected {len(wanted)} failed task attempts, the log shows {failures}"
        checker.drain()
        h.verdict("spark task failures", bootstrap_servers, app, expected, checker=checker,
                  extra=f"{failures} failed task attempts retried {time.monotonic() - began:.0f}s")
    finally:
        checker.stop_event.set()
        app.destroy_all()


def test_speculative_execution(bootstrap_servers, make_topic):
    """Spark only speculates on a cluster master (its TaskSchedulerImpl never starts the
    speculation checker for local[N]), so this runs on `local-cluster[2,1,1024]`: a standalone
    master and two executor JVMs on this machine."""
    records = h.scale(40_000, 400_000)
    source, sink = make_topic("spec-in", PARTITIONS), make_topic("spec-out", PARTITIONS)
    expected = h.seed(bootstrap_servers, source, PARTITIONS, records)
    checker = h.Checker(bootstrap_servers, sink, PARTITIONS)
    app = h.App(bootstrap_servers, source, sink, PARTITIONS, cap=h.scale(2_500, 10_000),
                master="local-cluster[2,1,1024]",
                extra=["--conf", "spark.speculation=true", "--conf", "spark.speculation.multiplier=1",
                       "--conf", "spark.speculation.quantile=0.1", "--conf", "spark.speculation.minTaskRuntime=100ms",
                       "--conf", "spark.speculation.interval=50ms", "--conf", "spark.executor.memory=1g"],
                env_extra={"TXSTREAM_SPARK_LOG_LEVEL": "INFO"})
    began = time.monotonic()
    try:
        checker.start()
        code = app.start(until_caught_up=True).wait(900)
        log = app.log_text()
        assert code == 0, "\n".join(line for line in log.splitlines()
                                    if "INFO" not in line)[-4000:]
        speculated = len(re.findall(r"as speculatable", log))
        launched = len(re.findall(r"Starting task \d+\.[1-9] in stage", log))
        fenced = len(re.findall(r"fenced|already-done|stale-plan", log))
        assert speculated > 0, "Spark never marked a task speculatable: speculation was not exercised"
        checker.drain()
        h.verdict("speculative execution", bootstrap_servers, app, expected, checker=checker,
                  extra=f"speculatable {speculated}, extra attempts launched {launched}, "
                        f"fenced/already-done/stale statuses {fenced} {time.monotonic() - began:.0f}s")
    finally:
        checker.stop_event.set()
        app.destroy_all()
