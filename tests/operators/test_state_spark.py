"""Stateful runs through a real broker whose expected output is what Spark Structured Streaming
itself emits over the same rows and the same batch cuts (tests/support/spark_reference.py;
issue 60): one input partition and max_records_per_partition = the cut size, so txstream's
batches are the cuts."""
from __future__ import annotations

import functools

import pytest

from tests.support.kafka import produce, read_all
from tests.support.spark_queries import (
    DedupWithinWatermark,
    JoinedWindows,
    WindowedCounts,
    dedup_within_watermark,
    joined_windows,
    lookup_frame,
    windowed_counts,
)
from tests.support.spark_reference import spark_emits, txstream_emits
from txstream import Processor


def _seed(bootstrap: str, topic: str, cuts: list[list[tuple[str, str]]]) -> None:
    assert len({len(cut) for cut in cuts[:-1]}) <= 1, "a batch takes max_records_per_partition: equal cuts"
    produce(bootstrap, topic, [(k.encode(), v.encode()) for cut in cuts for k, v in cut], partition=0)


def test_a_batch_of_duplicates_advances_the_watermark(bootstrap_servers, make_topic, run_processor, spark) -> None:
    """Batch 2 holds only copies of batch 1's ids, 100 s later: nothing to emit, but Spark's
    watermark takes their event time (90 s). Batch 3 runs under it, and its end forgets batch 1's
    ids (first seen + 10 s): batch 4's id2 is new again. Without batch 2's event time in the
    watermark, batch 3 runs under the old one and id2 stays a duplicate one batch longer."""
    cuts = [[(f"id{i}", str(i * 1000)) for i in range(1, 6)],
            [(f"id{i}", "100000") for i in range(1, 6)],
            [("id1", "100000"), *((f"new{i}", "100000") for i in range(4))],
            [("id2", "100000"), *((f"new{i}", "100000") for i in range(4, 8))]]
    want = spark_emits(spark, dedup_within_watermark, cuts, "append")
    assert want == {**{(f"id{i}", str(i * 1000)): 1 for i in range(1, 6)},
                    **{(f"new{i}", "100000"): 1 for i in range(8)}, ("id2", "100000"): 1}, want
    source, sink, dlq = make_topic("dup-in"), make_topic("dup-out"), make_topic("dup-dlq")
    _seed(bootstrap_servers, source, cuts)
    driver = run_processor(DedupWithinWatermark, inputs=[source], output=sink, dead_letter=dlq,
                           max_records_per_partition=5)
    assert driver.exit_code == 0, driver.lines
    assert txstream_emits(read_all(bootstrap_servers, sink)) == want


# 10-second windows, a 5-second watermark, cuts of 3 rows, no late row (Spark's late rule is issue
# 60 #1's): the last cut's watermark (37 s) closes [20, 30) in a batch with no records; [30, 40) stays open.
WINDOW_CUTS = [[("a", "1000"), ("b", "2000"), ("c", "3000")], [("d", "12000"), ("e", "13000"), ("f", "14000")],
               [("g", "25000"), ("h", "26000"), ("i", "27000")], [("j", "33000"), ("k", "31000"), ("l", "32000")],
               [("m", "40000"), ("n", "41000"), ("o", "42000")]]


def test_state_reset_to_earliest_recomputes_from_a_new_watermark(bootstrap_servers, make_topic, run_processor,
                                                                  spark) -> None:
    """Issue 60 #2: after `state reset --to-earliest` the replay is a new query's run, as Spark's
    over a new checkpoint: the same windows again. With the old watermark (37 s) kept in the
    markers and the plan log, every replayed row was late and nothing was emitted (CLEAN all the same)."""
    from click.testing import CliRunner

    from txstream.cli.main import main

    want = spark_emits(spark, windowed_counts, WINDOW_CUTS, "append")
    assert want == {("0", "3"): 1, ("10000", "3"): 1, ("20000", "3"): 1}, want
    source, sink, dlq = make_topic("rs-in"), make_topic("rs-out"), make_topic("rs-dlq")
    _seed(bootstrap_servers, source, WINDOW_CUTS)
    app = "test-reset-watermark-" + source[-8:]
    first = run_processor(WindowedCounts, inputs=[source], output=sink, dead_letter=dlq, app_id=app,
                          max_records_per_partition=3)
    assert first.exit_code == 0, first.lines
    assert txstream_emits(read_all(bootstrap_servers, sink)) == want

    reset = CliRunner().invoke(main, ["state", "reset", "--app-id", app, "-b", bootstrap_servers, "--execute",
                                      "--to-earliest"])
    assert reset.exit_code == 0, reset.output
    again_sink = make_topic("rs-out2")
    again = run_processor(WindowedCounts, inputs=[source], output=again_sink, dead_letter=dlq, app_id=app,
                          max_records_per_partition=3)
    assert again.exit_code == 0, again.lines
    assert txstream_emits(read_all(bootstrap_servers, again_sink)) == want
    assert sum(b.get("late", 0) for b in again.events.batches) == 0   # with the old watermark: all 15


def test_a_stream_static_join_before_windows_emits_in_batches_with_no_records(bootstrap_servers, make_topic,
                                                                             run_processor, spark) -> None:
    """Issue 60 #19: a lookup joined before the windowed aggregation. Over empty ranges Spark's
    adaptive execution found the join's stream side empty and replaced the plan up to the state
    merge by an empty relation of no partitions: no unit ran, so a batch with no records emitted
    nothing, and the window the last watermark closed ([20, 30)) never came out."""
    want = spark_emits(spark, functools.partial(joined_windows, lookup=lookup_frame(spark)), WINDOW_CUTS, "append")
    assert set(want) == {("0", "3/6"), ("10000", "3/15"), ("20000", "3/24")}, want
    source, sink, dlq = make_topic("sj-in"), make_topic("sj-out"), make_topic("sj-dlq")
    _seed(bootstrap_servers, source, WINDOW_CUTS)
    driver = run_processor(JoinedWindows, inputs=[source], output=sink, dead_letter=dlq, max_records_per_partition=3)
    assert driver.exit_code == 0, driver.lines
    assert txstream_emits(read_all(bootstrap_servers, sink)) == want
    assert driver.events.batches[-1]["records_in"] == 0 and driver.events.batches[-1]["records_out"] > 0


# -- the end-to-end layer of the differential suite (issue 60): each kind and mode through Kafka ----

def _rows(frame):
    from pyspark.sql import functions as F

    return frame.select(F.substring(F.col("key").cast("string"), 1, 1).alias("k"), F.col("key").cast("string").alias("id"),
                        F.timestamp_millis(F.col("value").cast("string").cast("long")).alias("ts"))


def _out(frame, *values):
    from pyspark.sql import functions as F

    return frame.select(F.col("k").alias("key"), F.concat_ws("/", *values).alias("value"))


def _sessions(frame):
    from pyspark.sql import functions as F

    s = _rows(frame).withWatermark("ts", "5 seconds").groupBy(F.session_window("ts", "3 seconds"), "k").count()
    return _out(s, F.unix_millis("session_window.start"), F.unix_millis("session_window.end"), "count")


def _hopping(frame):
    from pyspark.sql import functions as F

    w = _rows(frame).withWatermark("ts", "5 seconds").groupBy(F.window("ts", "10 seconds", "5 seconds"), "k").count()
    return _out(w, F.unix_millis("window.start"), "count")


def _running(frame):
    from pyspark.sql import functions as F

    r = _rows(frame).groupBy("k").agg(F.count("*").alias("n"), F.max("ts").alias("last"), F.min("id").alias("first"))
    return _out(r, "n", F.unix_millis("last"), "first")


def _late_windows(frame):
    from pyspark.sql import functions as F

    w = _rows(frame).withWatermark("ts", "2 seconds").groupBy(F.window("ts", "5 seconds"), "k").count()
    return _out(w, F.unix_millis("window.start"), "count")


def _dedup_with_event_time(frame):
    from pyspark.sql import functions as F

    d = _rows(frame).withWatermark("ts", "5 seconds").dropDuplicates(["id", "ts"])
    return _out(d, "id", F.unix_millis("ts"))


def _complete(frame):
    from pyspark.sql import functions as F

    w = _rows(frame).withWatermark("ts", "5 seconds").groupBy(F.window("ts", "10 seconds")).agg(
        F.count("*").alias("n"), F.min("k").alias("k"))
    return _out(w, F.unix_millis("window.start"), "n")


# Cuts of 4 rows (a batch takes max_records_per_partition): keys a/b/c, event times in ms with
# disorder, a row on a window boundary, a row behind the watermark in a closed window (b3, 1 s in
# the fourth cut), duplicates of an (id, ts) in a later cut, and a gap that ends a session.
E2E_CUTS = [[("a1", "1000"), ("b1", "2000"), ("a2", "4000"), ("c1", "5000")],
            [("a3", "6000"), ("b2", "10000"), ("a1", "1000"), ("c2", "9000")],
            [("a4", "15000"), ("b1", "2000"), ("c3", "16500"), ("a5", "20000")],
            [("b3", "1000"), ("c4", "25000"), ("a6", "24000"), ("b4", "30000")],
            [("c5", "40000"), ("a7", "41000"), ("b5", "45000"), ("a8", "50000")]]


@pytest.mark.parametrize(("query", "mode"), [
    (_sessions, "append"), (_hopping, "update"), (_hopping, "append"), (_running, "update"), (_running, "complete"),
    (_late_windows, "append"), (_dedup_with_event_time, "append"), (_complete, "complete"),
], ids=["sessions-append", "hopping-update", "hopping-append", "running-update", "running-complete",
        "late-windows-append", "dedup-append", "windows-complete"])
def test_a_stateful_run_through_kafka_emits_what_spark_emits(bootstrap_servers, make_topic, run_processor, spark,
                                                             query, mode) -> None:
    """The same query, rows and cuts: every emission of every batch (a no-data batch's too;
    complete mode: the last batch's table) equals Spark Structured Streaming's, and the late rows
    Spark drops are dead-lettered."""
    want = spark_emits(spark, query, E2E_CUTS, mode)
    source, sink, dlq = make_topic("e2e-in"), make_topic("e2e-out"), make_topic("e2e-dlq")
    _seed(bootstrap_servers, source, E2E_CUTS)
    processor = type(f"E2E_{query.__name__}", (Processor,), {"output_mode": mode,
                                                             "transform": lambda self, batch: query(batch)})
    driver = run_processor(processor, inputs=[source], output=sink, dead_letter=dlq, max_records_per_partition=4)
    assert driver.exit_code == 0, driver.lines
    out = read_all(bootstrap_servers, sink)
    if mode == "complete":   # Spark's memory sink keeps the last batch's table: so, here, the last batch's records
        last = max(int(r.headers["txstream.batch"]) for r in out)
        out = [r for r in out if int(r.headers["txstream.batch"]) == last]
    assert txstream_emits(out) == want
    if query is _late_windows:
        late = read_all(bootstrap_servers, dlq)
        assert [(r.key, r.value) for r in late] == [(b"b3", b"1000")], late   # the input record, as read
