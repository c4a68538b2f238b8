"""Stateful processors over numbered input (tests/support/seeding.py: record n, key `k<n>`), whose
exact results tests can compute from the numbers alone (docs/state.md)."""
from __future__ import annotations

import json
from collections import Counter, defaultdict

from pyspark.sql import functions as F

from txstream import Processor

BUCKETS = 37
WINDOW_MS = 10_000      # record n happens at n * EVENT_MS: 1,000 records per window
EVENT_MS = 10
DELAY = "2 seconds"


def _n():
    return F.expr("cast(substring(cast(key as string), 2) as long)")


class BucketRunningTotals(Processor):
    """Per bucket (n mod 37): how many records and the sum of their n, since the app began."""

    output_mode = "update"

    def transform(self, batch):
        return (batch.select(_n().alias("n")).withColumn("bucket", F.col("n") % BUCKETS)
                .groupBy("bucket").agg(F.count("*").alias("count"), F.sum("n").alias("sum"))
                .select(F.col("bucket").cast("string").alias("key"), F.to_json(F.struct("count", "sum")).alias("value")))


class BucketWindows(Processor):
    """Per 10-second window of event time (n * 10 ms) and bucket (n mod 5): count and sum."""

    output_mode = "append"

    def transform(self, batch):
        rows = batch.select(_n().alias("n")).select("n", (F.col("n") % 5).alias("bucket"),
                                                    F.timestamp_millis(F.col("n") * EVENT_MS).alias("ts"))
        windows = (rows.withWatermark("ts", DELAY).groupBy(F.window("ts", "10 seconds"), "bucket")
                   .agg(F.count("*").alias("count"), F.sum("n").alias("sum")))
        return windows.select(F.col("bucket").cast("string").alias("key"), F.to_json(F.struct(
            F.unix_millis(F.col("window.start")).alias("start"), "bucket", "count", "sum")).alias("value"))


class NumberDedup(Processor):
    """Each number once, whatever copies of it the input holds (dropDuplicatesWithinWatermark on
    n, event time n * 10 ms, a 1-hour watermark: every copy arrives within it, batches later)."""

    output_mode = "append"

    def transform(self, batch):
        rows = batch.select(_n().alias("n")).select("n", F.timestamp_millis(F.col("n") * EVENT_MS).alias("ts"))
        unique = rows.withWatermark("ts", "1 hour").dropDuplicatesWithinWatermark(["n"])
        return unique.select(F.col("n").cast("string").alias("key"), F.col("n").cast("string").alias("value"))


def late_number(record) -> int:
    """The number of a late record's dead letter: the input record as read (key `k<n>`), which
    names its source."""
    assert record.headers.get("txstream.dlq.source"), record.headers
    return int(record.key.decode()[1:])


def dedup_check(records: list, late: list, numbers: range) -> list[str]:
    """Problems with a NumberDedup output: every number exactly once, in the output or (late) in
    the dead-letter topic."""
    seen = Counter(int(r.value) for r in records)
    late_numbers = Counter(late_number(r) for r in late)
    problems = [f"{n} emitted {c} times" for n, c in seen.items() if c > 1]
    problems += [f"{n} missing" for n in numbers if n not in seen and n not in late_numbers][:20]
    return problems


def running_totals_check(records: list, numbers: range) -> list[str]:
    """Problems with a BucketRunningTotals output: per bucket, the updates a read_committed reader
    sees must strictly increase and the last must equal the exact total."""
    want_count: Counter = Counter()
    want_sum: Counter = Counter()
    for n in numbers:
        want_count[str(n % BUCKETS)] += 1
        want_sum[str(n % BUCKETS)] += n
    last: dict[str, tuple[int, int]] = {}
    problems = []
    for r in records:
        v = json.loads(r.value)
        bucket = r.key.decode()
        before = last.get(bucket)
        if before is not None and v["count"] <= before[0]:
            problems.append(f"bucket {bucket}: update {v} after {before}")
        last[bucket] = (v["count"], v["sum"])
    for bucket in want_count:
        if last.get(bucket) != (want_count[bucket], want_sum[bucket]):
            problems.append(f"bucket {bucket}: last {last.get(bucket)}, exact {(want_count[bucket], want_sum[bucket])}")
    return problems


def windows_check(records: list, late: list, numbers: range, watermark_ms: int) -> list[str]:
    """Problems with a BucketWindows output: every (window, bucket) the final watermark closed is
    emitted exactly once, and its count and sum plus its late records (in the dead-letter topic)
    are exactly the input's; none is emitted early."""
    want: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])
    for n in numbers:
        key = (n * EVENT_MS // WINDOW_MS * WINDOW_MS, n % 5)
        want[key][0] += 1
        want[key][1] += n
    for r in late:
        n = late_number(r)
        key = (n * EVENT_MS // WINDOW_MS * WINDOW_MS, n % 5)
        want[key][0] -= 1
        want[key][1] -= n
    emitted: Counter = Counter()
    problems = []
    for r in records:
        v = json.loads(r.value)
        key = (v["start"], v["bucket"])
        emitted[key] += 1
        if key[0] + WINDOW_MS > watermark_ms:
            problems.append(f"window {key} emitted before the watermark {watermark_ms} closed it")
        elif [v["count"], v["sum"]] != want[key]:
            problems.append(f"window {key}: emitted {(v['count'], v['sum'])}, exact {tuple(want[key])}")
    problems += [f"window {k} emitted {n} times" for k, n in emitted.items() if n > 1]
    closed = {k for k in want if k[0] + WINDOW_MS <= watermark_ms and want[k][0] > 0}
    problems += [f"window {k} closed and never emitted" for k in sorted(closed - set(emitted))]
    return problems
