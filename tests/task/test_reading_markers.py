"""Reads of ranges that end in a transaction's commit marker (task/reading.py `_next_messages`),
against the real broker: input written by an upstream exactly-once writer ends every
transaction with a control record, which has an offset but is never delivered.

A read that has every record of its range must not wait for the next fetch: nothing may come
(the upstream is idle), and the position already shows the marker passed. Each call the reader
makes to its consumer is recorded; no call that waited may come back empty once the range's
records were all delivered.
"""
from __future__ import annotations

import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.support.waiting import wait_until
from txstream.kafka.config import KafkaClients
from txstream.task import reading
from txstream.task.spec import PartitionPlan, ReadSpec


class _RecordingConsumer:
    """The reader's consumer, its consume() calls noted as (timeout, records returned, records
    of the ranges delivered before the call)."""

    def __init__(self, consumer: Any) -> None:
        self._consumer, self.calls, self.delivered = consumer, [], 0

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list:
        before = self.delivered
        messages = self._consumer.consume(num_messages=num_messages, timeout=timeout)
        self.delivered += len(messages)
        self.calls.append((timeout, len(messages), before))
        return messages

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


def _committed_in_transactions(bootstrap: str, topic: str, partitions: int, per_partition: int) -> dict[int, int]:
    """`per_partition` records in each partition, one transaction; the high watermarks, once
    each is past its partition's commit marker (commit_transaction returns before the
    coordinator has written the markers)."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"upstream-{uuid.uuid4().hex}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for p in range(partitions):
        for i in range(per_partition):
            producer.produce(topic, b"v%d" % i, b"k", partition=p)
    producer.commit_transaction(30)
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": "marks"})
    highs: dict[int, int] = {}

    def marked() -> bool:
        highs.update({p: probe.get_watermark_offsets(TopicPartition(topic, p), 10)[1] for p in range(partitions)})
        return all(high > per_partition for high in highs.values())

    try:
        wait_until(marked, 60, f"the commit markers of {topic}", every=0.05)
        return highs
    finally:
        probe.close()


@pytest.mark.parametrize("partitions", [1, 3], ids=["one-range", "a-slot-of-three"])
def test_a_range_ending_in_a_commit_marker_is_done_without_waiting_for_another_fetch(
        partitions, bootstrap_servers, make_topic) -> None:
    per_partition = 40
    topic = make_topic("marked", partitions)
    highs = _committed_in_transactions(bootstrap_servers, topic, partitions, per_partition)
    assert all(high == per_partition + 1 for high in highs.values()), highs   # the marker's offset is the last
    plans = tuple(PartitionPlan(topic, p, 0, highs[p], None, "") for p in range(partitions))
    spec = ReadSpec(clients=KafkaClients(bootstrap_servers), app_id=f"marked-{uuid.uuid4().hex[:6]}",
                    side_dir=f"txstream-test-{uuid.uuid4().hex[:8]}", plans=plans)
    config = spec.consumer_config()
    recording = _RecordingConsumer(reading.Consumer(config))
    reading._CONSUMERS[repr(sorted(config.items()))] = recording   # noqa: SLF001 - the reader's own consumer
    try:
        batches = list(reading.read_ranges(spec, [reading.RangeRead(p, p, plan) for p, plan in enumerate(plans)]))
    finally:
        reading._CONSUMERS.pop(repr(sorted(config.items())), None)   # noqa: SLF001
        recording.close()
    rows = [row for batch in batches for row in batch.select(["partition", "offset"]).to_pylist()]
    assert sorted((r["partition"], r["offset"]) for r in rows) == [
        (p, o) for p in range(partitions) for o in range(per_partition)]
    waited_for_nothing = [call for call in recording.calls
                          if call[0] > 0 and call[1] == 0 and call[2] == partitions * per_partition]
    assert not waited_for_nothing, recording.calls
