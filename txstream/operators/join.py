"""Stream-stream joins (Spark's StreamingSymmetricHashJoinExec): inner, leftOuter, rightOuter,
fullOuter and leftSemi, each side's rows kept in the unit's state until Spark's state watermark
for that side passes them (docs/joins.md).

Spark's rules, per batch and unit (the unit holds the rows of the join keys that hash to it):
- A side's row whose event time is at or behind the previous batch's watermark is late: dropped
  (to the dead-letter topic here), joined with nothing.
- A row failing the conjuncts over its own side alone never matches: on the preserved side of an
  outer join it is emitted null-padded at once, else dropped (JoinConditionSplitPredicates); so
  is a new row its side's state watermark has passed already and that met no partner.
- The left rows join the right state as it was before the batch; then the right rows join the
  left state with the batch's left rows added. A new row is kept only while its side's state
  watermark has not passed it (and, on a semi join's left side, only while it has no match), so
  a new left row already past its bound meets the old right rows, not the new ones.
- A kept row remembers whether it ever matched; when the state watermark passes it, it is
  removed, and on the preserved side of an outer join emitted null-padded if it never did.

What a row's state watermark is comes from Spark itself (operators/join_plan.py). The condition
is evaluated by Spark too: a unit's merge runs in two steps in one task (task/join_unit.py). The
first (`probe`) reads the state and yields every candidate pair of rows with equal join keys; a
Spark filter with the join's own condition keeps the pairs that match; the second (`finish`)
takes the matches, emits the joined and null-padded rows and writes the state's changes.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from txstream.errors import TransformError
from txstream.operators.base import LATE, LATE_MS, ROUTE, LateRow, Merged, MergeSpec, StatefulOperator
from txstream.operators.join_plan import PRESERVED, Eviction, JoinPlan
from txstream.state import values
from txstream.state.keys import EXPIRY, EXPIRY_VALUE, _plain, encode_keys, window_prefix
from txstream.state.operator import JOIN, OperatorDescription, state_format
from txstream.state.store import StateStore

# The unit's input: one row per side row.
SIDE = "_txs_side"        # 0 left, 1 right
KEY = "_txs_jk"           # the join keys, a struct
ROWS_OF = ("_txs_l", "_txs_r")   # the side's row, a struct (null on the other side's rows)
EVENT = "_txs_et"         # the side's event time, µs (its watermark's column)
EVICT = "_txs_ev"         # what its state row expires by, µs
PRE = "_txs_pre"          # the conjuncts over its own side pass
# The probe's pairs: the left row's fields, the right row's, and which rows they are.
LEFT_ID, RIGHT_ID = "_txs_li", "_txs_ri"
SIDES = (b"L", b"R")
_SEP = b"\xff"            # after a key's JSON (which never holds the byte 0xff)


def flat_names(side: int, count: int) -> list[str]:
    return [f"_txs_{'lr'[side]}{i}" for i in range(count)]


@dataclass(frozen=True)
class JoinRun:
    """What a unit's join of one batch is told: the join type, each side's state eviction, and
    the Arrow types of each side's rows and of the probe's pairs."""

    join_type: str
    evictions: tuple[Eviction | None, Eviction | None]
    types: tuple[pa.StructType, pa.StructType] = field(repr=False)
    pairs_schema: pa.Schema = field(repr=False)
    expiring: tuple[bool, bool] = (False, False)   # whose rows ever expire (their index is kept)


# -- the state's rows --------------------------------------------------------------------------------

def _ceil_ms(us: int) -> int:
    return -((-us) // 1000)


def _row_key(side: int, key: bytes, batch_id: int, index: int) -> bytes:
    return SIDES[side] + key + _SEP + struct.pack(">QI", batch_id, index)


def _key_prefix(side: int, key: bytes) -> bytes:
    return SIDES[side] + key + _SEP


def _index_key(side: int, evict_us: int, row_key: bytes) -> bytes:
    """The expiry index entry of a state row: a side's rows in the order its watermark passes them."""
    return EXPIRY + SIDES[side] + window_prefix(_ceil_ms(evict_us)) + row_key


def _index_end(side: int, state_watermark_ms: int) -> bytes:
    """Scan a side's index up to here for every row with evict_us <= state_watermark_ms * 1000."""
    return EXPIRY + SIDES[side] + window_prefix(state_watermark_ms + 1)


def _encode_rows(rows: pa.StructArray) -> list[bytes]:
    """Each row's values, as JSON (state/keys.py's lossless values: bytes tagged, timestamps in µs,
    decimals as text)."""
    fields = [rows.field(i).to_pylist() for i in range(rows.type.num_fields)]
    return [json.dumps([_plain(v) for v in row], separators=(",", ":"), ensure_ascii=False).encode()
            for row in zip(*fields, strict=True)] if fields else [b"[]"] * len(rows)


def _decode_rows(encoded: list[bytes], typ: pa.StructType) -> pa.StructArray:
    rows = json.loads(b"[" + b",".join(encoded) + b"]") if encoded else []
    columns = [values.arrow_column([r[i] for r in rows], typ.field(i).type) for i in range(typ.num_fields)]
    return pa.StructArray.from_arrays(columns, fields=list(typ)) if columns else pa.array([{}] * len(rows), typ)


def _value(matched: bool, row: bytes, evict_us: int | None) -> bytes:
    return json.dumps([int(matched), evict_us]).encode() + b"\n" + row


def _parse_value(value: bytes) -> tuple[bool, int | None, bytes]:
    head, row = value.split(b"\n", 1)
    matched, evict_us = json.loads(head)
    return bool(matched), evict_us, row


@dataclass
class SideRows:
    """The rows of one side a unit's batch touches: the batch's own (new) and the state's it
    meets or expires, each by its place here (the probe's LEFT_ID/RIGHT_ID). Their values are
    columns of `sources` (the batch's rows, then the stored ones decoded at once: `seal`)."""

    typ: pa.StructType
    sources: list[pa.StructArray] = field(default_factory=list)
    refs: list[tuple[int, int]] = field(default_factory=list)   # (source, index) of each row
    keys: list[bytes] = field(default_factory=list)          # the state key (row key) of each
    encoded: list[bytes] = field(default_factory=list)       # its values, as stored
    evict_us: list[int | None] = field(default_factory=list)
    new: list[bool] = field(default_factory=list)
    kept: list[bool] = field(default_factory=list)           # new: kept in the state (its bound not passed)
    matched: list[bool] = field(default_factory=list)        # stored: matched before this batch
    expires: list[bool] = field(default_factory=list)        # stored: removed by this batch's watermark
    _stored: list[int] = field(default_factory=list)         # rows whose values are still only `encoded`
    _table: pa.StructArray | None = None   # `sources` concatenated, and where each starts in it
    _offsets: list[int] = field(default_factory=list)

    def source(self, rows: pa.StructArray) -> int:
        self.sources.append(rows.cast(self.typ))
        return len(self.sources) - 1

    def add(self, ref: tuple[int, int] | None, key: bytes, encoded: bytes, evict_us: int | None, new: bool,
            kept: bool, matched: bool, expires: bool) -> int:
        if ref is None:
            self._stored.append(len(self.keys))
        self.refs.append(ref or (-1, -1))
        self.keys.append(key)
        self.encoded.append(encoded)
        self.evict_us.append(evict_us)
        self.new.append(new)
        self.kept.append(kept)
        self.matched.append(matched)
        self.expires.append(expires)
        return len(self.keys) - 1

    def seal(self) -> None:
        """Decode the stored rows' values, all at once."""
        if self._stored:
            src = self.source(_decode_rows([self.encoded[i] for i in self._stored], self.typ))
            for n, i in enumerate(self._stored):
                self.refs[i] = (src, n)
            self._stored = []

    def take(self, indexes: list[int]) -> pa.StructArray:
        """The values of rows `indexes`, in that order."""
        if self._table is None:
            self._table = pa.concat_arrays(self.sources) if self.sources else pa.array([], self.typ)
            offsets = [0]
            for s in self.sources:
                offsets.append(offsets[-1] + len(s))
            self._offsets = offsets
        return self._table.take(pa.array([self._offsets[s] + j for s, j in (self.refs[i] for i in indexes)],
                                         pa.int64()))


@dataclass
class Probed:
    """What the probe leaves the finish (task/join_unit.py passes it in the task's side dir)."""

    base_batch: int
    sides: tuple[SideRows, SideRows]
    types: tuple[pa.StructType, pa.StructType]
    padded_now: tuple[list[int], list[int]]   # rows (of `sides`) failing their own side's conjuncts, padded now
    late: list[LateRow]
    events: tuple[int | None, int | None]     # the latest event time of each side's rows (ms)
    rows: int                                 # input rows
    keys: int                                 # the state's keys before the batch (approximately)


class StreamStreamJoin(StatefulOperator):
    kind = JOIN
    entries_per_key = 2   # a row and its expiry index entry

    # -- driver ----------------------------------------------------------------------------------

    def describe(self, units: int, output_mode: str, plan: JoinPlan,
                 watermarks: tuple[dict[str, Any] | None, dict[str, Any] | None]) -> OperatorDescription:
        if output_mode != "append":
            raise TransformError(f"a stream-stream join runs in append mode only (Structured Streaming refuses it in "
                                 f"{output_mode} mode): set output_mode = 'append'")
        for side, attrs in enumerate((plan.left_attrs, plan.right_attrs)):
            nested = [str(a.name()) for a in attrs if a.dataType().typeName() in ("struct", "array", "map")
                      and a is not plan.watermarked[side]]
            if nested:
                raise TransformError(f"the join's {'left' if side == 0 else 'right'} side keeps nested columns in "
                                     f"its state ({', '.join(nested)}), which txstream's join state does not hold yet: "
                                     "select flat columns before the join and build the nested ones after it")
        join = {**plan.describe(), "watermarks": list(watermarks)}
        watermark = next((w for w in watermarks if w is not None), None)
        return OperatorDescription("join", self.kind, units, output_mode, list(join["left_keys"]), [], None, watermark,
                                   None, state_format=state_format(self.kind), join=join)

    def unit_input(self, plan: JoinPlan, late_ms: int | None) -> Any:
        """Both sides' rows as the units take them, routed by their join keys."""
        from pyspark.sql import functions as F

        evicts = plan.expiring
        frames = []
        for side in (0, 1):
            frame = plan.side_frame(side)
            row = F.struct(*[plan.column(a) for a in (plan.left_attrs if side == 0 else plan.right_attrs)])
            other = plan.right_attrs if side == 0 else plan.left_attrs
            empty = F.lit(None).cast(_struct_type(other))
            event, evict = plan.event_time(side), plan.eviction_time(side, evicts[side])
            pre = plan.side_condition(side)
            late = (F.coalesce(F.unix_micros(event.cast("timestamp")) <= F.lit(late_ms * 1000), F.lit(False))
                    if event is not None and late_ms is not None else F.lit(False))
            columns = [F.lit(side).cast("byte").alias(SIDE), F.struct(*[k.alias(f"k{i}") for i, k in enumerate(plan.keys(side))]).alias(KEY),
                       (row if side == 0 else empty).alias(ROWS_OF[0]), (empty if side == 0 else row).alias(ROWS_OF[1]),
                       (F.unix_micros(event.cast("timestamp")) if event is not None else F.lit(None).cast("long")).alias(EVENT),
                       (F.unix_micros(evict.cast("timestamp")) if evict is not None else F.lit(None).cast("long")).alias(EVICT),
                       (F.coalesce(pre, F.lit(False)) if pre is not None else F.lit(True)).alias(PRE),
                       F.when(late, F.to_json(row)).alias(LATE),
                       F.when(late, F.unix_millis(event.cast("timestamp")) if event is not None else F.lit(None))
                       .cast("long").alias(LATE_MS)]
            frames.append(frame.select(*columns))
        unioned = frames[0].unionByName(frames[1])
        return unioned.withColumn(ROUTE, F.hash(F.col(KEY)))

    def owes_batch(self, description: OperatorDescription, last_watermark: int | None,
                   next_watermark: int | None) -> bool:
        """Spark's join runs a batch with no records when the watermark moved and some side's rows expire."""
        join = description.join or {}
        if not any(join.get("evicts") or []) or next_watermark is None:
            return False
        return last_watermark is None or next_watermark > last_watermark

    # -- task: the probe ---------------------------------------------------------------------------

    def probe(self, spec: MergeSpec, store: StateStore, table: pa.Table | None) -> tuple[pa.Table, Probed]:
        """The candidate pairs of one unit's batch (rows with equal join keys, the state's and the
        batch's, as Spark meets them) and what the finish needs to decide the rest."""
        run: JoinRun = spec.join
        types = run.types
        sides = (SideRows(types[0]), SideRows(types[1]))
        late: list[LateRow] = []
        events: list[int | None] = [None, None]
        padded_now: tuple[list[int], list[int]] = ([], [])
        rows = table.num_rows if table is not None else 0
        new_by_key: tuple[dict[bytes, list[int]], dict[bytes, list[int]]] = ({}, {})
        if table is not None and rows:
            for side in (0, 1):
                part = table.filter(pc.equal(table[SIDE], side))
                key_struct = part[KEY].combine_chunks()
                null_key = _any_null(key_struct)
                if side not in PRESERVED[run.join_type]:
                    # What Spark's optimizer pushes into a side no outer join keeps, below its watermark:
                    # the side's own conjuncts and isnotnull of its keys (InferFiltersFromConstraints).
                    part = part.filter(pc.and_(part[PRE], pc.invert(null_key)))
                    key_struct = part[KEY].combine_chunks()
                    null_key = _any_null(key_struct)
                if not part.num_rows:
                    continue
                present = part[EVENT].drop_null()
                if len(present):
                    events[side] = pc.max(present).as_py() // 1000   # EventTimeStats: µs / 1000
                is_late = pc.is_valid(part[LATE])
                for text, ms in zip(part.filter(is_late)[LATE].to_pylist(), part.filter(is_late)[LATE_MS].to_pylist(),
                                    strict=True):
                    late.append(LateRow(text.encode(), ms))
                part = part.filter(pc.invert(is_late))
                if not part.num_rows:
                    continue
                struct_rows = part[ROWS_OF[side]].combine_chunks()
                key_struct = part[KEY].combine_chunks()
                keys = encode_keys([key_struct.field(i) for i in range(key_struct.type.num_fields)], part.num_rows)
                encoded = _encode_rows(struct_rows)
                evicts = part[EVICT].to_pylist()
                pres = part[PRE].to_pylist()
                eviction = run.evictions[side]
                src = sides[side].source(struct_rows)
                order = sorted(range(part.num_rows), key=lambda j: (keys[j], encoded[j]))
                for n, j in enumerate(order):
                    if not pres[j]:
                        if side in PRESERVED[run.join_type]:
                            i = sides[side].add((src, j), b"", encoded[j], None, True, False, False, False)
                            padded_now[side].append(i)
                        continue
                    kept = not (eviction is not None and evicts[j] is not None
                                and evicts[j] <= eviction.watermark_ms * 1000)
                    i = sides[side].add((src, j), _row_key(side, keys[j], spec.batch_id, n), encoded[j], evicts[j],
                                        True, kept, False, False)
                    # A null key meets a null key, as Spark's state keys (rows) compare: on a side no outer
                    # join keeps there are none (Spark infers isnotnull there).
                    new_by_key[side].setdefault(keys[j], []).append(i)
        # The state's rows of every key the batch's other side holds, and the rows that expire.
        stored_by_key: tuple[dict[bytes, list[int]], dict[bytes, list[int]]] = ({}, {})
        seen: tuple[dict[bytes, int], dict[bytes, int]] = ({}, {})
        for side in (0, 1):
            for key in sorted(new_by_key[1 - side]):
                for row_key, value in store.scan(_key_prefix(side, key)):
                    stored_by_key[side].setdefault(key, []).append(
                        self._stored(sides[side], seen[side], row_key, value))
            eviction = run.evictions[side]
            if eviction is not None:
                for index_key, _ in store.scan(start=EXPIRY + SIDES[side], end=_index_end(side, eviction.watermark_ms)):
                    row_key = index_key[len(EXPIRY) + 1 + 8:]
                    value = store.get(row_key)
                    if value is None:
                        continue
                    i = self._stored(sides[side], seen[side], row_key, value)
                    sides[side].expires[i] = True
        # Candidates, in Spark's order: new left x stored right, then (stored left + kept new left) x new right.
        pairs: list[tuple[int, int]] = []
        for key, lefts in new_by_key[0].items():
            pairs += [(li, ri) for li in lefts for ri in stored_by_key[1].get(key, [])]
        for key, rights in new_by_key[1].items():
            lefts = stored_by_key[0].get(key, []) + [li for li in new_by_key[0].get(key, []) if sides[0].kept[li]]
            pairs += [(li, ri) for ri in rights for li in lefts]
        for rows_of_side in sides:
            rows_of_side.seal()
        probed = Probed(store.version.batch, sides, types, padded_now, late, (events[0], events[1]), rows,
                        self.user_keys(store))
        return _pairs_table(spec, probed, pairs), probed

    @staticmethod
    def _stored(rows: SideRows, seen: dict[bytes, int], row_key: bytes, value: bytes) -> int:
        if row_key in seen:
            return seen[row_key]
        matched, evict_us, encoded = _parse_value(value)
        seen[row_key] = rows.add(None, row_key, encoded, evict_us, False, True, matched, False)
        return seen[row_key]

    # -- task: the finish --------------------------------------------------------------------------

    def finish(self, spec: MergeSpec, probed: Probed, matches: pa.Table | None) -> tuple[Merged, dict[bytes, bytes | None]]:
        """The batch's output and state changes, given the candidate pairs Spark's condition kept."""
        run: JoinRun = spec.join
        left, right = probed.sides
        li = matches[LEFT_ID].to_pylist() if matches is not None else []
        ri = matches[RIGHT_ID].to_pylist() if matches is not None else []
        changes: dict[bytes, bytes | None] = {}
        outs: list[pa.Table] = []
        if run.join_type == "leftsemi":
            # A new left row with a match among the old right rows is emitted and never kept; the
            # others are emitted (once) by their first match with a new right row, unless matched before.
            met_old = {a for a, b in zip(li, ri, strict=True) if not right.new[b]}
            emit = sorted(a for a in met_old if left.new[a])
            later = {a for a, b in zip(li, ri, strict=True) if right.new[b] and not left.matched[a]
                     and not (left.new[a] and a in met_old)}
            emit += sorted(later - set(emit))
            matched = (set(later), set(ri))
            for a in met_old:
                if left.new[a]:
                    left.kept[a] = False
            if emit:
                outs.append(_flat(left.take(emit), spec.out_schema, 0, None))
        else:
            matched = (set(li), set(ri))
            if matches is not None and matches.num_rows:
                outs.append(matches.drop_columns([LEFT_ID, RIGHT_ID]).cast(spec.out_schema))
        padded: tuple[list[int], list[int]] = (list(probed.padded_now[0]), list(probed.padded_now[1]))
        for side, rows in enumerate(probed.sides):
            for i in range(len(rows.keys)):
                if not rows.keys[i]:
                    continue   # failed its own side's conjuncts: never kept
                was = rows.matched[i] or i in matched[side]
                if rows.new[i] and rows.kept[i]:
                    changes[rows.keys[i]] = _value(was, rows.encoded[i], rows.evict_us[i])
                    if rows.evict_us[i] is not None and run.expiring[side]:
                        changes[_index_key(side, rows.evict_us[i], rows.keys[i])] = EXPIRY_VALUE
                elif rows.new[i]:
                    if not was and side in PRESERVED[run.join_type]:
                        padded[side].append(i)   # past its state watermark already: no partner can come
                elif not rows.new[i] and rows.expires[i]:
                    changes[rows.keys[i]] = None
                    changes[_index_key(side, rows.evict_us[i], rows.keys[i])] = None
                    if not was and side in PRESERVED[run.join_type]:
                        padded[side].append(i)
                elif not rows.new[i] and was and not rows.matched[i]:
                    changes[rows.keys[i]] = _value(True, rows.encoded[i], rows.evict_us[i])
        for side in (0, 1):
            if padded[side]:
                rows = probed.sides[side]
                outs.append(_flat(rows.take(padded[side]), spec.out_schema, side, probed.types[1 - side]))
        out = pa.concat_tables(outs) if outs else None
        return Merged(out, [], probed.late, probed.events[0], probed.rows, [], events_right=probed.events[1]), changes


def _any_null(keys: pa.StructArray) -> pa.Array:
    """Per row, whether any of its join keys is null."""
    out = pa.array([False] * len(keys), pa.bool_())
    for i in range(keys.type.num_fields):
        out = pc.or_(out, pc.is_null(keys.field(i)))
    return out


def _struct_type(attrs: list[Any]) -> str:
    fields = ", ".join(f"`{a.name()}`: {a.dataType().simpleString()}" for a in attrs)
    return f"struct<{fields}>"


def _flat(rows: pa.StructArray, out_schema: pa.Schema, side: int, other: pa.StructType | None) -> pa.Table:
    """Rows of one side as output rows: the other side's columns null (a semi join has none)."""
    columns = [rows.field(i) for i in range(rows.type.num_fields)]
    if other is not None:
        nulls = [pa.nulls(len(rows), other.field(i).type) for i in range(other.num_fields)]
        columns = columns + nulls if side == 0 else nulls + columns
    return pa.Table.from_arrays(columns, schema=out_schema.remove_metadata()).cast(out_schema)


def _pairs_table(spec: MergeSpec, probed: Probed, pairs: list[tuple[int, int]]) -> pa.Table:
    """The candidate pairs as rows: the left row's fields, the right row's, and their places."""
    left_type, right_type = probed.types
    li = [p[0] for p in pairs]
    ri = [p[1] for p in pairs]
    left, right = probed.sides[0].take(li), probed.sides[1].take(ri)
    columns = [left.field(i) for i in range(left_type.num_fields)] + [right.field(i) for i in range(right_type.num_fields)]
    columns += [pa.array(li, pa.int64()), pa.array(ri, pa.int64())]
    return pa.Table.from_arrays(columns, schema=spec.join.pairs_schema)


def join_watermark(last_ms: int | None, events: tuple[list[int | None], list[int | None]],
                   watermarks: list[dict[str, Any] | None]) -> int | None:
    """The next batch's watermark of a join: each watermarked side's latest event time (over its
    units) less its delay, the least of them (Spark's default multiple-watermark policy, "min"),
    never below the last batch's; None until every watermarked side has seen an event."""
    sides = []
    for side_events, watermark in zip(events, watermarks, strict=True):
        if watermark is None:
            continue
        seen = max((e for e in side_events if e is not None), default=None)
        if seen is None:
            return last_ms
        sides.append(seen - watermark["delay_ms"])
    if not sides:
        return last_ms
    return max(min(sides), last_ms) if last_ms is not None else min(sides)


def shown(key: bytes, value: bytes) -> tuple[list[Any], dict[str, Any]]:
    """A join state entry as `txstream state show` lists it: (side and join key values, the row
    and whether it ever matched)."""
    side, rest = key[:1], key[1:]
    keys = json.loads(rest[:rest.index(_SEP)])
    matched, evict_us, row = _parse_value(value)
    return ["left" if side == SIDES[0] else "right", *keys], {"matched": matched, "expires_by_us": evict_us,
                                                              "row": json.loads(row)}
