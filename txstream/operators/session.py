"""Session windows: `groupBy(session_window(ts, gap), keys).agg(...)` after `withWatermark`
(Spark's SessionWindowStateStoreSaveExec). A group's open sessions live in one state key, so a
group's partials are routed by the group alone (not the session). A batch's sessions (Spark cut
them within the batch) merge with every open session they overlap; a session closes once the
watermark passes its end (last event + gap). Bounds are epoch microseconds, as Spark's session
timestamps; a group's key is indexed by its sessions' first end in milliseconds (the watermark's
unit, rounded down so the index never misses a session that closes), so closing reads only the
groups that close.
"""
from __future__ import annotations

from typing import Any

import pyarrow as pa

from txstream.errors import TransformError
from txstream.operators.aggregate import RunningAggregate, rows
from txstream.operators.base import Emitted, MergeSpec
from txstream.operators.window import WindowAggregate
from txstream.state import aggregates as aggs
from txstream.state import values
from txstream.state.codec import StateCodec
from txstream.state.keys import (
    EXPIRY,
    EXPIRY_END,
    EXPIRY_VALUE,
    decode_key,
    encode_key,
    encode_keys,
    expiring_key,
    expiry_end,
    expiry_key,
    micros,
)
from txstream.state.operator import SESSION, Aggregate, OperatorDescription
from txstream.state.store import StateStore


class SessionWindow(RunningAggregate):
    kind = SESSION
    entries_per_key = 2

    def check(self, output_mode: str, watermark: tuple[str, int] | None) -> None:
        WindowAggregate.check(self, output_mode, watermark)
        if output_mode == "update":   # Spark 4's UnsupportedOperationChecker refuses it too
            raise TransformError("output mode update is not supported for session windows, as Structured Streaming "
                                 "refuses it (STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION): use append, each session "
                                 "emitted once when the watermark closes it")

    def state_schema(self, aggregates: list[Aggregate]) -> dict[str, Any]:
        return aggs.session_schema(aggregates)

    def routed(self, group_names: tuple[str, ...]) -> tuple[str, ...]:
        return group_names[1:]

    def late(self, description: OperatorDescription, watermark_ms: int | None) -> Any:
        """A row is late when its session can no longer be open: ts + gap at or behind the
        watermark (Spark's `session.end <= watermark`). Complete mode closes nothing."""
        from pyspark.sql import functions as F

        if description.output_mode == "complete" or description.watermark is None or watermark_ms is None:
            return None
        window = description.window
        ts_us = F.unix_micros(F.col(window["column"]).cast("timestamp"))
        return F.coalesce(ts_us + F.lit(window["gap_ms"] * 1000) <= F.lit(watermark_ms * 1000), F.lit(False))

    def owes_batch(self, description: Any, last_watermark: int | None, next_watermark: int | None) -> bool:
        return super(RunningAggregate, self).owes_batch(description, last_watermark, next_watermark)

    def merge_partials(self, spec: MergeSpec, store: StateStore, partials: pa.Table | None) -> Emitted:
        codec = StateCodec(spec.description.state_schema)
        aggregates, mode, watermark = spec.description.aggregates, spec.description.output_mode, spec.watermark_ms
        names, window = spec.group_names[1:], spec.group_names[0]
        by_key: dict[bytes, list[dict]] = {}
        if partials is not None:
            keys = encode_keys([partials[n] for n in names], partials.num_rows)
            for key, row in zip(keys, partials.to_pylist(), strict=True):
                by_key.setdefault(key, []).append(row)
        changed: list[tuple[bytes, dict]] = []
        ordered = sorted(by_key)
        for key, stored in zip(ordered, store.get_many(ordered), strict=True):
            batch = by_key[key]
            before = codec.decode(stored)["sessions"] if stored is not None else []
            sessions = before
            for row in sorted(batch, key=lambda r: micros(r[window]["start"])):
                start, end = micros(row[window]["start"]), micros(row[window]["end"])
                state = aggs.merge(aggregates, aggs.empty(aggregates),
                                   [values.plain(row[n]) for n in spec.partial_names])
                joined = [s for s in sessions if self.overlaps(s["start"], s["end"], start, end)]
                for other in joined:
                    state = aggs.merge_states(aggregates, state, other)
                    start, end = min(start, other["start"]), max(end, other["end"])
                sessions = [s for s in sessions if s not in joined] + [{**state, "start": start, "end": end}]
            sessions.sort(key=lambda s: s["start"])
            _put_sessions(store, codec, key, before, sessions)
            changed += [(key, s) for s in sessions if any(
                micros(r[window]["start"]) >= s["start"] and micros(r[window]["end"]) <= s["end"]
                for r in batch)]
        out: list[tuple[bytes, dict]] = []
        if mode == "update":
            out += [_session_pair(key, s) for key, s in changed]
        if mode == "complete":
            for key, value in store.scan(start=EXPIRY_END):
                out += [_session_pair(key, s) for s in codec.decode(value)["sessions"]]
        elif watermark is not None:
            # The groups with a session the watermark closed, in key order (as a scan of every key gave them).
            closing = sorted(expiring_key(k) for k, _ in store.scan(EXPIRY, end=expiry_end(watermark)))
            for key, stored in zip(closing, store.get_many(closing), strict=True):
                sessions = codec.decode(stored)["sessions"]
                closed = [s for s in sessions if s["end"] <= watermark * 1000]
                if mode == "append":
                    out += [_session_pair(key, s) for s in closed]
                _put_sessions(store, codec, key, sessions, [s for s in sessions if s["end"] > watermark * 1000])
        return rows(spec, out, windowed=True, bounds_scale=1)

    @staticmethod
    def overlaps(start: int, end: int, other_start: int, other_end: int) -> bool:
        """Whether two sessions [start, end) are one: they overlap or touch, as Spark's
        MergingSessionsIterator merges a session starting exactly where the last one ends."""
        return start <= other_end and other_start <= end


def _put_sessions(store: StateStore, codec: StateCodec, key: bytes, before: list[dict], after: list[dict]) -> None:
    """A group's sessions and its index entry (by its sessions' first end, in ms), both replaced."""
    if before:
        store.delete(expiry_key(min(s["end"] for s in before) // 1000, key))
    if after:
        store.put(key, codec.encode({"sessions": after}))
        store.put(expiry_key(min(s["end"] for s in after) // 1000, key), EXPIRY_VALUE)
    else:
        store.delete(key)


def _session_pair(key: bytes, session: dict) -> tuple[bytes, dict]:
    key_values, _ = decode_key(key, False)
    return encode_key(key_values, (session["start"], session["end"])), session
