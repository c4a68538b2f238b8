"""How many rows an Arrow batch from Spark's JVM to a Python worker holds (the publishing hop's input).

Spark 4 bounds such a batch at 64 MB (`spark.sql.execution.arrow.maxBytesPerBatch`) by measuring
it after every row it adds, and for nested columns (Kafka's `headers`) that measurement is the
costliest step of the hop. Rows per batch must stay large, though: the Avro encoder works a batch
at a time, and 64 MB over Kafka's 1 MB record limit would be 63 rows.

So, per batch (driver/loop.py): a run's first batch, and the one after any failed batch, keep
Spark's per-row check; after a clean batch the check is off and a batch holds 64 MB over 16 times
the largest record that batch read, at most 10,000 rows (Spark's default). Both are session
settings that Spark reads each time a job runs (the mapInArrow operator's runner is made per
execution, and the tasks get the session's SQL settings with the job), so the batch's job, built
once and run again, follows them without being built again (tests/spark/test_arrow_batches.py). A
record up to 16 times larger than any of the batch before still fits Spark's bound; a larger jump
makes one larger batch (the reader's own batches stay within 64 MB, task/reading.py), and should
that batch fail, its retry measures every row again. A user's own setting of either key is left
alone (docs/tuning.md, "Spark and JVM"). Wide batches keep Spark's check (their results do not
report record sizes).
"""
from __future__ import annotations

from typing import Any

BATCH_BYTES = 64 * 1024 * 1024          # Spark's own default bound
MAX_ROWS = 10_000                       # Spark's default maxRecordsPerBatch
HEADROOM = 16                           # how much larger than last batch's largest a record may be
MAX_BYTES_KEY = "spark.sql.execution.arrow.maxBytesPerBatch"
MAX_ROWS_KEY = "spark.sql.execution.arrow.maxRecordsPerBatch"
NO_BYTE_CHECK = str(2**31 - 1)          # Spark skips the per-row measurement at exactly Int.MaxValue
SPARK_BYTE_CHECK = str(BATCH_BYTES)


def rows_per_batch(largest_record: int) -> int:
    """Rows per Arrow batch after a batch whose largest record had `largest_record` bytes."""
    return max(1, min(MAX_ROWS, BATCH_BYTES // max(1, HEADROOM * largest_record)))


class ArrowBatches:
    """The session's Arrow batch settings, chosen before each batch from the last one's records."""

    def __init__(self, spark: Any) -> None:
        conf = spark.sparkContext.getConf()
        # txstream sets neither at start (spark/setup.py), so one in the SparkConf is the user's.
        self.users = conf.contains(MAX_BYTES_KEY) or conf.contains(MAX_ROWS_KEY)
        self.spark = spark
        self.rows: int | None = None   # rows per batch after the last clean batch; None: measure rows
        self._applied: tuple[str, str] | None = None

    def settings(self) -> tuple[str, str]:
        """(maxBytesPerBatch, maxRecordsPerBatch) for the next batch."""
        if not self.rows:
            return SPARK_BYTE_CHECK, str(MAX_ROWS)
        return NO_BYTE_CHECK, str(self.rows)

    def before_batch(self) -> None:
        if self.users:
            return
        wanted = self.settings()
        if wanted != self._applied:
            self.spark.conf.set(MAX_BYTES_KEY, wanted[0])
            self.spark.conf.set(MAX_ROWS_KEY, wanted[1])
            self._applied = wanted

    def after_batch(self, rows: list[dict] | None) -> None:
        """A finished batch's results (None: the batch failed)."""
        largest = max((int(row.get("largest_record") or 0) for row in rows or []), default=0)
        if not largest:   # a failed batch, or a wide one (no sizes): Spark's check again
            self.rows = None
            return
        self.rows = rows_per_batch(largest)
