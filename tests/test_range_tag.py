"""The readers' range tag carried through a transform's plan (driver/range_tag.py), on real Spark:
every row that reaches the output keeps the tag of the row it came from, whatever the transform
selects; a plan that cannot carry it is recognised, never mistagged."""
from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from txstream.driver.range_tag import carry_range_tag
from txstream.protocol import RANGE_COLUMN


def _read_tagged(ids):
    """Like the slot reader: reading task i yields values 100*i .. 100*i+5, tagged i."""
    for batch in ids:
        for task in batch.column(0).to_pylist():
            yield pa.RecordBatch.from_pydict({
                "value": [100 * task + k for k in range(6)],
                "word": [f"w{task}-{k}" for k in range(6)],
                RANGE_COLUMN: pa.array([task] * 6, pa.int32())})


@pytest.fixture
def tagged_input(spark):
    """8 reading tasks in 2 Spark partitions, the tag hidden from the transform (as range_frame)."""
    frame = spark.range(0, 8, 1, 2).mapInArrow(_read_tagged, f"value long, word string, {RANGE_COLUMN} int")
    return frame.drop(RANGE_COLUMN)


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
    assert carried.columns == [*out.columns, RANGE_COLUMN]
    rows = carried.collect()
    assert sorted(tuple(r)[:-1] for r in rows) == sorted(tuple(r) for r in out.collect())
    # Every row derives from one input value, 100 * task + k (k < 6), and `out` stays within
    # task's hundred too: the tag must be that task.
    source = "value" if "value" in carried.columns else "out"
    assert all(row[RANGE_COLUMN] == row[source] // 100 for row in rows), rows
    assert {r[RANGE_COLUMN] for r in rows} == ({4, 5, 6, 7} if "where" in name else set(range(8)))


def test_struct_star_does_not_pick_the_tag_up(tagged_input) -> None:
    rows = carry_range_tag(CARRIED["withColumn chain and struct(*)"](tagged_input)).collect()
    assert all(RANGE_COLUMN not in r["out"] for r in rows)
    assert all(r[RANGE_COLUMN] == r["value"] // 100 for r in rows)


@pytest.mark.parametrize("name", sorted(NOT_CARRIED))
def test_a_plan_that_cannot_carry_the_tag_is_recognised(name, tagged_input) -> None:
    assert carry_range_tag(NOT_CARRIED[name](tagged_input)) is None
