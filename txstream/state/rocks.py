"""The store that spills to disk: RocksDB through `rocksdict`. Chosen by measurement
(benchmarks/experiments/state_store.py) over LMDB, sqlite3 and Arrow files: its compressed files
take a quarter of LMDB's and sqlite3's bytes per key on disk and it keeps far less in memory than
LMDB, with puts as fast; LMDB's quicker point reads come from mapping the whole file in memory.

Each load is one write batch holding the changes and the version (in the `meta` column family),
with atomic flush across the two families: whatever survives a crash is the state after some
committed batch, named by the version beside it. The write-ahead log is off: what a crash loses
is in the changelog, and a restore reads the tail after the version's offset.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from txstream.state.errors import StateStoreError
from txstream.state.store import Change, StateStore, StoreVersion

_META = "meta"
_VERSION = b"version"


class RocksStore(StateStore):
    def __init__(self, path: str, unit: int) -> None:
        super().__init__(unit)
        from rocksdict import Options, Rdict, WriteOptions

        options = Options(raw_mode=True)
        options.create_if_missing(True)
        options.create_missing_column_families(True)
        options.set_atomic_flush(True)
        self.path = path
        try:
            self._db = Rdict(path, options, column_families={_META: Options(raw_mode=True)})
        except Exception as exc:   # rocksdict raises plain Exception for RocksDB's errors
            raise StateStoreError(f"cannot open the state store in {path}: {exc}") from exc
        write = WriteOptions()
        write.disable_wal = True
        self._db.set_write_options(write)
        self._meta = self._db.get_column_family_handle(_META)
        stored = self._db.get_column_family(_META).get(_VERSION)
        if stored is not None:
            self._version = _parse_version(stored, path)
            if self._version.unit != unit:
                raise StateStoreError(f"the state store in {path} is unit {self._version.unit}'s, not unit {unit}'s")

    def _get(self, key: bytes) -> bytes | None:
        return self._db.get(key)

    def _get_many(self, keys: list[bytes]) -> list[bytes | None]:
        return self._db.get(keys) if keys else []   # a list of keys: RocksDB's MultiGet

    def _scan(self, start: bytes, end: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        for key, value in self._db.items(from_key=start or None):
            if end is not None and key >= end:
                return
            yield key, value

    def _apply(self, changes: Iterable[Change], version: StoreVersion) -> None:
        from rocksdict import WriteBatch

        batch = WriteBatch(raw_mode=True)
        put, delete = batch.put, batch.delete
        for key, value in changes:
            if value is None:
                delete(key)
            else:
                put(key, value)
        batch.put(_VERSION, _version_bytes(version), self._meta)
        self._write(batch)

    def _clear(self, version: StoreVersion) -> None:
        from rocksdict import WriteBatch

        batch = WriteBatch(raw_mode=True)
        last = next(iter(self._db.keys(backwards=True)), None)
        if last is not None:
            batch.delete_range(b"", last + b"\x00")
        batch.put(_VERSION, _version_bytes(version), self._meta)
        self._write(batch)

    def _write(self, batch: Any) -> None:
        try:
            self._db.write(batch)
        except Exception as exc:
            raise StateStoreError(f"cannot write the state store in {self.path}: {exc}") from exc

    def approximate_count(self) -> int:
        return self._db.property_int_value("rocksdb.estimate-num-keys") or 0

    def approximate_bytes(self) -> int:
        live = self._db.property_int_value("rocksdb.estimate-live-data-size") or 0
        return live + (self._db.property_int_value("rocksdb.cur-size-all-mem-tables") or 0)

    def close(self) -> None:
        """Flush and close; the files stay, and the next open resumes at their version."""
        db, self._db, self._meta = self._db, None, None
        if db is not None:
            db.flush()
            db.close()


def _version_bytes(version: StoreVersion) -> bytes:
    offset = -1 if version.changelog_offset is None else version.changelog_offset
    return b"%d/%d/%d" % (version.unit, version.batch, offset)


def _parse_version(value: bytes, path: str) -> StoreVersion:
    try:
        unit, batch, offset = (int(part) for part in value.split(b"/"))
    except ValueError as exc:
        raise StateStoreError(f"the state store in {path} has an unreadable version {value!r}") from exc
    return StoreVersion(unit, batch, None if offset < 0 else offset)
