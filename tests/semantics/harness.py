"""txstream's side of the differential suite, without Kafka (issue 60, the fast layer): the
real rewrite (driver/stateful_query.py's `recording` replaces the stateful operator with Spark
partials), the real merge into a memory store per unit kept across batches, batch after batch,
with the watermark computed as the driver computes it (operators/base.py `next_watermark`).

Only the transport differs from a run: the partials are collected (repartitioned by unit as
Spark's tasks get them) and merged here instead of in `mapInArrow` tasks that restore the unit
from Kafka, and the merged rows go back to Spark (`BatchContext.merge_frame`) so the rest of the
user's transform applies to them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

import pyarrow as pa
import pyarrow.compute as pc

from tests.support.state_commit import commit_batch
from txstream.driver.stateful_query import BatchContext, recording
from txstream.operators.base import ROUTE, MergeSpec, next_watermark
from txstream.operators.join import LEFT_ID, RIGHT_ID, StreamStreamJoin, join_watermark
from txstream.operators.kinds import operator_for
from txstream.state.memory import MemoryStore

APP = "semantics"
_UNIT = "_txs_diff_unit"


@dataclass
class TxBatch:
    batch_id: int
    rows: list[dict]
    watermark_ms: int | None
    cut: int | None                     # None: a batch with no records
    late_ids: set[int] = field(default_factory=set)


class TxRun:
    """One app's state (K memory stores) and watermark across its batches."""

    def __init__(self, spark: Any, query: Callable[[Any], Any], mode: str, units: int, schema: Any) -> None:
        self.spark, self.query, self.mode, self.units, self.schema = spark, query, mode, units, schema
        self.stores = [MemoryStore(u) for u in range(units)]
        self.events: list[int | None] = [None] * units
        self.events_right: list[int | None] = [None] * units   # a join's right side
        self.watermark: int | None = None
        self.ran_with: int | None = None   # the last batch's watermark: this batch's late rows are judged by it
        self.batch_id = 1   # a fresh store is at batch 0
        self.description = None

    def batch(self, cut: pa.Table | None, index: int | None) -> TxBatch:

        late_ids: set[int] = set()
        batch_id, watermark = self.batch_id, self.watermark

        def merge_spec(description, group_names, partial_names, out_schema, event_column, join=None):
            return MergeSpec(APP, None, "", batch_id, description, group_names, partial_names, out_schema,
                             watermark, "memory", 60.0, event_column, join=join)

        probes: dict[int, Any] = {}

        def join_probe(unit_input: Any, spec: MergeSpec) -> Any:
            pairs = []
            for unit, (store, part) in enumerate(zip(self.stores, _per_unit(unit_input, self.units), strict=True)):
                found, probes[unit] = StreamStreamJoin().probe(spec, store, part)
                # The unit in the ids' high bits: the matches come back from Spark as one frame.
                ids = [pc.add(found[c], unit << 40) for c in (LEFT_ID, RIGHT_ID)]
                pairs.append(found.set_column(found.schema.get_field_index(LEFT_ID), LEFT_ID, ids[0])
                             .set_column(found.schema.get_field_index(RIGHT_ID), RIGHT_ID, ids[1]))
            rows = pa.concat_tables(pairs).combine_chunks()   # createDataFrame drops the rows after an empty chunk
            return self.spark.createDataFrame(rows, schema=_spark_schema(spec.join.pairs_schema))

        def join_finish(matches: Any, spec: MergeSpec, out_schema: Any) -> Any:
            table = matches.toArrow()
            outs = []
            for unit, store in enumerate(self.stores):
                mine = table.filter(pc.equal(pc.shift_right(table[LEFT_ID], 40), unit))
                mine = mine.set_column(mine.schema.get_field_index(LEFT_ID), LEFT_ID,
                                       pc.bit_wise_and(mine[LEFT_ID], (1 << 40) - 1))
                mine = mine.set_column(mine.schema.get_field_index(RIGHT_ID), RIGHT_ID,
                                       pc.bit_wise_and(mine[RIGHT_ID], (1 << 40) - 1))
                merged, changes = StreamStreamJoin().finish(spec, probes[unit], mine)
                for key, value in changes.items():
                    if value is None:
                        store.delete(key)
                    else:
                        store.put(key, value)
                outs.append(self._merged(unit, store, merged, late_ids))
            return self._frame(outs, spec, out_schema)

        def merge_frame(grouped: Any, spec: MergeSpec, out_schema: Any) -> Any:
            outs = [self._merged(unit, store, operator_for(spec.description.kind).merge(spec, store, part), late_ids)
                    for unit, (store, part) in enumerate(zip(self.stores, _per_unit(grouped, self.units), strict=True))]
            return self._frame(outs, spec, out_schema)

        context = BatchContext(APP, self.units, self.mode, batch_id, watermark, merge_spec, merge_frame,
                               late_ms=self.ran_with, is_source=_is_source, join_probe=join_probe,
                               join_finish=join_finish)
        frame = self.spark.createDataFrame(cut if cut is not None else self.schema.empty_table(),
                                           schema=_spark_schema(self.schema))
        # An opaque source, as a run's (a MapInArrow): the optimizer cannot see an empty side through it.
        frame = frame.mapInArrow(_identity, frame.schema)
        with recording(context) as recorded:
            out = self.query(frame)
            rows = out.toArrow().to_pylist()
        self.description = recorded.description
        self.batch_id += 1
        self.ran_with = watermark
        delay = (self.description.watermark or {}).get("delay_ms") if self.description else None
        if self.description is not None and self.description.join is not None:
            self.watermark = join_watermark(self.watermark, (self.events, self.events_right),
                                            self.description.join["watermarks"])
        elif delay is not None:
            self.watermark = next_watermark(self.watermark, self.events, delay)
        return TxBatch(batch_id, rows, watermark, index, late_ids)

    def _merged(self, unit: int, store: MemoryStore, merged: Any, late_ids: set[int]) -> pa.Table | None:
        """A unit's merge taken: its batch committed, its event times and late rows noted; its output."""
        commit_batch(store, self.batch_id)
        for side_events, seen in ((self.events, merged.events), (self.events_right, merged.events_right)):
            if seen is not None:
                side_events[unit] = max(side_events[unit] or seen, seen)
        late_ids.update(_row_id(json.loads(late.row)) for late in merged.late)
        return merged.out if merged.out is not None and merged.out.num_rows else None

    def _frame(self, outs: list[pa.Table | None], spec: MergeSpec, out_schema: Any) -> Any:
        """The units' outputs back in Spark, for the rest of the user's transform."""
        kept = [o for o in outs if o is not None]
        rows = pa.concat_tables(kept).combine_chunks() if kept else spec.out_schema.empty_table()
        return self.spark.createDataFrame(rows, schema=out_schema)

    def owes_batch(self, last_watermark: int | None) -> bool:
        """The driver's question (driver/stateful.py): does the operator owe a batch with no
        records at the watermark the next batch would run with?"""
        d = self.description
        return d is not None and operator_for(d.kind).owes_batch(d, last_watermark, self.watermark)


def run_txstream(spark: Any, query: Callable[[Any], Any], mode: str, units: int, cuts: list[pa.Table]) -> list[TxBatch]:
    run = TxRun(spark, query, mode, units, cuts[0].schema)
    batches = []
    # As the oracle feeds Spark (every cut's file there before the query starts), a batch with no
    # records runs only once the input is exhausted: before that the next cut is always waiting,
    # as it is for txstream's driver, which plans a batch with no records only when idle.
    for i, cut in enumerate(cuts):
        batches.append(run.batch(cut, i))
    while run.owes_batch(batches[-1].watermark_ms):
        batches.append(run.batch(None, None))
    return batches


def _per_unit(frame: Any, units: int) -> list[pa.Table | None]:
    """`frame` routed to the units as Spark's tasks get it (Arrow batches: toArrow's cast refuses
    the late rows' null FIRST): each unit's rows, None where it has none."""
    from pyspark.sql import functions as F

    routed = frame.repartition(units, ROUTE).withColumn(_UNIT, F.spark_partition_id())
    collected = routed._collect_as_arrow()  # noqa: SLF001
    table = pa.Table.from_batches(collected) if collected else None
    parts = [None if table is None else table.filter(pc.equal(table[_UNIT], unit)).drop_columns([_UNIT])
             for unit in range(units)]
    return [p if p is not None and p.num_rows else None for p in parts]


def _row_id(row: dict) -> int:
    """A late row's input id: `id`, or a join's right side's `rid`."""
    return row["id"] if "id" in row else row["rid"]


def _identity(batches: Any) -> Any:
    yield from batches


def _is_source(node: Any) -> bool:
    return node.getClass().getSimpleName() in ("MapInArrow", "PythonMapInArrow")


def _spark_schema(schema: pa.Schema) -> Any:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)
