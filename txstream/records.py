"""What the protocols write to Kafka and read back, each a typed record with one encode/decode
(Spark keeps these as classes too: OffsetSeqLog, CommitLog). The driver and the tasks write
them; the driver, the tasks and the offline commands (tools/) read them, so this module sits
below all three and imports none of them (tests/test_import_structure.py).

- `PlanShare`: an input partition's share of a wide batch's plan, in its committed offset's
  metadata (the plan log: docs/wide-transforms.md §1), and what the log says (`pending_batch`).
- `Marker`: a unit's marker, the committed offset and metadata of partition i of `<app>.units`
  in the group `<app>.units` (docs/wide-transforms.md §2).
- `BatchRecord`: the record the closing transaction of a wide batch writes to `<app>.units`,
  partition 0, which `txstream verify` reconciles (docs/wide-transforms.md §8).
- `DeadLetter`: an input record set aside (undecodable, or poison in the transform), handed from
  a reader or the driver's isolation to whoever publishes it to the dead-letter topic.

The wire formats are those written since these records existed; a decoder reads every older
form (fields added later are optional).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, NamedTuple

# -- the plan log (in the app group's committed offsets) --------------------------------------

VERSION = "txs1"


@dataclass(frozen=True)
class PlanShare:
    """One input partition's share of a wide batch's plan: `txs1;b=<batch>;e=<end>;k=<units>;
    t=<batch time, ms>[;w=<watermark, ms>][;l=<late rows' watermark, ms>][;v=<tables' version>]`.
    The committed offset is where the batch starts, `e`
    where it ends: `e` beyond the committed offset is a batch planned and not closed (pending).
    Kafka's `offset.metadata.max.bytes` (4,096 by default) is per partition and a share is ~40
    bytes: the log grows with the partitions, never past the cap."""

    batch_id: int
    end: int
    units: int
    timestamp_ms: int
    watermark_ms: int | None = None   # a stateful batch's watermark (docs/state.md): the same on a re-run
    # The watermark its late rows are judged by: the previous batch's (Spark's
    # eventTimeWatermarkForLateEvents); absent in shares written before it was logged.
    late_ms: int | None = None
    # The version of the processor's tables the batch joins against (task/tables.py
    # encode_versions: `name:end.end...,name:...`), so that a re-run reads the same.
    tables: str | None = None

    def encode(self) -> str:
        text = f"{VERSION};b={self.batch_id};e={self.end};k={self.units};t={self.timestamp_ms}"
        if self.watermark_ms is not None:
            text += f";w={self.watermark_ms}"
        if self.late_ms is not None:
            text += f";l={self.late_ms}"
        return text if self.tables is None else f"{text};v={self.tables}"

    @staticmethod
    def decode(text: str | None) -> PlanShare | None:
        """The share in a commit's metadata; None for metadata txstream did not write (a narrow
        run's, `txstream offsets reset`'s, another tool's)."""
        if not text or not text.startswith(VERSION + ";"):
            return None
        try:
            fields = dict(part.split("=", 1) for part in text.split(";")[1:])
            return PlanShare(int(fields["b"]), int(fields["e"]), int(fields["k"]), int(fields["t"]),
                             int(fields["w"]) if "w" in fields else None, int(fields["l"]) if "l" in fields else None,
                             fields.get("v"))
        except (KeyError, ValueError):
            return None


@dataclass(frozen=True)
class LoggedPartition:
    """What the log says of one input partition: its committed offset and its plan share."""

    committed: int | None
    share: PlanShare | None

    @property
    def pending(self) -> bool:
        return (self.share is not None and self.committed is not None and self.share.end > self.committed)


@dataclass(frozen=True)
class PendingBatch:
    """A logged batch that is not closed: its id, units, time and the range of every partition."""

    batch_id: int
    units: int
    timestamp_ms: int
    ranges: dict[tuple[str, int], tuple[int, int]]   # (topic, partition) -> [start, end)
    watermark_ms: int | None = None
    late_ms: int | None = None
    tables: str | None = None


def pending_batch(log: dict[tuple[str, int], LoggedPartition]) -> PendingBatch | None:
    """The batch the log says must run again, if any.

    One transaction logs a plan's shares for all its partitions, so the pending shares agree on
    the batch; a partition without a share of that batch takes part with an empty range."""
    pending = [entry for entry in log.values() if entry.pending]
    if not pending:
        return None
    newest = max(entry.share.batch_id for entry in pending)  # type: ignore[union-attr]
    first = next(e.share for e in pending if e.share.batch_id == newest)  # type: ignore[union-attr]
    ranges = {}
    for key, entry in log.items():
        if entry.committed is None:
            continue
        in_batch = entry.share is not None and entry.share.batch_id == newest
        ranges[key] = (entry.committed, entry.share.end if in_batch else entry.committed)  # type: ignore[union-attr]
    return PendingBatch(newest, first.units, first.timestamp_ms, ranges, first.watermark_ms, first.late_ms,
                        first.tables)


def last_batch_id(log: dict[tuple[str, int], LoggedPartition]) -> int:
    """The highest batch id the log mentions (0 when it mentions none)."""
    return max((e.share.batch_id for e in log.values() if e.share is not None), default=0)


def last_watermark(log: dict[tuple[str, int], LoggedPartition]) -> int | None:
    """The newest watermark the log mentions (None: no stateful batch logged one)."""
    return max((e.share.watermark_ms for e in log.values() if e.share is not None and e.share.watermark_ms is not None),
               default=None)


# -- the units' markers (committed offsets of the group `<app>.units`) --------------------------

MARKERS_SUFFIX = ".units"


def markers_name(app_id: str) -> str:
    """The internal topic and the group whose committed offsets are the units' markers (the
    topic's partition 0 holds the batch records too)."""
    return f"{app_id}{MARKERS_SUFFIX}"


@dataclass(frozen=True)
class Marker:
    """A unit's marker: `offset` is the next batch it has to publish; the metadata describes the
    last one it published: `p=<plan id>;r=<rows>;h=<routing digest>;v=<values digest>`, then
    `;x=<latest event time, ms>` (a join's left side; `;y=` its right side's), `;a=<merge attempt>` and `;m=<rows merged>;l=<rows late>` for a
    stateful unit."""

    offset: int | None
    plan_id: str = ""
    rows: int = -1
    content: str = ""       # digest of what routed the records (topic and key)
    values: str = ""        # digest of the values
    events: int | None = None   # a stateful unit: the latest event time it has seen (ms), for the watermark
    merged: int = -1            # a stateful unit: input rows its batch merged into the state
    late: int = -1              # ... and rows behind the watermark
    attempt: str = ""           # ... and which merge attempt's changes it committed (task/state_unit.py)
    events_right: int | None = None   # a stream-stream join's unit: its right side's latest event time (ms)

    @property
    def done_through(self) -> int:
        """The last batch id this unit published (0: none)."""
        return (self.offset or 1) - 1

    def encode(self) -> str:
        """The commit's metadata (the offset is the commit's own)."""
        text = f"p={self.plan_id};r={self.rows};h={self.content};v={self.values}"
        if self.events is not None:
            text += f";x={self.events}"
        if self.events_right is not None:
            text += f";y={self.events_right}"
        if self.attempt:
            text += f";a={self.attempt}"
        return text if self.merged < 0 else f"{text};m={self.merged};l={self.late}"

    @staticmethod
    def decode(offset: int | None, metadata: str | None) -> Marker:
        """A committed offset (None: none) and its metadata; fields that do not read are left
        at their defaults (a marker is never refused: its offset is what counts)."""
        fields = dict(part.split("=", 1) for part in (metadata or "").split(";") if "=" in part)
        try:
            rows = int(fields.get("r", -1))
        except ValueError:
            rows = -1
        try:
            events = int(fields["x"]) if "x" in fields else None
            events_right = int(fields["y"]) if "y" in fields else None
            merged, late = int(fields.get("m", -1)), int(fields.get("l", -1))
        except ValueError:
            events, events_right, merged, late = None, None, -1, -1
        return Marker(offset, fields.get("p", ""), rows, fields.get("h", ""), fields.get("v", ""), events, merged, late,
                      fields.get("a", ""), events_right)


def read_markers(clients: Any, app_id: str, units: int, timeout: float = 30.0) -> dict[int, Marker]:
    """Every unit's marker, read stably (a marker pending in an open transaction is resolved
    first). `clients`: kafka/config.py's KafkaClients."""
    from confluent_kafka import TopicPartition

    from txstream.kafka.transactions import stable_offsets

    name = markers_name(app_id)
    config = clients.consumer(name, **{"isolation.level": "read_committed", "enable.auto.commit": False})
    answer = stable_offsets(config, [TopicPartition(name, i) for i in range(units)], timeout)
    return {tp.partition: Marker.decode(tp.offset if tp.offset >= 0 else None, tp.metadata) for tp in answer}


# -- the batch record (`<app>.units`, partition 0, one per closing) -----------------------------

@dataclass(frozen=True)
class StateFacts:
    """A stateful batch's facts in its record, from the units' markers: the operator, its kind
    and mode, the state's epoch (new at every `txstream state reset`: keys start over), the
    watermark, whether each row is merged once (not a hopping window's), and per unit that
    published the batch the rows it merged and the rows that were late."""

    operator: str
    kind: str
    output_mode: str
    epoch: Any = None                  # absent from records written before state resets had epochs
    watermark_ms: int | None = None
    rows_once: bool = True
    unit_merged: dict[int, int] = field(default_factory=dict)
    unit_late: dict[int, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"operator": self.operator, "kind": self.kind, "output_mode": self.output_mode, "epoch": self.epoch,
                "watermark_ms": self.watermark_ms, "rows_once": self.rows_once,
                "unit_merged": {str(i): n for i, n in sorted(self.unit_merged.items())},
                "unit_late": {str(i): n for i, n in sorted(self.unit_late.items())}}

    @staticmethod
    def from_json(found: dict[str, Any]) -> StateFacts:
        return StateFacts(found["operator"], found["kind"], found["output_mode"], found.get("epoch"),
                          found.get("watermark_ms"), bool(found.get("rows_once", True)),
                          {int(k): int(v) for k, v in (found.get("unit_merged") or {}).items()},
                          {int(k): int(v) for k, v in (found.get("unit_late") or {}).items()})


@dataclass(frozen=True)
class BatchRecord:
    """What the closing transaction of a wide batch writes (JSON, keyed by the batch id): the
    batch, its plan id and time, the wide mode, its units, its input ranges, the records each
    unit published, the dead letters it closed with, and a stateful batch's facts."""

    batch: int
    plan: str = ""
    time_ms: int = 0
    mode: str = ""
    units: int = 0
    ranges: list[tuple[str, int, int, int]] = field(default_factory=list)   # (topic, partition, start, end)
    unit_records: dict[int, int] = field(default_factory=dict)
    dead_letters: int = 0
    state: StateFacts | None = None
    # Where the record was read (its offset in the markers topic): a reader's, never encoded.
    offset: int = field(default=-1, compare=False)

    def encode(self) -> bytes:
        found: dict[str, Any] = {
            "batch": self.batch, "plan": self.plan, "time_ms": self.time_ms, "mode": self.mode, "units": self.units,
            "ranges": [list(r) for r in self.ranges],
            "unit_records": {str(k): v for k, v in sorted(self.unit_records.items())}, "dead_letters": self.dead_letters}
        if self.state is not None:
            found["state"] = self.state.to_json()
        return json.dumps(found, separators=(",", ":")).encode()

    @staticmethod
    def decode(value: bytes | str, offset: int = -1) -> BatchRecord:
        """A batch record's value (read at `offset` of the markers topic). Raises ValueError (or
        KeyError: no batch id) for a value that is not one."""
        found = json.loads(value)
        state = found.get("state")
        return BatchRecord(
            int(found["batch"]), found.get("plan", ""), int(found.get("time_ms", 0)), found.get("mode", ""),
            int(found.get("units", 0)), [(t, int(p), int(s), int(e)) for t, p, s, e in found.get("ranges", [])],
            {int(k): int(v) for k, v in (found.get("unit_records") or {}).items()}, int(found.get("dead_letters", 0)),
            StateFacts.from_json(state) if state else None, offset)


# -- dead letters (a reader's side file, the wide batch's accumulator, the driver's isolation) ---

class DeadLetter(NamedTuple):
    """An input record set aside, as read: published to the dead-letter topic with its original
    key, value and headers, and the stage (`decode`, `transform`) and error in headers. A tuple
    (pickled in side files and accumulators, built per undecodable record: kept cheap)."""

    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None
    timestamp_ms: int
    offset: int
    stage: str
    error: str
