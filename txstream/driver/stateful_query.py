"""The transform's stateful operators, taken from the user's own Structured Streaming code
(docs/state.md, "Semantics").

The user writes `withWatermark`, `groupBy(...).agg(...)` (with `window(...)` among the keys, or
not) and `dropDuplicates`/`dropDuplicatesWithinWatermark` as for Structured Streaming. On a batch
DataFrame Spark would aggregate only the batch and ignore the watermark, so while the transform
runs these calls are recorded (`recording`): the aggregation the user asked for is replaced by
one that Spark computes per batch as partials, routes to the K state units and merges into each
unit's state (task/state_merge.py), in the aggregation's own schema, so the rest of the
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

from txstream.errors import TransformError
from txstream.state import aggregates as aggs
from txstream.state.operator import AGGREGATE, DEDUP, SESSION, WINDOW, Aggregate, OperatorDescription, state_format
from txstream.task.state_merge import EVENTS, FIRST, LATE, LATE_MS, ROUTE, ROWS, MergeSpec, merge_unit

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


@dataclass
class BatchContext:
    """What the stateful batch being built needs from the driver."""

    app_id: str
    units: int
    output_mode: str
    batch_id: int = 0
    watermark_ms: int | None = None
    merge_spec: Callable[..., MergeSpec] | None = None   # (description, group_names, partials, schema, event) -> spec


@dataclass
class Recorded:
    """What one run of the transform asked for."""

    watermark: tuple[str, int] | None = None          # (column, delay ms)
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
                              "dropDuplicatesWithinWatermark")}
    originals.update({(GroupedData, name): getattr(GroupedData, name)
                      for name in ("agg", "count", "sum", "min", "max", "avg", "mean", "applyInPandasWithState")
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
            _context()[1].watermark = (eventTime, duration_ms(delayThreshold))
        return originals[(DataFrame, "withWatermark")](self, eventTime, delayThreshold)

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

    def refused(what: str, why: str) -> Callable:
        def call(*_args, **_kwargs):
            raise TransformError(f"{what} is not supported with state across batches yet: {why} "
                                 "(docs/state.md, 'What is refused')")
        return call

    patches = {(DataFrame, "withWatermark"): with_watermark, (DataFrame, "groupBy"): group_by,
               (DataFrame, "groupby"): group_by, (GroupedData, "agg"): agg,
               (DataFrame, "dropDuplicates"): drop_duplicates(False, "dropDuplicates"),
               (DataFrame, "drop_duplicates"): drop_duplicates(False, "drop_duplicates"),
               (DataFrame, "dropDuplicatesWithinWatermark"): drop_duplicates(True, "dropDuplicatesWithinWatermark")}
    for name, function in (("count", F.count), ("sum", F.sum), ("min", F.min), ("max", F.max), ("avg", F.avg),
                           ("mean", F.avg)):
        if (GroupedData, name) in originals:
            patches[(GroupedData, name)] = shortcut(function)
    if (GroupedData, "applyInPandasWithState") in originals:
        patches[(GroupedData, "applyInPandasWithState")] = refused(
            "applyInPandasWithState", "arbitrary per-key state comes next, on this foundation")
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


def _window_of(cols: list) -> tuple[int, str, dict[str, Any]] | None:
    """(index, kind, spec) of the `window(...)` or `session_window(...)` among the grouping
    columns: spec {"column", "size_ms", "slide_ms"} or {"column", "gap_ms"}."""
    for i, col in enumerate(cols):
        text = str(col)
        match = re.search(r"session_window\((.+?), '([^']+)'\)", text)
        if match:
            return i, SESSION, {"column": match[1].strip("`"), "gap_ms": duration_ms(match[2])}
        match = re.search(r"window\((.+?), '([^']+)', '([^']+)', '([^']+)'\)", text)
        if match:
            return i, WINDOW, {"column": match[1].strip("`"), "size_ms": duration_ms(match[2]),
                               "slide_ms": duration_ms(match[3])}
    return None


def _late_split(source: Any, watermark: tuple[str, int] | None, watermark_ms: int | None) -> tuple[Any, Any]:
    """(rows on time, rows behind the watermark) of `source`."""
    from pyspark.sql import functions as F

    if watermark is None or watermark_ms is None:
        return source, None
    column = watermark[0]
    if column not in source.columns:
        raise TransformError(f"the watermark's column {column!r} does not reach the stateful operator (its input "
                             f"has {', '.join(source.columns)}): keep it in the columns you aggregate or deduplicate")
    late = F.coalesce(F.col(column) < F.timestamp_millis(F.lit(watermark_ms)), F.lit(False))
    late_rows = source.where(late).select(
        F.to_json(F.struct(*[F.col(c) for c in source.columns])).alias(LATE),
        F.unix_millis(F.col(column).cast("timestamp")).alias(LATE_MS))
    return source.where(~late), late_rows.withColumn(ROUTE, F.hash(F.col(LATE)))


def _stateful_aggregate(source: Any, cols: list, real: Any) -> Any:
    from pyspark.sql import functions as F

    context, recorded = _context()
    _second_operator(recorded)
    plan = real._jdf.queryExecution().analyzed()
    grouping = plan.groupingExpressions().size()
    schema = real.schema
    group_names = tuple(f.name for f in schema.fields[:grouping])
    aggregates, partials = [], []
    expressions = plan.aggregateExpressions()
    for i in range(grouping, expressions.size()):
        expression = expressions.apply(i)
        name = expression.name()
        inner = expression.child() if expression.getClass().getSimpleName() == "Alias" else expression
        if inner.getClass().getSimpleName() != "AggregateExpression":
            raise TransformError(f"the aggregate {expression.sql()} is an expression over aggregates: aggregate "
                                 "first, then compute it in a select after the aggregation")
        function = inner.aggregateFunction()
        spark_class, distinct = function.getClass().getSimpleName(), bool(inner.isDistinct())
        why = aggs.refusal(spark_class, distinct)
        if why is not None:
            raise TransformError(f"{expression.sql()} cannot be kept across batches: {why}")
        children = function.children()
        arguments = [children.apply(j).sql() for j in range(children.size())] or ["1"]
        condition = inner.filter().get().sql() if inner.filter().isDefined() else None
        agg = Aggregate(name, aggs.function_name(spark_class, distinct),
                        ", ".join(arguments) + (f" FILTER (WHERE {condition})" if condition else ""))
        aggregates.append(agg)
        column = F.expr(arguments[0])
        if len(arguments) > 1:   # count(a, b), count(DISTINCT a, b): the rows where no child is null, as Spark
            columns = [F.expr(a) for a in arguments]
            column = F.when(functools.reduce(lambda x, y: x & y, [c.isNotNull() for c in columns]), F.struct(*columns))
        if condition is not None:   # FILTER (WHERE ...): the other rows count as nulls, which no partial takes
            column = F.when(F.expr(condition), column)
        p = f"_txs_p{len(partials)}"
        if agg.function == "count":
            partials.append(F.count(column).alias(p))
        elif agg.function == "count_distinct":
            partials.append(F.collect_set(column).alias(p))
        elif agg.function == "approx_count_distinct":
            partials.append(F.hll_sketch_agg(column, aggs.SKETCH_LG_K).alias(p))
        elif agg.function == "avg":   # Spark's own buffer: an exact sum for decimals, a double's otherwise
            decimal = children.apply(0).dataType().typeName().startswith("decimal")
            partials.append((F.sum(column) if decimal else F.sum(column.cast("double"))).alias(p))
            partials.append(F.count(column).alias(f"_txs_p{len(partials)}"))
        else:
            partials.append(getattr(F, agg.function)(column).alias(p))
    window = _window_of(cols)
    watermark = recorded.watermark
    if window is not None and watermark is None:
        raise TransformError("a window aggregation needs withWatermark(column, delay) before the groupBy: without "
                             "one its windows never close and its state grows without bound")
    if context.output_mode == "append" and window is None:
        raise TransformError("output mode append (Structured Streaming's default) needs a window and a watermark for "
                             "an aggregation: each result is emitted once, when its window closes. Set output_mode = "
                             "'update' or 'complete' for totals so far, or 'per-batch' to aggregate each batch alone "
                             "(docs/state.md)")
    kind = window[1] if window is not None else AGGREGATE
    if window is not None and window[0] != 0:
        raise TransformError("put window(...) or session_window(...) first among the groupBy columns")
    description = OperatorDescription(
        "agg", kind, context.units, context.output_mode, [n for n in group_names[1 if window else 0:]],
        aggregates, window[2] if window else None,
        {"column": watermark[0], "delay_ms": watermark[1]} if watermark else None,
        aggs.session_schema(aggregates) if kind == SESSION else aggs.state_schema(aggregates),
        state_format=state_format(kind))
    recorded.description = description
    if context.merge_spec is None:   # describing only (at start): the real aggregation's shape will do
        return real
    with _ours():
        ontime, late = _late_split(source, watermark, context.watermark_ms)
        events = F.max(F.col(watermark[0])).alias(EVENTS) if watermark else F.lit(None).cast("timestamp").alias(EVENTS)
        grouped = ontime.groupBy(*cols).agg(*partials, events, F.count(F.lit(1)).alias(ROWS))
        # A group's sessions live in one state key (they merge across batches): routed by the
        # group alone; a fixed window is its own key, routed with it.
        routed = group_names[1:] if kind == SESSION else group_names
        grouped = grouped.withColumn(ROUTE, F.hash(*[F.col(f"`{n}`") for n in routed]) if routed else F.lit(0))
        if late is not None:
            grouped = grouped.unionByName(late, allowMissingColumns=True)
    spec = context.merge_spec(description, group_names, tuple(f"_txs_p{i}" for i in range(len(partials))),
                              _arrow_schema(schema), None)
    return grouped.repartition(context.units, ROUTE).mapInArrow(functools.partial(merge_unit, spec), schema)


def _stateful_dedup(source: Any, subset: list[str], within: bool) -> Any:

    context, recorded = _context()
    _second_operator(recorded)
    watermark = recorded.watermark
    if within and watermark is None:
        raise TransformError("dropDuplicatesWithinWatermark needs withWatermark(column, delay) before it")
    missing = [c for c in subset if c not in source.columns]
    if missing:
        raise TransformError(f"dropDuplicates: no column {missing[0]!r} among {', '.join(source.columns)}")
    description = OperatorDescription(
        "dedup", DEDUP, context.units, context.output_mode, list(subset), [], None,
        {"column": watermark[0], "delay_ms": watermark[1]} if watermark else None,
        aggs.state_schema([], event_time=True), state_format=state_format(DEDUP))
    recorded.description = description
    if context.merge_spec is None:
        return source
    with _ours():
        return _dedup_frame(context, description, source, subset, watermark)


def _dedup_frame(context: BatchContext, description: OperatorDescription, source: Any, subset: list[str],
                 watermark: tuple[str, int] | None) -> Any:
    from pyspark.sql import functions as F

    ontime, late = _late_split(source, watermark, context.watermark_ms)
    # The copy kept is the first by (input partition, offset) when the rows still carry them,
    # else the least row: the same copy on every re-run of the batch.
    order = [F.col(c).alias(f"o{i}") for i, c in enumerate(("partition", "offset")) if c in source.columns]
    first = F.min(F.struct(*order, F.struct(*[F.col(f"`{c}`") for c in source.columns]).alias("row"))).alias(FIRST)
    events = F.max(F.col(watermark[0])).alias(EVENTS) if watermark else F.lit(None).cast("timestamp").alias(EVENTS)
    grouped = ontime.groupBy(*[F.col(f"`{c}`") for c in subset]).agg(first, events, F.count(F.lit(1)).alias(ROWS))
    grouped = grouped.withColumn(ROUTE, F.hash(*[F.col(f"`{c}`") for c in subset]))
    if late is not None:
        grouped = grouped.unionByName(late, allowMissingColumns=True)
    spec = context.merge_spec(description, tuple(subset), (), _arrow_schema(source.schema),
                              watermark[0] if watermark else None)
    return grouped.repartition(context.units, ROUTE).mapInArrow(functools.partial(merge_unit, spec), source.schema)
