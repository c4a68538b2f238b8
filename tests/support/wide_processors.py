"""Wide processors for the tests (raw keys `k<n>`, as tests/support/seeding.py numbers them), and the
reconciliation their output must pass: per bucket, the counts and sums over every output record
equal the input's."""
from __future__ import annotations

import json
from collections import Counter

from pyspark.sql import functions as F

from txstream import Processor

BUCKETS = 37


def _n(batch):
    return F.expr("cast(substring(cast(key as string), 2) as long)")


class BucketTotals(Processor):
    """Per batch: for each bucket (n mod 37), how many records and the sum of their n."""

    output_mode = "per-batch"

    def transform(self, batch):
        n = _n(batch)
        return (batch.select(n.alias("n")).withColumn("bucket", F.col("n") % BUCKETS)
                .groupBy("bucket").agg(F.count("*").alias("count"), F.sum("n").alias("sum"))
                .select(F.col("bucket").cast("string").alias("key"), F.to_json(F.struct("count", "sum")).alias("value")))


class RandomBuckets(BucketTotals):
    """Not deterministic: the bucket of a record is drawn at random."""

    def transform(self, batch):
        return (batch.select(F.floor(F.rand() * BUCKETS).alias("bucket"))
                .groupBy("bucket").agg(F.count("*").alias("count"))
                .select(F.col("bucket").cast("string").alias("key"), F.to_json(F.struct("count")).alias("value")))


class SlyRandomBuckets(RandomBuckets):
    """The same, let through knowingly: the markers catch the replay that differs."""

    allow_nondeterministic = True


def expected_totals(numbers: range | list[int]) -> dict[str, tuple[int, int]]:
    counts: Counter = Counter()
    sums: Counter = Counter()
    for n in numbers:
        counts[str(n % BUCKETS)] += 1
        sums[str(n % BUCKETS)] += n
    return {b: (counts[b], sums[b]) for b in counts}


def output_totals(records: list) -> dict[str, tuple[int, int]]:
    """Totals over every output record (tests/support/kafka.py Records)."""
    counts: Counter = Counter()
    sums: Counter = Counter()
    for record in records:
        key, value = record.key, json.loads(record.value)
        c, s = int(value["count"]), int(value.get("sum", 0))
        counts[key.decode()] += c
        sums[key.decode()] += s
    return {b: (counts[b], sums[b]) for b in counts}
