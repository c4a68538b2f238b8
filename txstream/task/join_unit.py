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

import uuid
from typing import Iterator

import pyarrow as pa

from txstream.operators.base import MergeSpec
from txstream.operators.join import StreamStreamJoin
from txstream.task import worker_heap
from txstream.task.sidefile import MergeResult, take_probe, write_probe, write_state
from txstream.task.spec import FromJob, resolve
from txstream.task.state_unit import open_unit, save_pending, unit_to_merge


def probe_unit(spec: MergeSpec | FromJob, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: the unit's candidate pairs of the batch."""
    worker_heap.settle()
    from pyspark import TaskContext

    spec = resolve(spec)
    unit = TaskContext.get().partitionId()
    received = list(batches)
    marker = unit_to_merge(spec, unit, "join")
    if marker is None:
        write_probe(spec.side_dir, spec.batch_id, None)   # published by an earlier attempt: nothing to merge
        return
    opened = open_unit(spec, unit, marker)
    try:
        pairs, probed = StreamStreamJoin().probe(spec, opened.store,
                                                 pa.Table.from_batches(received) if received else None)
        write_probe(spec.side_dir, spec.batch_id, {"probed": probed, "path": opened.path, "restore": (
            opened.report.source, opened.report.changelog_records, opened.restored_s, opened.snapshot_s)})
    finally:
        opened.store.close()
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
    save_pending(spec, left["path"], changes, probed.base_batch, attempt)
    if merged.out is not None and merged.out.num_rows:
        yield from merged.out.to_batches()

