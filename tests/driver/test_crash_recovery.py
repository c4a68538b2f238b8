"""Exactly-once under crashes (issue 3): `txstream run` as a real subprocess, killed for real.

1. kill -9 at random moments: the process group is SIGKILLed while a batch is in flight (right
   after the group's committed offsets show that some partitions of this run committed), 4+
   times, restarting each time until a run exits 0. The read_committed output must equal one
   clean run's output: the input's (key, value) multiset, and `txstream.verify.audit` clean.
2. Faults at the dangerous points (txstream/fault_injection.py, TXSTREAM_FAULTS): a kill between produce
   and commit, after the commit before the driver learns of it, in the driver between batches,
   and task failures that Spark retries. Each restarts until done and checks the exact output.

`kill` faults fire in a Spark Python worker, which lives in the process group of Spark's Python
daemon (pyspark/daemon.py calls setpgid), not the driver's. tests/support/running.py therefore exports
TXSTREAM_DRIVER_PGID (the session's group) so fault_injection.py SIGKILLs the driver and its JVM; the
worker that fired it survives a moment longer, and the rest of the session is then swept.
"""
from __future__ import annotations

import random
import re
import time

import pytest

from tests.chaos import harness as h
from tests.support.running import App
from tests.support.seeding import seed_numbered
from tests.support.waiting import wait_until

PARTITIONS = 4


@pytest.mark.timeout(2400)  # 5+ Spark start-ups: ~5 min on an idle 2-core machine, far more when shared
def test_kill_9_at_random_moments(bootstrap_servers, make_topic):
    """240k+ records, 4 partitions, 10k per partition per batch: kill -9 mid-batch 4+ times. Each
    run starts with 240k records ahead of it (topped up), so the kills land however fast runs are."""
    ahead = records = 240_000
    wanted_kills = 4
    source, sink = make_topic("crash-in", PARTITIONS), make_topic("crash-out", PARTITIONS)
    expected = seed_numbered(bootstrap_servers, source, PARTITIONS, records)
    app = App(bootstrap_servers, source, sink, PARTITIONS, cap=10_000)
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    kills, kill_points, codes = 0, [], []
    began = time.monotonic()
    try:
        for _attempt in range(wanted_kills + 6):
            if kills < wanted_kills:
                expected += h.top_up(app, records, ahead)
                records = sum(expected.values())
            run = app.start()
            if kills < wanted_kills:
                baseline = app.baseline()
                # Kill while a batch is in flight: right after this run's first partition
                # commits (the rest of its batch still publishing), or a little later.
                progressed = wait_until(app.progressed_since(baseline), 420,
                                        "this run to commit a range", every=0.05, run=run)
                if progressed and run.poll() is None:
                    # (Up to 4 s let a run with 2 slots of 2 partitions, 20k records per commit,
                    # finish everything before the kill: the kill then tests nothing.)
                    time.sleep(rng.choice([0.0, 0.0, rng.uniform(0.1, 1.5)]))
                    at = app.committed_total()
                    if run.poll() is None and (at or 0) < records:
                        run.kill9()
                        kills += 1
                        kill_points.append(at)
                        continue
            code = run.wait(420)
            codes.append(code)
            assert code == 0, f"txstream run exited {code}\n{run.tail()}"
            break
        else:
            raise AssertionError(f"no clean finish after {kills} kills")
        assert kills >= wanted_kills, (
            f"only {kills} kills landed before the run finished (seed {seed}); the input is too small "
            "for the batch size")
        assert all(0 < at < records for at in kill_points if at is not None), f"a kill was not mid-run: {kill_points}"
        h.verdict("kill -9 x%d" % kills, bootstrap_servers, app, expected,
                  extra=f"kills at committed {kill_points} seed {seed} {time.monotonic() - began:.0f}s")
    finally:
        app.destroy_all()


FAULTS = [
    # (id, TXSTREAM_FAULTS, runs that must die before one finishes)
    ("kill-between-produce-and-commit", "publish.before_commit=kill@3", 1),
    ("kill-after-commit-before-driver-learns", "publish.after_commit=kill@3", 1),
    ("kill-in-driver-between-batches", "driver.between_batches=kill@1", 1),
    ("kill-mid-produce", "publish.mid_produce=kill@2", 1),
    # Two batches of two slots (4 partitions on local[2]): four publishing tasks plus the retries.
    ("task-failures-spark-retries", "read.end=raise@1,publish.mid_produce=raise@2,"
                                    "publish.before_commit=raise@4,publish.after_commit=raise@3", 0),
]


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("faults,deaths", [f[1:] for f in FAULTS], ids=[f[0] for f in FAULTS])
def test_fault_at_dangerous_point(bootstrap_servers, make_topic, faults, deaths):
    records = 10_000
    source, sink = make_topic("fault-in", PARTITIONS), make_topic("fault-out", PARTITIONS)
    expected = seed_numbered(bootstrap_servers, source, PARTITIONS, records)
    app = App(bootstrap_servers, source, sink, PARTITIONS, cap=1_250, faults=faults)  # 2 batches
    began = time.monotonic()
    try:
        codes = app.until_done(max_runs=deaths + 2)
        fired = sorted(p.name for p in __import__("pathlib").Path(app.faults_dir).iterdir())
        wanted = {item.split("=")[0] + "." + item.split("@")[1] for item in faults.split(",")}
        assert wanted <= set(fired), f"faults did not fire: wanted {sorted(wanted)}, occurrences {fired}"
        killed = [c for c in codes if c != 0]
        assert len(killed) == deaths, f"expected {deaths} killed run(s), exit codes {codes}\n{app.log_text()[-3000:]}"
        if deaths:
            assert all(c == -9 for c in killed), f"a run died otherwise than by SIGKILL: {codes}"
        h.verdict(f"fault {faults}", bootstrap_servers, app, expected,
                  extra=f"exit codes {codes} {time.monotonic() - began:.0f}s")
    finally:
        app.destroy_all()


@pytest.mark.timeout(900)
def test_hung_task_is_cancelled_and_the_batch_replanned(bootstrap_servers, make_topic):
    """A task that never returns (here: blocked before its commit) must not stall the run: the
    driver's watchdog cancels the batch after --batch-timeout, re-plans, and the output is still
    exactly the input."""
    records = 4_000
    source, sink = make_topic("hang-in", PARTITIONS), make_topic("hang-out", PARTITIONS)
    expected = seed_numbered(bootstrap_servers, source, PARTITIONS, records)
    app = App(bootstrap_servers, source, sink, PARTITIONS, cap=1_000, faults="publish.before_commit=hang@2",
                extra=["--batch-timeout", "20"])
    try:
        code = app.start(until_caught_up=True).wait(600)
        log = app.log_text()
        assert code == 0, log[-3000:]
        messages = app.events().messages()
        assert any("exceeded 20s; cancelling it" in m for m in messages), log[-3000:]
        assert any(re.search(r"still running after \d+s: stage \d+: \d+/\d+ tasks done", m) for m in messages), \
            log[-3000:]
        h.verdict("hung task", bootstrap_servers, app, expected)
    finally:
        app.destroy_all()
