"""RecordCollector on its own: the Kafka records built from an output batch.

No broker: the producer here only records `produce()` calls. Nothing in this file touches
transactions, offsets or isolation (those are proven against Apache Kafka elsewhere); it pins the
one-pass path for the common output shape to the general per-row path, header for header.
"""
from __future__ import annotations

import pyarrow as pa

from txstream.kafka import headers
from txstream.records import DeadLetter
from txstream.task.collector import RecordCollector


class _Calls:
    def __init__(self) -> None:
        self.records: list[tuple] = []

    def produce(self, topic, value, key, partition=-1, headers=None) -> None:
        # confluent-kafka takes headers as a list of pairs or a dict (the one-pass path's).
        pairs = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
        self.records.append((topic, value, key, partition, pairs))

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
    assert records[1][4] == [(headers.LINEAGE, b"in/3/6/pub-1/1")]
    assert headers.lineage_of(records[1][4]) == headers.Lineage("in", 3, 6, b"pub-1", b"1")
    # With one null offset the other rows keep theirs; the null one names its partition only.
    nulled = _collect(_batch([5, None, 7], False))
    assert [headers.lineage_of(r[4]).source for r in nulled] == [("in", 3, 5), None, ("in", 3, 7)]
    assert nulled[1][4] == [(headers.LINEAGE, headers.lineage_value("in", 3, None, "pub-1", 1))]


def test_without_lineage_no_headers_are_added() -> None:
    assert all(not r[4] for r in _collect(_batch([5, 6, 7], False), lineage=False))


def test_positions_count_every_record_of_a_publication_across_batches_and_dead_letters() -> None:
    calls = _Calls()
    collector = RecordCollector(producer=calls, default_topic="out", value_codec=None, key_codec=None,
                                source=("in", 3), publication="pub-1")
    collector.add_batch(_batch([5, 6, 7], False))
    collector.add_dead_letter("dlq", DeadLetter(b"k", b"v", None, 0, 8, "decode", "bad"), "app")
    collector.add_batch(_batch([9, 10, 11], True))
    seqs = [headers.lineage_of(r[4]).position for r in calls.records]
    assert seqs == [str(i).encode() for i in range(7)]
    collector.replay()   # after an abort: the same records, the same positions
    assert [headers.lineage_of(r[4]).position for r in calls.records[7:]] == seqs


def test_a_batch_encoded_once_for_several_runs_gives_the_records_each_run_encoded_alone_gives() -> None:
    """A slot's batch holds runs of several ranges (task/publish.py `_produce_all`): its struct
    key and value are encoded once (`encoded_batch`), then each run goes to its range's collector."""
    import json
    from pathlib import Path

    from txstream.serde.avro import AvroCodec, arrow_type
    from txstream.task.collector import encoded_batch

    schema = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "order_enriched.avsc").read_text())
    codec = AvroCodec(schema)
    rows = [{"id": f"o{i}", "customer_id": f"c{i % 3}", "amount_cents": i * 100, "currency": "EUR",
             "created_at": 1_700_000_000_000 + i, "items": i % 4, "is_large": i % 2 == 0} for i in range(9)]
    batch = pa.RecordBatch.from_pydict({"key": pa.array([f"k{i}".encode() for i in range(9)]),
                                        "value": pa.array(rows, arrow_type(schema)),
                                        "offset": pa.array(range(9), pa.int64())})
    runs = [(0, 4), (4, 5), (5, 9)]

    def collect(source: pa.RecordBatch) -> list[tuple]:
        calls = _Calls()
        for n, (first, last) in enumerate(runs):
            RecordCollector(producer=calls, default_topic="out", value_codec=codec, key_codec=None,
                            source=("in", n), publication=f"pub-{n}").add_batch(source.slice(first, last - first))
        return calls.records

    once = collect(encoded_batch(batch, codec, None))
    assert once == collect(batch)
    assert [codec.decode(r[1])["id"] for r in once] == [f"o{i}" for i in range(9)]


def test_lineage_reads_both_formats_and_the_last_one_wins() -> None:
    """Output written before `txstream.lineage` (five headers) still reads; a dead letter keeps
    its input's own headers (an upstream app's lineage, in either format) before txstream's."""
    five = [(headers.SOURCE_TOPIC, b"up"), (headers.SOURCE_PARTITION, b"1"), (headers.SOURCE_OFFSET, b"9"),
            (headers.PUBLICATION, b"p0"), (headers.PUBLICATION_SEQ, b"4")]
    compact = [(headers.LINEAGE, headers.lineage_value("in", 3, 6, "p1", 2))]
    assert headers.lineage_of(five) == headers.Lineage("up", 1, 9, b"p0", b"4")
    assert headers.lineage_of(five + compact) == headers.Lineage("in", 3, 6, b"p1", b"2")
    assert headers.lineage_of(compact + five) == headers.Lineage("up", 1, 9, b"p0", b"4")
    assert headers.lineage_of(compact + [(headers.LINEAGE, b"in/4/7/p2/0")]).source == ("in", 4, 7)
    # The five-header format wrote `None` for a nulled offset; oldest output has no publication.
    assert headers.lineage_of(five[:2] + [(headers.SOURCE_OFFSET, b"None")]) == headers.Lineage("up", 1, None, None, None)
    # No lineage, or a header of that name that is not txstream's.
    for other in (None, [], [("origin", b"x")], [(headers.LINEAGE, b"not ours")], five[1:]):
        assert headers.lineage_of(other) is None, other
    assert headers.lineage_of(five).source == ("up", 1, 9)


def test_a_wide_unit_stamps_its_batch_unit_publication_and_position() -> None:
    calls = _Calls()
    collector = RecordCollector(producer=calls, default_topic="out", value_codec=None, key_codec=None,
                                source=("", -1), publication="pub-w", fixed_headers=headers.wide_lineage(7, 2, "pub-w"))
    collector.add_batch(pa.RecordBatch.from_pydict({"value": pa.array([b"a", b"b"])}))
    assert [r[4] for r in calls.records] == [
        [(headers.BATCH, b"7"), (headers.UNIT, b"2"), (headers.PUBLICATION, b"pub-w"), (headers.PUBLICATION_SEQ, str(i).encode())]
        for i in range(2)]
    assert all(headers.lineage_of(r[4]) is None for r in calls.records)


def test_collections_are_paused_while_a_batch_is_built_and_restored_after_it_even_when_it_fails() -> None:
    import gc

    import pytest

    from txstream.errors import OutputError

    seen = []

    class _Watching(_Calls):
        def produce(self, *args, **kwargs) -> None:
            seen.append(gc.isenabled())
            super().produce(*args, **kwargs)

    collector = RecordCollector(producer=_Watching(), default_topic="out", value_codec=None, key_codec=None,
                                source=("in", 3), publication="pub-1")
    assert gc.isenabled()
    collector.add_batch(_batch([5, 6, 7], False))
    assert seen == [False] * 3 and gc.isenabled()
    struct_value = pa.RecordBatch.from_pydict({"value": pa.array([{"a": 1}])})
    with pytest.raises(OutputError):
        collector.add_batch(struct_value)    # a struct and no schema to encode it with
    assert gc.isenabled()


def test_runs_built_at_once_give_the_records_each_run_added_alone_gives() -> None:
    """A slot's batch of several ranges (task/publish.py `_produce_all`): `add_runs` builds every
    run's records in one pass, positions continuing where each collector stands, a range's runs
    recurring in the batch, a nulled offset, one collector without lineage; header for header
    what `add_batch` per run produces."""
    from txstream.task.collector import add_runs

    n = 12
    offsets = [100 + i for i in range(n)]
    offsets[5] = None
    batch = pa.RecordBatch.from_pydict({"key": pa.array([f"k{i}".encode() if i % 4 else None for i in range(n)]),
                                        "value": pa.array([f"v{i}".encode() for i in range(n)]),
                                        "offset": pa.array(offsets, pa.int64())})
    runs = [(0, 0, 3), (1, 3, 4), (0, 4, 7), (2, 7, 9), (1, 9, 12)]

    def collectors(calls: _Calls) -> dict[int, RecordCollector]:
        made = {pos: RecordCollector(producer=calls, default_topic="out", value_codec=None, key_codec=None,
                                     source=("in", pos), publication=f"pub-{pos}", lineage=pos != 2)
                for pos in range(3)}
        made[1].add_batch(_batch([1, 2, 3], False))   # positions of range 1 start at 3
        return made

    alone_calls = _Calls()
    alone = collectors(alone_calls)
    for pos, first, last in runs:
        alone[pos].add_batch(batch.slice(first, last - first))
    together_calls = _Calls()
    together = collectors(together_calls)
    seen: list[int] = []
    counts = add_runs(together, batch, runs, seen.append)

    assert counts == [3, 1, 3, 2, 3] and seen == [0, 1, 0, 2, 1]
    assert together_calls.records == alone_calls.records
    assert [len(c.sent) for c in together.values()] == [len(c.sent) for c in alone.values()]
    assert headers.lineage_of(together_calls.records[3 + 3][4]) == headers.Lineage("in", 1, 103, b"pub-1", b"3")
    # Shapes it does not take: the caller goes run by run.
    assert add_runs(together, batch, [(0, 0, 5), (1, 6, 12)], seen.append) is None
    assert add_runs(together, batch.append_column("topic", pa.array(["out"] * n)), runs) is None
    together[2].value_codec = object()   # collectors that do not share their codecs
    assert add_runs(together, batch, runs) is None
