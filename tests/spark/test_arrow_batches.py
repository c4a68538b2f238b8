"""The Arrow batches between Spark's JVM and the Python workers (spark/arrow_batches.py), and the
reader's own batches (task/reading.py): bounded, and sized from the records a batch read."""
from __future__ import annotations

import uuid

import pyarrow as pa
import pytest

from tests.support.kafka import produce
from txstream.kafka.config import KafkaClients
from txstream.spark.arrow_batches import (
    MAX_BYTES_KEY,
    MAX_ROWS_KEY,
    NO_BYTE_CHECK,
    SPARK_BYTE_CHECK,
    ArrowBatches,
    rows_per_batch,
)
from txstream.task.reading import RangeRead, read_ranges
from txstream.task.spec import PartitionPlan, ReadSpec


def _batch_rows(spark) -> int:
    """The largest Arrow batch a Python worker receives for 3,000 rows with a nested column."""
    frame = spark.range(0, 3000, 1, 1).selectExpr(
        "id", "array(named_struct('key', 'k', 'value', cast('v' as binary))) as headers")

    def sizes(batches):
        for batch in batches:
            yield pa.RecordBatch.from_pydict({"rows": [batch.num_rows]})

    return max(row.rows for row in frame.mapInArrow(sizes, "rows long").collect())


def test_rows_per_batch_follow_the_last_batch_and_measure_again_after_a_failure(spark) -> None:
    assert [rows_per_batch(n) for n in (100, 10_240, 1_048_576)] == [10_000, 409, 4]
    arrow = ArrowBatches(spark)
    assert not arrow.users   # txstream's own session sets neither
    try:
        arrow.before_batch()   # the first batch: Spark's per-row check
        assert (spark.conf.get(MAX_BYTES_KEY), spark.conf.get(MAX_ROWS_KEY)) == (SPARK_BYTE_CHECK, "10000")
        arrow.after_batch([{"largest_record": 200}, {"largest_record": 10_240}, {"largest_record": 0}])
        arrow.before_batch()
        assert (spark.conf.get(MAX_BYTES_KEY), spark.conf.get(MAX_ROWS_KEY)) == (NO_BYTE_CHECK, "409")
        assert _batch_rows(spark) == 409   # what the Python side of the hop is handed
        # The count follows the last batch's largest record, both ways.
        for largest, rows in ((12_000, 349), (10_240, 409), (6_000, 699), (2_000, 2_097), (100, 10_000),
                              (150, 10_000), (1_048_576, 4)):
            arrow.after_batch([{"largest_record": largest}])
            assert arrow.settings() == (NO_BYTE_CHECK, str(rows)), largest
        arrow.after_batch(None)   # a failed batch: the next one measures every row again
        arrow.before_batch()
        assert (spark.conf.get(MAX_BYTES_KEY), spark.conf.get(MAX_ROWS_KEY)) == (SPARK_BYTE_CHECK, "10000")
        arrow.after_batch([{"largest_record": 0}])   # a wide batch reports no sizes: the check stays
        assert arrow.settings() == (SPARK_BYTE_CHECK, "10000")
    finally:
        spark.conf.unset(MAX_BYTES_KEY)
        spark.conf.unset(MAX_ROWS_KEY)


@pytest.mark.parametrize("join", [False, True], ids=["plain", "broadcast-join"])
def test_a_job_built_once_follows_the_settings_of_each_run(spark, join) -> None:
    """The driver runs one DataFrame for every batch of a shape (driver/jobs.py) and changes the
    settings between batches: Spark must read them each time the job runs, not when it was built.
    Here the same DataFrame, collected under other settings, hands its Python worker batches of
    the new count, and Spark's per-row byte check comes and goes with its setting; also behind a
    broadcast join, whose plan adaptive execution keeps between runs."""
    from pyspark.sql import functions as F

    frame = spark.range(0, 6000, 1, 1).selectExpr("id", "id % 3 as k", "repeat('x', 1000) as s")
    if join:
        frame = frame.join(F.broadcast(spark.createDataFrame([(0,), (1,), (2,)], "k long")), "k")

    def sizes(batches):
        for batch in batches:
            yield pa.RecordBatch.from_pydict({"rows": [batch.num_rows]})

    job = frame.mapInArrow(sizes, "rows long")
    if join:
        assert "AdaptiveSparkPlan" in job._jdf.queryExecution().executedPlan().toString()
    try:
        seen = []
        for rows, limit in (("10000", SPARK_BYTE_CHECK), ("500", NO_BYTE_CHECK), ("10000", "100000"),
                            ("2000", NO_BYTE_CHECK)):
            spark.conf.set(MAX_ROWS_KEY, rows)
            spark.conf.set(MAX_BYTES_KEY, limit)
            seen.append(max(row.rows for row in job.collect()))
        # ~1 KB rows: 6,000 fit 64 MB; 500 by count; ~100 by a 100,000-byte bound; 2,000 by count.
        assert seen[0] == 6000 and seen[1] == 500 and seen[2] < 200 and seen[3] == 2000, seen
    finally:
        spark.conf.unset(MAX_BYTES_KEY)
        spark.conf.unset(MAX_ROWS_KEY)


def test_the_users_setting_of_either_leaves_both_alone(spark) -> None:
    class Settings:   # what SparkContext.getConf() answers when the user set maxRecordsPerBatch
        def contains(self, key: str) -> bool:
            return key == MAX_ROWS_KEY

    class Session:
        conf = spark.conf
        sparkContext = type("Context", (), {"getConf": staticmethod(Settings)})()

    arrow = ArrowBatches(Session())
    arrow.after_batch([{"largest_record": 100}])
    arrow.before_batch()
    assert arrow.users and spark.conf.get(MAX_BYTES_KEY) != NO_BYTE_CHECK and spark.conf.get(MAX_ROWS_KEY) == "10000"


def test_the_reader_bounds_its_batches_by_bytes_and_reports_the_largest_record(bootstrap_servers, make_topic) -> None:
    topic = make_topic("sizes")
    produce(bootstrap_servers, topic, [(b"k%03d" % i, b"v" * (1_000 if i != 7 else 5_000)) for i in range(60)])
    spec = ReadSpec(clients=KafkaClients(bootstrap_servers), app_id=f"sizes-{uuid.uuid4().hex[:6]}",
                    side_dir="unused", chunk_records=12, chunk_bytes=10_000)
    read = RangeRead(0, 0, PartitionPlan(topic, 0, 0, 60, None, ""))
    batches = list(read_ranges(spec, [read]))
    assert sum(b.num_rows for b in batches) == 60 and read.largest == 5_004
    # The first batch closes at 12 records (its first call took them all, 16 KB); from then on
    # no call asks for more than fits in 10,000 bytes at the largest record seen (5,004 B), and a
    # batch closes at its first record past 10,000 bytes.
    import pyarrow.compute as pc

    sizes = [pc.sum(pc.binary_length(b.column("key"))).as_py() + pc.sum(pc.binary_length(b.column("value"))).as_py()
             for b in batches]
    assert batches[0].num_rows == 12 and all(size <= 10_000 + 1_004 for size in sizes[1:]), sizes   # 1 KB records
    assert len(batches) >= 6, sizes


def test_a_slot_read_together_hands_its_ranges_over_in_few_batches_each_in_offset_order(
        bootstrap_servers, make_topic) -> None:
    """A slot's ranges read together (task/reading.py read_ranges) are decoded and handed
    to Spark together, not one small batch per range; each row keeps its range's tag, each range
    its offset order, and an undecodable record goes to its own range's side file."""
    from pathlib import Path

    from processors.sample_orders import orders
    from tests.support.kafka import avro_bytes
    from txstream.constants import RANGE_COLUMN
    from txstream.serde.avro import load_schema
    from txstream.task.reading import read_planned_range
    from txstream.task.sidefile import read_side_files

    order = load_schema(str(Path(__file__).resolve().parents[2] / "schemas/order.avsc"))
    partitions, per_partition, poisoned = 12, 30, {2: 7, 9: 0}   # partition -> offset of its bad record
    topic = make_topic("slot", partitions)
    good = iter(orders(partitions * per_partition, seed=3))
    for p in range(partitions):
        produce(bootstrap_servers, topic, [
            (b"k", b"\xff" * 12 if poisoned.get(p) == i else avro_bytes(order, next(good))) for i in range(per_partition)],
            partition=p)
    spec = ReadSpec(clients=KafkaClients(bootstrap_servers), app_id=f"slot-{uuid.uuid4().hex[:6]}",
                    side_dir=f"txstream-test-{uuid.uuid4().hex[:8]}", value_schema=order,
                    plans=tuple(PartitionPlan(topic, p, 0, per_partition, None, "") for p in range(partitions)))
    # Reading tasks 100.. read plans 0..: the slot's tasks, padded before it.
    spec = spec.with_batch(spec.batch_id, list(spec.plans), layout=(-1,) * 100 + tuple(range(partitions)))
    tasks = pa.record_batch([pa.array(range(100, 100 + partitions), pa.int64())], names=["id"])
    batches = list(read_planned_range(spec, None, True, iter([tasks])))

    assert 1 <= len(batches) < partitions // 2, [b.num_rows for b in batches]   # one per range before
    rows = pa.Table.from_batches(batches).select(["partition", "offset", RANGE_COLUMN]).to_pylist()
    assert len(rows) == partitions * per_partition - len(poisoned)
    for p in range(partitions):
        mine = [r for r in rows if r["partition"] == p]
        assert [r["offset"] for r in mine] == [o for o in range(per_partition) if poisoned.get(p) != o], p
        assert {r[RANGE_COLUMN] for r in mine} == {100 + p}
    # One side file for the slot's ranges, taken whole by its publisher.
    found = read_side_files(spec.side_dir, spec.batch_id, list(range(partitions)))
    for p in range(partitions):
        read = found.get(p)
        assert read is not None and read.records == per_partition - (p in poisoned), p
        assert [d[4] for d in read.dead_letters] == ([poisoned[p]] if p in poisoned else []), p
