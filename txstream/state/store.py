"""The interface of a state partition's local store, as Spark's StateStore providers and Kafka
Streams' KeyValueStore: one store per (operator, unit), bytes to bytes, kept sorted by key.

Writes of the running batch are buffered (`changes`) and read back by `get` and `scan`; the
merge hands them to the unit's transaction and then drops them (`abort`). They reach the
committed state only through `load`, from the changelog (a restore) or from the executor's
pending file once the unit's marker names their batch: the committed state is therefore always
the state after the batch in `version`, which a worker compares with the unit's marker.

A subclass supplies the committed state (`_get`, `_scan`, `_apply`, ...); the buffering, the
version rules and the merge of buffered writes into reads live here, once.
"""
from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from txstream.state.errors import StateStoreError

Change = tuple[bytes, "bytes | None"]     # a key and its new value; None deletes it


@dataclass(frozen=True)
class StoreVersion:
    """What a store holds: the state after `batch` (0: no batch yet) of `unit`. `changelog_offset`
    is the changelog offset this state covers (the next one to read), when known."""

    unit: int
    batch: int = 0
    changelog_offset: int | None = None


class StateStore(ABC):
    """get / put / delete / scan of one state partition; see the module docstring."""

    def __init__(self, unit: int) -> None:
        self._pending: dict[bytes, bytes | None] = {}
        self._version = StoreVersion(unit)

    # -- reads: the committed state with this batch's writes over it ----------------------------

    def get(self, key: bytes) -> bytes | None:
        if key in self._pending:
            return self._pending[key]
        return self._get(key)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """`get` of many keys in one call into the store (RocksDB's multi-get, a dict's C loop):
        a merge reads every key of its batch, and a call per key would cost more than the read."""
        found = self._get_many(keys)
        pending = self._pending
        if pending:
            found = [pending[k] if k in pending else v for k, v in zip(keys, found, strict=True)]
        return found

    def scan(self, prefix: bytes = b"", start: bytes | None = None, end: bytes | None = None) -> Iterator[Change]:
        """(key, value) in key order: keys starting with `prefix`, from `start` (included) to
        `end` (excluded) when given."""
        low = max(prefix, start) if start is not None else prefix
        pending = sorted((k, v) for k, v in self._pending.items()
                         if k.startswith(prefix) and k >= low and (end is None or k < end))
        committed = ((k, v) for k, v in self._scan(low, end) if k not in self._pending)
        if prefix:
            committed = _while_prefixed(committed, prefix)
        for key, value in heapq.merge(committed, pending, key=lambda kv: kv[0]):
            if value is not None:
                yield key, value

    def items(self) -> Iterator[Change]:
        return self.scan()

    # -- writes of the running batch ---------------------------------------------------------

    def put(self, key: bytes, value: bytes) -> None:
        if value is None:
            raise StateStoreError("put of None: use delete")
        self._pending[key] = value

    def delete(self, key: bytes) -> None:
        self._pending[key] = None

    def changes(self) -> dict[bytes, bytes | None]:
        """This batch's writes, last one per key: what goes to the changelog."""
        return self._pending

    def abort(self) -> None:
        """The unit's transaction aborted (or never began): forget this batch's writes."""
        self._pending = {}

    # -- restore: straight into the committed state ------------------------------------------

    @property
    def version(self) -> StoreVersion:
        return self._version

    def load(self, changes: Iterable[Change], version: StoreVersion | None = None) -> None:
        """Apply restored records (in changelog order) to the committed state, then take
        `version` when given. Refused with writes pending: restore happens between batches."""
        if self._pending:
            raise StateStoreError(f"unit {self._version.unit}: restore with {len(self._pending)} writes pending")
        self._apply(changes, version or self._version)
        if version is not None:
            self._version = version

    def replace(self, version: StoreVersion) -> None:
        """Drop the committed state (a stale local copy about to be replaced by a snapshot)."""
        self._pending = {}
        self._clear(version)
        self._version = version

    # -- what a store supplies ----------------------------------------------------------------

    @abstractmethod
    def _get(self, key: bytes) -> bytes | None: ...

    def _get_many(self, keys: list[bytes]) -> list[bytes | None]:
        return [self._get(key) for key in keys]

    @abstractmethod
    def _scan(self, start: bytes, end: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        """Committed (key, value) in key order, from `start` (included) to `end` (excluded)."""

    @abstractmethod
    def _apply(self, changes: Iterable[Change], version: StoreVersion) -> None:
        """Write the changes and the version, all or nothing where the store can."""

    @abstractmethod
    def _clear(self, version: StoreVersion) -> None: ...

    @abstractmethod
    def approximate_count(self) -> int:
        """Committed keys, estimated where counting would read everything."""

    @abstractmethod
    def approximate_bytes(self) -> int:
        """Bytes the committed state takes (keys and values; on disk for a disk store)."""

    @abstractmethod
    def close(self) -> None:
        """Release the store; a disk store keeps its files (a later open resumes from them)."""


def _while_prefixed(pairs: Iterator[tuple[bytes, bytes]], prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
    for key, value in pairs:
        if not key.startswith(prefix):
            return
        yield key, value
