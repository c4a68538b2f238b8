"""A test harness's stand-in for a unit's commit: the batch's changes go into the store as the
next batch's restore would bring them back from the changelog (the store has no commit of its own)."""
from __future__ import annotations

from txstream.state.store import StateStore, StoreVersion


def commit_batch(store: StateStore, batch_id: int) -> None:
    changes = dict(store.changes())
    store.abort()
    store.load(changes.items(), StoreVersion(store.version.unit, batch_id, store.version.changelog_offset))
