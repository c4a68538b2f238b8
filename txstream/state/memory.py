"""The in-memory store: a dict, with a sorted key list rebuilt on the first scan after a change
(scans are rarer than point reads and writes in aggregation). For state that fits a worker's
memory; `rocks` spills to disk."""
from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Iterator

from txstream.state.store import Change, StateStore, StoreVersion


class MemoryStore(StateStore):
    def __init__(self, unit: int) -> None:
        super().__init__(unit)
        self._data: dict[bytes, bytes] = {}
        self._sorted: list[bytes] | None = None

    def _get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def _get_many(self, keys: list[bytes]) -> list[bytes | None]:
        return list(map(self._data.get, keys))

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
        # Last change per key first (a C-level dict build), then one update: a restore applies
        # millions of records, and a Python loop per record would bound its rate.
        latest = changes if isinstance(changes, dict) else dict(changes)
        gone = [key for key, value in latest.items() if value is None]
        self._data.update(latest)
        for key in gone:
            del self._data[key]
        self._sorted = None

    def _clear(self, version: StoreVersion) -> None:
        self._data, self._sorted = {}, None

    def approximate_count(self) -> int:
        return len(self._data)

    def approximate_bytes(self) -> int:
        """Keys and values, estimated from a sample of the keys."""
        sample = list(itertools.islice(self._data.items(), 1024))
        if not sample:
            return 0
        return len(self._data) * sum(len(k) + len(v) for k, v in sample) // len(sample)

    def close(self) -> None:
        self._clear(self._version)
