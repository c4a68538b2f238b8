"""The sink of a dry run: computes the transform over planned ranges and publishes nothing.

The driver's poison isolator (driver/poison.py) runs these to find the record a transform fails
on; a task here only counts the rows that reach it.
"""
from __future__ import annotations

from typing import Iterator

import pyarrow as pa

COUNT_SCHEMA = pa.schema([("rows", pa.int64())])


def count_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    total = sum(batch.num_rows for batch in batches)
    yield pa.RecordBatch.from_pylist([{"rows": total}], schema=COUNT_SCHEMA)
