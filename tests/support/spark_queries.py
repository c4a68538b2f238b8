"""Stateful queries run both by txstream (as a processor's transform) and by Spark Structured
Streaming itself (tests/support/spark_reference.py): input key = an id, value = the event time
in ms since the epoch, as text."""
from __future__ import annotations

from pyspark.sql import functions as F

from txstream import Processor


def _rows(frame):
    return frame.select(F.col("key").cast("string").alias("id"),
                        F.timestamp_millis(F.col("value").cast("string").cast("long")).alias("ts"))


def dedup_within_watermark(frame):
    """Each id once (its first row), a 10-second watermark."""
    unique = _rows(frame).withWatermark("ts", "10 seconds").dropDuplicatesWithinWatermark(["id"])
    return unique.select(F.col("id").alias("key"), F.unix_millis("ts").cast("string").alias("value"))


def windowed_counts(frame):
    """Rows per 10-second window of event time, a 5-second watermark, in append mode."""
    counted = (_rows(frame).withWatermark("ts", "5 seconds").groupBy(F.window("ts", "10 seconds"))
               .agg(F.count("*").alias("n")))
    return counted.select(F.unix_millis("window.start").cast("string").alias("key"),
                          F.col("n").cast("string").alias("value"))


LOOKUP = [(chr(ord("a") + i), i + 1) for i in range(26)]   # id -> weight


def lookup_frame(spark):
    """A static lookup DataFrame (what a processor's `setup` loads)."""
    return spark.createDataFrame(LOOKUP, "id string, weight long")


def joined_windows(frame, lookup):
    """A stream-static join, then rows and weights per 10-second window, a 5-second watermark
    (after the join: before an inner join Spark would count the rows without a partner toward it,
    which txstream refuses)."""
    joined = _rows(frame).join(lookup, "id").withWatermark("ts", "5 seconds")
    counted = joined.groupBy(F.window("ts", "10 seconds")).agg(F.count("*").alias("n"), F.sum("weight").alias("w"))
    return counted.select(F.unix_millis("window.start").cast("string").alias("key"),
                          F.concat_ws("/", "n", "w").alias("value"))


class JoinedWindows(Processor):
    output_mode = "append"

    def setup(self, spark):
        self.lookup = lookup_frame(spark)

    def transform(self, batch):
        return joined_windows(batch, self.lookup)


class DedupWithinWatermark(Processor):
    output_mode = "append"

    def transform(self, batch):
        return dedup_within_watermark(batch)


class WindowedCounts(Processor):
    output_mode = "append"

    def transform(self, batch):
        return windowed_counts(batch)
