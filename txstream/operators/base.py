"""What every stateful operator shares (docs/state.md, "Semantics"): the interface one class per
kind implements (aggregate.py, window.py, session.py, dedup.py; join.py and arbitrary.py are the
rooms of the kinds to come), the columns the driver adds to the merge's input, what a unit's merge
is given and decides, and the watermark's rule.

An operator has two sides, as Spark's StateStoreSaveExec or StreamingDeduplicateExec do: on the
driver it builds the batch's frame of partials and late rows (`partials`, `late`: pyspark is
imported inside the functions that build frames, as the Python workers import this package too);
in a Spark task it merges a unit's partials into the unit's store and decides what the output mode
emits and what expires (`merge`, callable with any StateStore and no Kafka or TaskContext:
task/state_unit.py runs it in a task). `owes_batch` is Spark's shouldRunAnotherBatch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from txstream.errors import TransformError
from txstream.kafka.config import KafkaClients
from txstream.state import values
from txstream.state.operator import OperatorDescription
from txstream.state.store import StateStore

# Columns the driver adds to the merge's input.
ROUTE = "_txs_route"      # what routed the row to its unit
LATE = "_txs_late"        # a late row, as JSON (null on partial rows)
LATE_MS = "_txs_late_ms"  # its event time
LATE_RECORD = "_txs_late_record"   # ... and the input record it came from, as JSON (when the plan carries it)
# The reader's columns the driver carries to the stateful operator's input (driver/range_tag.py), named
# INPUT + name there: where a late row came from, so that its dead letter is the input record as read
# (the unit reads it back: the reader's frame holds decoded values, not the bytes).
INPUT = "_txs_in_"
INPUT_RECORD = ("topic", "partition", "offset")
EVENTS = "_txs_events"    # the latest event time of a group's rows in the batch
FIRST = "_txs_first"      # deduplication: the key's first row, (order..., row)
ROWS = "_txs_rows"        # how many input rows a partial row merges


@dataclass(frozen=True)
class MergeSpec:
    app_id: str
    clients: KafkaClients
    side_dir: str
    batch_id: int
    description: OperatorDescription
    group_names: tuple[str, ...]          # grouping columns in the partial rows (window first, if any)
    partial_names: tuple[str, ...]        # the partial aggregate columns, in aggregates' order
    out_schema: pa.Schema = field(repr=False)   # the aggregation's (or the deduplicated rows') schema
    watermark_ms: int | None = None
    store_kind: str = "rocksdb"
    timeout_s: float = 60.0
    event_column: str | None = None       # deduplication: the watermark's column in the rows
    # A snapshot once the changelog has grown this many records past the newest one (docs/state.md).
    snapshot_every: int = 200_000
    join: Any = None                      # a stream-stream join: operators/join.py JoinRun

    @property
    def operator(self) -> str:
        return self.description.operator


@dataclass
class Merged:
    """What a unit's merge of one batch decided (the publisher's side file holds it)."""

    out: pa.Table | None              # the rows emitted, in the aggregation's (or the rows') schema
    emitted: list[bytes]              # the state key of each row emitted, in order
    late: list[LateRow]               # the late rows, one per input row
    events: int | None                # the latest event time among the partials
    rows: int                         # input rows the partials merge
    # Deduplication with a watermark: each emitted row's expiry (ms), aligned with `emitted`.
    expires: list[int | None] = field(default_factory=list)
    events_right: int | None = None   # a stream-stream join: the latest event time of its right side's rows


@dataclass
class Emitted:
    """What an operator's merge of the partials emits: rows, their state keys, their expiries."""

    out: pa.Table | None = None
    keys: list[bytes] = field(default_factory=list)
    expires: list[int | None] = field(default_factory=list)


def next_watermark(last_ms: int | None, unit_events_ms: list[int | None], delay_ms: int) -> int | None:
    """The watermark of the next batch: the latest event time any unit has seen minus the delay,
    never below the last batch's (Structured Streaming's watermark does not move back); None
    while no unit has seen an event and no batch had a watermark."""
    events = max((e for e in unit_events_ms if e is not None), default=None)
    known = [w for w in (last_ms, None if events is None else events - delay_ms) if w is not None]
    return max(known) if known else None


class LateRow(NamedTuple):
    """A row behind the watermark: as the stateful operator saw it (JSON), its event time, and
    the input record it came from (`<topic>/<partition>/<offset>`), when the transform's plan
    could carry it there (None: a union or an aggregate on the way)."""

    row: bytes
    event_ms: int
    record: bytes | None = None


def split_late(table: pa.Table | None) -> tuple[pa.Table | None, list[LateRow]]:
    """(the partial rows, or None; the late rows) of a unit's input. The late rows come grouped
    (ROWS copies of one row in a group); a row of a hopping window comes once per window holding
    it, each group with the same count: the most copies of a row in any one group is its count."""
    if table is None or table.num_rows == 0:
        return None, []
    late: list[LateRow] = []
    late_mask = pc.is_valid(table[LATE]) if LATE in table.column_names else None
    if late_mask is not None and pc.any(late_mask).as_py():
        gone = table.filter(late_mask)
        records = gone[LATE_RECORD].to_pylist() if LATE_RECORD in gone.column_names else [None] * gone.num_rows
        counts: dict[tuple[str, int, str | None], int] = {}
        for text, ms, record, n in zip(gone[LATE].to_pylist(), gone[LATE_MS].to_pylist(), records,
                                       gone[ROWS].to_pylist(), strict=True):
            counts[(text, ms, record)] = max(counts.get((text, ms, record), 0), n)
        late = [LateRow(text.encode(), ms, record.encode() if record is not None else None)
                for (text, ms, record), n in sorted(counts.items(), key=lambda item: (item[0][1], item[0][0],
                                                                                      item[0][2] or ""))
                for _ in range(n)]
        table = table.filter(pc.invert(late_mask))
    return (table if table.num_rows else None), late


def row_columns(frame: Any) -> list[str]:
    """The stateful operator's input columns, less those the driver carried (INPUT)."""
    return [c for c in frame.columns if not c.startswith(INPUT)]


class StatefulOperator:
    """One kind of stateful operator: its late rule, its merge (what each output mode emits, what
    expires) and whether the watermark owes a batch with no records."""

    kind: str = ""
    # State entries per user key: deduplication and session windows keep an expiry index entry
    # beside each key (state/keys.py expiry_key).
    entries_per_key: int = 1

    # -- driver ----------------------------------------------------------------------------------

    def late(self, description: OperatorDescription, watermark_ms: int | None) -> Any:
        """The Column that is true on the input rows this batch drops as late (the state they would
        update is closed), or None when none is. Default: the event time is at or behind the
        watermark (Spark's watermark predicate for data, `event time <= watermark`)."""
        from pyspark.sql import functions as F

        if description.watermark is None or watermark_ms is None:
            return None
        column = F.col(description.watermark["column"])
        return F.coalesce(column <= F.timestamp_millis(F.lit(watermark_ms)), F.lit(False))

    def late_marked(self, description: OperatorDescription, source: Any, watermark_ms: int | None) -> tuple[Any, list]:
        """`source` with, on each late row, LATE (the row as JSON), LATE_MS (its event time) and,
        where the driver carried where it was read (INPUT), LATE_RECORD; null on the rows on time.
        Returns the frame and the columns to add to the grouping, so that each late row stays a
        group of its own (ROWS copies of it) and the input is read once: a union of the rows on time
        and the late rows would read it twice (one scan per branch)."""
        from pyspark.sql import functions as F

        if description.watermark is None or watermark_ms is None:
            return source, []
        column = description.watermark["column"]
        if column not in source.columns:
            raise TransformError(f"the watermark's column {column!r} does not reach the stateful operator (its "
                                 f"input has {', '.join(row_columns(source))}): keep it in the columns you aggregate "
                                 "or deduplicate")
        late = self.late(description, watermark_ms)
        if late is None:
            return source, []
        marked = source.withColumn(LATE, F.when(late, F.to_json(F.struct(*[F.col(f"`{c}`") for c in row_columns(source)]))))
        marked = marked.withColumn(LATE_MS, F.when(late, F.unix_millis(F.col(column).cast("timestamp"))))
        added = [LATE, LATE_MS]
        if all(INPUT + name in source.columns for name in INPUT_RECORD):
            record = F.concat_ws("/", *[F.col(INPUT + name).cast("string") for name in INPUT_RECORD])
            marked = marked.withColumn(LATE_RECORD, F.when(late, record))
            added.append(LATE_RECORD)
        return marked, [F.col(c) for c in added]

    @staticmethod
    def route(routed: Any, late_columns: list) -> Any:
        """ROUTE: a partial row's state key (`routed`), a late row's own content."""
        from pyspark.sql import functions as F

        return F.when(F.col(LATE).isNull(), routed).otherwise(F.hash(*late_columns)) if late_columns else routed

    def owes_batch(self, description: OperatorDescription, last_watermark: int | None,
                   next_watermark: int | None) -> bool:
        """Spark's shouldRunAnotherBatch: whether a batch with no records would change the state
        or the output (close windows, forget keys) at `next_watermark`. Default: when it moved, in
        append or update mode (complete mode closes nothing; Spark runs none there)."""
        if (description.watermark is None or next_watermark is None
                or description.output_mode not in ("append", "update")):
            return False
        return last_watermark is None or next_watermark > last_watermark

    # -- task ------------------------------------------------------------------------------------

    def merge(self, spec: MergeSpec, store: StateStore, table: pa.Table | None) -> Merged:
        """A unit's input of one batch (partials and late rows) merged into `store`, whose buffered
        changes are then the batch's state changes."""
        partials, late = split_late(table)
        emitted = self.merge_partials(spec, store, partials)
        events = rows = None
        if partials is not None:
            events = values.ms(pc.max(partials[EVENTS]).as_py())
            rows = pc.sum(partials[ROWS]).as_py()
        return Merged(emitted.out, emitted.keys, late, events, int(rows or 0), emitted.expires)

    def merge_partials(self, spec: MergeSpec, store: StateStore, partials: pa.Table | None) -> Emitted:
        raise NotImplementedError

    def user_keys(self, store: StateStore) -> int:
        """The store's keys less the expiry index."""
        return store.approximate_count() // self.entries_per_key
