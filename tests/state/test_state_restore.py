"""Restore of a unit's state from Kafka (txstream/state/restore.py), against the real broker: the
changelog written in the unit's transactions reads back as the state; a snapshot plus the tail
after it gives the same state as the whole changelog; tombstones delete; aborted batches never
appear; compaction (only the latest record per key left) changes nothing; and a record, snapshot
or local copy of a batch after the unit's marker stops the restore with a typed error."""
from __future__ import annotations

import gc
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

from txstream.errors import InfrastructureError
from txstream.fault_injection import InjectedFault
from txstream.kafka.config import KafkaClients
from txstream.records import Marker, markers_name, read_markers
from txstream.state import partition
from txstream.state.changelog import (
    CHANGELOG_CONFIG,
    SNAPSHOT_CONFIG,
    ChangelogWriter,
    changelog_end,
    changelog_topic,
    snapshot_topic,
    writer_header,
)
from txstream.state.errors import ForeignStateRecord, MarkerMovedDuringRestore, RestoreIncomplete, StateAheadOfMarker
from txstream.state.restore import restore
from txstream.state.snapshot import latest_manifest, write_snapshot
from txstream.state.store import StoreVersion
from txstream.state.stores import open_store

OPERATOR = "agg"
UNITS = 2


@pytest.fixture
def app(admin) -> str:
    """A fresh app: its changelog and snapshot topics for OPERATOR, and its markers topic."""
    app_id = f"state-{uuid.uuid4().hex[:8]}"
    topics = [NewTopic(changelog_topic(app_id, OPERATOR), UNITS, 1, config=CHANGELOG_CONFIG),
              NewTopic(snapshot_topic(app_id, OPERATOR), UNITS, 1, config=SNAPSHOT_CONFIG),
              NewTopic(markers_name(app_id), UNITS, 1)]
    for future in admin.create_topics(topics).values():
        future.result(30)
    yield app_id
    admin.delete_topics([t.topic for t in topics])


class Unit:
    """What the engine will do for one unit: its store, its transactional producer, and a batch
    = the store's writes produced to the changelog and committed (with the marker) or aborted."""

    def __init__(self, bootstrap: str, app_id: str, unit: int, store) -> None:
        self.clients, self.app_id, self.unit, self.store = KafkaClients(bootstrap), app_id, unit, store
        self.producer = Producer(self.clients.producer(**{"transactional.id": f"{app_id}-unit-{unit}"}))
        self.producer.init_transactions(30)
        self.writer = ChangelogWriter(app_id, OPERATOR, unit)
        group = Consumer(self.clients.consumer(markers_name(app_id), **{"enable.auto.commit": False}))
        self.markers_metadata = group.consumer_group_metadata()
        group.close()

    def batch(self, batch: int, puts: dict[bytes, bytes], deletes: tuple[bytes, ...] = (), commit: bool = True,
              marker: bool = True) -> None:
        for key, value in puts.items():
            self.store.put(key, value)
        for key in deletes:
            self.store.delete(key)
        self.producer.begin_transaction()
        self.writer.produce(self.producer, self.store.changes(), batch)
        if marker:
            self.producer.send_offsets_to_transaction(
                [TopicPartition(markers_name(self.app_id), self.unit, batch + 1)], self.markers_metadata, 30)
        if commit:
            self.producer.commit_transaction(30)
            changes = dict(self.store.changes())   # the engine's pending file, applied once committed
            self.store.abort()
            self.store.load(changes.items(), StoreVersion(self.unit, batch))
        else:
            self.producer.flush(30)    # an abort right after produce can fail fatally (librdkafka#4849)
            self.producer.abort_transaction(30)
            self.store.abort()

    def snapshot(self):
        return write_snapshot(self.clients, self.app_id, OPERATOR, self.store,
                              changelog_offset=changelog_end(self.clients, self.app_id, OPERATOR, self.unit))

    def marker(self) -> Marker:
        return read_markers(self.clients, self.app_id, UNITS)[self.unit]


def restored(unit: Unit, tmp_path, marker: Marker | None = None, kind: str = "memory", **kwargs):
    store = open_store(kind, str(tmp_path / f"restored-{uuid.uuid4().hex[:6]}"), unit.unit)
    report = restore(unit.clients, unit.app_id, OPERATOR, unit.unit, store, marker or unit.marker(), **kwargs)
    return store, report


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
def test_the_changelog_reads_back_as_the_state_of_the_marker_batch(kind, bootstrap_servers, app, tmp_path) -> None:
    unit = Unit(bootstrap_servers, app, 1, open_store("memory", None, 1))
    unit.batch(1, {b"k%03d" % i: b"v1-%d" % i for i in range(300)})
    unit.batch(2, {b"k%03d" % i: b"v2-%d" % i for i in range(0, 300, 3)}, deletes=(b"k001", b"k002"))
    assert unit.marker().done_through == 2
    store, report = restored(unit, tmp_path, kind=kind)
    try:
        assert list(store.items()) == list(unit.store.items())
        assert store.get(b"k001") is None and store.get(b"k003") == b"v2-3"
        assert report.source == "changelog" and report.changelog_records == 300 + 100 + 2
        assert store.version == StoreVersion(1, 2, report.changelog_to)
    finally:
        store.close()


def test_an_aborted_batch_never_reaches_the_restored_state(bootstrap_servers, app, tmp_path) -> None:
    unit = Unit(bootstrap_servers, app, 0, open_store("memory", None, 0))
    unit.batch(1, {b"a": b"1", b"b": b"1"})
    unit.batch(2, {b"a": b"aborted", b"c": b"aborted"}, deletes=(b"b",), commit=False)
    unit.batch(2, {b"a": b"2"})
    store, _ = restored(unit, tmp_path)
    assert list(store.items()) == [(b"a", b"2"), (b"b", b"1")] == list(unit.store.items())


def test_a_snapshot_plus_the_tail_after_it_equals_the_whole_changelog(bootstrap_servers, app, tmp_path) -> None:
    unit = Unit(bootstrap_servers, app, 0, open_store("memory", None, 0))
    unit.batch(1, {b"k%05d" % i: b"v1" for i in range(30_000)})
    unit.batch(2, {b"k%05d" % i: b"v2" for i in range(0, 30_000, 2)}, deletes=(b"k00001",))
    manifest = unit.snapshot()
    assert (manifest.batch, manifest.keys) == (2, 29_999) and manifest.chunks >= 1
    unit.batch(3, {b"k00003": b"v3", b"new": b"v3"}, deletes=(b"k00000", b"k00005"))
    store, report = restored(unit, tmp_path)
    assert list(store.items()) == list(unit.store.items())
    assert store.get(b"k00000") is None and store.get(b"k00001") is None and store.get(b"new") == b"v3"
    assert report.source == "snapshot of batch 2" and report.snapshot_keys == 29_999
    assert report.changelog_records == 4          # batch 3's records only: the tail
    whole = open_store("memory", None, 0)
    restore(unit.clients, app, OPERATOR, 0, whole, unit.marker())
    assert list(whole.items()) == list(store.items())


def test_a_newer_snapshot_replaces_the_previous_one_and_compaction_keeps_only_it(
        bootstrap_servers, app, tmp_path) -> None:
    unit = Unit(bootstrap_servers, app, 0, open_store("memory", None, 0))
    unit.batch(1, {b"k%05d" % i: b"x" * 40 for i in range(40_000)})
    first = unit.snapshot()
    unit.batch(2, {b"only": b"2"}, deletes=tuple(b"k%05d" % i for i in range(40_000)))
    second = unit.snapshot()
    assert first.chunks > 1 and (second.batch, second.keys, second.chunks) == (2, 1, 1)
    assert latest_manifest(unit.clients, app, OPERATOR, 0) == second
    # What compaction leaves of the snapshot partition: the latest record per key, tombstones gone.
    latest: dict[bytes, bytes | None] = {}
    for key, value in read_partition(bootstrap_servers, snapshot_topic(app, OPERATOR), 0):
        latest[key] = value
    assert sorted(k for k, v in latest.items() if v is not None) == [b"chunk/2/0", b"manifest"]
    store, report = restored(unit, tmp_path)
    assert list(store.items()) == [(b"only", b"2")] and report.snapshot_keys == 1


def test_restore_is_correct_after_compaction_left_only_the_latest_records(bootstrap_servers, app, tmp_path) -> None:
    """Compaction is simulated by writing only what it would leave: each key's latest record
    (tombstones included, as compaction keeps them for delete.retention.ms), in their order."""
    full = Unit(bootstrap_servers, app, 0, open_store("memory", None, 0))
    full.batch(1, {b"a": b"1", b"b": b"1", b"c": b"1"})
    full.batch(2, {b"a": b"2"}, deletes=(b"b",))
    full.batch(3, {b"c": b"3", b"d": b"3"})
    compacted = Unit(bootstrap_servers, app, 1, open_store("memory", None, 1))
    producer, writer = compacted.producer, compacted.writer
    producer.begin_transaction()
    for batch, changes in ((2, {b"a": b"2", b"b": None}), (3, {b"c": b"3", b"d": b"3"})):
        for key, value, headers in writer.records(changes, batch):
            producer.produce(writer.topic, value, key, partition=1, headers=headers)
    producer.send_offsets_to_transaction([TopicPartition(markers_name(app), 1, 4)], compacted.markers_metadata, 30)
    producer.commit_transaction(30)
    store, _ = restored(compacted, tmp_path)
    assert list(store.items()) == list(full.store.items()) == [(b"a", b"2"), (b"c", b"3"), (b"d", b"3")]


def test_a_changelog_record_newer_than_the_marker_makes_restore_refuse(bootstrap_servers, app, tmp_path) -> None:
    unit = Unit(bootstrap_servers, app, 0, open_store("memory", None, 0))
    unit.batch(1, {b"a": b"1"})
    unit.batch(2, {b"a": b"2"}, marker=False)      # the changelog says 2, the marker still 1
    assert unit.marker().done_through == 1
    with pytest.raises(StateAheadOfMarker, match=r"changelog record at offset \d+ is of batch 2, but the unit's "
                                                 r"marker says batch 1") as refused:
        restored(unit, tmp_path)
    assert (refused.value.batch, refused.value.marker_batch, refused.value.unit) == (2, 1, 0)


def test_a_marker_that_moved_during_the_restore_is_retried_not_refused(bootstrap_servers, app, tmp_path) -> None:
    unit = Unit(bootstrap_servers, app, 0, open_store("memory", None, 0))
    unit.batch(1, {b"a": b"1"})
    before = unit.marker()
    unit.batch(2, {b"a": b"2"})                    # another attempt committed batch 2 meanwhile
    with pytest.raises(MarkerMovedDuringRestore, match="marker moved from batch 1 to 2"):
        restored(unit, tmp_path, marker=before, reread_marker=unit.marker)
    store, _ = restored(unit, tmp_path, reread_marker=unit.marker)
    assert store.get(b"a") == b"2"


def test_a_snapshot_or_local_copy_newer_than_the_marker_makes_restore_refuse(bootstrap_servers, app, tmp_path) -> None:
    unit = Unit(bootstrap_servers, app, 0, open_store("memory", None, 0))
    unit.batch(1, {b"a": b"1"})
    unit.batch(2, {b"a": b"2"})
    unit.snapshot()
    with pytest.raises(StateAheadOfMarker, match="the newest snapshot is of batch 2, but the unit's marker says batch 1"):
        restored(unit, tmp_path, marker=Marker(2))
    with pytest.raises(StateAheadOfMarker, match="this worker's copy is of batch 2"):
        restore(unit.clients, app, OPERATOR, 0, unit.store, Marker(2))


def test_a_local_copy_resumes_from_its_offset_without_reading_the_history(bootstrap_servers, app, tmp_path) -> None:
    """A worker's disk store survives its process: after a crash the next restore reads only the
    batches committed since, from the offset the store recorded."""
    unit = Unit(bootstrap_servers, app, 0, open_store("memory", None, 0))
    unit.batch(1, {b"k%04d" % i: b"1" for i in range(2000)})
    local = open_store("rocksdb", str(tmp_path / "local"), 0)
    restore(unit.clients, app, OPERATOR, 0, local, unit.marker())
    local.close()                                   # the worker stops; another one goes on
    unit.batch(2, {b"k0000": b"2"}, deletes=(b"k0001",))
    local = open_store("rocksdb", str(tmp_path / "local"), 0)
    try:
        assert local.version.batch == 1
        report = restore(unit.clients, app, OPERATOR, 0, local, unit.marker())
        assert report.source == "local copy" and report.changelog_records == 2
        assert list(local.items()) == list(unit.store.items())
        assert local.version.batch == 2
    finally:
        local.close()


def test_records_another_unit_wrote_into_this_partition_are_refused(bootstrap_servers, app, tmp_path) -> None:
    unit = Unit(bootstrap_servers, app, 0, open_store("memory", None, 0))
    unit.producer.begin_transaction()
    unit.producer.produce(changelog_topic(app, OPERATOR), b"v", b"k", partition=0,
                          headers=[("txstream.state", writer_header(OPERATOR, 1, 1))])
    unit.producer.commit_transaction(30)
    with pytest.raises(ForeignStateRecord, match="written by operator 'agg', unit 1"):
        restored(unit, tmp_path, marker=Marker(2))


def read_partition(bootstrap: str, topic: str, partition: int) -> list[tuple[bytes, bytes | None]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe", "isolation.level": "read_committed",
                         "enable.partition.eof": True, "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, partition, 0)])
    records = []
    try:
        while True:
            message = consumer.poll(30)
            assert message is not None, f"no end of {topic}[{partition}] within 30 s"
            if message.error():
                return records
            records.append((message.key(), message.value()))
    finally:
        consumer.close()


def test_the_newest_snapshot_is_found_behind_an_aborted_one(bootstrap_servers, app, tmp_path) -> None:
    """The manifest is searched backwards from the partition's end in growing windows: an aborted
    snapshot after it (its records still take offsets) pushes it back past the first window."""
    unit = Unit(bootstrap_servers, app, 0, open_store("memory", None, 0))
    unit.batch(1, {b"a": b"1"})
    written = unit.snapshot()
    unit.producer.begin_transaction()
    for n in range(300):
        unit.producer.produce(snapshot_topic(app, OPERATOR), b"x", b"chunk/9/%d" % n, partition=0)
    unit.producer.flush(30)        # an abort right after produce can fail fatally (librdkafka#4849)
    unit.producer.abort_transaction(30)
    assert latest_manifest(unit.clients, app, OPERATOR, 0) == written
    store, report = restored(unit, tmp_path)
    assert report.source == "snapshot of batch 1" and list(store.items()) == [(b"a", b"1")]


def test_a_restore_right_after_a_commit_has_the_batch_just_committed(bootstrap_servers, app, tmp_path) -> None:
    """commit_transaction returns before the commit marker is written: until it is, a
    read_committed consumer's end of the partition is before the batch. Restore reads to the
    high watermark instead, so the batch the marker names is always there, and so is the
    snapshot's covered offset (taken from the high watermark too)."""
    unit = Unit(bootstrap_servers, app, 0, open_store("memory", None, 0))
    local = open_store("memory", None, 0)
    for batch in range(1, 11):
        unit.batch(batch, {b"k%d" % batch: b"%d" % batch, b"last": b"%d" % batch})
        if batch == 5:
            manifest = unit.snapshot()
            assert manifest.changelog_offset >= 14      # batch 5 wrote offsets 12 and 13 (3 offsets a batch)
        restore(unit.clients, app, OPERATOR, 0, local, unit.marker())
        assert local.get(b"last") == b"%d" % batch and local.version.batch == batch
    assert list(local.items()) == list(unit.store.items())


def _open_producers() -> int:
    """Producers alive in this process (a closed one refuses every call)."""
    gc.collect()
    alive = 0
    for producer in [o for o in gc.get_objects() if isinstance(o, Producer)]:
        try:
            len(producer)
            alive += 1
        except RuntimeError:
            pass
    return alive


def test_a_snapshot_is_a_transaction_of_the_engine_and_releases_its_producer(bootstrap_servers, app, tmp_path,
                                                                              monkeypatch) -> None:
    """write_snapshot runs one attempt of kafka/transactions.py on a producer of its own, closed
    after it, whether it committed or not; a failure before the commit aborts, and the previous
    snapshot stays the newest."""
    unit = Unit(bootstrap_servers, app, 0, open_store("memory", None, 0))
    unit.batch(1, {b"a": b"1"})
    before = _open_producers()
    first = unit.snapshot()
    assert latest_manifest(unit.clients, app, OPERATOR, 0) == first
    assert _open_producers() == before
    unit.batch(2, {b"a": b"2", b"b": b"2"})

    def fail(point: str, detail: object = None) -> None:
        if point == "state.before_snapshot_commit":
            raise InjectedFault(point)

    monkeypatch.setattr("txstream.state.snapshot.fault_injection.maybe_fail", fail)
    with pytest.raises(InjectedFault):
        unit.snapshot()
    assert _open_producers() == before
    assert latest_manifest(unit.clients, app, OPERATOR, 0) == first
    store, report = restored(unit, tmp_path)
    assert report.source == "snapshot of batch 1" and list(store.items()) == [(b"a", b"2"), (b"b", b"2")]


def test_a_read_that_cannot_reach_the_end_fails_instead_of_returning_a_part(bootstrap_servers, app) -> None:
    """The one read-to-end reader (state/partition.py over kafka/scan.py): behind a transaction
    left open, read_committed cannot reach the high watermark; the read raises a typed
    InfrastructureError, never returns what it read as the whole (issue 60: a description read
    that timed out wrote a new epoch)."""
    unit = Unit(bootstrap_servers, app, 0, open_store("memory", None, 0))
    unit.batch(1, {b"a": b"1"})
    unit.producer.begin_transaction()
    unit.writer.produce(unit.producer, {b"b": b"open"}, 2)
    unit.producer.flush(30)
    seen: list[bytes] = []
    try:
        with partition.reader(unit.clients, app) as reader, pytest.raises(RestoreIncomplete) as refused:
            partition.read_to_end(reader, changelog_topic(app, OPERATOR), 0, None,
                                  lambda records: seen.extend(r.key() for r in records), 3)
        assert isinstance(refused.value, InfrastructureError) and seen == [b"a"]
    finally:
        unit.producer.abort_transaction(30)
