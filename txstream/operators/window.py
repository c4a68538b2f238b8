"""Windowed aggregates: `groupBy(window(ts, size, slide), keys).agg(...)` after `withWatermark`
(Spark's StateStoreSaveExec with the window among the keys). A window's state key sorts by its
end (state/keys.py), so what the watermark closes is one range scan: emitted then in append mode,
and deleted from the state in append and update mode.
"""
from __future__ import annotations

from typing import Any

from txstream.errors import TransformError
from txstream.operators.aggregate import RunningAggregate
from txstream.operators.base import MergeSpec
from txstream.state.codec import StateCodec
from txstream.state.keys import window_prefix
from txstream.state.operator import WINDOW
from txstream.state.store import StateStore


class WindowAggregate(RunningAggregate):
    kind = WINDOW
    windowed = True

    def check(self, output_mode: str, watermark: tuple[str, int] | None) -> None:
        if watermark is None:
            raise TransformError("a window aggregation needs withWatermark(column, delay) before the groupBy: "
                                 "without one its windows never close and its state grows without bound")

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
