"""What a stateful operator is, as kept beside its state: the description `txstream state show`
reads, and the fingerprint a restart compares with its own transform's (docs/state.md).

It lives in the app's state topic `<app>.state` (one partition, compacted): key = the operator's
name, value = this description as JSON. The driver writes it at start, before the first batch
that writes state; a restart whose transform describes the operator differently (other keys,
aggregates, window or state schema) is refused with what changed, instead of reading state it
cannot understand.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

AGGREGATE = "aggregate"     # groupBy().agg() without a window: running aggregates
WINDOW = "window"           # groupBy(window(...), ...).agg()
SESSION = "session"         # groupBy(session_window(...), ...).agg()
DEDUP = "dedup"             # dropDuplicates / dropDuplicatesWithinWatermark
JOIN = "join"               # a stream-stream join (each side's rows, until its state watermark passes them)

STATE_TOPIC_CONFIG = {"cleanup.policy": "compact"}


def state_format(kind: str) -> int:
    """The state format an operator of `kind` writes now (OperatorDescription.state_format)."""
    # 3: keys and values are Spark's exactly (bytes, microseconds, decimals); 4: sessions' bounds in µs
    return 4 if kind == SESSION else 3


def state_topic(app_id: str) -> str:
    """The app's topic of operator descriptions (one record per stateful operator)."""
    return f"{app_id}.state"


@dataclass(frozen=True)
class Aggregate:
    name: str           # the output column
    function: str       # count, sum, min, max, avg, count_distinct
    input: str          # the input column's name ("*" for count(*))


@dataclass(frozen=True)
class OperatorDescription:
    operator: str                         # "agg" or "dedup": the name in its topics
    kind: str                             # AGGREGATE, WINDOW or DEDUP
    units: int                            # K state partitions
    output_mode: str                      # append, update, complete
    keys: list[str]                       # grouping (or deduplication) columns, window excluded
    aggregates: list[Aggregate] = field(default_factory=list)
    # {"column", "size_ms", "slide_ms", "start_ms"}; sessions {"column", "gap_ms"} or, a gap per row, {"column", "gap"}
    window: dict[str, Any] | None = None
    watermark: dict[str, Any] | None = None   # {"column", "delay_ms"}
    state_schema: dict[str, Any] | None = None  # Avro record schema of the state values
    # How the state is laid out: 2 adds the expiry index of deduplication and session windows
    # (state/keys.py), which a state of format 1 lacks (its keys would never expire); 3 keeps
    # binary key values as tagged base64, timestamps in keys as microseconds and decimals as exact
    # text (a key or value of format 2 would be misread); 4, of session windows, keeps a session's
    # bounds in microseconds (3: milliseconds). In the fingerprint, so an older state is
    # refused with the way to start over rather than misread.
    state_format: int = 1
    # Which life of the state this is: new when the description is first written (after a
    # `txstream state reset` too), so a worker's local copy of an earlier life is never reused.
    epoch: str = ""
    # Deduplication: dropDuplicatesWithinWatermark (keys forgotten once ts + delay passes the
    # watermark) rather than dropDuplicates (kept, unless the event time is a key). Outside the
    # fingerprint, as the output mode: a state written before it was recorded reads as False.
    within_watermark: bool = False
    # A stream-stream join (operators/join_plan.py JoinPlan.describe): its type, sides, keys,
    # condition, which sides expire, and each side's watermark ({"column", "delay_ms"} or None).
    join: dict[str, Any] | None = None

    @property
    def windowed(self) -> bool:
        return self.kind == WINDOW

    def fingerprint(self) -> str:
        """What must not change while state exists: everything but the output mode and the
        watermark's delay (both only change what is emitted and when). The window's start offset
        and the watermark's column place and close the windows; a window described before the
        offset was kept has none (0)."""
        kept = {k: v for k, v in asdict(self).items() if k not in ("output_mode", "watermark", "epoch",
                                                                               "within_watermark")}
        if self.kind == WINDOW and self.window is not None:
            kept["window"] = {**self.window, "start_ms": self.window.get("start_ms", 0)}
        if self.watermark is not None:
            kept["watermark_column"] = self.watermark.get("column")
        if self.join is not None:   # the delays, as the watermark's, change only when rows expire
            kept["join"] = {**self.join, "watermarks": [w and w.get("column") for w in self.join.get("watermarks") or []]}
        else:
            kept.pop("join", None)
        return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]

    def to_json(self) -> bytes:
        body = asdict(self)
        body["fingerprint"] = self.fingerprint()
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @staticmethod
    def from_json(value: bytes) -> OperatorDescription:
        body = json.loads(value)
        body.pop("fingerprint", None)
        body["aggregates"] = [Aggregate(**a) for a in body.get("aggregates") or []]
        return OperatorDescription(**body)

    def differences(self, other: OperatorDescription) -> list[str]:
        """What differs between the stored description (`self`) and a new one, for the message
        that refuses the restart."""
        said = []
        for name in ("kind", "units", "keys", "aggregates", "window", "watermark", "state_schema", "state_format",
                     "join"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if name == "watermark":
                mine, theirs = (mine or {}).get("column"), (theirs or {}).get("column")
                if mine != theirs:
                    said.append(f"the watermark's column: {_show(mine)} in the state, {_show(theirs)} in the transform")
                continue
            if mine != theirs and name == "state_format":
                said.append(f"the state's format: {mine} in the state, {theirs} in this txstream (docs/state.md)")
            elif mine != theirs:
                said.append(f"{name}: {_show(mine)} in the state, {_show(theirs)} in the transform")
        return said


def _show(value: Any) -> str:
    if isinstance(value, list) and value and isinstance(value[0], Aggregate):
        return "[" + ", ".join(f"{a.function}({a.input}) as {a.name}" for a in value) + "]"
    if isinstance(value, dict) and value.get("type") == "record":
        return "a state schema with fields " + ", ".join(f["name"] for f in value.get("fields", []))
    return json.dumps(value) if not isinstance(value, str) else value
