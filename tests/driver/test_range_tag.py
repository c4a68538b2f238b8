"""The readers' range tag and source offset carried through a transform's plan
(driver/range_tag.py), on real Spark: every row that reaches the output keeps the tag and the
offset of the row it came from, whatever the transform selects (the `offset` column dropped
included); a plan that cannot carry them is recognised, never mistagged."""
from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from txstream.constants import RANGE_COLUMN
from txstream.driver.range_tag import carry_range_tag
from txstream.task.collector import OFFSET_COLUMN


def _read_tagged(ids):
    """Like the slot reader: reading task i yields values 100*i .. 100*i+5 at offsets ten times
    the value, tagged i."""
    for batch in ids:
        for task in batch.column(0).to_pylist():
            yield pa.RecordBatch.from_pydict({
                "value": [100 * task + k for k in range(6)],
                "word": [f"w{task}-{k}" for k in range(6)],
                "offset": [10 * (100 * task + k) for k in range(6)],
                RANGE_COLUMN: pa.array([task] * 6, pa.int32())})


@pytest.fixture
def tagged_input(spark):
    """8 reading tasks in 2 Spark partitions, the tag hidden from the transform (as range_frame)."""
    frame = spark.range(0, 8, 1, 2).mapInArrow(_read_tagged,
                                               f"value long, word string, offset long, {RANGE_COLUMN} int")
    return frame.drop(RANGE_COLUMN)


@pytest.fixture
def untagged_input(spark):
    """The reader of a run that reads one range per Spark partition: no tag, the `offset` column."""
    return spark.range(0, 8, 1, 8).mapInArrow(_read_tagged, f"value long, word string, offset long, {RANGE_COLUMN} int"
                                              ).drop(RANGE_COLUMN)


def _double(v):
    return v * 2


def _same_batches(batches):
    yield from batches


CARRIED = {
    "filter, then only a computed column": lambda df: df.filter(F.col("value") % 2 == 0).select(
        (F.col("value") + 1).alias("out")),
    "withColumn chain and struct(*)": lambda df: df.withColumn("x", F.col("value") * 3).select(
        F.to_json(F.struct("*")).alias("out"), "value"),
    "a Python UDF": lambda df: df.select(F.udf(_double, T.LongType())("value").alias("out"), "value"),
    "an explode": lambda df: df.select(F.explode(F.array("value", F.col("value") + 1)).alias("out")),
    "an alias and a SQL where": lambda df: df.alias("orders").where("value >= 400").selectExpr("value AS out"),
}
NOT_CARRIED = {
    "a broadcast join": lambda df: df.join(F.broadcast(df.sparkSession.createDataFrame([("w1-1", 1)], "word string, n int")), "word"),
    "a union": lambda df: df.union(df),
    "an aggregate": lambda df: df.groupBy("word").count(),
    "its own mapInArrow": lambda df: df.mapInArrow(_same_batches, "value long, word string"),
    "a column of the tag's name": lambda df: df.withColumn(RANGE_COLUMN, F.lit(7)),
}


@pytest.mark.parametrize("name", sorted(CARRIED))
def test_each_output_row_keeps_its_input_rows_tag(name, tagged_input) -> None:
    out = CARRIED[name](tagged_input)
    assert RANGE_COLUMN not in out.columns
    assert RANGE_COLUMN not in out.select("*").schema.simpleString()
    carried = carry_range_tag(out)
    assert carried is not None, carried
    assert carried.columns == [*out.columns, OFFSET_COLUMN, RANGE_COLUMN]
    rows = carried.collect()
    assert sorted(tuple(r)[:-2] for r in rows) == sorted(tuple(r) for r in out.collect())
    # Every row derives from one input value, 100 * task + k (k < 6), and `out` stays within
    # task's hundred too: the tag must be that task, the offset ten times that value.
    source = "value" if "value" in carried.columns else "out"
    assert all(row[RANGE_COLUMN] == row[source] // 100 for row in rows), rows
    assert all(row[OFFSET_COLUMN] // 1000 == row[RANGE_COLUMN] for row in rows), rows
    if source == "value":
        assert all(row[OFFSET_COLUMN] == 10 * row["value"] for row in rows), rows
    assert {r[RANGE_COLUMN] for r in rows} == ({4, 5, 6, 7} if "where" in name else set(range(8)))


def test_an_explode_gives_each_output_row_its_input_rows_offset(tagged_input) -> None:
    out = tagged_input.select(F.explode(F.array("value", F.col("value") + 1000)).alias("out"))
    rows = carry_range_tag(out).collect()
    assert len(rows) == 96
    assert all(row[OFFSET_COLUMN] == 10 * (row["out"] % 1000) for row in rows), rows


def test_a_transform_that_keeps_offset_is_read_as_it_is(tagged_input, untagged_input) -> None:
    out = tagged_input.select((F.col("value") * 2).alias("doubled"), "offset")
    carried = carry_range_tag(out)
    assert carried.columns == ["doubled", "offset", RANGE_COLUMN]
    assert carry_range_tag(untagged_input.select("value", "offset"), tag=False).columns == ["value", "offset"]


def test_struct_star_does_not_pick_the_tag_up(tagged_input) -> None:
    rows = carry_range_tag(CARRIED["withColumn chain and struct(*)"](tagged_input)).collect()
    assert all(RANGE_COLUMN not in r["out"] for r in rows)
    assert all(r[RANGE_COLUMN] == r["value"] // 100 for r in rows)


@pytest.mark.parametrize("name", sorted(NOT_CARRIED))
def test_a_plan_that_cannot_carry_the_tag_is_recognised(name, tagged_input) -> None:
    assert carry_range_tag(NOT_CARRIED[name](tagged_input)) is None


@pytest.mark.parametrize("name", sorted(CARRIED))
def test_reading_a_range_per_partition_the_offset_is_carried_alone(name, untagged_input) -> None:
    out = CARRIED[name](untagged_input)
    carried = carry_range_tag(out, tag=False)
    assert carried.columns == [*out.columns, OFFSET_COLUMN]
    for row in carried.collect():
        source = row["value"] if "value" in carried.columns else row["out"]
        assert row[OFFSET_COLUMN] // 1000 == source // 100, row


def test_the_offset_crosses_a_join_with_a_table(untagged_input) -> None:
    out = NOT_CARRIED["a broadcast join"](untagged_input).select("n", F.col("value").alias("v"))
    rows = carry_range_tag(out, tag=False).collect()
    assert [(r["v"], r[OFFSET_COLUMN]) for r in rows] == [(101, 1010)]


@pytest.mark.parametrize("name", ["a union", "an aggregate", "its own mapInArrow"])
def test_a_plan_that_cannot_carry_the_offset_is_left_as_it_is(name, untagged_input) -> None:
    out = NOT_CARRIED[name](untagged_input)
    assert carry_range_tag(out, tag=False) is out
