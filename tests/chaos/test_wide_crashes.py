"""The crash suite for wide transforms (docs/wide-transforms.md §3): `txstream run` of a groupBy
aggregation as a real subprocess, killed for real at each dangerous point of the wide protocol and
at random moments, restarted until a run exits 0. The aggregated output must reconcile exactly with
the input (per bucket, counts and sums over every output record equal the input's) and `verify`
must be clean per batch and unit.

Dangerous points (txstream/fault_injection.py): in the driver between the plan log and the run; in a unit
before and after its commit; between the last unit and the input commit; task failures that
Spark retries (mid-produce).
"""
from __future__ import annotations

import random
import time

import pytest

from tests.chaos import harness as h
from tests.support.kafka import read_all
from tests.support.running import App
from tests.support.seeding import seed_numbered
from tests.support.waiting import wait_until
from tests.support.wide_processors import expected_totals, output_totals
from txstream.tools.verify import audit

pytestmark = pytest.mark.chaos
PARTITIONS = 4
PROCESSOR = "tests/support/wide_processors.py:BucketTotals"
# A killed driver's membership lingers for a session timeout, during which a restart of a wide
# app waits (one instance at a time): keep it short.
EXTRA = ["--output-units", "3", "-X", "consumer.session.timeout.ms=6000"]


def _check(bootstrap: str, app: App, records: int, what: str, began: float) -> None:
    out = read_all(bootstrap, app.output, timeout=300)
    got, want = output_totals(out), expected_totals(range(records))
    wrong = {b: (got.get(b), want[b]) for b in want if got.get(b) != want[b]}
    report = audit(bootstrap, app.input, app.output, app_id=app.app_id, count_field="count")
    print(f"{what}: {records} records in, {len(out)} totals out, {len(wrong)} buckets off, "
          f"wide audit problems {report.wide.problem_count if report.wide else 'n/a'}, "
          f"{time.monotonic() - began:.0f}s", flush=True)
    assert not wrong, f"{what}: totals do not reconcile (got, want): {dict(list(wrong.items())[:5])}"
    assert report.clean and report.wide is not None and report.wide.reconciled_batches > 0, report.table()


@pytest.mark.timeout(1800)
def test_wide_kills_at_each_dangerous_point(bootstrap_servers, make_topic) -> None:
    records = h.scale(24_000, 200_000)
    source, sink = make_topic("wc-in", PARTITIONS), make_topic("wc-out", 3)
    seed_numbered(bootstrap_servers, source, PARTITIONS, records)
    # Each fault fires once, on its n-th occurrence over all runs; a kill ends the run, the next
    # run re-runs the logged batch and meets the next fault.
    faults = ("driver.after_plan_log=kill@2,publish.before_commit=kill@4,publish.after_commit=kill@9,"
              "driver.before_close=kill@5,publish.mid_produce=raise@14")
    app = App(bootstrap_servers, source, sink, PARTITIONS, processor=PROCESSOR, cap=h.scale(1_000, 5_000),
                extra=EXTRA, faults=faults)
    began = time.monotonic()
    try:
        codes = app.until_done(8)
        log = app.log_text()
        assert codes.count(0) == 1 and len(codes) >= 5, f"exit codes {codes}: not every kill fired\n{log[-3000:]}"
        replays = [m for m in app.events().messages() if "re-running its logged plan" in m]
        assert len(replays) >= 3, log[-4000:]
        _check(bootstrap_servers, app, records, f"wide faults {faults} (exits {codes})", began)
        app.passed()
    finally:
        app.destroy_all()


@pytest.mark.timeout(2400)
def test_wide_kill_9_at_random_moments(bootstrap_servers, make_topic) -> None:
    ahead = h.scale(60_000, 400_000)   # input left beyond the committed offsets at each start
    kills_wanted = h.scale(3, 10)
    source, sink = make_topic("wr-in", PARTITIONS), make_topic("wr-out", 3)
    records = ahead
    seed_numbered(bootstrap_servers, source, PARTITIONS, records)
    app = App(bootstrap_servers, source, sink, PARTITIONS, processor=PROCESSOR, cap=h.scale(2_000, 10_000),
                extra=EXTRA)
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    kills, codes = 0, []
    began = time.monotonic()
    try:
        while kills < kills_wanted:
            records += sum(h.top_up(app, records, ahead).values())
            run = app.start()
            baseline = app.baseline()
            # Mid-run: once this run has closed a batch, at a random moment of the next ones.
            if not wait_until(app.progressed_since(baseline), 300, "a closed batch", run=run):
                codes.append(run.wait(60))
                break   # the run finished before the kill: the input is done
            time.sleep(rng.uniform(0.0, 2.5))
            if run.poll() is not None:
                codes.append(run.poll())
                break
            run.kill9()
            kills += 1
            codes.append(-9)
        codes += app.until_done(4)
        assert kills >= min(2, kills_wanted), f"only {kills} kills landed (seed {seed}, {records} records)"
        _check(bootstrap_servers, app, records, f"wide kill -9 x{kills} (seed {seed}, exits {codes})", began)
        app.passed()
    finally:
        app.destroy_all()
