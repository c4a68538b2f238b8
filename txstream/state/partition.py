"""Reading one partition of a state topic from an offset to its end: the high watermark read
first (read_uncommitted), then kafka/scan.py's read loop (read_committed, assigned, never
subscribed: no group membership, no rebalance) up to it, in large fetches. A read that cannot
reach the end raises RestoreIncomplete (an InfrastructureError), never returns a part as whole."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from txstream.errors import TransientKafkaError
from txstream.kafka.config import KafkaClients
from txstream.kafka.errors import classify_kafka
from txstream.kafka.scan import scan
from txstream.state.errors import RestoreIncomplete

# `auto.offset.reset: error`: a start before the partition's first offset fails, never skips.
_FETCH = {"auto.offset.reset": "error", "fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 16 << 20,
          "queued.max.messages.kbytes": 256 << 10}


class Reader:
    """A read_uncommitted consumer for the partition's bounds (a read_committed consumer's "latest
    offset" is the last stable offset, which stays before a transaction whose commit has returned
    until its commit marker is written), and what the reads' consumers are made of."""

    def __init__(self, clients: KafkaClients, app_id: str) -> None:
        from confluent_kafka import Consumer

        self.clients, self.group = clients, f"{app_id}.state-reader"
        self.offsets = Consumer(clients.consumer(self.group, **{"isolation.level": "read_uncommitted",
                                                                "enable.auto.commit": False}))

    def close(self) -> None:
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


def read_to_end(reader: Reader, topic: str, partition: int, start: int | None,
                on_records: Callable[[list], None], timeout: float) -> int:
    """Hand every committed record from `start` (None: the partition's first offset) to the
    partition's end to `on_records`, a list per fetch; returns the end offset (the next offset
    to read). Raises RestoreIncomplete when the read makes no progress for `timeout` seconds.

    The end is the high watermark when the read starts, not the first end the consumer reports:
    a transaction whose commit has returned may not have its commit marker written yet, and a
    read_committed consumer reports its end at that transaction's first record until it is. The
    records a committed marker names are all below the high watermark read after the commit;
    records past it (written meanwhile) are left for the next read."""
    low, end = bounds(reader, topic, partition, timeout)
    start = low if start is None else start
    if start >= end:
        return start
    try:
        for records in scan(reader.clients, {(topic, partition): (start, end)}, timeout, purpose="state",
                            group_id=reader.group, **_FETCH):
            on_records(records)
    except TransientKafkaError as exc:
        raise RestoreIncomplete(f"{topic}[{partition}]: could not read from offset {start} to {end} ({exc}; "
                                "a transaction on it still open?)") from exc
    return end
