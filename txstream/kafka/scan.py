"""Reading ranges of partitions back, read_committed: the one read-until-position loop (the state
topics' reads to their end, state/partition.py, go through it too).

A partition is done when the consumer's position reaches the range's end (or its end-of-partition
event does), never on a count: transactional topics have offset gaps (commit/abort markers, aborted
records read_committed never delivers). The consumer is assigned, never joins its group, never
commits. `verify` and `consume` read with `scan`; the driver fetches a poison record with `read_one`.
"""
from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from txstream.errors import TransientKafkaError
from txstream.kafka.config import KafkaClients, as_clients
from txstream.kafka.errors import classify_kafka

_BATCH = 10_000
# Errors of one partition that reading it again will not cure.
_UNREADABLE = {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.TOPIC_AUTHORIZATION_FAILED,
               KafkaError._UNKNOWN_PARTITION, KafkaError._AUTO_OFFSET_RESET}  # noqa: SLF001


def _reader(clients: KafkaClients, purpose: str, isolation: str, overrides: Mapping[str, Any],
            group_id: str | None = None) -> Consumer:
    return Consumer(clients.consumer(
        group_id or f"txstream-{purpose}-{uuid.uuid4().hex}",   # never joined, never committed
        **{"isolation.level": isolation, "enable.auto.commit": False, "enable.auto.offset.store": False,
           "enable.partition.eof": True, "auto.offset.reset": "earliest", **overrides}))


def scan(clients: KafkaClients | str, ranges: Mapping[tuple[str, int], tuple[int, int]], timeout: float = 30.0, *,
         isolation: str = "read_committed", purpose: str = "scan", group_id: str | None = None,
         **overrides: Any) -> Iterator[list[Message]]:
    """Yield batches of the records in [start, end) of every partition of `ranges`.

    Records at or past a partition's end (the log grew meanwhile) are dropped. Raises
    TransientKafkaError when no partition makes progress for `timeout` seconds, and the Kafka
    failure (classify_kafka) when a partition cannot be read at all (unknown, not authorised).
    Closing the generator early (a `--max` reached) closes the consumer. `group_id`: the group
    the consumer names (one the principal's ACLs cover); it is never joined either.
    """
    clients = as_clients(clients)
    todo = {(t, p): end for (t, p), (start, end) in ranges.items() if end > start}
    if not todo:
        return
    eof = KafkaError._PARTITION_EOF
    consumer = _reader(clients, purpose, isolation, overrides, group_id)
    try:
        consumer.assign([TopicPartition(t, p, ranges[(t, p)][0]) for (t, p) in todo])
        last_progress = time.monotonic()
        while todo:
            batch = []
            progressed = False
            for msg in consumer.consume(num_messages=_BATCH, timeout=0.1):
                err = msg.error()
                key = (msg.topic(), msg.partition())
                if err is None:
                    if msg.offset() < ranges[key][1]:
                        batch.append(msg)
                    continue
                if err.code() == eof:
                    if key in todo and msg.offset() >= todo[key]:
                        del todo[key]
                        progressed = True
                    continue
                if err.fatal() or err.code() in _UNREADABLE:
                    raise classify_kafka(err, f"reading {msg.topic()}[{msg.partition()}]")
                # Anything else is transient (a broker down, a leader moving): librdkafka retries.
            if batch:
                progressed = True
                yield batch
            if todo:
                # The position is past the last delivered record, and past the control records
                # and aborted data the consumer skipped over.
                for tp in consumer.position([TopicPartition(t, p) for t, p in todo]):
                    key = (tp.topic, tp.partition)
                    if tp.offset >= 0 and tp.offset >= todo[key]:
                        del todo[key]
                        progressed = True
            if progressed:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > timeout:
                stuck = ", ".join(f"{t}[{p}] (end {e})" for (t, p), e in sorted(todo.items()))
                raise TransientKafkaError(f"No progress for {timeout:.0f}s reading {stuck} from "
                                          f"{clients.bootstrap_servers}.")
    finally:
        consumer.close()


def read_one(clients: KafkaClients | str, topic: str, partition: int, offset: int,
             timeout: float = 30.0, *, group_id: str | None = None) -> Message | None:
    """The record at `offset` (read_committed), or None when there is none there (a control
    record, aborted data, or the offset is past the end within `timeout`)."""
    clients = as_clients(clients)
    consumer = Consumer(clients.consumer(
        group_id or f"txstream-read-{uuid.uuid4().hex}",
        **{"isolation.level": "read_committed", "enable.auto.commit": False, "enable.partition.eof": True}))
    consumer.assign([TopicPartition(topic, partition, offset)])
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF and msg.offset() > offset:
                    return None
                continue
            if msg.offset() == offset:
                return msg
            if msg.offset() > offset:
                return None
        return None
    finally:
        consumer.close()
