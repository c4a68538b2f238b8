"""Windowed aggregates: `groupBy(window(ts, size, slide), keys).agg(...)` after `withWatermark`
(Spark's StateStoreSaveExec with the window among the keys). A window's state key sorts by its
end (state/keys.py), so what the watermark closes is one range scan: emitted then in append mode,
and deleted from the state in append and update mode.
"""
from __future__ import annotations

from typing import Any

from txstream.errors import TransformError
from txstream.operators.aggregate import RunningAggregate
from txstream.operators.base import LATE, MergeSpec
from txstream.state.codec import StateCodec
from txstream.state.keys import window_prefix
from txstream.state.operator import WINDOW, OperatorDescription
from txstream.state.store import StateStore


class WindowAggregate(RunningAggregate):
    kind = WINDOW
    windowed = True

    def check(self, output_mode: str, watermark: tuple[str, int] | None) -> None:
        if watermark is None:
            raise TransformError("a window aggregation needs withWatermark(column, delay) before the groupBy: "
                                 "without one its windows never close and its state grows without bound")

    def late(self, description: OperatorDescription, watermark_ms: int | None) -> Any:
        """A row is late when every window holding it is closed: the latest one's end is at or
        behind the watermark (Spark evicts and drops a window once `window.end <= watermark`).
        Complete mode closes nothing."""
        from pyspark.sql import functions as F

        if description.output_mode == "complete" or description.watermark is None or watermark_ms is None:
            return None
        window = description.window
        size_us, slide_us = window["size_ms"] * 1000, window["slide_ms"] * 1000
        offset_us = window.get("start_ms", 0) * 1000
        ts_us = F.unix_micros(F.col(window["column"]).cast("timestamp"))
        last_start = ts_us - F.pmod(ts_us - F.lit(offset_us), F.lit(slide_us))
        return F.coalesce(last_start + F.lit(size_us) <= F.lit(watermark_ms * 1000), F.lit(False))

    def open_partials(self, description: OperatorDescription, grouped: Any, group_names: tuple[str, ...],
                      watermark_ms: int | None) -> Any:
        """A hopping window's row on time for its latest window may still fall in closed ones:
        those partials are dropped, as Spark drops them, rather than reopen a closed window."""
        from pyspark.sql import functions as F

        if description.output_mode == "complete" or watermark_ms is None:
            return grouped
        open_ = F.col(f"`{group_names[0]}`.end") > F.timestamp_millis(F.lit(watermark_ms))
        return grouped.where(open_ | F.col(LATE).isNotNull()) if LATE in grouped.columns else grouped.where(open_)

    def owes_batch(self, description: Any, last_watermark: int | None, next_watermark: int | None) -> bool:
        return super(RunningAggregate, self).owes_batch(description, last_watermark, next_watermark)

    def close(self, spec: MergeSpec, store: StateStore, codec: StateCodec) -> list[tuple[bytes, dict]]:
        out: list[tuple[bytes, dict]] = []
        if spec.watermark_ms is None or spec.description.output_mode == "complete":
            return out
        for key, value in list(store.scan(end=window_prefix(spec.watermark_ms + 1))):
            if spec.description.output_mode == "append":
                out.append((key, codec.decode(value)))
            store.delete(key)
        return out
