"""The stateful operator read from Spark's plans (txstream/operators/plan.py; issue 60, items 3,
12, 17, 18, 22), each case checked against Spark's own Structured Streaming over the same rows
and the same cuts (a file source with one file per micro-batch, maxFilesPerTrigger=1, a memory
sink, processAllAvailable), or, for what is refused, by its message.

No broker: the real rewrite (driver/stateful_query.py, while `recording`), the real Spark
partials and the real merge (task/state_merge.py merge_partials) into a memory store per unit
that a file carries from batch to batch; the Kafka-bound parts of a unit (markers, changelog,
publisher) are what this layer leaves out. The watermark and the batches with no records follow
the driver's rules (driver/stateful.py): the latest event time of the units minus the delay,
never moving back, and a batch with no records while the watermark moved."""
from __future__ import annotations

import functools
import json
import os
import pickle
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import pytest
from pyspark.sql import functions as F

from txstream.driver.stateful_query import BatchContext, recording
from txstream.errors import TransformError
from txstream.operators.base import ROUTE, MergeSpec, next_watermark
from txstream.operators.kinds import operator_for


def _local_merge(spec: MergeSpec, batches):
    """A unit's merge without Kafka: the operator's own merge into a memory store holding the
    changes the unit's earlier batches left in a file."""
    import pyarrow as pa
    from pyspark import TaskContext

    from txstream.operators.kinds import operator_for
    from txstream.state.stores import open_store

    unit = TaskContext.get().partitionId()
    path = Path(spec.side_dir) / f"unit{unit}.pickle"
    changes = pickle.loads(path.read_bytes()) if path.exists() else []
    store = open_store("memory", None, unit)
    store.load(changes)
    received = list(batches)
    merged = operator_for(spec.description.kind).merge(spec, store, pa.Table.from_batches(received)
                                                       if received else None)
    changes += list(store.changes().items())
    path.write_bytes(pickle.dumps(changes))
    if merged.events is not None:
        (Path(spec.side_dir) / f"events-{spec.batch_id}-{unit}").write_text(str(merged.events))
    if merged.out is not None and merged.out.num_rows:
        yield from merged.out.to_batches()


def _merge_here(grouped, spec: MergeSpec, out_schema):
    return grouped.repartition(spec.description.units, ROUTE).mapInArrow(functools.partial(_local_merge, spec),
                                                                         out_schema)


def _rows(rows) -> Counter:
    return Counter(json.dumps(r.asDict(recursive=True), sort_keys=True, default=str) for r in rows)


def spark_streaming(spark, tmp_path: Path, schema: str, cuts: list[list[dict]], query: Callable, mode: str) -> Counter:
    """What Spark's Structured Streaming emits (every batch's rows together) for `query` over
    `cuts`, one micro-batch each."""
    folder = tmp_path / "spark-input"
    folder.mkdir(parents=True)
    for i, cut in enumerate(cuts):
        path = folder / f"cut-{i:03d}.json"
        path.write_text("".join(json.dumps(r) + "\n" for r in cut))
        os.utime(path, (1_000_000 + i, 1_000_000 + i))   # the file source takes the oldest first
    spark.conf.set("spark.sql.shuffle.partitions", "2")   # kept in the checkpoint: 2 state stores, not 200
    stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(str(folder))
    name = f"reference_{tmp_path.name}".replace("-", "_")
    running = (query(stream).writeStream.format("memory").queryName(name).outputMode(mode)
               .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    try:
        running.processAllAvailable()
        return _rows(spark.table(name).collect())
    finally:
        running.stop()


def txstream_batches(spark, tmp_path: Path, schema: str, cuts: list[list[dict]], query: Callable, mode: str,
                     units: int = 2) -> Counter:
    """What txstream's rewrite of `query` emits over `cuts` (then batches with no records while
    the operator owes one), every batch's rows together."""
    from txstream.driver.stateful import keep_empty_units

    keep_empty_units(spark)   # as a stateful run does
    side = tmp_path / "units"
    side.mkdir()
    emitted: Counter = Counter()
    watermark, last = None, None
    description = None
    batch_id = 0
    while True:
        batch_id += 1
        if batch_id > len(cuts) and not operator_for(description.kind).owes_batch(description, last, watermark):
            return emitted
        cut = cuts[batch_id - 1] if batch_id <= len(cuts) else []
        # Not a local relation: an empty one would let Spark's optimizer drop the units' merge tasks of a
        # batch with no records, which a run's reader (a MapInArrow over spark.range) never allows.
        source = spark.read.schema(schema).json(spark.sparkContext.parallelize([json.dumps(r) for r in cut], 1))
        spec = functools.partial(_spec, str(side), batch_id, watermark)
        with recording(BatchContext("plan-test", units, mode, batch_id, watermark, spec, _merge_here)) as recorded:
            out = query(source)
        description = recorded.description
        emitted += _rows(out.collect())
        last = watermark
        if description.watermark:
            events = [int(p.read_text()) for p in side.glob("events-*")]
            watermark = next_watermark(watermark, events, description.watermark["delay_ms"])


def _spec(side: str, batch_id: int, watermark: int | None, description, group_names, partials, out_schema, event):
    return MergeSpec("plan-test", None, side, batch_id, description, group_names, partials, out_schema, watermark,
                     "memory", 30.0, event)


def describe(spark, schema: str, query: Callable, mode: str = "append") -> Any:
    """The description the rewrite records at start (no merge)."""
    with recording(BatchContext("plan-test", 2, mode)) as recorded:
        query(spark.createDataFrame([], schema))
    return recorded.description


ROWS = "k string, ts timestamp"


def _at(k: str, hhmmss: str) -> dict:
    return {"k": k, "ts": f"2026-01-01T{hhmmss}Z"}


# No row behind the watermark: which late rows Spark keeps is issue 60's item 1, not these.
WINDOW_CUTS = [[_at("a", "12:00:50"), _at("b", "12:01:40")], [_at("a", "12:01:45"), _at("a", "12:02:20")],
               [_at("b", "12:04:00"), _at("a", "12:05:30")], [_at("a", "12:09:00")]]


@pytest.mark.parametrize(("window", "mode"), [
    pytest.param(lambda: F.expr("window(ts, '1 minute')"), "update", id="sql-update"),
    pytest.param(lambda: F.expr("WINDOW(ts, '2 minutes', '1 minute')"), "append", id="sql-sliding-append"),
    # The merge keeps Spark's own window starts (the partials compute them): startTime is honoured.
    pytest.param(lambda: F.window("ts", "1 minute", "1 minute", "20 seconds"), "append", id="start-time-append"),
])
def test_windows_read_from_the_plan_emit_what_spark_emits(spark, tmp_path, window, mode) -> None:
    def query(frame):
        return (frame.withWatermark("ts", "30 seconds").groupBy(window(), "k").agg(F.count("*").alias("n"))
                .select(F.col("window.start").alias("start"), F.col("window.end").alias("end"), "k", "n"))

    want = spark_streaming(spark, tmp_path / "spark", ROWS, WINDOW_CUTS, query, mode)
    got = txstream_batches(spark, tmp_path, ROWS, WINDOW_CUTS, query, mode)
    assert got == want


def test_the_window_offset_and_the_watermark_column_are_in_the_fingerprint(spark) -> None:
    schema = "k string, ts timestamp, at timestamp"

    def query(start: str, column: str = "ts"):
        return lambda frame: (frame.withWatermark(column, "30 seconds")
                              .groupBy(F.window(column, "1 minute", "1 minute", start), "k").count())

    plain, offset = describe(spark, schema, query("0 seconds")), describe(spark, schema, query("20 seconds"))
    assert offset.window == {"column": "ts", "size_ms": 60_000, "slide_ms": 60_000, "start_ms": 20_000}
    assert plain.fingerprint() != offset.fingerprint()
    other = describe(spark, schema, query("0 seconds", "at"))
    assert "the watermark's column: ts in the state, at in the transform" in plain.differences(other)
    assert plain.fingerprint() != other.fingerprint()
    # A description stored before the offset was kept (no start_ms) is the same operator as start 0.
    old = {k: v for k, v in plain.window.items() if k != "start_ms"}
    from dataclasses import replace
    assert replace(plain, window=old).fingerprint() == plain.fingerprint()


def test_a_window_over_another_column_than_the_watermarks_is_refused(spark) -> None:
    with pytest.raises(TransformError, match="window is over 'at' but the watermark is on 'ts'"):
        describe(spark, "k string, ts timestamp, at timestamp",
                 lambda f: f.withWatermark("ts", "1 minute").groupBy(F.window("at", "1 minute"), "k").count())


@pytest.mark.parametrize("mode", ["append", "update"])
def test_the_watermark_follows_its_column_through_an_alias_as_spark_carries_it(spark, tmp_path, mode) -> None:
    """Issue 60 also-check: Spark keeps the watermark on an alias of its column (the attribute's
    metadata); so does txstream, and the windows close by it."""
    def query(frame):
        renamed = frame.withWatermark("ts", "30 seconds").select("k", F.col("ts").alias("t"))
        return (renamed.groupBy(F.window("t", "1 minute"), "k").agg(F.count("*").alias("n"))
                .select(F.col("window.start").alias("start"), "k", "n"))

    assert describe(spark, ROWS, query, mode).watermark == {"column": "t", "delay_ms": 30_000}
    want = spark_streaming(spark, tmp_path / "spark", ROWS, WINDOW_CUTS, query, mode)
    assert want == txstream_batches(spark, tmp_path, ROWS, WINDOW_CUTS, query, mode)


def test_a_window_computed_before_the_groupby_is_refused_by_name(spark) -> None:
    with pytest.raises(TransformError, match="'w' is a window computed before the groupBy"):
        describe(spark, ROWS, lambda f: f.withWatermark("ts", "1 minute")
                 .withColumn("w", F.window("ts", "1 minute")).groupBy("w", "k").count(), mode="update")


# -- item 22: a session gap per row ----------------------------------------------------------------------

def _dynamic_sessions(frame):
    gap = F.when(F.col("k") == "a", "1 minute").otherwise("20 seconds")
    return (frame.withWatermark("ts", "30 seconds").groupBy(F.session_window("ts", gap), "k")
            .agg(F.count("*").alias("n"))
            .select(F.col("session_window.start").alias("start"), F.col("session_window.end").alias("end"), "k", "n"))


def test_a_dynamic_session_gap_is_described_by_its_expression(spark) -> None:
    from txstream.operators.plan import window_of

    aggregated = (spark.createDataFrame([], ROWS).groupBy(
        F.session_window("ts", F.when(F.col("k") == "a", "1 minute").otherwise("20 seconds")), "k").count())
    spec = window_of(aggregated).spec
    assert spec["column"] == "ts" and "gap_ms" not in spec
    assert "CASE WHEN" in spec["gap"] and "'1 minute'" in spec["gap"]
    fixed = describe(spark, ROWS, lambda f: f.withWatermark("ts", "30 seconds")
                     .groupBy(F.expr("session_window(ts, '90 seconds')"), "k").count())
    assert fixed.window == {"column": "ts", "gap_ms": 90_000}


SESSION_CUTS = [[_at("a", "12:00:00"), _at("b", "12:00:10"), _at("b", "12:00:25")],
                [_at("a", "12:00:50"), _at("b", "12:01:00")], [_at("a", "12:03:00"), _at("b", "12:03:05")],
                [_at("a", "12:06:00")]]


def test_a_dynamic_session_gap_is_refused_at_start_with_the_reason(spark) -> None:
    """Spark accepts it; txstream's late rule (ts + gap <= watermark, operators/session.py) cannot
    evaluate a gap per row from the description yet: refused rather than crash or differ."""
    with pytest.raises(TransformError, match=r"session_window with a gap per row \(CASE WHEN .*\) is not supported "
                                             "yet: the late rule needs each row's own session end"):
        describe(spark, ROWS, _dynamic_sessions)


def test_session_windows_in_update_mode_are_refused_as_spark_refuses_them(spark, tmp_path) -> None:
    def query(frame):
        return frame.withWatermark("ts", "30 seconds").groupBy(F.session_window("ts", "1 minute"), "k").count()

    with pytest.raises(Exception, match="not supported for session window streaming aggregations"):
        spark_streaming(spark, tmp_path, ROWS, SESSION_CUTS[:1], query, "update")
    with pytest.raises(TransformError, match="output mode update is not supported for session windows"):
        describe(spark, ROWS, query, mode="update")


# -- item 18: what would run on each batch alone is refused by name ------------------------------------

def _no_rows(_arg, batches):
    yield from batches


def _batch(spark):
    """A frame shaped as the batch's source (driver/jobs.py range_frame): a MapInArrow over spark.range
    yielding the Kafka columns; never run here."""
    from txstream.task.reading import input_struct

    return spark.range(0, 2, 1, 2).mapInArrow(functools.partial(_no_rows, None), input_struct(None, None))


def _describe_at_start(spark, transform: Callable, output_mode: str | None = None):
    from types import SimpleNamespace

    from txstream.driver.stateful import describe_operator

    settings = SimpleNamespace(app_id="plan-test", output_mode=output_mode)
    return describe_operator(settings, 2, lambda recorded: (None, transform(_batch(spark))))


def _self_join(batch):
    orders = batch.where(F.col("topic") == "orders").select(F.col("key").alias("id"), F.col("value").alias("order"))
    payments = batch.where(F.col("topic") == "payments").select(F.col("key").alias("id"), "value")
    return orders.join(payments, "id")


def test_a_stream_stream_join_is_a_join_operator_in_append_mode_only(spark) -> None:
    description, (_, frame) = _describe_at_start(spark, _self_join)
    assert description.kind == "join" and description.join["type"] == "inner"
    assert description.join["left_keys"] == ["id"] and frame.columns == ["id", "order", "value"]   # USING's shape
    with pytest.raises(TransformError, match="a stream-stream join runs in append mode only"):
        _describe_at_start(spark, _self_join, "update")


def test_a_join_with_a_static_frame_is_allowed(spark) -> None:
    lookup = spark.createDataFrame([(b"k", "gold")], "id binary, tier string")
    description, (_, frame) = _describe_at_start(
        spark, lambda batch: batch.select(F.col("key").alias("id"), "value").join(lookup, "id"))
    assert description is None and "tier" in frame.columns


def _processor():
    """A StatefulProcessor Spark accepts on a batch DataFrame (it would run each batch alone)."""
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class Counter(StatefulProcessor):
        def init(self, handle) -> None:
            pass

        def handleInputRows(self, key, rows, timerValues):  # noqa: N802, N803 (Spark's names)
            yield from rows

        def close(self) -> None:
            pass

    return Counter()


@pytest.mark.parametrize("call", [
    pytest.param(lambda g: g.applyInPandasWithState(lambda k, rows, state: rows, "key binary", "n long", "Update",
                                                    "NoTimeout"), id="applyInPandasWithState"),
    pytest.param(lambda g: g.transformWithStateInPandas(_processor(), "key binary", "Update", "None"),
                 id="transformWithStateInPandas"),
])
@pytest.mark.parametrize("output_mode", [None, "update"])
def test_arbitrary_state_is_refused_at_start_by_name(spark, call, output_mode) -> None:
    with pytest.raises(TransformError, match=r"(applyInPandasWithState|transformWithStateInPandas) is not supported "
                                             "yet: txstream would run it on each batch alone, its per-key state "
                                             "starting empty every batch"):
        _describe_at_start(spark, lambda batch: call(batch.select("key", "value").groupBy("key")), output_mode)


# -- item 3: nothing between the merge and the publisher but selects and filters ------------------------

def _merged_output(spark, after: Callable):
    """The transform's output as a stateful batch builds it (the real unit merge, never run here)."""
    side = "plan-test-side"
    with recording(BatchContext("plan-test", 3, "update", 1, None, functools.partial(_spec, side, 1, None))):
        frame = spark.createDataFrame([("a", 1)], "k string, n long")
        out = after(frame.groupBy("k").agg(F.sum("n").alias("total")))
    return out.select(F.col("k").alias("key"), F.col("total").cast("string").alias("value"))


def test_a_coalesce_after_the_stateful_operator_is_refused(spark) -> None:
    from txstream.driver.stateful import _check_no_shuffle_after_merge

    _check_no_shuffle_after_merge(_merged_output(spark, lambda agg: agg.where("total > 0")))
    with pytest.raises(TransformError, match=r"moves rows after its stateful operator \(Coalesce"):
        _check_no_shuffle_after_merge(_merged_output(spark, lambda agg: agg.coalesce(1)))
    with pytest.raises(TransformError, match="moves rows after its stateful operator"):
        _check_no_shuffle_after_merge(_merged_output(spark, lambda agg: agg.orderBy("total")))


def _merge_twice(spec: MergeSpec, batches):
    """A task that merged a unit already (its side file written) and is handed another unit's partials."""
    from txstream.task.sidefile import write_state
    from txstream.task.state_unit import merge_unit

    write_state(spec.side_dir, spec.batch_id, {"skip": True})
    yield from merge_unit(spec, batches)


def test_a_second_merge_in_one_task_fails_loudly(spark, tmp_path) -> None:
    captured = {}

    def merge_frame(grouped, spec, out_schema):
        captured["spec"] = spec
        return grouped

    with recording(BatchContext("plan-test", 1, "update", 1, None,
                                functools.partial(_spec, f"plan-test-{tmp_path.name}", 1, None), merge_frame)):
        grouped = spark.createDataFrame([("a", 1)], "k string, n long").groupBy("k").agg(F.sum("n").alias("total"))
    with pytest.raises(Exception, match="a second state merge in the task of unit 0"):
        grouped.mapInArrow(functools.partial(_merge_twice, captured["spec"]), "k string, total long").collect()


# -- item 12: a TimestampNTZ event time -----------------------------------------------------------------

def test_a_watermark_on_a_timestamp_ntz_column_is_refused_as_spark_refuses_it(spark, tmp_path) -> None:
    """Spark's Structured Streaming refuses it; txstream compared such times with TIMESTAMP values,
    shifted by the session time zone (a closed window reopened and was emitted twice)."""
    def query(frame):
        return frame.withWatermark("ts", "30 seconds").groupBy(F.window("ts", "1 minute"), "k").count()

    schema = "k string, ts timestamp_ntz"
    with pytest.raises(Exception, match="EVENT_TIME_IS_NOT_ON_TIMESTAMP_TYPE"):
        spark_streaming(spark, tmp_path, schema, [[{"k": "a", "ts": "2026-01-01T12:00:50"}]], query, "append")
    with pytest.raises(TransformError, match=r"the event time 'ts' is TIMESTAMP_NTZ: Structured Streaming refuses a "
                                             r"watermark on it \(EVENT_TIME_IS_NOT_ON_TIMESTAMP_TYPE"):
        describe(spark, schema, query)
    ok = describe(spark, schema, lambda f: query(f.withColumn("ts", F.col("ts").cast("timestamp"))))
    assert ok.window["column"] == "ts"


# -- the batch's input is read once, and a late row keeps its input record (item 21) -------------------

def _stateful_frame(spark, transform: Callable, watermark: int | None = 1_000):
    """The frame of partials a stateful batch builds over the batch's source (never run)."""
    captured = {}

    def merge_frame(grouped, spec, out_schema):
        captured["grouped"] = grouped
        return grouped

    with recording(BatchContext("plan-test", 2, "append", 2, watermark, functools.partial(_spec, "side", 2, watermark),
                                merge_frame, late_ms=watermark)):
        transform(_batch(spark))
    return captured["grouped"]


def _readers(frame) -> int:
    """How many times the physical plan reads the batch's source (a MapInArrow over Range)."""
    plan = frame._jdf.queryExecution().sparkPlan().toString()
    return plan.count("MapInArrow partial(")


def _orders(batch):
    return batch.select("key", F.timestamp_millis(F.col("offset")).alias("ts"), F.length("value").alias("n"))


@pytest.mark.parametrize("transform", [
    lambda b: _orders(b).withWatermark("ts", "1 second").groupBy(F.window("ts", "1 minute"), "key").agg(F.sum("n")),
    lambda b: _orders(b).withWatermark("ts", "1 second").groupBy(F.window("ts", "1 minute", "20 seconds"), "key").count(),
    lambda b: _orders(b).withWatermark("ts", "1 second").groupBy(F.session_window("ts", "5 seconds"), "key").count(),
    lambda b: _orders(b).withWatermark("ts", "1 second").dropDuplicatesWithinWatermark(["key"]),
    lambda b: _orders(b).withWatermark("ts", "1 second").dropDuplicates(["key", "ts"]),
], ids=["tumbling", "hopping", "session", "dedup-within", "dedup-ts"])
def test_a_batch_with_a_late_rule_reads_its_input_once_and_carries_the_input_record(spark, transform) -> None:
    from txstream.operators.base import LATE_RECORD

    grouped = _stateful_frame(spark, transform)
    assert _readers(grouped) == 1, grouped._jdf.queryExecution().sparkPlan().toString()
    assert LATE_RECORD in grouped.columns


def test_a_late_row_that_cannot_name_its_input_record_still_counts_once(spark) -> None:
    """A union on the way to the operator: no input record to carry; the late rows are the rows as JSON."""
    from txstream.operators.base import LATE, LATE_RECORD

    grouped = _stateful_frame(spark, lambda b: _orders(b).unionByName(_orders(b)).withWatermark("ts", "1 second")
                              .groupBy(F.window("ts", "1 minute"), "key").count())
    assert LATE in grouped.columns and LATE_RECORD not in grouped.columns


# -- also-check: what lies between withWatermark and the stateful operator -------------------------

def _between(spark, step: Callable, mode: str = "append"):
    rows = spark.createDataFrame([("a", 1, [1])], "k string, v long, xs array<long>").withColumn(
        "ts", F.timestamp_millis(F.col("v")))
    table = spark.createDataFrame([("a", "x")], "k string, t string")
    return describe(spark, "k string", lambda _unused: step(rows.withWatermark("ts", "5 seconds"), table)
                    .groupBy(F.window("ts", "10 seconds"), "k").count(), mode)


@pytest.mark.parametrize(("step", "what"), [
    (lambda df, t: df.where(F.second("ts") > 0), r"a filter on the event time \(\(second\(ts"),
    (lambda df, t: df.where(F.rand() > 0.5), "a filter on the event time"),
    (lambda df, t: df.join(t, "k"), r"a join \(Inner"),
    (lambda df, t: df.join(t, "k", "left_semi"), r"a join \(LeftSemi"),
    (lambda df, t: t.join(df, "k", "left"), r"a join \(LeftOuter"),
    (lambda df, t: df.select("*", F.explode("xs").alias("x")), "an explode"),
    (lambda df, t: df.limit(5), "a GlobalLimit"),
], ids=["event-time-filter", "random-filter", "inner-join", "semi-join", "table-first-left-join", "explode", "limit"])
def test_what_removes_rows_between_withwatermark_and_the_operator_is_refused(spark, step, what) -> None:
    with pytest.raises(TransformError, match=f"applies {what}.*between withWatermark\\('ts', \\.\\.\\.\\) and groupBy: "
                                             "Structured Streaming computes the watermark where withWatermark is"):
        _between(spark, step)


@pytest.mark.parametrize("step", [
    lambda df, t: df.where(F.col("v") > 0),                       # pushed below the watermark by Spark
    lambda df, t: df.join(t, "k", "left"),
    lambda df, t: df.select("*", F.explode_outer("xs").alias("x")),
    lambda df, t: df.withColumn("w", F.col("v") * 2).orderBy("v"),
], ids=["filter-not-on-event-time", "left-join", "explode-outer", "project-sort"])
def test_what_keeps_every_row_between_withwatermark_and_the_operator_is_accepted(spark, step) -> None:
    assert _between(spark, step).watermark == {"column": "ts", "delay_ms": 5000}
