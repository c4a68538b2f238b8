"""The local state stores (txstream/state/): both the in-memory store and RocksDB behave alike —
a batch's writes are read back before they commit, reach the state only when the batch commits,
and vanish on abort; scans merge them in key order; the disk store resumes at its version after
a reopen. Also the state row and snapshot chunk encodings, and the changelog header's checks."""
from __future__ import annotations

import pytest

from txstream.errors import Decision, decide
from txstream.state.changelog import ChangelogWriter, HeaderReader, writer_header
from txstream.state.codec import StateCodec, snapshot_chunk, snapshot_rows
from txstream.state.errors import (
    ForeignStateRecord,
    MarkerMovedDuringRestore,
    RestoreIncomplete,
    StateAheadOfMarker,
    StateDecodeError,
    StateStoreError,
)
from txstream.state.store import StoreVersion
from txstream.state.stores import open_store

SCHEMA = {"type": "record", "name": "state", "fields": [{"name": "count", "type": "long"},
                                                        {"name": "sum", "type": "double"}]}


def committed(store, batch: int, changelog_offset: int | None = None) -> None:
    """What the engine does once a batch's transaction committed: its writes, dropped from the
    buffer, are loaded into the committed state with the batch's version."""
    changes = dict(store.changes())
    store.abort()
    store.load(changes.items(), StoreVersion(store.version.unit, batch, changelog_offset))


@pytest.fixture(params=["memory", "rocksdb"])
def make_store(request, tmp_path):
    opened = []

    def make(unit: int = 0, path: str = "db"):
        store = open_store(request.param, str(tmp_path / path), unit)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


def test_a_batchs_writes_are_read_back_before_commit_and_kept_after(make_store) -> None:
    store = make_store()
    store.put(b"a", b"1")
    store.put(b"b", b"2")
    store.delete(b"b")
    assert (store.get(b"a"), store.get(b"b")) == (b"1", None)
    assert store.changes() == {b"a": b"1", b"b": None}
    committed(store, 1, changelog_offset=2)
    assert store.version == StoreVersion(0, 1, 2)
    assert store.changes() == {}
    assert (store.get(b"a"), store.get(b"b")) == (b"1", None)


def test_get_many_reads_the_committed_state_under_the_batchs_writes(make_store) -> None:
    store = make_store()
    store.put(b"a", b"1")
    store.put(b"b", b"2")
    committed(store, 1)
    assert store.get_many([]) == []
    store.put(b"c", b"3")
    store.delete(b"a")
    keys = [b"a", b"b", b"c", b"d", b"b"]
    assert store.get_many(keys) == [store.get(k) for k in keys] == [None, b"2", b"3", None, b"2"]


def test_count_and_bytes_are_estimated_from_the_committed_state(make_store) -> None:
    store = make_store()
    for i in range(1000):
        store.put(b"key-%04d" % i, b"v" * 10)
    assert store.approximate_count() == 0        # pending writes are not state yet
    committed(store, 1)
    assert 900 <= store.approximate_count() <= 1100
    assert store.approximate_bytes() >= 1000 * 18


def test_abort_discards_the_batch_and_keeps_the_state_after_the_last_commit(make_store) -> None:
    store = make_store()
    store.put(b"a", b"1")
    store.put(b"b", b"2")
    committed(store, 1)
    store.put(b"a", b"changed")
    store.delete(b"b")
    store.put(b"c", b"new")
    store.abort()
    assert store.version.batch == 1
    assert list(store.items()) == [(b"a", b"1"), (b"b", b"2")]
    assert store.changes() == {}


def test_scans_merge_pending_writes_and_deletes_in_key_order(make_store) -> None:
    store = make_store()
    for key in (b"w1/a", b"w1/c", b"w2/a", b"w2/b", b"x"):
        store.put(key, key.upper())
    committed(store, 1)
    store.put(b"w1/b", b"pending")
    store.delete(b"w1/c")
    store.put(b"w2/0", b"pending")
    assert list(store.scan(b"w1/")) == [(b"w1/a", b"W1/A"), (b"w1/b", b"pending")]
    assert [k for k, _ in store.scan(b"w2/")] == [b"w2/0", b"w2/a", b"w2/b"]
    assert [k for k, _ in store.scan(start=b"w1/b", end=b"w2/b")] == [b"w1/b", b"w2/0", b"w2/a"]
    assert [k for k, _ in store.scan(b"w2/", start=b"w2/a")] == [b"w2/a", b"w2/b"]
    assert [k for k, _ in store.items()] == [b"w1/a", b"w1/b", b"w2/0", b"w2/a", b"w2/b", b"x"]
    assert list(store.scan(b"zz")) == []


def test_a_load_with_writes_pending_is_refused(make_store) -> None:
    store = make_store()
    committed(store, 3)
    store.put(b"a", b"1")
    with pytest.raises(StateStoreError, match="writes pending"):
        store.load([(b"b", b"2")])


def test_load_and_replace_write_the_committed_state_directly(make_store) -> None:
    store = make_store(unit=2)
    store.load([(b"a", b"1"), (b"b", b"2"), (b"a", None)], StoreVersion(2, 5, 40))
    assert list(store.items()) == [(b"b", b"2")] and store.version == StoreVersion(2, 5, 40)
    assert store.approximate_bytes() > 0
    store.replace(StoreVersion(2))
    assert list(store.items()) == [] and store.version == StoreVersion(2)


def test_the_disk_store_resumes_at_its_version_after_a_reopen(tmp_path) -> None:
    store = open_store("rocksdb", str(tmp_path / "db"), 4)
    store.put(b"a", b"1")
    committed(store, 7, changelog_offset=12)
    store.put(b"b", b"never committed")
    store.close()
    again = open_store("rocksdb", str(tmp_path / "db"), 4)
    try:
        assert again.version == StoreVersion(4, 7, 12)
        assert list(again.items()) == [(b"a", b"1")]
    finally:
        again.close()
    with pytest.raises(StateStoreError, match="unit 4's, not unit 5's"):
        open_store("rocksdb", str(tmp_path / "db"), 5)


def test_an_unknown_store_kind_is_refused(tmp_path) -> None:
    with pytest.raises(StateStoreError, match="unknown state store 'hash'"):
        open_store("hash", str(tmp_path), 0)


def test_state_rows_round_trip_and_a_foreign_value_is_a_decode_error() -> None:
    codec = StateCodec(SCHEMA)
    encoded = codec.encode({"count": 3, "sum": 2.5})
    assert codec.decode(encoded) == {"count": 3, "sum": 2.5}
    assert len(encoded) == 9        # zig-zag varint count, 8-byte double
    with pytest.raises(StateDecodeError, match="does not read with the state schema"):
        codec.decode(b"\x01")


def test_snapshot_chunks_round_trip() -> None:
    keys, values = [b"k%d" % i for i in range(1000)], [b"v%d" % i for i in range(1000)]
    assert snapshot_rows(snapshot_chunk(keys, values)) == (keys, values)
    with pytest.raises(StateDecodeError, match="not an Arrow stream"):
        snapshot_rows(b"garbage")


def test_changelog_records_name_their_writer_and_tombstones_have_no_value() -> None:
    writer = ChangelogWriter("app", "agg", 3)
    records = list(writer.records({b"a": b"1", b"b": None}, batch=9))
    assert writer.topic == "app.agg.changelog"
    assert records == [(b"a", b"1", [("txstream.state", b"agg/9/3")]), (b"b", None, [("txstream.state", b"agg/9/3")])]
    reader = HeaderReader("agg", 3, writer.topic)
    assert reader.batch_of(Record(records[0][2], 0)) == 9


@pytest.mark.parametrize("headers, message", [
    (None, "has no txstream.state header"),
    ([("txstream.state", writer_header("other", 1, 3))], "written by operator 'other', unit 3"),
    ([("txstream.state", writer_header("agg", 1, 4))], "written by operator 'agg', unit 4"),
    ([("txstream.state", b"agg/x/3")], "unreadable txstream.state header"),
])
def test_a_record_another_writer_wrote_is_refused(headers, message) -> None:
    with pytest.raises(ForeignStateRecord, match=message):
        HeaderReader("agg", 3, "app.agg.changelog").batch_of(Record(headers, 17))


class Record:
    """The two things a header check reads of a confluent_kafka Message."""

    def __init__(self, headers, offset: int) -> None:
        self._headers, self._offset = headers, offset

    def headers(self):
        return self._headers

    def offset(self) -> int:
        return self._offset


def test_state_errors_fall_into_the_taxonomy() -> None:
    assert decide(StateAheadOfMarker("x", 5, 4, "agg", 0)) is Decision.STOP
    assert decide(ForeignStateRecord("x")) is Decision.STOP
    assert decide(StateDecodeError("x")) is Decision.STOP
    assert decide(StateStoreError("x")) is Decision.RETRY
    assert decide(RestoreIncomplete("x")) is Decision.RETRY
    assert decide(MarkerMovedDuringRestore("x")) is Decision.RETRY
    assert "txstream state reset" in str(StateAheadOfMarker("a changelog record", 5, 4, "agg", 0))
