"""Does this cluster honour transactions? The round trip txstream's guarantees rest on.

A transactional producer writes one aborted transaction, one committed transaction that also
commits a consumer-group offset (`send_offsets_to_transaction`), and leaves a third one open.
A `read_committed` reader must see only the committed record; a `read_uncommitted` reader sees
all three; the group's committed offset must be the one sent inside the transaction.
Apache Kafka passes; librdkafka's mock cluster and the lookalikes we tried do not.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


@dataclass
class RoundTrip:
    topic: str
    group: str
    read_committed: list[bytes]
    read_uncommitted: list[bytes]
    committed_offset: int
    sent_offset: int

    @property
    def ok(self) -> bool:
        return (self.read_committed == [b"committed"]
                and self.read_uncommitted == [b"aborted", b"committed", b"open"]
                and self.committed_offset == self.sent_offset)

    def report(self) -> str:
        return "\n".join([
            f"topic {self.topic}: one aborted, one committed and one open transaction",
            f"  read_committed   sees {[v.decode() for v in self.read_committed]}",
            f"  read_uncommitted sees {[v.decode() for v in self.read_uncommitted]}",
            f"  group {self.group}: committed offset {self.committed_offset} "
            f"(sent in the transaction: {self.sent_offset})",
            "  => " + ("the cluster honours transactions" if self.ok else "THE CLUSTER GETS TRANSACTIONS WRONG"),
        ])


def read_partition(bootstrap: str, topic: str, partition: int, isolation: str, expect: int,
                   timeout: float = 20.0) -> list[bytes]:
    """Values of one partition from the beginning, until `expect` records or the end is stable."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"txstream-check-{uuid.uuid4().hex}",
                         "isolation.level": isolation, "enable.auto.commit": False,
                         "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, partition, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                # EOF: under read_committed the reader stops at the open transaction.
                if len(values) >= expect:
                    break
                continue
            values.append(msg.value())
    finally:
        consumer.close()
    return values


def transaction_round_trip(bootstrap: str, timeout: float = 30.0) -> RoundTrip:
    suffix = uuid.uuid4().hex[:8]
    topic, group = f"txstream-check-{suffix}", f"txstream-check-group-{suffix}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1)])[topic].result(timeout)
    group_member = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    # log_level 3: the coordinator is often still loading on a fresh broker; librdkafka retries.
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"txstream-check-{suffix}",
                         "log_level": 3})
    sent_offset = 42
    try:
        producer.init_transactions(timeout)
        producer.begin_transaction()
        producer.produce(topic, b"aborted")
        producer.flush(timeout)
        producer.abort_transaction(timeout)

        producer.begin_transaction()
        producer.produce(topic, b"committed")
        producer.send_offsets_to_transaction([TopicPartition(topic, 0, sent_offset)],
                                             group_member.consumer_group_metadata(), timeout)
        producer.commit_transaction(timeout)

        producer.begin_transaction()
        producer.produce(topic, b"open")
        producer.flush(timeout)  # delivered, never committed

        committed = read_partition(bootstrap, topic, 0, "read_committed", expect=1)
        uncommitted = read_partition(bootstrap, topic, 0, "read_uncommitted", expect=3)
        offsets = group_member.committed([TopicPartition(topic, 0)], timeout)
        result = RoundTrip(topic, group, committed, uncommitted, offsets[0].offset, sent_offset)
        producer.abort_transaction(timeout)
        return result
    finally:
        group_member.close()
        admin.delete_topics([topic])
