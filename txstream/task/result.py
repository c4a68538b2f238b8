"""What one task reports to the driver: a row of RESULT_SCHEMA (its outcomes: txstream/constants.py)."""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from txstream.constants import EMPTY

RESULT_SCHEMA = pa.schema([
    ("index", pa.int32()), ("status", pa.string()), ("records_in", pa.int64()),
    ("records_out", pa.int64()), ("dead_letters", pa.int64()), ("committed", pa.int64()),
    ("read_s", pa.float64()), ("upstream_s", pa.float64()), ("produce_s", pa.float64()), ("commit_s", pa.float64()),
    ("init_s", pa.float64()), ("attempts", pa.int32()), ("message", pa.string()),
    ("transactional_id", pa.string()), ("largest_record", pa.int64()),
    ("rows_merged", pa.int64()), ("late", pa.int64()), ("state_keys", pa.int64()),
    ("restore_s", pa.float64()), ("restore_records", pa.int64()),
])


def result_schema():
    """RESULT_SCHEMA for Spark. A StructType rather than DDL text, so Spark's SQL parser stays idle."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(RESULT_SCHEMA)


@dataclass
class TaskResult:
    index: int
    status: str = EMPTY
    records_in: int = 0
    records_out: int = 0
    dead_letters: int = 0
    committed: int = -1
    read_s: float = 0.0
    upstream_s: float = 0.0   # waiting for the transform's output (reading, JVM, transform)
    produce_s: float = 0.0    # encoding and producing it
    commit_s: float = 0.0
    init_s: float = 0.0
    attempts: int = 0
    message: str = ""
    transactional_id: str = ""   # the producer that published it (exactly-once)
    largest_record: int = 0      # bytes of the range's largest input record (key + value)
    # A stateful unit's (task/state_unit.py): input rows merged into its state, rows behind the
    # watermark, keys held after the batch (before its deletions), and its restore.
    rows_merged: int = 0
    late: int = 0
    state_keys: int = 0
    restore_s: float = 0.0
    restore_records: int = 0

    def to_batch(self) -> pa.RecordBatch:
        return results_batch([self])


def results_batch(results: list[TaskResult]) -> pa.RecordBatch:
    """The rows a task yields to the driver: one per range (or unit) it published."""
    return pa.RecordBatch.from_pylist([r.__dict__ for r in results], schema=RESULT_SCHEMA)
