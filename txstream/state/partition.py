"""Reading one partition of a state topic from an offset to its end: a read_committed consumer
assigned to the partition (never subscribed: no group membership, no rebalance), in large
fetches. One consumer per restore or snapshot, closed after it: both are rare, and a consumer
reused across assignments can hand out the previous assignment's end-of-partition events."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from txstream.kafka.config import KafkaClients
from txstream.kafka.errors import classify_kafka
from txstream.state.errors import RestoreIncomplete

_FETCH = {"isolation.level": "read_committed", "enable.auto.commit": False, "enable.partition.eof": True,
          "auto.offset.reset": "error", "fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 16 << 20,
          "queued.max.messages.kbytes": 256 << 10}


class Reader:
    """A read_committed consumer for the records, and a read_uncommitted one for the partition's
    bounds: a read_committed consumer's "latest offset" is the last stable offset, which stays
    before a transaction whose commit has returned until its commit marker is written."""

    def __init__(self, clients: KafkaClients, app_id: str) -> None:
        from confluent_kafka import Consumer

        group = f"{app_id}.state-reader"
        self.consumer = Consumer(clients.consumer(group, **_FETCH))
        self.offsets = Consumer(clients.consumer(group, **{"isolation.level": "read_uncommitted",
                                                           "enable.auto.commit": False}))

    def close(self) -> None:
        self.consumer.close()
        self.offsets.close()


@contextmanager
def reader(clients: KafkaClients, app_id: str) -> Iterator[Reader]:
    """A state reader; it never joins its group (assign only, no commit)."""
    state_reader = Reader(clients, app_id)
    try:
        yield state_reader
    finally:
        state_reader.close()


def bounds(reader: Reader, topic: str, partition: int, timeout: float) -> tuple[int, int]:
    """The partition's first offset and its high watermark."""
    from confluent_kafka import KafkaException, TopicPartition

    try:
        low, high = reader.offsets.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout,
                                                         cached=False)
    except KafkaException as exc:
        raise classify_kafka(exc, f"offsets of {topic}[{partition}]") from exc
    if low < 0 or high < 0:
        raise RestoreIncomplete(f"{topic}[{partition}]: the broker answered no offsets ({low}, {high})")
    return low, high


def end_offset(clients: KafkaClients, app_id: str, topic: str, partition: int, timeout: float = 30.0) -> int:
    """The partition's high watermark: read after a transaction committed, every record it wrote
    lies below it."""
    with reader(clients, app_id) as state_reader:
        return bounds(state_reader, topic, partition, timeout)[1]


def read_to_end(reader: Reader, topic: str, partition: int, start: int, on_records: Callable[[list], None],
                timeout: float) -> int:
    """Hand every committed record from `start` to the partition's end to `on_records`, a list per
    fetch; returns the end offset (the next offset to read).

    The end is the high watermark when the read starts, not the first end the consumer reports:
    a transaction whose commit has returned may not have its commit marker written yet, and a
    read_committed consumer reports its end at that transaction's first record until it is. The
    records a committed marker names are all below the high watermark read after the commit."""
    from confluent_kafka import KafkaError, TopicPartition

    _low, end = bounds(reader, topic, partition, timeout)
    if start >= end:
        return start
    consumer = reader.consumer
    consumer.assign([TopicPartition(topic, partition, start)])
    deadline = time.monotonic() + timeout
    reached = start
    try:
        while True:
            messages = consumer.consume(num_messages=50_000, timeout=0.2)
            records = []
            for message in messages:
                error = message.error()
                if error is None:
                    records.append(message)
                elif error.code() != KafkaError._PARTITION_EOF:
                    raise classify_kafka(error, f"reading {topic}[{partition}]")
                elif message.topic() == topic and message.partition() == partition:
                    reached = max(reached, message.offset())   # past a trailing commit marker
            if records:
                on_records(records)
                reached = max(reached, records[-1].offset() + 1)
                deadline = time.monotonic() + timeout
            if reached < end:
                reached = max(reached, consumer.position([TopicPartition(topic, partition)])[0].offset)
            if reached >= end:
                return reached
            if time.monotonic() > deadline:
                raise RestoreIncomplete(f"{topic}[{partition}]: read from offset {start} to {reached} of {end} "
                                        f"in {timeout:.0f} s (a transaction on it still open?)")
    finally:
        consumer.unassign()
