"""The recording of the transform's stateful calls, taken from the user's own Structured
Streaming code (docs/state.md, "Semantics"); each kind's plan and merge is its operator's
(txstream/operators/).

The user writes `withWatermark`, `groupBy(...).agg(...)` (with `window(...)` among the keys, or
not) and `dropDuplicates`/`dropDuplicatesWithinWatermark` as for Structured Streaming. On a batch
DataFrame Spark would aggregate only the batch and ignore the watermark, so while the transform
runs these calls are recorded (`recording`): the aggregation the user asked for is replaced by
one that Spark computes per batch as partials, routes to the K state units and merges into each
unit's state (task/state_unit.py), in the aggregation's own schema, so the rest of the
transform (its `select` of key and value) applies to the merged rows unchanged.

Recording the calls, rather than taking the analyzed plan apart, keeps the user's own Column
objects: Spark's batch analyzer rewrites `window()` into an Expand or Project and drops the
watermark, which would have to be reverse-engineered from the plan.
"""
from __future__ import annotations

import functools
import re
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import pyarrow as pa

from txstream.driver.range_tag import carry_reader_columns
from txstream.errors import TransformError
from txstream.operators import join_plan
from txstream.operators import plan as plan_reading
from txstream.operators.aggregate import aggregation_partials
from txstream.operators.base import INPUT, INPUT_RECORD, ROUTE, MergeSpec
from txstream.operators.dedup import Deduplicate
from txstream.operators.join import LEFT_ID, RIGHT_ID, ROWS_OF, JoinRun, StreamStreamJoin, flat_names
from txstream.operators.kinds import operator_for
from txstream.state.operator import AGGREGATE, OperatorDescription
from txstream.task.join_unit import finish_unit, probe_unit
from txstream.task.spec import FromJob
from txstream.task.state_unit import merge_unit

_UNITS_MS = {"millisecond": 1, "milliseconds": 1, "ms": 1, "second": 1000, "seconds": 1000, "sec": 1000,
             "secs": 1000, "minute": 60_000, "minutes": 60_000, "min": 60_000, "mins": 60_000,
             "hour": 3_600_000, "hours": 3_600_000, "day": 86_400_000, "days": 86_400_000,
             "week": 604_800_000, "weeks": 604_800_000}


def duration_ms(text: str) -> int:
    """Spark's interval strings ('30 seconds', '1 minute 30 seconds', 'interval 5 minutes')."""
    parts = re.findall(r"(-?\d+(?:\.\d+)?)\s*([a-zA-Z]+)", text.lower().replace("interval", ""))
    if not parts or any(unit not in _UNITS_MS for _n, unit in parts):
        raise TransformError(f"cannot read the duration {text!r} (write e.g. '30 seconds' or '1 minute')")
    return round(sum(float(n) * _UNITS_MS[unit] for n, unit in parts))


_SAME: Any = object()


@dataclass
class BatchContext:
    """What the stateful batch being built needs from the driver."""

    app_id: str
    units: int
    output_mode: str
    batch_id: int = 0
    watermark_ms: int | None = None      # what the state closes by (eviction, emission)
    merge_spec: Callable[..., MergeSpec] | None = None   # (description, group_names, partials, schema, event) -> spec
    # How the frame of partials (routed by ROUTE) becomes the merged rows: (grouped, spec, out_schema)
    # -> DataFrame. None: Spark's tasks merge each unit into its state (`_unit_merge`); a test
    # harness plugs its own here to merge into a memory store without Kafka.
    merge_frame: Callable[[Any, MergeSpec, Any], Any] | None = None
    # What late rows are judged by: the previous batch's watermark, as Spark 3.4+ judges them
    # (eventTimeWatermarkForLateEvents); by default the batch's own.
    late_ms: int | None = _SAME
    # What a plan node that reads the batch is (operators/plan.py's by default): a harness's own source.
    is_source: Callable[[Any], bool] | None = None
    # A stream-stream join's two steps in a unit (operators/join.py): (frame, spec) -> DataFrame each.
    # None: Spark's tasks run them (task/join_unit.py); a test harness plugs its own.
    join_probe: Callable[[Any, MergeSpec], Any] | None = None
    join_finish: Callable[[Any, MergeSpec, Any], Any] | None = None

    def __post_init__(self) -> None:
        if self.late_ms is _SAME:
            self.late_ms = self.watermark_ms


@dataclass
class Recorded:
    """What one run of the transform asked for."""

    watermark: tuple[str, int] | None = None          # (column, delay ms)
    watermarked: Any = None                           # the frame withWatermark returned
    watermarks: list[tuple[Any, str, int]] = field(default_factory=list)   # every (frame, column, delay ms)
    description: OperatorDescription | None = None
    refusals: list[str] = field(default_factory=list)


_active = threading.local()


def _context() -> tuple[BatchContext, Recorded] | None:
    return getattr(_active, "value", None)


@contextmanager
def recording(context: BatchContext) -> Iterator[Recorded]:
    """Run the transform inside: its stateful calls build the stateful plan of this batch."""
    from pyspark.sql import GroupedData

    DataFrame = _dataframe_class()  # noqa: N806
    recorded = Recorded()
    originals = {(DataFrame, name): getattr(DataFrame, name)
                 for name in ("withWatermark", "groupBy", "groupby", "dropDuplicates", "drop_duplicates",
                              "dropDuplicatesWithinWatermark", "join")}
    originals.update({(GroupedData, name): getattr(GroupedData, name)
                      for name in ("agg", "count", "sum", "min", "max", "avg", "mean", *plan_reading.ARBITRARY_STATE)
                      if hasattr(GroupedData, name)})
    patches = _patches(originals)
    _active.value = (context, recorded)
    for (cls, name), patched in patches.items():
        setattr(cls, name, patched)
    try:
        yield recorded
    finally:
        for (cls, name), original in originals.items():
            setattr(cls, name, original)
        _active.value = None
    if recorded.refusals:
        raise TransformError(recorded.refusals[0])


def _dataframe_class() -> type:
    """The DataFrame class a transform's batch is: Spark 4's classic one overrides the methods."""
    try:
        from pyspark.sql.classic.dataframe import DataFrame
    except ImportError:   # Spark 3
        from pyspark.sql import DataFrame
    return DataFrame


def _patches(originals: dict) -> dict:
    from pyspark.sql import GroupedData
    from pyspark.sql import functions as F

    DataFrame = _dataframe_class()  # noqa: N806

    def with_watermark(self, eventTime: str, delayThreshold: str):  # noqa: N803 (Spark's names)
        if _context() is not None:
            refusal = plan_reading.watermark_refusal(self.schema, eventTime)
            if refusal is not None:
                raise TransformError(refusal)
            _context()[1].watermark = (eventTime, duration_ms(delayThreshold))
        marked = originals[(DataFrame, "withWatermark")](self, eventTime, delayThreshold)
        if _context() is not None:
            _context()[1].watermarked = marked
            _context()[1].watermarks.append((marked, eventTime, duration_ms(delayThreshold)))
        return marked

    def join(self, other, on=None, how=None):
        original = originals[(DataFrame, "join")]
        context = _context()
        if context is None or not join_plan.is_stream_stream(self, other, context[0].is_source):
            return original(self, other, on, how)   # a stream-static join (a table, a frame of setup())
        return _stateful_join(self, other, original(self, other, on, how))

    def group_by(self, *cols):
        grouped = originals[(DataFrame, "groupBy")](self, *cols)
        # Kept on the GroupedData for its agg(): the frame it groups and the user's own columns.
        grouped._txs_source = self  # noqa: SLF001
        grouped._txs_cols = list(cols[0] if len(cols) == 1 and isinstance(cols[0], list) else cols)  # noqa: SLF001
        return grouped

    def agg(self, *exprs):
        source = getattr(self, "_txs_source", None)
        if source is None or _context() is None:   # a groupBy Spark made itself (cube, rollup), or ours
            return originals[(GroupedData, "agg")](self, *exprs)
        real = originals[(GroupedData, "agg")](self, *exprs)
        return _stateful_aggregate(source, self._txs_cols, real)

    def shortcut(function: Callable) -> Callable:
        def call(self, *cols):
            if getattr(self, "_txs_source", None) is None or _context() is None:
                return originals[(GroupedData, function.__name__)](self, *cols)
            if function is F.count:
                return agg(self, F.count(F.lit(1)).alias("count"))
            if not cols:
                raise TransformError(f"groupBy().{function.__name__}() without columns: name the columns")
            return agg(self, *[function(c).alias(f"{function.__name__}({c})") for c in cols])
        return call

    def drop_duplicates(within: bool, name: str) -> Callable:
        def call(self, subset=None):
            if _context() is None:
                return originals[(DataFrame, name)](self, subset)
            return _stateful_dedup(self, list(subset) if subset else list(self.columns), within)
        return call

    def refused(what: str) -> Callable:
        def call(*_args, **_kwargs):
            raise TransformError(plan_reading.arbitrary_state_refusal(what))
        return call

    patches = {(DataFrame, "withWatermark"): with_watermark, (DataFrame, "groupBy"): group_by,
               (DataFrame, "groupby"): group_by, (GroupedData, "agg"): agg,
               (DataFrame, "dropDuplicates"): drop_duplicates(False, "dropDuplicates"),
               (DataFrame, "drop_duplicates"): drop_duplicates(False, "drop_duplicates"),
               (DataFrame, "dropDuplicatesWithinWatermark"): drop_duplicates(True, "dropDuplicatesWithinWatermark"),
               (DataFrame, "join"): join}
    for name, function in (("count", F.count), ("sum", F.sum), ("min", F.min), ("max", F.max), ("avg", F.avg),
                           ("mean", F.avg)):
        if (GroupedData, name) in originals:
            patches[(GroupedData, name)] = shortcut(function)
    for name in plan_reading.ARBITRARY_STATE:   # refused by name, not run on each batch alone
        if (GroupedData, name) in originals:
            patches[(GroupedData, name)] = refused(name)
    return patches


def _arrow_schema(schema: Any) -> Any:
    """The Arrow schema the merge yields rows in (timestamps as UTC microseconds, as Spark keeps them)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


@contextmanager
def _ours() -> Iterator[None]:
    """Frames txstream builds inside a recorded call use Spark's own methods."""
    saved = _active.value
    _active.value = None
    try:
        yield
    finally:
        _active.value = saved


def _second_operator(recorded: Recorded) -> None:
    if recorded.description is not None:
        raise TransformError("the transform has two stateful operators (an aggregation or deduplication after "
                             "another): chained stateful operators are not supported yet; keep one per processor "
                             "(docs/state.md, 'What is refused')")


def _stateful_aggregate(source: Any, cols: list, real: Any) -> Any:
    context, recorded = _context()
    _second_operator(recorded)
    watermark = _watermark_at(source, recorded, "groupBy")
    group_names, aggregates, partials = aggregation_partials(real)
    found = plan_reading.window_of(real)   # read from Spark's plan, not the column's text
    window = (found.index, found.kind, found.spec) if found is not None else None
    if window is not None and watermark is not None and window[2]["column"] != watermark[0]:
        raise TransformError(f"the window is over {window[2]['column']!r} but the watermark is on "
                             f"{watermark[0]!r}: Structured Streaming closes windows by the watermark of "
                             "their own time column; window over the watermark's column")
    if window is not None and "gap" in window[2]:
        # Spark drops a session row once ts + gap(row) <= watermark (operators/session.py late): the
        # description keeps the gap's SQL, not a Column the late rule could evaluate per row yet.
        raise TransformError(f"session_window with a gap per row ({window[2]['gap']}) is not supported yet: the late "
                             "rule needs each row's own session end; use a fixed gap such as '5 minutes'")
    if window is not None and window[0] != 0:
        raise TransformError("put window(...) or session_window(...) first among the groupBy columns")
    operator = operator_for(window[1] if window is not None else AGGREGATE)
    description = operator.describe(context.units, context.output_mode, group_names, aggregates,
                                    window[2] if window else None, watermark)
    recorded.description = description
    if context.merge_spec is None:   # describing only (at start): the real aggregation's shape will do
        return real
    with _ours():
        grouped = operator.partials(description, _with_input_record(source, context), cols, partials, group_names,
                                    context.late_ms)
    spec = context.merge_spec(description, group_names, tuple(f"_txs_p{i}" for i in range(len(partials))),
                              _arrow_schema(real.schema), None)
    return (context.merge_frame or _unit_merge)(grouped, spec, real.schema)


def _stateful_dedup(source: Any, subset: list[str], within: bool) -> Any:
    context, recorded = _context()
    _second_operator(recorded)
    watermark = _watermark_at(source, recorded, "dropDuplicates")
    operator = Deduplicate()
    description = operator.describe(context.units, context.output_mode, subset, list(source.columns), watermark,
                                    within)
    recorded.description = description
    if context.merge_spec is None:
        return source
    with _ours():
        grouped = operator.partials(description, _with_input_record(source, context), subset, context.late_ms)
    spec = context.merge_spec(description, tuple(subset), (), _arrow_schema(source.schema),
                              watermark[0] if watermark else None)
    return (context.merge_frame or _unit_merge)(grouped, spec, source.schema)


def _side_watermark(side: Any, recorded: Recorded, which: str) -> dict[str, Any] | None:
    """The watermark on one side of a join ({"column" at the side's output, "delay_ms"}), or None."""
    with _ours():
        found = [(frame, column, delay) for frame, column, delay in recorded.watermarks
                 if plan_reading._contains(side._jdf.queryExecution().analyzed(),  # noqa: SLF001
                                           frame._jdf.queryExecution().analyzed())]
        if len(found) > 1:
            raise TransformError(f"the join's {which} side has {len(found)} watermarks: call withWatermark once per "
                                 "side of a stream-stream join")
        if not found:
            return None
        frame, column, delay = found[0]
        return {"column": plan_reading.watermark_column_at(side, frame, column, "join"), "delay_ms": delay}


def _stateful_join(left: Any, right: Any, real: Any) -> Any:
    """A stream-stream join: each side's rows kept by the units until Spark's state watermark for
    that side passes them (operators/join.py)."""
    context, recorded = _context()
    _second_operator(recorded)
    watermarks = (_side_watermark(left, recorded, "left"), _side_watermark(right, recorded, "right"))
    with _ours():
        plan = join_plan.JoinPlan(real, tuple({w["column"]: w["delay_ms"]} if w else {} for w in watermarks),
                                  context.is_source)
    operator = StreamStreamJoin()
    description = operator.describe(context.units, context.output_mode, plan, watermarks)
    recorded.description = description
    if context.merge_spec is None:
        return real
    with _ours():
        unit_input = operator.unit_input(plan, context.late_ms)
        types = tuple(_arrow_schema(unit_input.schema).field(name).type for name in ROWS_OF)
        pair_columns = [*flat_names(0, len(plan.left_attrs)), *flat_names(1, len(plan.right_attrs))]
        fields = [pa.field(name, f.type) for name, f in zip(pair_columns, [*types[0], *types[1]], strict=True)]
        pairs_schema = pa.schema([*fields, pa.field(LEFT_ID, pa.int64()), pa.field(RIGHT_ID, pa.int64())])
        out_schema = pa.schema(fields if plan.join_type != "leftsemi" else fields[:len(plan.left_attrs)])
        run = JoinRun(plan.join_type, plan.evictions(context.watermark_ms), types, pairs_schema,
                      tuple(kind is not None for kind in plan.expiring))
        spec = context.merge_spec(description, (), (), out_schema, None, join=run)
        probed = (context.join_probe or _unit_probe)(unit_input, spec)
        finished = (context.join_finish or _unit_finish)(_matches(plan, probed, pair_columns), spec,
                                                          _spark_schema(out_schema))
        return plan.output(finished)


def _matches(plan: Any, probed: Any, pair_columns: list[str]) -> Any:
    """The candidate pairs the join's condition keeps, evaluated by Spark over the pairs' columns."""
    condition = plan.condition_over(pair_columns)
    return probed.filter(condition) if condition is not None else probed


def _unit_probe(unit_input: Any, spec: MergeSpec) -> Any:
    """The join's first step in Spark's tasks: both sides' rows routed to the K units, each unit's
    candidate pairs (task/join_unit.py)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    task = functools.partial(probe_unit, FromJob("merge", spec.clients))
    return unit_input.repartition(spec.description.units, ROUTE).mapInArrow(
        task, from_arrow_schema(spec.join.pairs_schema))


def _unit_finish(matches: Any, spec: MergeSpec, out_schema: Any) -> Any:
    """The join's second step, in the same tasks: the matches, the unit's output and state changes."""
    return matches.mapInArrow(functools.partial(finish_unit, FromJob("merge", spec.clients)), out_schema)


def _spark_schema(schema: Any) -> Any:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


def _watermark_at(source: Any, recorded: Recorded, call: str) -> tuple[str, int] | None:
    """The recorded watermark (column, delay) under the name its column has where the stateful
    operator reads it; refuses what removes rows on the way (operators/plan.py)."""
    if recorded.watermark is None or recorded.watermarked is None:
        return recorded.watermark
    with _ours():
        column = plan_reading.watermark_column_at(source, recorded.watermarked, recorded.watermark[0], call)
    return column, recorded.watermark[1]


def _with_input_record(source: Any, context: BatchContext) -> Any:
    """The stateful operator's input with the reader's record (operators/base.py INPUT_RECORD)
    carried along, for the dead letters of its late rows, when this batch can have late rows and
    the transform's plan can carry it (driver/range_tag.py); else `source` as it is."""
    if context.late_ms is None:
        return source
    carried = carry_reader_columns(source, INPUT_RECORD, INPUT)
    return carried if carried is not None else source


def _unit_merge(grouped: Any, spec: MergeSpec, out_schema: Any) -> Any:
    """The merge in Spark's tasks: the partials routed to the K units, each merged into its state."""
    task = functools.partial(merge_unit, FromJob("merge", spec.clients))   # the spec comes with the batch's job
    return grouped.repartition(spec.description.units, ROUTE).mapInArrow(task, out_schema)
