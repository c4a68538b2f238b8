"""A unit's pending file (task/state_unit.py): the changes one merge attempt left beside the
local copy, applied at the next batch only if that very attempt committed (issue 60 #13)."""
from __future__ import annotations

from typing import Any

from txstream.operators.base import MergeSpec
from txstream.records import Marker
from txstream.state.memory import MemoryStore
from txstream.task import state_unit


def _spec(batch_id: int) -> MergeSpec:
    return MergeSpec("app", None, "", batch_id, None, (), (), None)   # type: ignore[arg-type]


def test_a_failed_attempts_pending_changes_are_not_applied_after_another_attempt_committed(tmp_path: Any) -> None:
    """Attempt A merged batch 3 and left its changes pending, then failed; attempt B merged the
    batch again and committed it (the marker says batch 3 is done, by B). A's changes need not be
    B's: the next batch must restore from the changelog, not apply them."""
    path = tmp_path / "agg-epoch-0"
    merged = MemoryStore(0)
    merged.put(b"k", b"A's value")
    state_unit.save_pending(_spec(3), path, merged.changes(), merged.version.batch, "attempt-A")
    assert state_unit._pending_file(path).exists()  # noqa: SLF001

    copy = MemoryStore(0)   # the local copy, still at the state A merged into
    assert copy.version.batch == merged.version.batch
    committed_by_b = Marker(4, attempt="attempt-B")
    assert committed_by_b.done_through == 3
    assert not state_unit._take_pending(_spec(4), 0, copy, path, committed_by_b)  # noqa: SLF001
    assert copy.get(b"k") is None and not state_unit._pending_file(path).exists()  # noqa: SLF001


def test_the_marker_carries_the_attempt_that_committed() -> None:
    marker = Marker(4, "plan", 2, "h", "v", events=10, merged=2, late=0, attempt="attempt-B")
    assert Marker.decode(4, marker.encode()) == marker
    assert Marker.decode(4, "p=plan;r=2;h=h;v=v;x=10;m=2;l=0").attempt == ""   # a marker written before it
