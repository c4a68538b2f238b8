"""RecordCollector on its own: the Kafka records built from an output batch.

No broker: the producer here only records `produce()` calls. Nothing in this file touches
transactions, offsets or isolation (those are proven against Apache Kafka elsewhere); it pins the
one-pass path for the common output shape to the general per-row path, header for header.
"""
from __future__ import annotations

import pyarrow as pa

from txstream.kafka import headers
from txstream.task.collector import RecordCollector


class _Calls:
    def __init__(self) -> None:
        self.records: list[tuple] = []

    def produce(self, topic, value, key, partition=-1, headers=None) -> None:
        self.records.append((topic, value, key, partition, list(headers or [])))

    def poll(self, _timeout: float) -> int:
        return 0


def _collect(batch: pa.RecordBatch, lineage: bool = True) -> list[tuple]:
    calls = _Calls()
    collector = RecordCollector(producer=calls, default_topic="out", value_codec=None, key_codec=None,
                                source=("in", 3), publication="pub-1", lineage=lineage)
    collector.add_batch(batch)
    return calls.records


def _batch(offsets: list, with_topic: bool) -> pa.RecordBatch:
    columns = {"value": pa.array([b"a", b"b", b"c"]), "key": pa.array([b"k1", None, b"k3"]),
               "offset": pa.array(offsets, pa.int64())}
    if with_topic:
        columns["topic"] = pa.array(["out"] * 3)  # the same topic, through the per-row path
    return pa.RecordBatch.from_pydict(columns)


def test_the_one_pass_path_builds_the_records_the_per_row_path_builds() -> None:
    for offsets in ([5, 6, 7], [5, None, 7]):  # a transform may null the offset of some rows
        fast, general = _collect(_batch(offsets, False)), _collect(_batch(offsets, True))
        assert fast == general, offsets
    records = _collect(_batch([5, 6, 7], False))
    assert [r[:4] for r in records] == [("out", b"a", b"k1", -1), ("out", b"b", None, -1), ("out", b"c", b"k3", -1)]
    assert records[1][4] == [(headers.SOURCE_TOPIC, b"in"), (headers.SOURCE_PARTITION, b"3"),
                             (headers.PUBLICATION, b"pub-1"), (headers.SOURCE_OFFSET, b"6"),
                             (headers.PUBLICATION_SEQ, b"1")]
    # With one null offset the other rows keep theirs.
    assert (headers.SOURCE_OFFSET, b"7") in _collect(_batch([5, None, 7], False))[2][4]


def test_without_lineage_no_headers_are_added() -> None:
    assert all(not r[4] for r in _collect(_batch([5, 6, 7], False), lineage=False))


def test_positions_count_every_record_of_a_publication_across_batches_and_dead_letters() -> None:
    calls = _Calls()
    collector = RecordCollector(producer=calls, default_topic="out", value_codec=None, key_codec=None,
                                source=("in", 3), publication="pub-1")
    collector.add_batch(_batch([5, 6, 7], False))
    collector.add_dead_letter("dlq", (b"k", b"v", None, 0, 8, "decode", "bad"), "app")
    collector.add_batch(_batch([9, 10, 11], True))
    seqs = [dict(r[4])[headers.PUBLICATION_SEQ] for r in calls.records]
    assert seqs == [str(i).encode() for i in range(7)]
    collector.replay()   # after an abort: the same records, the same positions
    assert [dict(r[4])[headers.PUBLICATION_SEQ] for r in calls.records[7:]] == seqs
