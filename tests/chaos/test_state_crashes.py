"""The crash suite for state across batches (docs/state.md): `txstream run` of a stateful
processor as a real subprocess, killed at each dangerous point of the wide protocol and at random
moments, restarted until a run exits 0.

Running totals: per bucket, the updates a read_committed reader sees strictly increase and the
last equals the exact total. Windows: every window the final watermark closed is emitted exactly
once with the exact count and sum (its late records, all in the dead-letter topic, added back),
none early."""
from __future__ import annotations

import random
import time

import pytest

from tests.chaos import harness as h
from tests.support.kafka import read_all
from tests.support.running import App
from tests.support.seeding import seed_numbered
from tests.support.state_processors import EVENT_MS, dedup_check, running_totals_check, windows_check
from tests.support.waiting import wait_until

pytestmark = pytest.mark.chaos
PARTITIONS = 4
TOTALS = "tests/support/state_processors.py:BucketRunningTotals"
WINDOWS = "tests/support/state_processors.py:BucketWindows"
PROCESSORS = {"windows": WINDOWS, "dedup": "tests/support/state_processors.py:NumberDedup"}
EXTRA = ["--output-units", "3", "-X", "consumer.session.timeout.ms=6000"]
FAULTS = ("driver.after_plan_log=kill@2,publish.before_commit=kill@4,publish.after_commit=kill@9,"
          "driver.before_close=kill@5,publish.mid_produce=raise@14")


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("processor", ["totals", "windows", "dedup", "restore-and-snapshot"])
def test_state_kills_at_each_dangerous_point(bootstrap_servers, make_topic, processor) -> None:
    """Each fault fires once, on its n-th occurrence over all runs. `restore-and-snapshot`: a
    snapshot is due every 10 changelog records, and runs are killed in the middle of a
    restore and of a snapshot (every restart restores: the new run's executor has no copy)."""
    records = h.scale(24_000, 200_000)
    source, sink, dlq = make_topic("sc-in", PARTITIONS), make_topic("sc-out", 3), make_topic("sc-dlq")
    seed_numbered(bootstrap_servers, source, PARTITIONS, records)
    if processor == "dedup":   # every number again, a little later in each partition: retried sends
        seed_numbered(bootstrap_servers, source, PARTITIONS, records)
    faults, snapshots = FAULTS, []
    if processor == "restore-and-snapshot":
        faults = "state.before_snapshot_commit=kill@2,state.mid_restore=kill@6,publish.after_commit=kill@12"
        snapshots = ["--state-snapshot-every", "10"]
    app = App(bootstrap_servers, source, sink, PARTITIONS, processor=PROCESSORS.get(processor, TOTALS),
              cap=h.scale(1_000, 5_000), extra=[*EXTRA, "--dead-letter-topic", dlq, *snapshots], faults=faults)
    began = time.monotonic()
    try:
        codes = app.until_done(8)
        # A fault fires on its n-th occurrence over all runs, and how many a run reaches depends on
        # timing (a restore whose tail is empty has no mid point): more input until three kills fired.
        for _ in range(3):
            if codes.count(-9) >= 3:
                break
            more = h.scale(8_000, 50_000)
            for _copy in range(2 if processor == "dedup" else 1):
                seed_numbered(bootstrap_servers, source, PARTITIONS, more, first=records)
            records += more
            codes += app.until_done(8)
        assert codes.count(-9) >= 3 and codes[-1] == 0, f"exit codes {codes}: not every kill fired"
        _check(bootstrap_servers, app, dlq, records, processor if processor in PROCESSORS else "totals",
               f"{processor} faults (exits {codes})", began)
        app.passed()
    finally:
        app.destroy_all()


@pytest.mark.timeout(2400)
def test_running_totals_kill_9_at_random_moments(bootstrap_servers, make_topic) -> None:
    ahead = h.scale(40_000, 400_000)
    kills_wanted = h.scale(3, 10)
    source, sink, dlq = make_topic("sr-in", PARTITIONS), make_topic("sr-out", 3), make_topic("sr-dlq")
    records = ahead
    seed_numbered(bootstrap_servers, source, PARTITIONS, records)
    app = App(bootstrap_servers, source, sink, PARTITIONS, processor=TOTALS, cap=h.scale(2_000, 10_000),
              extra=[*EXTRA, "--dead-letter-topic", dlq])
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    kills, codes = 0, []
    began = time.monotonic()
    try:
        while kills < kills_wanted:
            records += sum(h.top_up(app, records, ahead).values())
            run = app.start()
            baseline = app.baseline()
            if not wait_until(app.progressed_since(baseline), 300, "a closed batch", run=run):
                codes.append(run.wait(60))
                break
            time.sleep(rng.uniform(0.0, 2.5))
            if run.poll() is not None:
                codes.append(run.poll())
                break
            run.kill9()
            kills += 1
            codes.append(-9)
        codes += app.until_done(4)
        assert kills >= min(2, kills_wanted), f"only {kills} kills landed (seed {seed}, {records} records)"
        _check(bootstrap_servers, app, dlq, records, "totals", f"kill -9 x{kills} (seed {seed}, exits {codes})", began)
        app.passed()
    finally:
        app.destroy_all()


def _check(bootstrap: str, app: App, dlq: str, records: int, processor: str, what: str, began: float) -> None:
    out = read_all(bootstrap, app.output, timeout=300)
    if processor == "totals":
        problems = running_totals_check(out, range(records))
        late = []
    elif processor == "dedup":
        late = read_all(bootstrap, dlq, timeout=120)
        problems = dedup_check(out, late, range(records))
    else:
        late = read_all(bootstrap, dlq, timeout=120)
        assert all(r.headers["txstream.dlq.stage"] == b"late" for r in late)
        final = (records - 1) * EVENT_MS - 2_000   # the last record's event time minus the delay
        problems = windows_check(out, late, range(records), final)
    print(f"state {processor} {what}: {records} records in, {len(out)} out, {len(late)} late, "
          f"{len(problems)} problems, {time.monotonic() - began:.0f}s", flush=True)
    assert not problems, f"{what}: {problems[:8]}"
