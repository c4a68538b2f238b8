"""Running aggregates: `groupBy(keys).agg(...)` without a window (Spark's StateStoreSaveExec
without an event-time key). Each group's state is its partial aggregates; nothing ever closes,
so nothing is late and no batch with no records is owed. window.py and session.py build on it.

Driver side: the user's aggregation is read from its analysed plan and rewritten into partials
Spark computes per batch (`aggregation_partials`, `partials`). Task side: the partials merged
into each group's state, column-wise (`merge_partials`), and the rows each output mode emits
built a column at a time (`rows`).
"""
from __future__ import annotations

import functools
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from txstream.errors import TransformError
from txstream.operators.base import EVENTS, ROUTE, ROWS, Emitted, MergeSpec, StatefulOperator
from txstream.state import aggregates as aggs
from txstream.state import values
from txstream.state.codec import StateCodec
from txstream.state.keys import decode_keys, encode_keys
from txstream.state.operator import AGGREGATE, Aggregate, OperatorDescription, state_format
from txstream.state.store import StateStore


def aggregation_partials(real: Any) -> tuple[tuple[str, ...], list[Aggregate], list[Any]]:
    """(grouping column names, the aggregates, the partial Columns) of the user's aggregation
    `real`, read from its analysed plan; an aggregate that cannot be kept across batches is
    refused with the reason."""
    from pyspark.sql import functions as F

    plan = real._jdf.queryExecution().analyzed()
    grouping = plan.groupingExpressions().size()
    group_names = tuple(f.name for f in real.schema.fields[:grouping])
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
    return group_names, aggregates, partials


def distinct_rounds(keys: list[bytes]) -> list[list[int]]:
    """Row indexes in rounds that hold each key at most once, in row order: the store is read
    once per round, so a key twice in a batch (two groups whose values encode alike) merges both."""
    if len(set(keys)) == len(keys):
        return [list(range(len(keys)))]
    rounds: list[list[int]] = []
    seen: dict[bytes, int] = {}
    for j, key in enumerate(keys):
        r = seen.get(key, 0)
        seen[key] = r + 1
        if r == len(rounds):
            rounds.append([])
        rounds[r].append(j)
    return rounds


class RunningAggregate(StatefulOperator):
    """groupBy(keys).agg(...): totals so far, in update or complete mode."""

    kind = AGGREGATE
    windowed = False   # whether the first grouping column is a window struct kept in the state key

    # -- driver ----------------------------------------------------------------------------------

    def check(self, output_mode: str, watermark: tuple[str, int] | None) -> None:
        if output_mode == "append":
            raise TransformError("output mode append (Structured Streaming's default) needs a window and a watermark "
                                 "for an aggregation: each result is emitted once, when its window closes. Set "
                                 "output_mode = 'update' or 'complete' for totals so far, or 'per-batch' to "
                                 "aggregate each batch alone (docs/state.md)")

    def describe(self, units: int, output_mode: str, group_names: tuple[str, ...], aggregates: list[Aggregate],
                 window: dict[str, Any] | None, watermark: tuple[str, int] | None) -> OperatorDescription:
        self.check(output_mode, watermark)
        return OperatorDescription(
            "agg", self.kind, units, output_mode, list(group_names[1 if window else 0:]), aggregates, window,
            {"column": watermark[0], "delay_ms": watermark[1]} if watermark else None,
            self.state_schema(aggregates), state_format=state_format(self.kind))

    def state_schema(self, aggregates: list[Aggregate]) -> dict[str, Any]:
        return aggs.state_schema(aggregates)

    def routed(self, group_names: tuple[str, ...]) -> tuple[str, ...]:
        """The columns a partial row is routed to its unit by: its state key's."""
        return group_names

    def partials(self, description: OperatorDescription, source: Any, cols: list, partials: list[Any],
                 group_names: tuple[str, ...], watermark_ms: int | None) -> Any:
        """The batch's frame of partials (one row per group and ROUTE), late rows among them (LATE set)."""
        from pyspark.sql import functions as F

        marked, late = self.late_marked(description, source, watermark_ms)
        watermark = description.watermark
        events = (F.max(F.col(watermark["column"])).alias(EVENTS) if watermark
                  else F.lit(None).cast("timestamp").alias(EVENTS))
        grouped = self.open_partials(description, marked.groupBy(*cols, *late).agg(*partials, events,
                                                                                  F.count(F.lit(1)).alias(ROWS)),
                                     group_names, watermark_ms)
        routed = self.routed(group_names)
        route = F.hash(*[F.col(f"`{n}`") for n in routed]) if routed else F.lit(0)
        return grouped.withColumn(ROUTE, self.route(route, late))

    def open_partials(self, description: OperatorDescription, grouped: Any, group_names: tuple[str, ...],
                      watermark_ms: int | None) -> Any:
        """The partial rows whose state is still open (all of them, here)."""
        return grouped

    def late(self, description: OperatorDescription, watermark_ms: int | None) -> Any:
        """Never, unless the event time is itself a grouping key (Spark's StateStoreSaveExec drops
        a row only when the state it would update is closed; complete mode drops nothing)."""
        if (description.output_mode == "complete" or description.watermark is None
                or description.watermark["column"] not in description.keys):
            return None
        return super().late(description, watermark_ms)

    def owes_batch(self, description: OperatorDescription, last_watermark: int | None,
                   next_watermark: int | None) -> bool:
        return False   # no state closes with the watermark

    # -- task ------------------------------------------------------------------------------------

    def merge_partials(self, spec: MergeSpec, store: StateStore, partials: pa.Table | None) -> Emitted:
        codec = StateCodec(spec.description.state_schema)
        changed = self.aggregate(spec, store, codec, partials) if partials is not None else {}
        out: list[tuple[bytes, dict]] = []
        if spec.description.output_mode == "complete":
            out = [(key, codec.decode(value)) for key, value in store.scan()]
        elif spec.description.output_mode == "update":
            out = sorted(changed.items())
        out += self.close(spec, store, codec)
        return rows(spec, out, self.windowed)

    def close(self, spec: MergeSpec, store: StateStore, codec: StateCodec) -> list[tuple[bytes, dict]]:
        """What the watermark closes: deleted from the state, and the pairs the mode emits for it."""
        return []

    def aggregate(self, spec: MergeSpec, store: StateStore, codec: StateCodec,
                  partials: pa.Table) -> dict[bytes, dict]:
        """Each partial row merged into its group's state; the groups changed, with their state."""
        names = spec.group_names
        windows = None
        if self.windowed:
            window = partials[names[0]]
            windows = (values.ms_column(pc.struct_field(window, "start")),
                       values.ms_column(pc.struct_field(window, "end")))
            names = names[1:]
        keys = encode_keys([partials[n] for n in names], partials.num_rows, windows)
        columns = [values.plain_column(partials[n]) for n in spec.partial_names]
        changed: dict[bytes, dict] = {}
        aggregates = spec.description.aggregates
        decode, encode, put = codec.decode, codec.encode, store.put
        for indexes in distinct_rounds(keys):
            batch_keys = keys if len(indexes) == len(keys) else [keys[j] for j in indexes]
            batch_columns = columns if len(indexes) == len(keys) else [[c[j] for j in indexes] for c in columns]
            stored = store.get_many(batch_keys)
            states = aggs.merge_rows(aggregates, [None if v is None else decode(v) for v in stored], batch_columns)
            for key, state in zip(batch_keys, states, strict=True):
                put(key, encode(state))
                changed[key] = state
        return changed


def rows(spec: MergeSpec, pairs: list[tuple[bytes, dict]], windowed: bool, bounds_scale: int = 1000) -> Emitted:
    """The output rows of (state key, state) pairs, built a column at a time; their keys are the
    emitted ones, in order. `bounds_scale` turns the keys' window bounds into microseconds (a
    window's are milliseconds, a session's microseconds)."""
    if not pairs:
        return Emitted()
    fields, aggregates = spec.out_schema, spec.description.aggregates
    keys = [key for key, _ in pairs]
    key_values, windows = decode_keys(keys, windowed)
    names = spec.group_names
    columns: dict[str, pa.Array] = {}
    if windowed:
        typ = fields.field(names[0]).type
        columns[names[0]] = pa.StructArray.from_arrays(
            [values.arrow_column(windows[0], typ.field("start").type, bounds_scale),
             values.arrow_column(windows[1], typ.field("end").type, bounds_scale)], fields=list(typ))
        names = names[1:]
    for name, column in zip(names, key_values, strict=True):
        columns[name] = values.arrow_column(column, fields.field(name).type)   # keys keep µs
    finals = aggs.final_columns(aggregates, [state for _, state in pairs], aggs.output_kinds(aggregates, fields))
    for agg, column in zip(aggregates, finals, strict=True):
        columns[agg.name] = values.arrow_column(column, fields.field(agg.name).type)
    return Emitted(pa.Table.from_arrays([columns[f.name] for f in fields], schema=fields), keys)
