"""The soak, at the standard of Apache Kafka's transactions system test (issue 12, item 4).

One scenario puts everything together on a 3-node KRaft cluster (topics with replication 3 and
min.insync.replicas=2): `txstream run` copies a continuously fed input and is stopped again and
again -- SIGKILL of its whole process group (driver, JVM, Python workers) or SIGTERM -- and
restarted; between processor bounces a broker is bounced (SIGKILL or clean, alternating, one node
at a time, the cluster fully replicated again before the next). A read_committed checker reads
the output during all of it. At the end one run catches up and the output must be exactly the
input: no duplicate, nothing missing, the checker never saw a source offset twice, and
`txstream verify` is clean.

`make test` runs it at CI size; `make soak` (TXSTREAM_SOAK=1) runs 1,000,000+ records, 56
processor bounces and 7 broker bounces, printing a progress line per step.
"""
from __future__ import annotations

import random
import time
from collections import Counter

import pytest

from tests.chaos import harness as h
from tests.chaos.test_broker_bounces import PARTITIONS, _bounce, _topics
from tests.support.running import App
from tests.support.seeding import numbered, seed_numbered
from tests.support.waiting import wait_until

pytestmark = pytest.mark.chaos


def _say(began: float, text: str) -> None:
    print(f"[soak {time.monotonic() - began:6.0f}s] {text}", flush=True)


@pytest.mark.timeout(4 * 3600 if h.SOAK else 1500)
def test_soak(cluster):
    bootstrap = cluster.bootstrap_servers
    seeded = h.scale(20_000, 1_000_000)
    cycles = h.scale(4, 56)                    # processor starts, each ending in a kill or a stop
    bounce_every = h.scale(2, 8)               # a broker bounce during every n-th start
    rate = h.scale(200, 1_000)                 # records/s fed while the bounces happen
    suffix = f"{int(time.time())}"
    source, sink = f"soak-in-{suffix}", f"soak-out-{suffix}"
    _topics(cluster, source, sink)
    began = time.monotonic()
    expected = seed_numbered(bootstrap, source, PARTITIONS, seeded)
    _say(began, f"seeded {seeded} records into {source} ({PARTITIONS} partitions, RF 3, min ISR 2)")
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    plan = ["kill", "term"] + [rng.choice(["kill", "kill", "term"]) for _ in range(cycles - 2)]
    app = App(bootstrap, source, sink, PARTITIONS, cap=h.scale(2_500, 10_000),
                extra=["-X", "producer.message.timeout.ms=55000", "-X", "consumer.session.timeout.ms=30000",
                       "--batch-timeout", "120"])
    feeder = h.Feeder(bootstrap, source, PARTITIONS, rate, first=seeded)
    checker = h.Checker(bootstrap, sink, PARTITIONS)
    counts: Counter = Counter()
    bounces: list[str] = []
    restarts: list[str] = []
    try:
        checker.start()
        feeder.start()
        for number, action in enumerate(plan, 1):
            run = app.start(until_caught_up=False)
            baseline = app.baseline()
            progressed = wait_until(app.progressed_since(baseline), 300, "the run to commit a range",
                                    every=0.05, run=run)
            assert progressed, f"txstream run ended on its own (exit {run.poll()})\n{run.tail()}"
            if number % bounce_every == 0:
                node_id = rng.choice([n.node_id for n in cluster.nodes])
                hard = len(bounces) % 2 == 0
                took = _bounce(cluster, node_id, hard, restarts)
                bounces.append(f"{'SIGKILL' if hard else 'clean'} node {node_id} {took:.0f}s")
                baseline = app.baseline()
                assert wait_until(app.progressed_since(baseline), 300, "progress after a broker bounce",
                                  every=0.2, run=run), f"no progress after {bounces[-1]}\n{run.tail()}"
            h.stop_run(run, action, rng)
            counts[action] += 1
            _say(began, f"{number}/{len(plan)}: {action}; committed {app.committed_total()} of "
                        f"{feeder.next} written; broker bounces {len(bounces)}; checker saw {checker.records}, "
                        f"duplicates {len(checker.duplicates)}")
        feeder.finish()
        assert not feeder.errors, feeder.errors
        expected += Counter(numbered(n) for n in range(seeded, feeder.next))
        _say(began, f"feeding done: {sum(expected.values())} records; the last run catches up")
        code = app.start(until_caught_up=True).wait(h.scale(600, 3600))
        assert code == 0, app.log_text()[-3000:]
        checker.drain(timeout=h.scale(120, 600))
        h.verdict("soak", bootstrap, app, expected, checker=checker,
                  extra=f"kill -9 x{counts['kill']} SIGTERM x{counts['term']} broker bounces {len(bounces)} "
                        f"({', '.join(bounces)}; restarts retried {len(restarts)}) seed {seed} "
                        f"{time.monotonic() - began:.0f}s")
    finally:
        feeder.stop_event.set()
        checker.stop_event.set()
        app.destroy_all()
