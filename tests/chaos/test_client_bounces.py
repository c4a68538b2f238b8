"""Client bounces: `txstream run` is killed with SIGKILL at random points many times, with clean
stops (SIGTERM) in between, restarting each time, while a feeder keeps writing input and a
read_committed checker reads the output. Then one last run catches up and the output must be
exactly the input (no duplicate, nothing missing), the checker must never have seen a source
offset from two publications, and `txstream verify`'s audit must be clean.
"""
from __future__ import annotations

import random
import time
from collections import Counter

import pytest

from tests.chaos import harness as h
from tests.support.running import App
from tests.support.seeding import numbered, seed_numbered
from tests.support.waiting import wait_until

pytestmark = pytest.mark.chaos
PARTITIONS = 4


@pytest.mark.timeout(3600 if h.SOAK else 1800)
def test_client_bounces(bootstrap_servers, make_topic):
    cycles = h.scale(5, 40)                 # starts that end in a kill or a clean stop
    seeded = h.scale(20_000, 200_000)
    rate = h.scale(200, 1_000)              # records/s written while the bounces happen
    source, sink = make_topic("bounce-in", PARTITIONS), make_topic("bounce-out", PARTITIONS)
    expected = seed_numbered(bootstrap_servers, source, PARTITIONS, seeded)
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    # Kills and clean stops, the kills in the majority; a clean stop after the first kill.
    plan = ["kill", "term"] + [rng.choice(["kill", "kill", "term"]) for _ in range(cycles - 2)]
    # A batch stuck past 120 s is cancelled and re-planned (the watchdog), well inside the
    # 300 s this test waits for progress after each start.
    app = App(bootstrap_servers, source, sink, PARTITIONS, cap=h.scale(2_500, 10_000),
                extra=["--batch-timeout", "120"])
    # Unbounded until the bounces are over: every start must find new input to make progress
    # on (a bounded feed that ran dry left a restarted run idle, waiting for records).
    feeder = h.Feeder(bootstrap_servers, source, PARTITIONS, rate, first=seeded)
    checker = h.Checker(bootstrap_servers, sink, PARTITIONS)
    began = time.monotonic()
    counts = Counter()
    try:
        checker.start()
        feeder.start()
        for action in plan:
            run = app.start(until_caught_up=False)
            baseline = app.baseline()
            progressed = wait_until(app.progressed_since(baseline), 300,
                                    "the run to commit a range", every=0.05, run=run)
            assert progressed, f"txstream run ended on its own (exit {run.poll()})\n{run.tail()}"
            h.stop_run(run, action, rng)
            counts[action] += 1
        feeder.finish()
        assert not feeder.errors, feeder.errors
        expected += Counter(numbered(n) for n in range(seeded, feeder.next))
        code = app.start(until_caught_up=True).wait(600)
        assert code == 0, app.log_text()[-3000:]
        checker.drain()
        h.verdict("client bounces", bootstrap_servers, app, expected, checker=checker,
                  extra=f"kill -9 x{counts['kill']} SIGTERM x{counts['term']} seed {seed} "
                        f"{time.monotonic() - began:.0f}s")
    finally:
        feeder.stop_event.set()
        checker.stop_event.set()
        app.destroy_all()
