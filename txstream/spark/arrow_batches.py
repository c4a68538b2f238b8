"""How many rows an Arrow batch from Spark's JVM to a Python worker holds (the publishing hop's input).

Spark 4 bounds such a batch at 64 MB (`spark.sql.execution.arrow.maxBytesPerBatch`) by measuring
it after every row it adds. For nested columns (Kafka's `headers`, an array of structs in a
value) that measurement is the costliest step of the hop: measured in one sitting, 200,000
records of 100 B through a pass-through that keeps `headers`, local[2]: 13.5 / 9.9 s with the
per-row check, 6.5 / 6.2 s without it, 7.0 / 6.1 s with it replaced by 256 rows per batch, and
7.3 / 7.3 s by 16 rows (2 runs each).

So txstream bounds a batch by rows instead: 64 MB over the largest record the input topics accept
(their `max.message.bytes`), and at most Spark's 10,000 rows. With the broker's default limit
(1 MB) that is 64 rows; with 100 KB records allowed, 671. The bound holds for output rows no
larger than the largest input record; a transform that joins larger data in sets either setting
itself (`--conf`), and txstream then leaves that one alone (spark/setup.py). Where the topics'
limits cannot be read (no DescribeConfigs permission), Spark's own per-row check stays.
"""
from __future__ import annotations

BATCH_BYTES = 64 * 1024 * 1024          # Spark's own default bound
MAX_ROWS = 10_000                       # Spark's default maxRecordsPerBatch
MAX_BYTES_KEY = "spark.sql.execution.arrow.maxBytesPerBatch"
MAX_ROWS_KEY = "spark.sql.execution.arrow.maxRecordsPerBatch"
NO_BYTE_CHECK = str(2**31 - 1)          # Spark skips the per-row measurement at exactly Int.MaxValue


def rows_per_batch(largest_record: int) -> int:
    """Rows per Arrow batch for records of at most `largest_record` bytes."""
    return max(1, min(MAX_ROWS, BATCH_BYTES // max(1, largest_record)))


def arrow_defaults(largest_record: int | None) -> dict[str, str]:
    """txstream's Arrow batch settings (each applied only where the user set nothing)."""
    if not largest_record:
        return {MAX_ROWS_KEY: str(MAX_ROWS)}
    return {MAX_BYTES_KEY: NO_BYTE_CHECK, MAX_ROWS_KEY: str(rows_per_batch(largest_record))}
