"""What a stream-stream join is, read from Spark's own plans and decided by Spark's own helpers
(issue 61): the join type, the equi-join keys and the rest of the condition as Spark's planner
extracts them (ExtractEquiJoinKeys over the optimized plan, as StreamingJoinStrategy does), each
side's own conjuncts (JoinConditionSplitPredicates' left- and right-only parts), and each side's
state watermark for a given event-time watermark (StreamingSymmetricHashJoinHelper's
getStateWatermarkPredicates, called through py4j): txstream evicts a side's rows by the very
bound Spark derives from the condition, rather than by a reading of its own.

The sides are the analyzed plan's (as the user wrote them); what Spark's optimizer would push
into a side that is not preserved (its own conjuncts, `isnotnull` of its keys) is applied to its
rows in the units (operators/join.py).

On a batch DataFrame the analyzer drops withWatermark (EliminateEventTimeWatermark), and with it
the delay Spark's helpers read from the event time's attribute metadata; `JoinPlan` puts it back
on the attributes (and on the condition's references to them) before asking.

Pure functions over a DataFrame's plans; pyspark is imported lazily; nothing of driver/, task/,
cli/ or tools/ is imported.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from txstream.errors import TransformError
from txstream.operators.plan import _name, _reaches_source, _seq

DELAY_KEY = "spark.watermarkDelayMs"    # EventTimeWatermark.delayKey
_HELPER = "org.apache.spark.sql.execution.streaming.operators.stateful.join.StreamingSymmetricHashJoinHelper$"
_TYPES = {"Inner": "inner", "LeftOuter": "leftouter", "RightOuter": "rightouter", "FullOuter": "fullouter",
          "LeftSemi": "leftsemi"}
PRESERVED = {"inner": (), "leftsemi": (), "leftouter": (0,), "rightouter": (1,), "fullouter": (0, 1)}


@dataclass(frozen=True)
class Eviction:
    """How one side's state rows expire: by its own value (the side's event time) or by its
    join key (the watermark is in the keys), and the side's state watermark now (ms)."""

    kind: str            # "value" or "key"
    watermark_ms: int


def _scala_seq(jvm: Any, items: list[Any]) -> Any:
    return jvm.scala.jdk.javaapi.CollectionConverters.asScala(items).toSeq()


def _option(jvm: Any, value: Any) -> Any:
    return jvm.scala.Option.empty() if value is None else jvm.scala.Some(value)


def _conjuncts(expression: Any) -> list[Any]:
    if _name(expression) == "And":
        return _conjuncts(expression.left()) + _conjuncts(expression.right())
    return [expression]


class JoinPlan:
    """A stream-stream join of the transform, as Spark's planner would run it."""

    def __init__(self, real: Any, delays: tuple[dict[str, int], dict[str, int]], is_source: Any = None) -> None:
        """`real`: the DataFrame the user's join returned; `delays`: per side, the watermark's
        delay (ms) by the name its event-time column has at that side's output; `is_source`:
        what a plan node that reads the batch is (operators/plan.py's by default)."""
        self.spark = real.sparkSession
        jvm = self.jvm = self.spark._jvm
        self.real = real
        node = _find_join(real._jdf.queryExecution().analyzed(), is_source)
        if node is None:
            raise TransformError("the stream-stream join is not found in the transform's plan")
        # The condition as Spark's optimizer hands it to the planner (BETWEEN and date arithmetic
        # replaced, constants folded), over the sides as the user wrote them (the analyzed plan:
        # a batch plan's optimizer, with no watermark to stop it, would move the join).
        optimizer = jvm.org.apache.spark.sql.catalyst.optimizer
        for rule in (optimizer.ReplaceExpressions, optimizer.RewriteWithExpression, optimizer.ConstantFolding):
            node = rule.apply(node)
        extracted = jvm.org.apache.spark.sql.catalyst.planning.ExtractEquiJoinKeys.unapply(node)
        if not extracted.isDefined():
            raise TransformError("a stream-stream join needs an equality between the two sides in its condition "
                                 "(Structured Streaming refuses a stream-stream join without one)")
        found = extracted.get()
        # A Scala Tuple8: (type, left keys, right keys, the rest of the condition, ...).
        join_type, left_keys, right_keys, condition = (getattr(found, f"_{i}")() for i in range(1, 5))
        kind = _name(join_type).rstrip("$")
        if kind not in _TYPES:
            raise TransformError(f"a stream-stream {kind} join is not supported (Structured Streaming runs inner, "
                                 "leftOuter, rightOuter, fullOuter and leftSemi)")
        self.join_type = _TYPES[kind]
        self.node = node
        self.left_plan, self.right_plan = node.left(), node.right()
        self._delays = delays
        self.left_attrs = [self._marked(a, 0) for a in _seq(self.left_plan.output())]
        self.right_attrs = [self._marked(a, 1) for a in _seq(self.right_plan.output())]
        self._by_id = {int(a.exprId().id()): a for a in self.left_attrs + self.right_attrs}
        self.left_keys = [self._rebuilt(k) for k in _seq(left_keys)]
        self.right_keys = [self._rebuilt(k) for k in _seq(right_keys)]
        self.condition = self._rebuilt(condition.get()) if condition.isDefined() else None
        # JoinConditionSplitPredicates: deterministic conjuncts over one side's attributes only.
        left_ids = {int(a.exprId().id()) for a in self.left_attrs}
        right_ids = {int(a.exprId().id()) for a in self.right_attrs}
        self.side_only: list[list[Any]] = [[], []]
        for conjunct in _conjuncts(self.condition) if self.condition is not None else []:
            refs = {int(r.exprId().id()) for r in _seq(conjunct.references().toSeq())}
            if not conjunct.deterministic():
                continue
            if refs <= left_ids:
                self.side_only[0].append(conjunct)
            elif refs <= right_ids:
                self.side_only[1].append(conjunct)
        self.watermarked = [next((a for a in attrs if a.metadata().contains(DELAY_KEY)), None)
                            for attrs in (self.left_attrs, self.right_attrs)]
        self.expiring = self._eviction_kinds()
        self._check_supported()

    # -- what Spark decides --------------------------------------------------------------------

    def _marked(self, attribute: Any, side: int) -> Any:
        delay = self._delays[side].get(str(attribute.name()))
        if delay is None:
            return attribute
        builder = self.jvm.org.apache.spark.sql.types.MetadataBuilder().withMetadata(attribute.metadata())
        return attribute.withMetadata(builder.putLong(DELAY_KEY, delay).build())

    def _rebuilt(self, expression: Any) -> Any:
        """`expression` with its references to watermarked attributes carrying the delay."""
        if _name(expression) == "AttributeReference":
            return self._by_id.get(int(expression.exprId().id()), expression)
        children = _seq(expression.children())
        if not children:
            return expression
        return expression.withNewChildren(_scala_seq(self.jvm, [self._rebuilt(c) for c in children]))

    def _predicates(self, watermark_ms: int) -> Any:
        helper = self.jvm.java.lang.Class.forName(_HELPER).getField("MODULE$").get(None)
        jvm = self.jvm
        return helper.getStateWatermarkPredicates(
            _scala_seq(jvm, self.left_attrs), _scala_seq(jvm, self.right_attrs), _scala_seq(jvm, self.left_keys),
            _scala_seq(jvm, self.right_keys), _option(jvm, self.condition), _option(jvm, jvm.java.lang.Long(watermark_ms)),
            jvm.scala.Option.empty(), False)

    def evictions(self, watermark_ms: int | None) -> tuple[Eviction | None, Eviction | None]:
        """Each side's state eviction at the event-time watermark `watermark_ms` (None: no
        watermark yet, nothing expires)."""
        if watermark_ms is None:
            return None, None
        predicates = self._predicates(watermark_ms)
        out = []
        for predicate in (predicates.left(), predicates.right()):
            if not predicate.isDefined():
                out.append(None)
                continue
            p = predicate.get()
            out.append(Eviction("key" if "Key" in _name(p) else "value", int(p.stateWatermark())))
        return out[0], out[1]

    def _eviction_kinds(self) -> tuple[str | None, str | None]:
        """Which sides' rows ever expire, and how (`expiring`): asked at a watermark far from any data's time."""
        left, right = self.evictions(10**15)
        return (left.kind if left else None), (right.kind if right else None)

    def _check_supported(self) -> None:
        """Structured Streaming's own refusals (UnsupportedOperationChecker's
        checkForStreamStreamJoinWatermark): an outer or semi join needs its rows' state to expire."""
        if self.join_type == "inner":
            return
        left, right = self.expiring
        needed = {"leftouter": (left,), "leftsemi": (left,), "rightouter": (right,), "fullouter": (left, right)}
        if any(kind is None for kind in needed[self.join_type]):
            raise TransformError(
                f"a stream-stream {self.join_type} join needs a watermark in the join keys, or a watermark on the "
                "nullable side and a range condition on the event times (e.g. p_ts BETWEEN o_ts AND o_ts + interval "
                "1 hour): without one its rows would be kept forever and no null-padded row ever emitted "
                "(Structured Streaming refuses it the same way)")

    # -- columns over the sides' frames -------------------------------------------------------

    def column(self, expression: Any) -> Any:
        from pyspark.sql.classic.column import Column

        return Column(self.jvm.org.apache.spark.sql.classic.ExpressionUtils.column(expression))

    def side_frame(self, side: int) -> Any:
        """The side's input as the join reads it (the optimizer's pushed filters included)."""
        from pyspark.sql.classic.dataframe import DataFrame

        plan = self.left_plan if side == 0 else self.right_plan
        return DataFrame(self.jvm.org.apache.spark.sql.classic.Dataset.ofRows(self.spark._jsparkSession, plan),
                         self.spark)

    def keys(self, side: int) -> list[Any]:
        return [self.column(k) for k in (self.left_keys if side == 0 else self.right_keys)]

    def event_time(self, side: int) -> Any:
        """The side's event time (its watermark's attribute; a window's end), as a Column, or None."""
        attribute = self.watermarked[side]
        if attribute is None:
            return None
        column = self.column(attribute)
        return column["end"] if attribute.dataType().typeName() == "struct" else column

    def eviction_time(self, side: int, kind: str | None) -> Any:
        """What the side's state rows expire by: the key holding the watermark (key), or the
        side's event time (value)."""
        if kind is None:
            return None
        if kind == "value":
            return self.event_time(side)
        helper = self.jvm.java.lang.Class.forName(_HELPER).getField("MODULE$").get(None)
        ordinal = helper.findJoinKeyOrdinalForWatermark(_scala_seq(self.jvm, self.left_keys),
                                                        _scala_seq(self.jvm, self.right_keys))
        key = (self.left_keys if side == 0 else self.right_keys)[int(ordinal.get())]
        column = self.column(key)
        return column["end"] if key.dataType().typeName() == "struct" else column

    def side_condition(self, side: int) -> Any:
        """The conjuncts over the side alone (None: none): a row failing them never matches."""
        import functools

        conjuncts = [self.column(c) for c in self.side_only[side]]
        return functools.reduce(lambda a, b: a & b, conjuncts) if conjuncts else None

    def condition_over(self, names: list[str]) -> Any:
        """The join's condition as a Column over a frame whose columns `names` hold the pair's
        attributes (left then right), by name (None: no condition beyond the keys)."""
        if self.condition is None:
            return None
        by_id = {int(a.exprId().id()): name for a, name in zip(self.pair_attributes(), names, strict=True)}
        unresolved = self.jvm.org.apache.spark.sql.catalyst.analysis.UnresolvedAttribute

        def renamed(expression: Any) -> Any:
            if _name(expression) == "AttributeReference":
                return unresolved.quoted(by_id[int(expression.exprId().id())])
            children = _seq(expression.children())
            if not children:
                return expression
            return expression.withNewChildren(_scala_seq(self.jvm, [renamed(c) for c in children]))

        return self.column(renamed(self.condition))

    def pair_attributes(self) -> list[Any]:
        return self.left_attrs + self.right_attrs

    def output_attributes(self) -> list[Any]:
        return self.left_attrs if self.join_type == "leftsemi" else self.left_attrs + self.right_attrs

    def with_attributes(self, frame: Any, attributes: list[Any], extra: list[Any] = ()) -> Any:
        """`frame` (columns by position) under the join's own attributes, so that Columns of the
        user's (`orders.o_id`) and the join's condition resolve over it: a union whose first child
        has them and no rows (the optimizer prunes it: PropagateEmptyRelation)."""
        from pyspark.sql import functions as F

        template = (self.side_frame(0).crossJoin(self.side_frame(1)).where(F.lit(False))
                    .select(*[self.column(a) for a in attributes], *extra))
        return template.union(frame)

    def output(self, joined: Any) -> Any:
        """The user's join's result over `joined` (the join's rows, left columns then right): its
        projection (a USING join's), under the attributes of the DataFrame the user's join returned."""
        from pyspark.sql import functions as F

        joined = self.with_attributes(joined, self.output_attributes())
        analyzed = self.real._jdf.queryExecution().analyzed()
        if _name(analyzed) == "Project":
            joined = joined.select(*[self.column(e) for e in _seq(analyzed.projectList())])
        return self.real.where(F.lit(False)).union(joined)

    def describe(self) -> dict[str, Any]:
        """What the state's fingerprint keeps of the join (docs/state.md)."""
        return {"type": self.join_type,
                "left": [f"{a.name()}:{a.dataType().simpleString()}" for a in self.left_attrs],
                "right": [f"{a.name()}:{a.dataType().simpleString()}" for a in self.right_attrs],
                "left_keys": [str(k.sql()) for k in self.left_keys],
                "right_keys": [str(k.sql()) for k in self.right_keys],
                "condition": str(self.condition.sql()) if self.condition is not None else None,
                "evicts": list(self.expiring)}


def _find_join(node: Any, is_source: Any) -> Any:
    stack = [node]
    while stack:
        current = stack.pop()
        children = _seq(current.children())
        if _name(current) == "Join" and len(children) == 2 and all(_reaches_source(c, is_source) for c in children):
            return current
        stack.extend(children)
    return None


def is_stream_stream(left: Any, right: Any, is_source: Any = None) -> bool:
    """Whether both DataFrames read the batch (a join of them is stream-stream)."""
    return all(_reaches_source(f._jdf.queryExecution().analyzed(), is_source) for f in (left, right))
