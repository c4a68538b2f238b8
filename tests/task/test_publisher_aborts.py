"""The abort path (issue 12, item 3): hundreds of transactions through the real publisher, many
aborted right after producing, none may end in a fatal producer error, and a read_committed
reader sees exactly the committed ones.

librdkafka can fail an abort issued right after produce() fatally with INVALID_TXN_STATE
(confluentinc/librdkafka#4849; here a bare producer looping begin -> produce 1,000 -> commit,
commit, abort failed on an abort in 1 of 2 runs of 300 transactions). TransactionalPublisher
waits for in-flight requests before aborting and replaces a producer whose abort still fails.
And the stale plan: offsets carrying a group generation that is gone fail the commit.
"""
from __future__ import annotations

import random
import uuid
from collections import Counter

import pyarrow as pa
import pytest

from tests.support.kafka import committed, drop_cached_publishers, live_member, produce, read_all
from txstream.constants import COMMITTED, EXACTLY_ONCE, STALE_PLAN
from txstream.errors import AbortableError
from txstream.kafka.config import KafkaClients
from txstream.kafka.transactions import TransactionalPublisher
from txstream.task import publish
from txstream.task.result import TaskResult
from txstream.task.spec import PRODUCER_DEFAULTS, PartitionPlan, PublishSpec, ReadSpec

TRANSACTIONS, RECORDS = 300, 1_000


def test_hundreds_of_aborts_right_after_produce_never_end_in_a_fatal_error(bootstrap_servers, make_topic):
    topic = make_topic("aborts", 2)
    config = KafkaClients(bootstrap_servers).producer(**PRODUCER_DEFAULTS, **{"transaction.timeout.ms": 60_000})
    publisher = TransactionalPublisher(config, f"test-aborts-{uuid.uuid4().hex[:8]}", owner_dir=None, timeout_s=30)
    publisher.init()
    rng = random.Random(7)
    committed: Counter = Counter()
    aborts = 0
    try:
        for txn in range(TRANSACTIONS):
            publisher.begin()
            produce = publisher.producer.produce
            for n in range(RECORDS):
                while True:
                    try:
                        produce(topic, f"{txn}-{n}".encode())
                        break
                    except BufferError:
                        publisher.producer.poll(0.01)
            roll = rng.random()
            if roll < 0.4:                  # abort at once, requests still in flight
                publisher.abort()
                aborts += 1
            elif roll < 0.5:                # an abortable failure mid-produce, as the task sees one
                try:
                    raise AbortableError("injected: abort after produce")
                except AbortableError:
                    publisher.abort()
                    aborts += 1
            else:
                publisher.commit()
                committed.update(f"{txn}-{n}".encode() for n in range(RECORDS))
    finally:
        publisher.close()
    assert aborts > 100, aborts
    seen = Counter(r.value for r in read_all(bootstrap_servers, topic, timeout=120))
    assert seen == committed, (f"{sum((committed - seen).values())} committed records missing, "
                               f"{sum((seen - committed).values())} extra (aborted or twice)")
    print(f"\n[aborts] {TRANSACTIONS} transactions, {aborts} aborted right after producing, "
          f"{publisher.renewals} producer(s) replaced after a fatal abort, {sum(seen.values())} records read")


def test_offsets_of_a_generation_gone_fail_the_commit_and_the_slot_publishes_nothing(
        bootstrap_servers, make_topic, tmp_path):
    """The group moved on while the task produced (its offsets name a member that has left):
    send_offsets_to_transaction is refused, the task aborts and reports a stale plan, nothing is
    visible, and the next batch with the group's current metadata publishes the range once."""
    source, sink = make_topic("gone-in", 1), make_topic("gone-out", 1)
    produce(bootstrap_servers, source, [(b"k", b"v")] * 5)
    app_id = f"gone-{uuid.uuid4().hex[:8]}"
    clients = KafkaClients(bootstrap_servers)
    spec = PublishSpec(read=ReadSpec(clients=clients, app_id=app_id, side_dir=f"txstream-test-{uuid.uuid4().hex[:8]}"),
                       guarantee=EXACTLY_ONCE, transaction_timeout_s=10, owner_dir=str(tmp_path), output_topic=sink)

    def rows() -> pa.RecordBatch:
        return pa.RecordBatch.from_pylist([{"key": b"k", "value": f"v{i}".encode(), "offset": i} for i in range(5)])

    with live_member(bootstrap_servers, app_id, source) as first:
        old_metadata = first.consumer_group_metadata()
    # `first` has left the group: its member id and generation are gone.
    plan = PartitionPlan(source, 0, 0, 5, None, f"{app_id}-{source}-0")
    with live_member(bootstrap_servers, app_id, source) as current:
        try:
            result = TaskResult(0)
            publish.publish_transactional(spec.with_batch(1, [plan], old_metadata), plan, iter([rows()]), result)
            assert result.status == STALE_PLAN, result
            assert committed(bootstrap_servers, app_id, source, 1) == {0: None}
            result = TaskResult(0)
            publish.publish_transactional(spec.with_batch(2, [plan], current.consumer_group_metadata()), plan,
                                          iter([rows()]), result)
            assert result.status == COMMITTED, result
        finally:
            drop_cached_publishers()
    assert committed(bootstrap_servers, app_id, source, 1) == {0: 5}
    assert sorted(r.value for r in read_all(bootstrap_servers, sink)) == [f"v{i}".encode() for i in range(5)]


def test_a_closed_publisher_aborts_and_releases_its_producer_at_once(bootstrap_servers, make_topic) -> None:
    """Closing aborts the open transaction and destroys the producer then, not at Python's next
    cyclic collection (its delivery callback is a bound method: a cycle)."""
    topic = make_topic("closed", 1)
    publisher = TransactionalPublisher(KafkaClients(bootstrap_servers).producer(**PRODUCER_DEFAULTS),
                                       f"closed-{uuid.uuid4().hex}", None)
    publisher.init()
    publisher.begin()
    with publisher.producing():
        publisher.producer.produce(topic, b"never committed", partition=0)
    publisher.close()
    with pytest.raises(RuntimeError, match="closed"):   # destroyed, though the publisher is still held
        publisher.producer.poll(0)
    assert read_all(bootstrap_servers, topic) == []
