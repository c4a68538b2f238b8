"""Stateful runs through a real broker whose expected output is what Spark Structured Streaming
itself emits over the same rows and the same batch cuts (tests/support/spark_reference.py;
issue 60): one input partition and max_records_per_partition = the cut size, so txstream's
batches are the cuts."""
from __future__ import annotations

from tests.support.kafka import produce, read_all
from tests.support.spark_queries import DedupWithinWatermark, dedup_within_watermark
from tests.support.spark_reference import spark_emits, txstream_emits


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

