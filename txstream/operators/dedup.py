"""Deduplication: `dropDuplicates(cols)` and `dropDuplicatesWithinWatermark(cols)` (Spark's
StreamingDeduplicateExec and StreamingDeduplicateWithinWatermarkExec). A key's first row is
emitted once; the state holds the keys seen, each with its expiry (event time + delay) and an
index entry by that expiry (state/keys.py expiry_key), so forgetting reads only the keys that
expire.
"""
from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from txstream.errors import TransformError
from txstream.operators.base import EVENTS, FIRST, ROUTE, ROWS, Emitted, MergeSpec, StatefulOperator, row_columns
from txstream.state import aggregates as aggs
from txstream.state import values
from txstream.state.codec import StateCodec
from txstream.state.keys import EXPIRY, EXPIRY_VALUE, encode_keys, expiring_key, expiry_end, expiry_key
from txstream.state.operator import DEDUP, OperatorDescription, state_format
from txstream.state.store import StateStore


class Deduplicate(StatefulOperator):
    kind = DEDUP
    entries_per_key = 2

    # -- driver ----------------------------------------------------------------------------------

    def describe(self, units: int, output_mode: str, subset: list[str], columns: list[str],
                 watermark: tuple[str, int] | None, within: bool) -> OperatorDescription:
        if within and watermark is None:
            raise TransformError("dropDuplicatesWithinWatermark needs withWatermark(column, delay) before it")
        missing = [c for c in subset if c not in columns]
        if missing:
            raise TransformError(f"dropDuplicates: no column {missing[0]!r} among {', '.join(columns)}")
        return OperatorDescription(
            "dedup", DEDUP, units, output_mode, list(subset), [], None,
            {"column": watermark[0], "delay_ms": watermark[1]} if watermark else None,
            aggs.state_schema([], event_time=True), state_format=state_format(DEDUP), within_watermark=within)

    def partials(self, description: OperatorDescription, source: Any, subset: list[str],
                 watermark_ms: int | None) -> Any:
        """One row per key of the batch: its first row (FIRST), late rows among them (LATE set)."""
        from pyspark.sql import functions as F

        marked, late = self.late_marked(description, source, watermark_ms)
        watermark = description.watermark
        columns = row_columns(source)
        # The copy kept is the first by (input partition, offset) when the rows still carry them,
        # else the least row: the same copy on every re-run of the batch.
        order = [F.col(c).alias(f"o{i}") for i, c in enumerate(("partition", "offset")) if c in columns]
        first = F.min(F.struct(*order, F.struct(*[F.col(f"`{c}`") for c in columns]).alias("row"))).alias(FIRST)
        events = (F.max(F.col(watermark["column"])).alias(EVENTS) if watermark
                  else F.lit(None).cast("timestamp").alias(EVENTS))
        grouped = marked.groupBy(*[F.col(f"`{c}`") for c in subset], *late).agg(first, events,
                                                                                 F.count(F.lit(1)).alias(ROWS))
        return grouped.withColumn(ROUTE, self.route(F.hash(*[F.col(f"`{c}`") for c in subset]), late))

    # -- task ------------------------------------------------------------------------------------

    @staticmethod
    def expiry_delay(spec: MergeSpec) -> int | None:
        """How long after its event time a key is forgotten (None: never). Spark's
        dropDuplicatesWithinWatermark forgets a key once ts + delay passes the watermark;
        dropDuplicates evicts only when the event time is among the keys, once ts itself does
        (StreamingDeduplicateExec's watermark predicate on the keys), and else keeps it forever."""
        d = spec.description
        if spec.event_column is None or d.watermark is None:
            return None
        if d.within_watermark:
            return d.watermark["delay_ms"]
        return 0 if spec.event_column in d.keys else None

    def merge_partials(self, spec: MergeSpec, store: StateStore, partials: pa.Table | None) -> Emitted:
        """Each key's first row, unless the state has seen the key; keys whose expiry the
        watermark passed are forgotten (`expiry_delay`), found by the expiry index rather than by
        reading every key."""
        emitted = Emitted()
        codec = StateCodec(spec.description.state_schema)
        delay = self.expiry_delay(spec)
        if partials is not None:
            keys = encode_keys([partials[n] for n in spec.group_names], partials.num_rows)
            first = pc.struct_field(partials[FIRST], "row")
            events = (values.ms_column(pc.struct_field(first, spec.event_column)) if delay is not None
                      else [None] * len(keys))
            stored = store.get_many(keys)
            kept: list[int] = []
            seen: set[bytes] = set()
            for j in sorted(range(len(keys)), key=keys.__getitem__):
                key = keys[j]
                if stored[j] is not None or key in seen:
                    continue
                seen.add(key)
                kept.append(j)
                expires = None if events[j] is None else events[j] + delay
                store.put(key, codec.encode({"t": expires}))
                if expires is not None:
                    store.put(expiry_key(expires, key), EXPIRY_VALUE)
            emitted.keys = [keys[j] for j in kept]
            emitted.expires = [None if events[j] is None else events[j] + delay for j in kept]
            if kept:
                taken = first.take(pa.array(kept, pa.int64()))
                emitted.out = pa.Table.from_struct_array(taken).cast(spec.out_schema)
        if spec.watermark_ms is not None and delay is not None:
            for index_key, _ in list(store.scan(EXPIRY, end=expiry_end(spec.watermark_ms))):
                store.delete(index_key)
                store.delete(expiring_key(index_key))
        return emitted
