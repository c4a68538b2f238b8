"""The sink of a dry run: computes the transform over planned ranges and publishes nothing.

The driver's poison isolator (driver/poison.py) runs these to find the record a transform fails
on; a task here only counts the rows that reach it, and takes the reader's side file (which
says nothing a dry run needs) so that it does not stay behind.
"""
from __future__ import annotations

from typing import Iterator

import pyarrow as pa

from txstream.task.sidefile import read_side_file
from txstream.task.spec import FromJob, ReadSpec, resolve

COUNT_SCHEMA = pa.schema([("rows", pa.int64())])


def count_rows(spec: ReadSpec | FromJob, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    from pyspark import TaskContext

    spec = resolve(spec)
    total = sum(batch.num_rows for batch in batches)
    read_side_file(spec.side_dir, spec.batch_id, spec.plan_at(TaskContext.get().partitionId()))
    yield pa.RecordBatch.from_pylist([{"rows": total}], schema=COUNT_SCHEMA)
