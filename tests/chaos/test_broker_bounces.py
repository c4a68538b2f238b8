"""Broker bounces, as Kafka's transactions system test does them: a 3-node KRaft cluster, topics
with replication factor 3 and min.insync.replicas=2; while `txstream run` copies a continuously
fed input, each broker is bounced one at a time - SIGKILL and clean restarts, including the
leader of an input partition and the transaction coordinator of one of the app's
transactional.ids - waiting for the run to make progress and the cluster to be fully replicated
between bounces. A read_committed checker reads the output all along; afterwards the output must
be exactly the input and the audit clean.

The run is expected to ride out every bounce without exiting. If it does exit, the test
restarts it (the output must still be exact) and then fails, naming the bounce.
"""
from __future__ import annotations

import random
import time
from collections import Counter

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.chaos import harness as h
from tests.support.nodes import bounce, leader_of, transaction_coordinator, wait_fully_replicated
from tests.support.running import App
from tests.support.seeding import numbered, seed_numbered

pytestmark = pytest.mark.chaos
PARTITIONS = 4
TOPIC_CONFIG = {"min.insync.replicas": "2"}


def _topics(cluster, *names: str) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    futures = admin.create_topics([NewTopic(n, PARTITIONS, 3, config=TOPIC_CONFIG) for n in names])
    for future in futures.values():
        future.result(60)
    wait_fully_replicated(cluster, 120)


def _bounce(cluster, node_id: int, hard: bool, restarts: list[str]) -> float:
    """bounce (tests/support/nodes.py), with one more start if the restarted JVM dies during start-up (noted,
    with the node's stdout, which server.log does not have)."""
    from pathlib import Path

    from txstream.local.cluster import BrokerError

    began = time.monotonic()
    try:
        return bounce(cluster, node_id, hard=hard, timeout=240).total
    except BrokerError as exc:
        if "exited during start-up" not in str(exc):
            raise
        out = Path(cluster.node(node_id).directory, "stdout.log")
        tail = out.read_text(errors="replace").splitlines()[-15:] if out.exists() else []
        restarts.append(f"node {node_id}: {' | '.join(tail)[-1500:]}")
        print(f"node {node_id} died during its restart; stdout tail:\n" + "\n".join(tail), flush=True)
        cluster.start_node(node_id, wait=True, timeout=240)
        wait_fully_replicated(cluster, 240)
        return time.monotonic() - began


@pytest.mark.timeout(3600 if h.SOAK else 1800)
def test_broker_bounces(cluster):
    bootstrap = cluster.bootstrap_servers
    rounds = h.scale(1, 4)
    seeded = h.scale(10_000, 100_000)
    rate = h.scale(200, 1_000)
    suffix = f"{int(time.time())}"
    source, sink = f"bb-in-{suffix}", f"bb-out-{suffix}"
    _topics(cluster, source, sink)
    expected = seed_numbered(bootstrap, source, PARTITIONS, seeded)
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    app = App(bootstrap, source, sink, PARTITIONS, cap=h.scale(2_500, 10_000),
                # Sensible timeouts while a broker is down: librdkafka retries for a while
                # instead of failing the task at once.
                # A batch stuck behind a broker that went away is cancelled after 120 s and
                # re-planned (the watchdog), inside the 300 s allowed for progress per bounce.
                extra=["-X", "producer.message.timeout.ms=55000", "-X", "consumer.session.timeout.ms=30000",
                       "--batch-timeout", "120"])
    # The feeder writes until the bounces are over: progress after each bounce needs new input
    # (a bounded feed that ran dry made the progress checks wait for records that never came).
    feeder = h.Feeder(bootstrap, source, PARTITIONS, rate, first=seeded)
    checker = h.Checker(bootstrap, sink, PARTITIONS)
    bounces: list[str] = []
    exits: list[str] = []
    restarts: list[str] = []   # broker restarts that needed a second try (_bounce)
    began = time.monotonic()
    try:
        checker.start()
        feeder.start()
        run = app.start(until_caught_up=False)

        def progress(after: str) -> None:
            # A run that ends is noted and started again.
            nonlocal run
            run = app.wait_restarting(run, app.progressed_since(app.baseline()), 300, f"progress after {after}",
                                      exits=exits)

        progress("start")
        tid = f"{app.app_id}-{source}-0"
        for round_no in range(rounds):
            order: list[tuple[int, str]] = []
            leader = leader_of(cluster, source, 0)
            order.append((leader, f"leader of {source}[0]"))
            coordinator = transaction_coordinator(cluster, tid)
            if coordinator == leader:
                order.append((coordinator, f"txn coordinator of {tid} (also the leader)"))
            else:
                order.append((coordinator, f"txn coordinator of {tid}"))
            for node in cluster.nodes:
                if node.node_id not in (leader, coordinator):
                    order.append((node.node_id, "the remaining node"))
            # Each broker once per round, hard and clean alternating (the first one hard).
            # (leader == coordinator: that node is bounced twice, once each way)
            for i, (node_id, role) in enumerate(order):
                hard = (i + round_no) % 2 == 0
                took = _bounce(cluster, node_id, hard, restarts)
                what = f"{'SIGKILL' if hard else 'clean'} bounce of node {node_id} ({role}) {took:.0f}s"
                bounces.append(what)
                print(what, flush=True)
                progress(what)
                time.sleep(rng.uniform(0, 2))
        feeder.finish()
        assert not feeder.errors, feeder.errors
        expected += Counter(numbered(n) for n in range(seeded, feeder.next))
        ends = h.end_offsets(bootstrap, source, PARTITIONS)
        target = sum(ends.values())
        run = app.wait_restarting(run, lambda: (app.committed_total() or 0) >= target, 600,
                                  f"the run to catch up to {target}", every=0.5, exits=exits)
        code = run.terminate()
        assert code == 0, f"SIGTERM: exit {code}\n{run.tail()}"
        checker.drain()
        log_tail = app.log_text()[-4000:]
        h.verdict("broker bounces", bootstrap, app, expected, checker=checker,
                  extra=f"{len(bounces)} bounces, run exits {exits or 'none'}, broker restarts retried "
                        f"{len(restarts)} seed {seed} "
                        f"{time.monotonic() - began:.0f}s")
        assert not exits, (f"txstream run did not ride out the broker bounces: {exits} "
                           f"(bounces: {bounces})\n{log_tail}")
    finally:
        feeder.stop_event.set()
        checker.stop_event.set()
        app.destroy_all()


@pytest.mark.timeout(3600 if h.SOAK else 1800)
def test_wide_broker_bounces(cluster):
    """A wide app (groupBy per batch, 3 output units) through SIGKILL and clean bounces of the
    input's leader, a unit's transaction coordinator and the remaining node: the aggregated
    output reconciles exactly with the input and `verify` is clean per batch and unit."""
    from tests.support.kafka import read_all
    from tests.support.wide_processors import expected_totals, output_totals
    from txstream.tools.verify import audit

    bootstrap = cluster.bootstrap_servers
    seeded = h.scale(10_000, 100_000)
    suffix = f"{int(time.time())}"
    source, sink = f"wb-in-{suffix}", f"wb-out-{suffix}"
    _topics(cluster, source, sink)
    seed_numbered(bootstrap, source, PARTITIONS, seeded)
    app = App(bootstrap, source, sink, PARTITIONS, cap=h.scale(2_500, 10_000),
                processor="tests/support/wide_processors.py:BucketTotals",
                extra=["--output-units", "3", "-X", "producer.message.timeout.ms=55000",
                       "-X", "consumer.session.timeout.ms=30000", "--batch-timeout", "120"])
    feeder = h.Feeder(bootstrap, source, PARTITIONS, h.scale(200, 1_000), first=seeded)
    bounces, exits, restarts = [], [], []
    began = time.monotonic()
    try:
        feeder.start()
        run = app.start(until_caught_up=False)

        def progress(after: str) -> None:
            nonlocal run
            run = app.wait_restarting(run, app.progressed_since(app.baseline()), 300, f"progress after {after}",
                                      exits=exits)

        progress("start")
        leader = leader_of(cluster, source, 0)
        coordinator = transaction_coordinator(cluster, f"{app.app_id}-unit-0")
        order = [(leader, "leader", True), (coordinator, "unit-0 coordinator", False)]
        order += [(n.node_id, "the remaining node", True) for n in cluster.nodes if n.node_id not in (leader, coordinator)]
        for node_id, role, hard in order:
            took = _bounce(cluster, node_id, hard, restarts)
            bounces.append(f"{'SIGKILL' if hard else 'clean'} bounce of node {node_id} ({role}) {took:.0f}s")
            print(bounces[-1], flush=True)
            progress(bounces[-1])
        feeder.finish()
        assert not feeder.errors, feeder.errors
        total = feeder.next
        target = sum(h.end_offsets(bootstrap, source, PARTITIONS).values())
        run = app.wait_restarting(run, lambda: (app.committed_total() or 0) >= target, 600,
                                  f"the run to catch up to {target}", every=0.5, exits=exits)
        assert run.terminate() == 0, run.tail(120)
        got, want = output_totals(read_all(bootstrap, sink, timeout=300)), expected_totals(range(total))
        wrong = {b: (got.get(b), want[b]) for b in want if got.get(b) != want[b]}
        report = audit(bootstrap, source, sink, app_id=app.app_id, count_field="count", timeout=60)
        print(f"wide broker bounces: {total} records in, {len(wrong)} buckets off, {len(bounces)} bounces, "
              f"run exits {exits or 'none'}, {time.monotonic() - began:.0f}s", flush=True)
        assert not wrong, f"totals do not reconcile (got, want): {dict(list(wrong.items())[:5])}"
        assert report.clean and report.wide is not None, report.table()
        assert not exits, f"the wide run did not ride out the bounces: {exits} ({bounces})\n{app.log_text()[-4000:]}"
    finally:
        feeder.stop_event.set()
        app.destroy_all()


@pytest.mark.timeout(1800)
def test_state_broker_bounces(cluster):
    """A stateful app (running totals per bucket, update mode, 3 state units, a snapshot due every
    30 changelog records) through SIGKILL and clean bounces of the input's leader, a unit's
    transaction coordinator and the remaining node: its state topics are replicated on all three
    brokers, and per bucket the updates a read_committed reader sees strictly increase and the last
    equals the exact total."""
    from tests.support.kafka import read_all
    from tests.support.state_processors import running_totals_check
    from txstream.state.changelog import changelog_topic, snapshot_topic
    from txstream.state.operator import state_topic

    bootstrap = cluster.bootstrap_servers
    seeded = h.scale(6_000, 60_000)
    suffix = f"{int(time.time())}"
    source, sink = f"sb-in-{suffix}", f"sb-out-{suffix}"
    _topics(cluster, source)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(sink, 3, 3, config=TOPIC_CONFIG)])[sink].result(60)
    seed_numbered(bootstrap, source, PARTITIONS, seeded)
    app = App(bootstrap, source, sink, PARTITIONS, cap=h.scale(1_500, 10_000),
              processor="tests/support/state_processors.py:BucketRunningTotals",
              extra=["--output-units", "3", "--state-snapshot-every", "30", "-X", "producer.message.timeout.ms=55000",
                     "-X", "consumer.session.timeout.ms=30000", "--batch-timeout", "120"])
    feeder = h.Feeder(bootstrap, source, PARTITIONS, h.scale(150, 1_000), first=seeded)
    bounces, exits, restarts = [], [], []
    began = time.monotonic()
    try:
        feeder.start()
        run = app.start(until_caught_up=False)

        def progress(after: str) -> None:
            nonlocal run
            run = app.wait_restarting(run, app.progressed_since(app.baseline()), 300, f"progress after {after}",
                                      exits=exits)

        progress("start")
        state_topics = [changelog_topic(app.app_id, "agg"), snapshot_topic(app.app_id, "agg"), state_topic(app.app_id)]
        metadata = admin.list_topics(timeout=30).topics
        replicas = {t: {len(p.replicas) for p in metadata[t].partitions.values()} if t in metadata else None
                    for t in state_topics}
        assert replicas == {t: {3} for t in state_topics}, f"state topics' replication: {replicas}"
        leader = leader_of(cluster, source, 0)
        coordinator = transaction_coordinator(cluster, f"{app.app_id}-unit-0")
        changelog_leader = leader_of(cluster, state_topics[0], 0)
        order = [(leader, "leader", True), (coordinator, "unit-0 coordinator", False)]
        order += [(n.node_id, "the remaining node", True) for n in cluster.nodes if n.node_id not in (leader, coordinator)]
        for node_id, role, hard in order:
            took = _bounce(cluster, node_id, hard, restarts)
            also = " and changelog[0] leader" if node_id == changelog_leader else ""
            bounces.append(f"{'SIGKILL' if hard else 'clean'} bounce of node {node_id} ({role}{also}) {took:.0f}s")
            print(bounces[-1], flush=True)
            progress(bounces[-1])
        feeder.finish()
        assert not feeder.errors, feeder.errors
        total = feeder.next
        target = sum(h.end_offsets(bootstrap, source, PARTITIONS).values())
        run = app.wait_restarting(run, lambda: (app.committed_total() or 0) >= target, 600,
                                  f"the run to catch up to {target}", every=0.5, exits=exits)
        assert run.terminate() == 0, run.tail(120)
        out = read_all(bootstrap, sink, timeout=300)
        # The totals of what the input holds (a feeder's retry through a bounce may have written a
        # record twice: that copy counts too).
        numbers = [int(r.key[1:]) for r in read_all(bootstrap, source, timeout=120)]
        assert len(numbers) == target and set(numbers) == set(range(total)), (len(numbers), target, total)
        problems = running_totals_check(out, numbers)
        snapshots = read_all(bootstrap, state_topics[1], timeout=60)
        manifests = sum(1 for r in snapshots if r.key == b"manifest")
        print(f"state broker bounces: {len(numbers)} records in ({len(numbers) - total} written twice), {len(out)} updates out, {len(problems)} problems, "
              f"{manifests} snapshot manifests, {len(bounces)} bounces, run exits {exits or 'none'}, "
              f"{time.monotonic() - began:.0f}s", flush=True)
        assert not problems, f"running totals after the bounces ({bounces}): {problems[:8]}"
        assert manifests, "no snapshot was written: the bounces did not cover a snapshot"
        assert not exits, f"the stateful run did not ride out the bounces: {exits} ({bounces})\n{app.log_text()[-4000:]}"
    finally:
        feeder.stop_event.set()
        app.destroy_all()
