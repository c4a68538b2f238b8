"""A stream-stream join's unit in Spark tasks: two `mapInArrow` bodies in one task, with a Spark
filter between them (operators/join.py; docs/joins.md).

`probe_unit` is unit `partitionId`'s first step: it brings the unit's state to its marker (as
task/state_unit.py does for every kind), reads the rows of both sides the batch's keys meet and
the rows the watermark expires, and yields the candidate pairs; it closes the store before it
yields, and leaves what the second step needs in the task's side dir. Spark's filter with the
join's condition keeps the pairs that match. `finish_unit` then decides the output (joined rows,
null-padded rows), the state's changes and the late rows, and leaves them, as every kind's merge
does, to the unit's publisher through the task's side file: they reach Kafka in the unit's
transaction.
"""
from __future__ import annotations

import time
import uuid
from typing import Any, Iterator

import pyarrow as pa

from txstream.errors import TransformError
from txstream.operators.base import MergeSpec
from txstream.operators.join import StreamStreamJoin
from txstream.task import worker_heap
from txstream.task.sidefile import MergeResult, current_task_attempt, state_file, take_probe, write_probe, write_state
from txstream.task.spec import FromJob, resolve
from txstream.task.state_unit import _save_pending, _snapshot_if_due, _store, _take_pending


def probe_unit(spec: MergeSpec | FromJob, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: the unit's candidate pairs of the batch."""
    worker_heap.settle()
    from pyspark import TaskContext

    from txstream.records import read_markers
    from txstream.state.restore import restore

    spec = resolve(spec)
    unit = TaskContext.get().partitionId()
    if state_file(spec.side_dir, spec.batch_id, current_task_attempt()).exists():
        raise TransformError(f"batch {spec.batch_id}: a second state merge in the task of unit {unit}: the transform "
                             "merges partitions after its stateful operator; keep what follows the join to selects "
                             "and filters")
    received = list(batches)
    markers = read_markers(spec.clients, spec.app_id, spec.description.units, spec.timeout_s)
    marker = markers[unit]
    if marker.done_through >= spec.batch_id:
        write_probe(spec.side_dir, spec.batch_id, None)   # published by an earlier attempt: nothing to merge
        return
    store, path = _store(spec, unit)
    try:
        started = time.perf_counter()
        _take_pending(spec, unit, store, path, marker)
        report = restore(spec.clients, spec.app_id, spec.operator, unit, store, marker,
                         reread_marker=lambda: read_markers(spec.clients, spec.app_id, spec.description.units,
                                                            spec.timeout_s)[unit],
                         timeout=spec.timeout_s)
        restored_s = time.perf_counter() - started
        snapshot_s = _snapshot_if_due(spec, unit, store, report)
        pairs, probed = StreamStreamJoin().probe(spec, store, pa.Table.from_batches(received) if received else None)
        write_probe(spec.side_dir, spec.batch_id, {"probed": probed, "path": path, "version": store.version,
                                                   "restore": (report.source, report.changelog_records, restored_s,
                                                               snapshot_s)})
    finally:
        store.close()
    if pairs.num_rows:
        yield from pairs.to_batches()


def finish_unit(spec: MergeSpec | FromJob, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: the matches of the unit's pairs; the batch's output and state changes."""
    worker_heap.settle()
    spec = resolve(spec)
    received = list(batches)   # the whole input first: the probe has closed the store by its end
    left = take_probe(spec.side_dir, spec.batch_id)
    if left is None:
        write_state(spec.side_dir, spec.batch_id, MergeResult.skipped())
        return
    probed = left["probed"]
    merged, changes = StreamStreamJoin().finish(spec, probed, pa.Table.from_batches(received) if received else None)
    attempt = uuid.uuid4().hex[:12]
    source, records, restored_s, snapshot_s = left["restore"]
    write_state(spec.side_dir, spec.batch_id, MergeResult(
        changes=changes, attempt=attempt, late=merged.late, events=merged.events, events_right=merged.events_right,
        emitted=[], expires=[], rows=merged.rows, keys=probed.keys, restore_source=source, restore_records=records,
        restore_s=restored_s, snapshot_s=snapshot_s))
    _save_pending(spec, left["path"], _Changes(changes, left["version"]), attempt)
    if merged.out is not None and merged.out.num_rows:
        yield from merged.out.to_batches()


class _Changes:
    """What `_save_pending` reads of a store: the batch's changes and the version they apply to."""

    def __init__(self, changes: dict[bytes, bytes | None], version: Any) -> None:
        self._changes, self.version = changes, version

    def changes(self) -> dict[bytes, bytes | None]:
        return self._changes
