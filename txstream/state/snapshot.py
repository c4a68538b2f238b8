"""Snapshots: a unit's whole committed state written to Kafka, so a restore reads the snapshot and
only the changelog's tail after it (docs/state.md, "Snapshots").

The snapshot topic is compacted, partition i for unit i. One snapshot is one transaction of the
engine (kafka/transactions.py), with a producer of its own: its chunks (keys `chunk/<batch>/<n>`, each an Arrow stream of many keys), then
tombstones for the previous snapshot's chunks it does not overwrite, then its manifest (key
`manifest`, JSON: the batch, the changelog offset it covers, where its chunks start, how many).
A reader sees a snapshot whole or not at all (read_committed), and compaction keeps exactly the
newest manifest and its chunks.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from txstream import fault_injection
from txstream.kafka.config import KafkaClients
from txstream.kafka.transactions import Transaction, TransactionalPublisher, run
from txstream.state import partition
from txstream.state.changelog import HeaderReader, check_operator, snapshot_topic, writer_header
from txstream.state.codec import snapshot_chunk, snapshot_rows
from txstream.state.errors import ForeignStateRecord, RestoreIncomplete, StateDecodeError, StateStoreError
from txstream.state.store import StateStore

HEADER = "txstream.state.snapshot"
MANIFEST = b"manifest"
CHUNK_BYTES = 512 << 10     # well under the broker's default message.max.bytes (1 MiB)
CHUNK_KEYS = 50_000


@dataclass(frozen=True)
class Manifest:
    """One complete snapshot: the state after `batch`, covering the changelog up to
    `changelog_offset` (the next offset to read after it)."""

    operator: str
    unit: int
    batch: int
    changelog_offset: int
    keys: int
    chunks: int
    first_offset: int       # the snapshot topic's offset of its first chunk (-1: no chunk)

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @staticmethod
    def parse(value: bytes, where: str) -> Manifest:
        try:
            return Manifest(**json.loads(value))
        except (ValueError, TypeError) as exc:
            raise StateDecodeError(f"{where}: unreadable snapshot manifest {value[:200]!r}") from exc


def chunk_key(batch: int, n: int) -> bytes:
    return b"chunk/%d/%d" % (batch, n)


def snapshot_transactional_id(app_id: str, operator: str, unit: int) -> str:
    """The snapshot's own transactional.id: the unit's producer stays the publisher's, and a
    snapshot interrupted mid-way is aborted by the next one's init_transactions."""
    return f"{app_id}-{operator}-snapshot-{unit}"


class SnapshotTransaction(Transaction):
    """One snapshot as a transaction of the engine (kafka/transactions.py): chunks, tombstones for
    the previous snapshot's chunks it does not overwrite, then the manifest; no offsets."""

    def __init__(self, topic: str, store: StateStore, operator: str, previous: Manifest | None,
                 changelog_offset: int, timeout: float) -> None:
        self.topic, self.store, self.operator, self.previous = topic, store, operator, previous
        self.changelog_offset, self.timeout = changelog_offset, timeout
        self.manifest: Manifest | None = None

    def produce(self, producer: Any) -> None:
        version, topic = self.store.version, self.topic
        header = [(HEADER, writer_header(self.operator, version.batch, version.unit))]
        first: list[int] = []   # every attempt starts over: an aborted one's offsets mean nothing

        def produce(key: bytes, value: bytes | None, on_delivery: Any = None) -> None:
            while True:
                try:
                    producer.produce(topic, value, key, partition=version.unit, headers=header,
                                     **({"on_delivery": on_delivery} if on_delivery else {}))
                    return
                except BufferError:
                    producer.poll(0.05)

        def first_delivered(err: Any, message: Any) -> None:
            if err is None:
                first.append(message.offset())

        chunks = keys = 0
        for chunk_keys, chunk_values in _chunks(self.store):
            produce(chunk_key(version.batch, chunks), snapshot_chunk(chunk_keys, chunk_values),
                    first_delivered if chunks == 0 else None)
            chunks, keys = chunks + 1, keys + len(chunk_keys)
        previous = self.previous
        if previous is not None:
            start = chunks if previous.batch == version.batch else 0
            for n in range(start, previous.chunks):
                produce(chunk_key(previous.batch, n), None)
        # The manifest names its first chunk's offset: the chunks are delivered before it is written.
        if producer.flush(self.timeout) or (chunks and not first):
            raise RestoreIncomplete(f"{topic}[{version.unit}]: the snapshot's chunks were not delivered "
                                    f"within {self.timeout:.0f} s")
        self.manifest = Manifest(self.operator, version.unit, version.batch, self.changelog_offset, keys, chunks,
                                 first[0] if first else -1)
        produce(MANIFEST, self.manifest.to_bytes())
        fault_injection.maybe_fail("state.before_snapshot_commit", version.unit)

    def offsets(self) -> tuple[list, Any]:
        return [], None


def write_snapshot(clients: KafkaClients, app_id: str, operator: str, store: StateStore,
                   changelog_offset: int, timeout: float = 60.0) -> Manifest:
    """Write `store`'s committed state as a snapshot: one transaction of the engine, through a
    producer of its own (`snapshot_transactional_id`), initialised for it and closed after it,
    between batches. `changelog_offset` must not be past the first changelog record the state
    lacks: the end offset of the changelog partition read after the store's batch committed is."""
    if store.changes():
        raise StateStoreError(f"unit {store.version.unit}: snapshot with a batch's writes pending")
    version, topic = store.version, snapshot_topic(app_id, check_operator(operator))
    previous = latest_manifest(clients, app_id, operator, version.unit, timeout)
    snapshot = SnapshotTransaction(topic, store, operator, previous, changelog_offset, timeout)
    publisher = TransactionalPublisher(clients.producer(**{"enable.idempotence": True}),
                                       snapshot_transactional_id(app_id, operator, version.unit), None, timeout)
    try:
        publisher.init()
        # Fenced: another attempt of the unit snapshots now; that one's snapshot is as good.
        outcome = run(snapshot, publisher, fresh=True, renew=None)
    finally:
        publisher.close()
    if not outcome.committed or snapshot.manifest is None:
        raise RestoreIncomplete(f"{topic}[{version.unit}]: the snapshot of batch {version.batch} was not committed "
                                f"({outcome.status or outcome.message or 'no outcome'})")
    return snapshot.manifest


def _chunks(store: StateStore) -> Iterator[tuple[list[bytes], list[bytes]]]:
    keys: list[bytes] = []
    values: list[bytes] = []
    size = 0
    for key, value in store.items():
        keys.append(key)
        values.append(value)
        size += len(key) + len(value)
        if size >= CHUNK_BYTES or len(keys) >= CHUNK_KEYS:
            yield keys, values
            keys, values, size = [], [], 0
    if keys:
        yield keys, values


def latest_manifest(clients: KafkaClients, app_id: str, operator: str, unit: int,
                    timeout: float = 60.0) -> Manifest | None:
    """The newest committed snapshot's manifest, read backwards from the partition's end (the
    manifest is the last record of its transaction, so it is near the end)."""
    topic = snapshot_topic(app_id, operator)
    with partition.reader(clients, app_id) as reader:
        low, high = partition.bounds(reader, topic, unit, timeout)
    window = 2        # the newest manifest and its commit marker, unless an aborted snapshot follows
    while True:
        start = max(low, high - window)
        found: list[Manifest] = []

        def take(records: list, found: list[Manifest] = found) -> None:
            for record in records:
                if record.key() == MANIFEST and record.value() is not None:
                    found.append(Manifest.parse(record.value(), f"{topic}[{unit}]@{record.offset()}"))

        if start < high:
            with partition.reader(clients, app_id) as reader:   # a fresh one: no end event of the last window
                partition.read_to_end(reader, topic, unit, start, take, timeout)
        if found:
            manifest = found[-1]
            if manifest.operator != operator or manifest.unit != unit:
                raise ForeignStateRecord(f"{topic}[{unit}]: the newest snapshot manifest is of operator "
                                         f"{manifest.operator!r}, unit {manifest.unit}")
            return manifest
        if start <= low:
            return None
        window *= 8


def load_snapshot(clients: KafkaClients, app_id: str, manifest: Manifest, store: StateStore,
                  timeout: float = 120.0) -> int:
    """Load the snapshot `manifest` names into `store` (already emptied); returns the keys loaded."""
    topic = snapshot_topic(app_id, manifest.operator)
    if manifest.chunks == 0:
        return 0
    headers = HeaderReader(manifest.operator, manifest.unit, topic, HEADER)
    prefix = b"chunk/%d/" % manifest.batch
    state = {"chunks": 0, "keys": 0}

    def take(records: list) -> None:
        for record in records:
            key, value = record.key(), record.value()
            if value is None or not key.startswith(prefix) or state["chunks"] == manifest.chunks:
                continue
            if headers.batch_of(record) != manifest.batch:
                continue
            keys, values = snapshot_rows(value)
            store.load(zip(keys, values, strict=True))
            state["chunks"] += 1
            state["keys"] += len(keys)

    with partition.reader(clients, app_id) as reader:
        partition.read_to_end(reader, topic, manifest.unit, manifest.first_offset, take, timeout)
    if state["chunks"] != manifest.chunks or state["keys"] != manifest.keys:
        raise RestoreIncomplete(f"{topic}[{manifest.unit}]: the snapshot of batch {manifest.batch} has "
                                f"{state['chunks']} of its {manifest.chunks} chunks and {state['keys']} of its "
                                f"{manifest.keys} keys from offset {manifest.first_offset}")
    return state["keys"]
