"""The tests' Kafka helpers, once: write records, read a topic whole with read_committed, committed
offsets, a live group member, this process's cached task producers, the clients left open at the
end, murmur2 (Kafka's partitioner, as a reference)."""
from __future__ import annotations

import gc
import io
import time
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterable

import fastavro
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from txstream.kafka import headers
from txstream.kafka import lookups as kofs
from txstream.kafka.retry import retriable
from txstream.tools.topic_io import end_offsets, produce_waiting


@dataclass
class Record:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]

    @property
    def lineage(self) -> headers.Lineage | None:
        """What the record's txstream lineage names (txstream/kafka/headers.py), or None."""
        return headers.lineage_of(list(self.headers.items()))


def produce(bootstrap: str, topic: str, records: Iterable[tuple[bytes | None, bytes]],
            partitioner: str = "murmur2_random", partition: int | None = None,
            config: dict[str, Any] | None = None) -> int:
    """Produce `records` (key, value) and wait for all of them; `config` adds producer settings
    (a test that needs small record batches sets `linger.ms` and `batch.size`)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "partitioner": partitioner,
                         "enable.idempotence": True, **(config or {})})
    count = 0
    for key, value in records:
        produce_waiting(producer, topic, value, key, partition)
        count += 1
    assert producer.flush(60) == 0
    return count


def avro_bytes(schema: dict, value: dict) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, value)
    return buf.getvalue()


def read_all(bootstrap: str, topic: str, isolation: str = "read_committed", timeout: float = 60,
             settle: float = 5) -> list[Record]:
    """Everything up to the end offsets seen now, stopping on position (offset gaps allowed);
    under read_committed, once the topic's transactions have settled (`settled_end_offsets`)."""
    ends = settled_end_offsets(bootstrap, topic, settle) if isolation == "read_committed" else \
        end_offsets(bootstrap, topic, isolation)
    pending = {p: end for p, (low, end) in ends.items() if end > low}
    out: list[Record] = []
    if not pending:
        return out
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-read-{uuid.uuid4().hex}",
                         "isolation.level": isolation, "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, ends[p][0]) for p in pending])
    deadline = time.monotonic() + timeout
    try:
        while pending:
            assert time.monotonic() < deadline, f"reading {topic} stalled before {pending}"
            for msg in consumer.consume(5000, 0.5):
                if msg.error():
                    assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                    continue
                if msg.offset() < pending.get(msg.partition(), -1):
                    out.append(Record(msg.partition(), msg.offset(), msg.key(), msg.value(),
                                      dict(msg.headers() or [])))
            for tp in consumer.position([TopicPartition(topic, p) for p in list(pending)]):
                if tp.offset >= pending.get(tp.partition, 0):
                    pending.pop(tp.partition, None)
    finally:
        consumer.close()
    return out


def settled_end_offsets(bootstrap: str, topic: str, settle: float) -> dict[int, tuple[int, int]]:
    """read_committed end offsets (LSOs) once every partition's LSO has reached its log end, or
    after `settle` seconds (a test may hold a transaction open on purpose).

    commit_transaction() returns once the coordinator has decided the commit; the markers that
    make the records visible reach the output partitions just after. Read right after a run, a
    partition's LSO can still stand before the last transaction: its records would be missed
    (the fan-out test lost its last batch this way, 2 runs in ~10)."""
    admin = kofs.admin_client(bootstrap)
    partitions = [(topic, p) for p in range(kofs.topic_partition_counts(admin, [topic], 30)[topic])]
    deadline = time.monotonic() + settle
    while True:
        marks = kofs.watermarks(admin, partitions, 30)   # LSO and log end in one request
        if all(m.last_stable == m.log_end for m in marks.values()) or time.monotonic() >= deadline:
            return {p.partition: (m.earliest, m.last_stable) for p, m in marks.items()}
        time.sleep(0.05)


def committed(bootstrap: str, group: str, topic: str, partitions: int, timeout: float = 30) -> dict[int, int | None]:
    """The group's committed offsets per partition (None: nothing committed), read stably:
    read_committed, so a pending transactional offset commit is resolved first."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed"})
    try:
        wanted = [TopicPartition(topic, p) for p in range(partitions)]
        result = retriable(lambda: consumer.committed(wanted, timeout))
        return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in result}
    finally:
        consumer.close()


_PROBES: dict[tuple[str, str], Consumer] = {}


def committed_or_none(bootstrap: str, group: str, topic: str, partitions: int,
                      timeout: float = 15) -> dict[int, int | None] | None:
    """`committed`, for polling while brokers bounce: None when the offsets cannot be read now.
    One consumer per group is kept across calls (a wait polls every fraction of a second) until
    `close_probes()`."""
    key = (bootstrap, group)
    if key not in _PROBES:
        _PROBES[key] = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                 "isolation.level": "read_committed", "enable.auto.commit": False,
                                 "log_level": 0})
    try:
        result = _PROBES[key].committed([TopicPartition(topic, p) for p in range(partitions)], timeout)
    except KafkaException:   # a broker bouncing, a pending commit: the caller polls again
        return None
    return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in result}


def close_probes() -> None:
    while _PROBES:
        _, consumer = _PROBES.popitem()
        consumer.close()


@contextmanager
def live_member(bootstrap: str, group: str, topic: str, protocol: str = "classic") -> Iterator[Consumer]:
    """A subscribed consumer that holds an assignment for the `with` body (closed after: it leaves
    the group)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": "live-client",
                         "group.protocol": protocol, "enable.auto.commit": False})
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while not consumer.assignment():
            assert time.monotonic() < deadline, "consumer got no assignment within 60 s"
            consumer.poll(0.2)
        yield consumer
    finally:
        consumer.close()


def drop_cached_publishers() -> None:
    """Close this process's cached task producers (a test plays one Python worker)."""
    from txstream.task import publish

    for tid in publish.cached_publishers():
        publish.drop_publisher(tid)


def close_clients_left_open() -> list[str]:
    """Close every producer and consumer still alive in this process, and say what they were.

    The in-process tests play Python workers, whose caches (task/publish.py, task/reading.py)
    keep clients across batches by design. Left to the interpreter's shutdown, such a client is
    destroyed after its broker stopped, while Python tears itself down: CI saw pytest die of a
    segmentation fault after an all-passed summary. Closed here instead, while Python (and, for
    the session's broker, Kafka) still runs. An AdminClient has no close(); the session's is
    released by its fixture (tests/conftest.py)."""
    gc.collect()
    closed: list[str] = []
    for client in [o for o in gc.get_objects() if isinstance(o, (Producer, Consumer))]:
        try:
            if isinstance(client, Producer):
                client.purge(in_queue=True, in_flight=True)   # nothing to wait for: tests are over
            else:
                client.assignment()
        except RuntimeError:   # closed already
            continue
        except KafkaException:   # a fenced producer (a zombie test): closed all the same below
            pass
        with warnings.catch_warnings():
            # close() aborts an open transaction first; a fenced producer's abort fails, says so
            # in a warning and an exception, and the client is destroyed all the same.
            warnings.simplefilter("ignore", RuntimeWarning)
            try:
                client.close()
            except KafkaException:
                pass
        closed.append(type(client).__name__)
    return closed


def murmur2(data: bytes) -> int:
    """Kafka's Java `Utils.murmur2`, as a signed 32-bit int (reference for partitioning tests)."""
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(length // 4):
        k = int.from_bytes(data[i * 4:i * 4 + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    tail = length & ~3
    extra = length % 4
    if extra == 3:
        h ^= data[tail + 2] << 16
    if extra >= 2:
        h ^= data[tail + 1] << 8
    if extra >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def java_partition(key: bytes, partitions: int) -> int:
    """Where Kafka's Java producer (and so Kafka Streams and Spark) puts a keyed record."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions
