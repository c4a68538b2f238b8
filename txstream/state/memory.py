"""The in-memory store: a dict, with a sorted key list rebuilt on the first scan after a change
(scans are rarer than point reads and writes in aggregation). For state that fits a worker's
memory; `rocks` spills to disk."""
from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator

from txstream.state.store import Change, StateStore, StoreVersion


class MemoryStore(StateStore):
    def __init__(self, unit: int) -> None:
        super().__init__(unit)
        self._data: dict[bytes, bytes] = {}
        self._sorted: list[bytes] | None = None
        self._bytes = 0

    def _get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def _scan(self, start: bytes, end: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        if self._sorted is None:
            self._sorted = sorted(self._data)
        keys = self._sorted
        for i in range(bisect.bisect_left(keys, start), len(keys)):
            key = keys[i]
            if end is not None and key >= end:
                return
            yield key, self._data[key]

    def _apply(self, changes: Iterable[Change], version: StoreVersion) -> None:
        data, size = self._data, self._bytes
        for key, value in changes:
            old = data.pop(key, None) if value is None else data.get(key)
            if old is not None:
                size -= len(key) + len(old)
            if value is not None:
                data[key] = value
                size += len(key) + len(value)
        self._bytes, self._sorted = size, None

    def _clear(self, version: StoreVersion) -> None:
        self._data, self._sorted, self._bytes = {}, None, 0

    def approximate_count(self) -> int:
        return len(self._data)

    def approximate_bytes(self) -> int:
        return self._bytes

    def close(self) -> None:
        self._clear(self._version)
