"""Opening a state store by kind: the one place that knows every implementation (store.py, the
interface, knows none of them)."""
from __future__ import annotations

from txstream.state.errors import StateStoreError
from txstream.state.memory import MemoryStore
from txstream.state.store import StateStore


def open_store(kind: str, path: str | None, unit: int) -> StateStore:
    """A store of `kind` ("memory" or "rocksdb") for `unit`; `path` is the disk store's directory."""
    if kind == "memory":
        return MemoryStore(unit)
    if kind == "rocksdb":
        from txstream.state.rocks import RocksStore  # rocksdict loads only when a disk store is asked for

        if not path:
            raise StateStoreError("the rocksdb store needs a directory")
        return RocksStore(path, unit)
    raise StateStoreError(f"unknown state store {kind!r}: memory or rocksdb")
