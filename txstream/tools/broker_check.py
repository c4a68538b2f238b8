"""Does this cluster honour transactions? The round trip txstream's guarantees rest on.

A transactional producer writes one aborted transaction, one committed transaction that also
commits a consumer-group offset (`send_offsets_to_transaction`), and leaves a third one open.
A `read_committed` reader must see only the committed record; a `read_uncommitted` reader sees
all three; the group's committed offset must be the one sent inside the transaction.
Apache Kafka passes; librdkafka's mock cluster and the lookalikes we tried do not.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

from txstream.kafka.config import KafkaClients, as_clients
from txstream.kafka.lookups import admin_client, cluster_topics, watermarks
from txstream.kafka.scan import scan


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


def read_partition(clients: KafkaClients | str, topic: str, partition: int, isolation: str,
                   timeout: float = 20.0) -> list[bytes]:
    """Values of one partition from the beginning to its end as `isolation` sees it (the last
    stable offset under read_committed, the log end otherwise), read up to that position."""
    clients = as_clients(clients)
    mark = watermarks(admin_client(clients), [(topic, partition)], timeout)[(topic, partition)]
    end = mark.last_stable if isolation == "read_committed" else mark.log_end
    return [msg.value() for batch in scan(clients, {(topic, partition): (mark.earliest, end)}, timeout,
                                          isolation=isolation, purpose="check")
            for msg in batch]


def transaction_round_trip(clients: KafkaClients | str, timeout: float = 30.0) -> RoundTrip:
    clients = as_clients(clients)
    suffix = uuid.uuid4().hex[:8]
    topic, group = f"txstream-check-{suffix}", f"txstream-check-group-{suffix}"
    admin = admin_client(clients)
    cluster_topics(admin, timeout)  # unreachable: one clear line, before anything is created
    admin.create_topics([NewTopic(topic, 1)])[topic].result(timeout)
    group_member = Consumer(clients.consumer(group))
    producer = Producer(clients.producer(**{"transactional.id": f"txstream-check-{suffix}"}))
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

        committed = read_partition(clients, topic, 0, "read_committed", timeout)
        uncommitted = read_partition(clients, topic, 0, "read_uncommitted", timeout)
        offsets = group_member.committed([TopicPartition(topic, 0)], timeout)
        result = RoundTrip(topic, group, committed, uncommitted, offsets[0].offset, sent_offset)
        producer.abort_transaction(timeout)
        return result
    finally:
        group_member.close()
        _delete(admin, topic, group, timeout)


def _delete(admin, topic: str, group: str, timeout: float) -> None:
    """Remove the check's topic and group, waiting for the answers: a request left unsent when the
    command exits would leave them behind."""
    for futures in (admin.delete_topics([topic], operation_timeout=timeout),
                    admin.delete_consumer_groups([group], request_timeout=timeout)):
        for future in futures.values():
            try:
                future.result(timeout)
            except Exception:   # best effort: the check's result stands either way
                pass
