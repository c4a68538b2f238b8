"""The generated cases of the differential suite (issue 60): rows, cuts and queries.

A case is a family (a query: kind x aggregates x keys), an output mode, K units and a seed. Its
rows are made cut by cut, knowing the watermark Spark will run each cut with (the latest event
time of the cuts before, less the delay), so that a family that must meet a situation (a row
behind the watermark whose window is still open, a row exactly on the watermark, a session one
gap after another) meets it on every seed: a KNOWN entry then holds for every seed.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Callable

import pyarrow as pa

from tests.semantics.oracle import AGGREGATE, DEDUP, JOIN, SESSION, WINDOW, Late

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
SECOND = 1_000_000   # µs
SCHEMA = pa.schema([("id", pa.int64()), ("partition", pa.int32()), ("offset", pa.int64()),
                    ("ts", pa.timestamp("us", tz="UTC")), ("k", pa.string()), ("b", pa.binary()),
                    ("v", pa.int64()), ("d", pa.float64()), ("m", pa.decimal128(12, 3))])
# Non-UTF-8 keys, and the ASCII text that a lossy decoding ('backslashreplace') turns them into.
BINARY_KEYS = [b"\xff", b"\\xff", b"\xfe\x00", b"\\xfe\\x00", b"ok"]


@dataclass(frozen=True)
class Family:
    name: str
    kind: str
    modes: tuple[str, ...]
    query: Callable[[Any], Any]
    delay_s: int | None = None          # the watermark's delay (None: no watermark)
    size_s: int = 10                    # window size / slide, session gap
    slide_s: int = 10
    gap_s: int = 5
    late: bool = True                   # rows behind the watermark (whose state may still be open)
    features: frozenset[str] = field(default_factory=frozenset)   # nan, decimal, binary, micros, nulls, gap
    keep: Callable[[dict], bool] | None = None   # the query's filter, in Python (what reaches the operator)
    reads: int = 1                      # how often the query reads its input (a join: once per side)

    def late_rule(self) -> Late | None:
        if self.delay_s is None:
            return None
        return Late(self.kind, "ts", self.size_s * SECOND, self.slide_s * SECOND, self.gap_s * SECOND, self.keep)


def _F():
    from pyspark.sql import functions as F

    return F


def _aggs(F):
    return [F.count(F.lit(1)).alias("n"), F.sum("v").alias("sv"), F.min("v").alias("lo"), F.max("v").alias("hi"),
            F.avg("v").alias("av")]


def families() -> dict[str, Family]:
    F = _F()
    wm = lambda df, s: df.withWatermark("ts", f"{s} seconds")  # noqa: E731
    fams = [
        Family("running", AGGREGATE, ("update", "complete"),
               lambda df: df.groupBy("k").agg(*_aggs(F)), features=frozenset({"nulls"})),
        Family("running_watermark", AGGREGATE, ("update", "complete"),
               lambda df: wm(df, 10).groupBy("k").agg(F.count(F.lit(1)).alias("n"), F.sum("v").alias("sv")),
               delay_s=10),
        Family("running_nan", AGGREGATE, ("update",),
               lambda df: df.groupBy("k").agg(F.min("d").alias("lo"), F.max("d").alias("hi")),
               features=frozenset({"nan"})),
        Family("running_decimal", AGGREGATE, ("update",),
               lambda df: df.groupBy("k").agg(F.sum("m").alias("sm"), F.min("m").alias("lo"), F.max("m").alias("hi")),
               features=frozenset({"decimal"})),
        Family("running_decimal_avg", AGGREGATE, ("update",),
               lambda df: df.groupBy("k").agg(F.avg("m").alias("am")), features=frozenset({"decimal"})),
        Family("running_binary_key", AGGREGATE, ("update",),
               lambda df: df.groupBy("b").agg(F.count(F.lit(1)).alias("n")), features=frozenset({"binary"})),
        Family("running_micros_key", AGGREGATE, ("update",),
               lambda df: df.groupBy("ts").agg(F.count(F.lit(1)).alias("n")), features=frozenset({"micros"})),
        Family("running_count_distinct2", AGGREGATE, ("update",),
               lambda df: df.groupBy("k").agg(F.countDistinct("v", "d").alias("nd"))),
        Family("running_filter", AGGREGATE, ("update",),
               lambda df: df.groupBy("k").agg(F.expr("count(*) FILTER (WHERE v > 2)").alias("nf"))),
        Family("tumbling", WINDOW, ("append", "update"),
               lambda df: wm(df, 5).groupBy(F.window("ts", "10 seconds"), "k").agg(
                   F.count(F.lit(1)).alias("n"), F.sum("v").alias("sv")), delay_s=5),
        Family("tumbling_ontime", WINDOW, ("append", "update"),
               lambda df: wm(df, 5).groupBy(F.window("ts", "10 seconds"), "k").agg(
                   F.count(F.lit(1)).alias("n"), F.max("v").alias("hi")), delay_s=5, late=False),
        Family("hopping", WINDOW, ("append", "update"),
               lambda df: wm(df, 5).groupBy(F.window("ts", "10 seconds", "5 seconds"), "k").agg(
                   F.count(F.lit(1)).alias("n")), delay_s=5, slide_s=5),
        Family("hopping_ontime", WINDOW, ("append",),
               lambda df: wm(df, 5).groupBy(F.window("ts", "10 seconds", "5 seconds"), "k").agg(
                   F.count(F.lit(1)).alias("n")), delay_s=5, slide_s=5, late=False),
        Family("session", SESSION, ("append", "update"),
               lambda df: wm(df, 5).groupBy(F.session_window("ts", "5 seconds"), "k").agg(
                   F.count(F.lit(1)).alias("n"), F.sum("v").alias("sv")), delay_s=5),
        Family("session_ontime", SESSION, ("append",),
               lambda df: wm(df, 20).groupBy(F.session_window("ts", "5 seconds"), "k").agg(
                   F.count(F.lit(1)).alias("n")), delay_s=20, late=False),
        Family("session_gap_apart", SESSION, ("append",),
               lambda df: wm(df, 20).groupBy(F.session_window("ts", "5 seconds"), "k").agg(
                   F.count(F.lit(1)).alias("n")), delay_s=20, late=False, features=frozenset({"gap"})),
        # A filter between withWatermark and the operator: Spark pushes one that does not read the
        # event time below the watermark (its rows then never advance it), and keeps one that does above.
        Family("tumbling_filter_after_watermark", WINDOW, ("append",),
               lambda df: wm(df, 5).where(F.col("v") != 5).groupBy(F.window("ts", "10 seconds"), "k").agg(
                   F.count(F.lit(1)).alias("n")), delay_s=5, keep=lambda r: r["v"] is not None and r["v"] != 5),
        Family("tumbling_event_time_filter", WINDOW, ("append",),
               lambda df: wm(df, 5).where(F.second("ts") % 3 != 0).groupBy(F.window("ts", "10 seconds"), "k").agg(
                   F.count(F.lit(1)).alias("n")), delay_s=5, keep=lambda r: r["ts"].second % 3 != 0),
        Family("window_complete", WINDOW, ("complete",),
               lambda df: wm(df, 5).groupBy(F.window("ts", "10 seconds"), "k").agg(
                   F.count(F.lit(1)).alias("n")), delay_s=5),
        Family("dedup", DEDUP, ("append",), lambda df: df.dropDuplicates(["k"]), features=frozenset({"nulls"})),
        Family("dedup_watermark_ts_key", DEDUP, ("append",),
               lambda df: wm(df, 5).dropDuplicates(["k", "ts"]), delay_s=5),
        Family("dedup_watermark_ontime", DEDUP, ("append",),
               lambda df: wm(df, 5).dropDuplicates(["k", "ts"]), delay_s=5, late=False),
        Family("dedup_watermark_no_ts_key", DEDUP, ("append",),
               lambda df: wm(df, 5).dropDuplicates(["k"]), delay_s=5, late=False),
        Family("dedup_within_watermark", DEDUP, ("append",),
               lambda df: wm(df, 5).dropDuplicatesWithinWatermark(["k"]), delay_s=5, late=False),
    ]
    fams += _join_families(F)
    return {f.name: f for f in fams}


# A join of the stream with itself: the left side is the rows with v in (1, 3), the right v in (2, 5).
_LEFT, _RIGHT = (1, 3), (2, 5)
_RANGE = "lk = rk AND rts BETWEEN lts - interval 3 seconds AND lts + interval 3 seconds"


def _join_query(F, how: str, condition: str, delays: tuple[int | None, int | None] = (5, 5)) -> Callable:
    def query(df):
        left = df.where(F.col("v").isin(*_LEFT)).select("id", F.col("k").alias("lk"), F.col("ts").alias("lts"),
                                                         F.col("v").alias("lv"))
        right = df.where(F.col("v").isin(*_RIGHT)).select(F.col("id").alias("rid"), F.col("k").alias("rk"),
                                                           F.col("ts").alias("rts"))
        if delays[0] is not None:
            left = left.withWatermark("lts", f"{delays[0]} seconds")
        if delays[1] is not None:
            right = right.withWatermark("rts", f"{delays[1]} seconds")
        joined = left.join(right, F.expr(condition), how)
        if how == "leftsemi":
            return joined.select(left["id"], "lk", "lts", "lv")
        return joined.select(left["id"], right["rid"], "lk", F.col("lts"), right.rts, "lv")
    return query


def _join_keep(how: str) -> Callable[[dict], bool]:
    """The rows that reach the join's sides (those Spark may drop as late): a side no outer join
    keeps loses its null keys first (Spark infers isnotnull there, below the watermark)."""
    preserved = {"inner": (), "leftsemi": (), "leftouter": (0,), "rightouter": (1,), "fullouter": (0, 1)}[how]

    def keep(row: dict) -> bool:
        side = 0 if row["v"] in _LEFT else 1 if row["v"] in _RIGHT else None
        return side is not None and (row["k"] is not None or side in preserved)
    return keep


def _join_families(F) -> list[Family]:
    out = []
    for how in ("inner", "leftouter", "rightouter", "fullouter", "leftsemi"):
        out.append(Family(f"join_{how}_range", JOIN, ("append",), _join_query(F, how, _RANGE), delay_s=5,
                          keep=_join_keep(how), reads=2, features=frozenset({"nulls"})))
    out += [
        # The event time among the join keys: a key's rows expire with the watermark (a key predicate).
        Family("join_inner_time_key", JOIN, ("append",), _join_query(F, "inner", "lk = rk AND lts = rts"), delay_s=5,
               keep=_join_keep("inner"), reads=2),
        Family("join_leftouter_time_key", JOIN, ("append",), _join_query(F, "leftouter", "lk = rk AND lts = rts"),
               delay_s=5, keep=_join_keep("leftouter"), reads=2),
        # Conjuncts over one side alone: the left's (preserved) pads its failing rows at once, the right's is pushed.
        Family("join_leftouter_side_conditions", JOIN, ("append",),
               _join_query(F, "leftouter", _RANGE + " AND lv != 3 AND rid % 3 != 0"), delay_s=5,
               keep=_join_keep("leftouter"), reads=2),
        # No watermark at all: an inner join keeps every row (nothing is late, nothing expires).
        Family("join_inner_no_watermark", JOIN, ("append",), _join_query(F, "inner", "lk = rk", (None, None)),
               reads=2, late=False),
        # One side's watermark only: the other side's rows never expire.
        Family("join_inner_one_watermark", JOIN, ("append",), _join_query(F, "inner", _RANGE, (5, None)), delay_s=5,
               keep=_join_keep("inner"), reads=2),
        # Spark refuses an outer join whose nullable side has no watermark: txstream too.
        Family("join_leftouter_no_watermark", JOIN, ("append",), _join_query(F, "leftouter", "lk = rk", (None, None)),
               reads=2, late=False),
    ]
    return out


def make_cuts(family: Family, seed: int) -> list[pa.Table]:
    """2..4 cuts of 2..6 rows, in event-time order with disorder; each cut knows the watermark
    Spark runs it with (the latest event time before it, less the delay)."""
    rnd = random.Random(seed)
    ncuts = rnd.randint(2, 4)
    rows: list[list[dict]] = []
    latest_us: int | None = None
    clock = 0          # µs after T0: the stream's own time moves forward
    ident = 0
    delay_us = (family.delay_s or 0) * SECOND
    for c in range(ncuts):
        watermark = None if latest_us is None or family.delay_s is None else latest_us - delay_us
        cut: list[dict] = []
        for _ in range(rnd.randint(2, 6)):
            clock += rnd.choice([0, 1, 2, 3, 4]) * SECOND
            ts = clock
            if rnd.random() < 0.3:    # a row on a window or session boundary
                ts = (ts // (5 * SECOND)) * 5 * SECOND
            if rnd.random() < 0.25:   # disorder, within the delay
                ts = max(0, ts - rnd.randint(0, max(delay_us - 1, 0)))
            if "micros" in family.features or rnd.random() < 0.2:
                ts += rnd.choice([1, 7, 999, 1001])
            if watermark is not None and not family.late:
                ts = max(ts, watermark + 1000)    # strictly after the watermark, by a millisecond
            cut.append(_row(family, rnd, ident, ts))
            ident += 1
        if watermark is not None and family.late:
            # Behind the watermark by its own event time, and (window, session) whose state is
            # still open; and one exactly on the watermark; and one long closed.
            for ts in (_open_behind(family, watermark), watermark, max(0, watermark - 30 * SECOND)):
                cut.insert(rnd.randint(0, len(cut)), _row(family, rnd, ident, ts))
                ident += 1
        if "gap" in family.features and c > 0:
            # The next session of key 'g' starts exactly one gap after the last one's last event.
            last = max(r["ts_us"] for cut_ in rows for r in cut_ if r["k"] == "g")
            cut.append({**_row(family, rnd, ident, last + family.gap_s * SECOND), "k": "g"})
            ident += 1
        if "gap" in family.features and c == 0:
            cut.append({**_row(family, rnd, ident, clock), "k": "g"})
            ident += 1
        if "nan" in family.features and c < 2:
            # NaN then a number for key 'n', a number then NaN for 'o': Spark orders NaN above
            # every number whichever batch brings it.
            for key, d in (("n", float("nan") if c == 0 else 1.5), ("o", 1.5 if c == 0 else float("nan"))):
                cut.append({**_row(family, rnd, ident, clock), "k": key, "d": d})
                ident += 1
        if "micros" in family.features and cut:
            twin = dict(cut[0])   # a twin one microsecond apart: its own group
            twin.update(id=ident, ts_us=cut[0]["ts_us"] + 1)
            cut.append(twin)
            ident += 1
        rows.append(cut)
        latest = max(r["ts_us"] for r in cut)
        latest_us = latest if latest_us is None else max(latest_us, latest)
    return [_table(cut) for cut in rows]


def _open_behind(family: Family, watermark: int) -> int:
    """An event time behind the watermark whose window or session is still open (a running
    aggregate and deduplication: just behind)."""
    if family.kind == WINDOW:
        step = family.slide_s * SECOND
        start = (watermark // step) * step     # the window holding the watermark: end > watermark
        return start if start < watermark else watermark - 1000
    if family.kind == SESSION:
        return watermark - family.gap_s * SECOND // 2
    return watermark - 1000


def _row(family: Family, rnd: random.Random, ident: int, ts_us: int) -> dict:
    nulls = "nulls" in family.features
    keys = ["a", "b", "c"] + ([None] if nulls else [])
    d = rnd.choice([1.5, -2.0, 0.0, 3.25] + ([float("nan")] * 2 if "nan" in family.features else []))
    return {"id": ident, "partition": 0, "offset": ident, "ts_us": max(0, ts_us), "k": rnd.choice(keys),
            "b": rnd.choice(BINARY_KEYS if "binary" in family.features else [b"x", b"y"]),
            "v": rnd.choice([1, 2, 3, 5, None] if nulls else [1, 2, 3, 5]),
            "d": d, "m": rnd.choice([Decimal("1.001"), Decimal("123456789.123"), Decimal("0.333"),
                                     Decimal("-7.500")])}


def _table(cut: list[dict]) -> pa.Table:
    rows = [{**{k: v for k, v in r.items() if k != "ts_us"}, "ts": T0 + timedelta(microseconds=r["ts_us"])}
            for r in cut]
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def recut(cuts: list[pa.Table], seed: int) -> list[pa.Table]:
    """The same rows, in the same order, cut elsewhere."""
    whole = pa.concat_tables(cuts)
    rnd = random.Random(seed)
    n = whole.num_rows
    points = sorted(rnd.sample(range(1, n), min(rnd.randint(1, 3), n - 1)))
    bounds = [0, *points, n]
    return [whole.slice(a, b - a) for a, b in zip(bounds, bounds[1:], strict=False)]
