"""Aggregates kept across batches (txstream/state/aggregates.py), without a broker: merging a
batch's partials into the state gives what one aggregation over all the rows gives, whatever
the batches; what cannot be merged is refused with its reason."""
from __future__ import annotations

import random

import pytest

from txstream.state import aggregates as aggs
from txstream.state import keys
from txstream.state.codec import StateCodec
from txstream.state.keys import decode_key, encode_key, window_prefix
from txstream.state.operator import Aggregate

AGGREGATES = [Aggregate("n", "count", "1"), Aggregate("total", "sum", "v"), Aggregate("low", "min", "v"),
              Aggregate("high", "max", "v"), Aggregate("mean", "avg", "v"), Aggregate("kinds", "count_distinct", "k")]


def _partials(rows: list[tuple[int, str]]) -> list:
    values = [v for v, _ in rows]
    return [len(rows), sum(values), min(values), max(values), float(sum(values)), len(values),
            sorted({k for _, k in rows})]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_merging_batches_equals_aggregating_all_rows(seed: int) -> None:
    rng = random.Random(seed)
    rows = [(rng.randrange(-50, 500), rng.choice("abcdef")) for _ in range(500)]
    codec = StateCodec(aggs.state_schema(AGGREGATES))
    state = aggs.empty(AGGREGATES)
    cut = sorted(rng.sample(range(1, len(rows)), 7))
    for batch in (rows[a:b] for a, b in zip([0, *cut], [*cut, len(rows)], strict=True)):
        state = codec.decode(codec.encode(aggs.merge(AGGREGATES, state, _partials(batch))))  # through the changelog's bytes
    values = [v for v, _ in rows]
    assert aggs.final(AGGREGATES, state) == [len(rows), sum(values), min(values), max(values),
                                             pytest.approx(sum(values) / len(values)), len({k for _, k in rows})]


def test_approximate_distinct_counts_merge_their_sketches() -> None:
    from datasketches import hll_sketch

    agg = [Aggregate("users", "approx_count_distinct", "u")]
    state = aggs.empty(agg)
    for batch in range(5):
        sketch = hll_sketch(aggs.SKETCH_LG_K)
        for u in range(batch * 10_000, batch * 10_000 + 15_000):   # overlapping batches
            sketch.update(u)
        state = aggs.merge(agg, state, [sketch.serialize_compact()])
    assert aggs.final(agg, state)[0] == pytest.approx(55_000, rel=0.05)


@pytest.mark.parametrize("spark_class, distinct, refused", [
    ("First", False, "how they were cut"), ("CollectList", False, "order"), ("Percentile", False, "every row"),
    ("Sum", True, "only count(DISTINCT"), ("Count", True, None), ("HyperLogLogPlusPlus", False, None),
    ("Average", False, None)])
def test_what_cannot_be_merged_is_refused_with_its_reason(spark_class, distinct, refused) -> None:
    why = aggs.refusal(spark_class, distinct)
    assert (why is None) if refused is None else (refused in why)


def test_window_keys_sort_by_window_end_and_read_back() -> None:
    keys = [encode_key(["EUR"], (start, start + 60_000)) for start in (120_000, -60_000, 0, 60_000)]
    assert [decode_key(k, windowed=True)[1][1] for k in sorted(keys)] == [0, 60_000, 120_000, 180_000]
    assert decode_key(keys[0], windowed=True) == (["EUR"], (120_000, 180_000))
    closed = [k for k in keys if k < window_prefix(60_000 + 1)]   # what a watermark of 60,000 ms closes
    assert sorted(decode_key(k, True)[1][1] for k in closed) == [0, 60_000]


def test_keys_encoded_column_wise_are_the_bytes_of_encode_key() -> None:
    from datetime import date, datetime, timezone

    import pyarrow as pa

    columns = [pa.array(["a", 'q"uote', "back\\slash", "new\nline", "ü€", "", "x"]),
               pa.array([1, -2, 0, 2**40, None, 7, 8], pa.int64()),
               pa.array([1.5, -0.0, 2.0, None, 1e300, 3.25, 0.1]),
               pa.array([datetime(2026, 1, 1, 0, 0, 1, 999, tzinfo=timezone.utc)] * 7, pa.timestamp("us", "UTC")),
               pa.array([date(2026, 1, 2)] * 7),
               pa.array([b"\xff\x00", b"b", b"", None, b"c", b"d", b"e"])]
    rows = [list(row) for row in zip(*(c.to_pylist() for c in columns), strict=True)]
    for chosen in ([0], [1], [0, 1], [1, 0], [2], [3], [4], [5], list(range(6))):
        want = [encode_key([row[i] for i in chosen]) for row in rows]
        assert keys.encode_keys([columns[i] for i in chosen], 7) == want, chosen
    starts, ends = [0, 60_000, -60_000, 0, 0, 0, 0], [60_000, 120_000, 0, 60_000, 60_000, 60_000, 60_000]
    assert keys.encode_keys(columns[:2], 7, (starts, ends)) == [
        encode_key(row[:2], (s, e)) for row, s, e in zip(rows, starts, ends, strict=True)]
    assert keys.encode_keys([], 3) == [encode_key([])] * 3
    values, windows = keys.decode_keys(keys.encode_keys(columns[:2], 7, (starts, ends)), windowed=True)
    assert values == [c.to_pylist() for c in columns[:2]] and windows == (starts, ends)


def test_the_expiry_index_sorts_first_in_expiry_order() -> None:
    groups = [encode_key([v]) for v in ("b", "a", 3)]
    index = [keys.expiry_key(t, k) for t, k in ((5_000, groups[0]), (-1, groups[1]), (5_001, groups[2]))]
    assert sorted(index + groups)[:3] == sorted(index) and all(k < keys.EXPIRY_END for k in index)
    assert all(k >= keys.EXPIRY_END for k in groups)
    expired = sorted(k for k in index if k < keys.expiry_end(5_000))   # what a watermark of 5,000 ms expires
    assert [keys.expiring_key(k) for k in expired] == [groups[1], groups[0]]


def test_a_state_without_the_expiry_index_is_told_apart_by_its_fingerprint() -> None:
    from txstream.state.operator import DEDUP, SESSION, WINDOW, OperatorDescription, state_format

    schema = aggs.state_schema([], event_time=True)
    old = OperatorDescription("dedup", DEDUP, 2, "append", ["id"], [], None, None, schema)   # as stored before
    new = OperatorDescription("dedup", DEDUP, 2, "append", ["id"], [], None, None, schema,
                              state_format=state_format(DEDUP))
    assert old.fingerprint() != new.fingerprint()
    assert any("state's format: 1 in the state, 3" in d for d in old.differences(new))
    assert OperatorDescription.from_json(old.to_json()).fingerprint() == old.fingerprint()
    assert state_format(WINDOW) == state_format(DEDUP) == 3   # issue 60: exact keys
    assert state_format(SESSION) == 4   # issue 60: a session's bounds in microseconds, as Spark's
