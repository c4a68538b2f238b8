"""The per-kind rules of the stateful operators (txstream/operators/) against Spark's own
Structured Streaming (issue 60): late rows, sessions one gap apart, deduplication's expiry,
complete mode's batches with no records.

Each case runs twice over the same rows and the same batch cuts. Spark: a file source with one
file per micro-batch (`maxFilesPerTrigger=1`), `processAllAvailable()` per cut, `foreachBatch`
collecting what each batch emits. txstream, without Kafka: the transform's stateful call recorded
(driver/stateful_query.py) with the real rewrite into Spark's partials, its `merge_frame` seam
merging them with the operator's own `merge` into a memory store; the watermark from
operators/base.next_watermark, and a batch with no records whenever the operator owes one.
"""
from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from typing import Any, Callable

import pytest

from tests.support.state_commit import commit_batch
from txstream.driver.stateful_query import BatchContext, recording
from txstream.operators.base import MergeSpec, next_watermark
from txstream.operators.kinds import operator_for
from txstream.state.memory import MemoryStore

SCHEMA = "k STRING, ts TIMESTAMP, v LONG"
T0 = dt.datetime(2026, 1, 1, 12, 0, 0)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def _plain(value: Any) -> Any:
    """Rows compared as plain values: timestamps as naive UTC datetimes, structs as tuples."""
    if isinstance(value, dict):
        return tuple((k, _plain(v)) for k, v in sorted(value.items()))
    if hasattr(value, "asDict"):
        return _plain(value.asDict(recursive=True))
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return value


def _row(row: Any) -> tuple:
    return _plain(row.asDict(recursive=True) if hasattr(row, "asDict") else row)


def spark_run(spark: Any, tmp_path: Any, query: Callable[[Any], Any], mode: str,
              cuts: list[list[tuple]]) -> list[list[tuple]]:
    """What Spark's Structured Streaming emits per micro-batch (batches with no records included)."""
    source = tmp_path / "spark-in"
    source.mkdir()
    emitted: dict[int, list[tuple]] = {}

    def collect(frame: Any, batch_id: int) -> None:
        emitted[batch_id] = [_row(r) for r in frame.collect()]

    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))
    handle = (query(stream).writeStream.outputMode(mode).foreachBatch(collect)
              .option("checkpointLocation", str(tmp_path / "spark-checkpoint")).start())
    try:
        for i, rows in enumerate(cuts):
            with open(source / f"part-{i:04d}.json", "w") as out:
                for k, ts, v in rows:
                    out.write(json.dumps({"k": k, "ts": ts.isoformat() + "Z", "v": v}) + "\n")
            handle.processAllAvailable()
    finally:
        handle.stop()
    return [emitted[b] for b in sorted(emitted)]


def txstream_run(spark: Any, query: Callable[[Any], Any], mode: str,
                 cuts: list[list[tuple]]) -> tuple[list[list[tuple]], list[dict]]:
    """What txstream's operator emits per batch, and the rows it dead-letters as late."""
    from pyspark.sql import functions as F

    store = MemoryStore(0)
    events: int | None = None
    last: int | None = None
    batches: list[list[tuple]] = []
    late: list[dict] = []
    description = None

    def run(batch_id: int, rows: list[tuple], watermark_ms: int | None) -> None:
        merged_rows: list[tuple] = []

        def spec_of(desc: Any, group_names: tuple, partial_names: tuple, out_schema: Any, event: Any) -> MergeSpec:
            return MergeSpec("app", None, "", batch_id, desc, group_names, partial_names, out_schema, watermark_ms,
                             "memory", 30.0, event)

        def merge_frame(grouped: Any, spec: MergeSpec, out_schema: Any) -> Any:
            nonlocal events
            import pyarrow as pa

            # Arrow batches as Spark's tasks get them (toArrow's cast refuses the late rows' null FIRST).
            collected = grouped._collect_as_arrow()  # noqa: SLF001
            table = pa.Table.from_batches(collected) if collected else None
            merged = operator_for(spec.description.kind).merge(spec, store, table)
            commit_batch(store, batch_id)
            if merged.events is not None:
                events = max(events or merged.events, merged.events)
            late.extend(json.loads(row.row) for row in merged.late)
            if merged.out is not None:
                merged_rows.extend(_plain(r) for r in merged.out.to_pylist())
            return grouped

        frame = spark.createDataFrame([(k, ts.replace(tzinfo=dt.timezone.utc), v) for k, ts, v in rows] or [],
                                      SCHEMA).withColumn("ts", F.col("ts"))
        context = BatchContext("app", 1, mode, batch_id, watermark_ms, spec_of, merge_frame)
        with recording(context) as recorded:
            query(frame)
        nonlocal description
        description = recorded.description
        batches.append(sorted(merged_rows))

    batch_id = 1
    for rows in cuts:
        delay = description.watermark["delay_ms"] if description is not None and description.watermark else None
        watermark = next_watermark(last, [events], delay) if delay is not None else None
        run(batch_id, rows, watermark)
        last, batch_id = watermark, batch_id + 1
        delay = description.watermark["delay_ms"] if description.watermark else None
        while delay is not None:
            watermark = next_watermark(last, [events], delay)
            if not operator_for(description.kind).owes_batch(description, last, watermark):
                break
            run(batch_id, [], watermark)
            last, batch_id = watermark, batch_id + 1
    return batches, late


def both(spark: Any, tmp_path: Any, query: Callable[[Any], Any], mode: str,
         cuts: list[list[tuple]]) -> tuple[list[list[tuple]], list[list[tuple]], list[dict]]:
    theirs = spark_run(spark, tmp_path, query, mode, cuts)
    ours, late = txstream_run(spark, query, mode, cuts)
    return [sorted(b) for b in theirs], ours, late


def emitted(batches: list[list[tuple]]) -> Counter:
    return Counter(row for batch in batches for row in batch)


@pytest.fixture(scope="module")
def session(spark: Any) -> Any:
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    return spark


def window_counts(stream: Any) -> Any:
    from pyspark.sql import functions as F

    return (stream.withWatermark("ts", "30 seconds").groupBy(F.window("ts", "1 minute"), "k")
            .agg(F.count(F.lit(1)).alias("n")))


def test_a_row_behind_the_watermark_counts_while_its_window_is_open(session: Any, tmp_path: Any) -> None:
    """Issue 60 #1's example: 1-minute windows, 30 s delay, rows 12:00:50, 12:01:40 | 12:01:05 |
    12:03:00. 12:01:05 is behind the watermark (12:01:10) but its window [12:01, 12:02) is open:
    Spark counts it (2), and nothing is dead-lettered."""
    cuts = [[("a", at(50), 1), ("a", at(100), 1)], [("a", at(65), 1)], [("a", at(180), 1)]]
    theirs, ours, late = both(session, tmp_path, window_counts, "append", cuts)
    assert emitted(ours) == emitted(theirs)
    assert late == []


def test_running_aggregates_count_every_row_however_late(session: Any, tmp_path: Any) -> None:
    """Without the event time among the keys nothing closes: Spark counts the row an hour behind
    the watermark (update mode)."""
    from pyspark.sql import functions as F

    def totals(stream: Any) -> Any:
        return stream.withWatermark("ts", "30 seconds").groupBy("k").agg(F.sum("v").alias("total"))

    cuts = [[("a", at(3600), 1)], [("a", at(0), 2)], [("a", at(3601), 4)]]
    theirs, ours, late = both(session, tmp_path, totals, "update", cuts)
    assert [b for b in ours if b] == [b for b in theirs if b]
    assert late == []


def test_a_hopping_window_row_counts_in_its_open_windows_only(session: Any, tmp_path: Any) -> None:
    """2-minute windows every minute, watermark 12:02:10 after the first cut: 12:01:30 lies in
    [12:00, 12:02) (closed) and [12:01, 12:03) (open). Spark counts it in the open one only, and
    a row whose every window closed (12:00:30) is dropped."""
    from pyspark.sql import functions as F

    def hopping(stream: Any) -> Any:
        return (stream.withWatermark("ts", "30 seconds").groupBy(F.window("ts", "2 minutes", "1 minute"), "k")
                .agg(F.count(F.lit(1)).alias("n")))

    cuts = [[("a", at(20), 1), ("a", at(160), 1)], [("a", at(90), 1), ("a", at(30), 1)], [("a", at(400), 1)]]
    theirs, ours, late = both(session, tmp_path, hopping, "append", cuts)
    assert emitted(ours) == emitted(theirs)
    assert [row["ts"][:19] for row in late] == ["2026-01-01T12:00:30"]


def test_sessions_exactly_one_gap_apart_merge_across_batches(session: Any, tmp_path: Any) -> None:
    """Issue 60 #5: events at 12:00:00 and 12:01:00 with a 1-minute gap are one session in Spark
    ([12:00, 12:02), count 2) whether or not a batch cut falls between them."""
    from pyspark.sql import functions as F

    def sessions(stream: Any) -> Any:
        return (stream.withWatermark("ts", "5 minutes").groupBy(F.session_window("ts", "1 minute"), "k")
                .agg(F.count(F.lit(1)).alias("n")))

    cuts = [[("a", at(0), 1)], [("a", at(60), 1)], [("a", at(900), 1)]]
    theirs, ours, late = both(session, tmp_path, sessions, "append", cuts)
    assert emitted(ours) == emitted(theirs)
    assert late == []


def test_drop_duplicates_keeps_its_keys_past_the_watermark(session: Any, tmp_path: Any) -> None:
    """Issue 60 #8: dropDuplicates("k") with a watermark on ts (not a key) never forgets "a":
    Spark drops its copy at 12:05:10, long after 12:01:00 + the delay passed the watermark. The
    row at 12:00:00 in the last cut is behind the watermark: Spark drops it as late."""
    def unique(stream: Any) -> Any:
        return stream.withWatermark("ts", "30 seconds").dropDuplicates(["k"])

    cuts = [[("a", at(60), 1)], [("b", at(300), 2)], [("a", at(310), 3), ("c", at(0), 4)]]
    theirs, ours, late = both(session, tmp_path, unique, "append", cuts)
    assert emitted(ours) == emitted(theirs)
    assert [row["k"] for row in late] == ["c"]


def test_complete_mode_runs_no_batch_without_records(session: Any, tmp_path: Any) -> None:
    """Issue 60 #20: in complete mode Spark runs no batch with no records (nothing closes), so
    the table is emitted once per batch of records, not again each time the watermark moves."""
    cuts = [[("a", at(50), 1)], [("a", at(200), 1)], [("b", at(400), 1)]]
    theirs, ours, _late = both(session, tmp_path, window_counts, "complete", cuts)
    assert len(ours) == len(theirs) == len(cuts)
    assert ours[-1] == theirs[-1]
