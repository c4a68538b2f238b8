"""What the transform's stateful operator is, read from Spark's own plans rather than from the
text of the user's columns (issue 60: items 3, 12, 17, 18, 22).

Pure functions over a DataFrame's plans and types; pyspark is imported lazily and nothing of
driver/, task/, cli/ or tools/ is imported, so the operator modules can share them.

Why the logical plan for windows: on a batch DataFrame Spark's analyzer has already rewritten
`window()` into an Expand or Project (and `session_window()` into a Project) by the time the
analyzed plan exists, and the TimeWindow/SessionWindow expressions are gone; the analyzed plan
only marks the grouping attribute (`spark.timeWindow` / `spark.sessionWindow` metadata). The
logical plan the Dataset API built still holds the function call, however it was written
(`F.window`, `F.expr("window(...)")`, SQL), and Spark's own TimeWindow constructor reads its
durations exactly as the analyzer does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from txstream.errors import TransformError

WINDOW = "window"
SESSION = "session"
_TIME_WINDOW_MARK = "spark.timeWindow"
_SESSION_WINDOW_MARK = "spark.sessionWindow"
# The columns of the batch's source relation (task/reading.py input_struct): a MapInArrow over
# spark.range that yields them is the batch itself (driver/jobs.py range_frame).
_SOURCE_COLUMNS = {"key", "value", "topic", "partition", "offset"}


@dataclass(frozen=True)
class WindowFound:
    index: int                 # its place among the grouping columns
    kind: str                  # WINDOW or SESSION
    spec: dict[str, Any]       # {"column", "size_ms", "slide_ms", "start_ms"} / {"column", "gap_ms"} / {"column", "gap"}


def _name(node: Any) -> str:
    return node.getClass().getSimpleName()


def _unaliased(expression: Any) -> Any:
    while _name(expression) in ("Alias", "UnresolvedAlias"):
        expression = expression.child()
    return expression


def _seq(scala_seq: Any) -> list[Any]:
    return [scala_seq.apply(i) for i in range(scala_seq.size())]


def _time_column(expression: Any, what: str) -> str:
    kind = _name(expression)
    if kind == "UnresolvedAttribute":
        return str(expression.nameParts().last())
    if kind == "AttributeReference":
        return str(expression.name())
    raise TransformError(f"{what}'s time column is an expression ({expression.sql()}): compute it as a column "
                         "before withWatermark and window over that column")


def _function(expression: Any) -> tuple[str, list[Any]] | None:
    """('window' | 'session_window', arguments) of a window call, as the logical plan holds it."""
    expression = _unaliased(expression)
    kind = _name(expression)
    if kind == "UnresolvedFunction":
        name = str(expression.nameParts().last()).lower()
        if name in ("window", "session_window"):
            return name, _seq(expression.arguments())
    if kind == "TimeWindow":
        return "window", [expression.timeColumn(), expression]
    if kind == "SessionWindow":
        return "session_window", [expression.timeColumn(), expression.gapDuration()]
    return None


def _ms(micros: int, what: str) -> int:
    if micros % 1000:
        raise TransformError(f"{what} of {micros} microseconds is not a whole number of milliseconds: the state "
                             "keeps windows in milliseconds")
    return micros // 1000


def window_of(aggregated: Any) -> WindowFound | None:
    """The window among the grouping columns of `aggregated` (a DataFrame built by
    `groupBy(...).agg(...)`), read from its plans: `window(...)` however it was written, with its
    size, slide and start offset (`startTime`), or `session_window(...)` with its gap, a fixed
    one in ms or a dynamic one (a gap column or expression) as its SQL text."""
    jvm = aggregated.sparkSession._jvm
    query = aggregated._jdf.queryExecution()
    logical = query.logical()
    analyzed = query.analyzed()
    found: WindowFound | None = None
    if _name(logical) == "Aggregate":
        for i, expression in enumerate(_seq(logical.groupingExpressions())):
            call = _function(expression)
            if call is None:
                continue
            if found is not None:
                raise TransformError("the groupBy has two windows: group by one window(...) or session_window(...)")
            name, args = call
            if name == "window":
                window = args[1] if _name(args[1]) == "TimeWindow" else \
                    jvm.org.apache.spark.sql.catalyst.expressions.TimeWindow(*args)
                spec = {"column": _time_column(args[0], "window(...)"),
                        "size_ms": _ms(window.windowDuration(), "the window's size"),
                        "slide_ms": _ms(window.slideDuration(), "the window's slide"),
                        "start_ms": _ms(window.startTime(), "the window's startTime")}
                found = WindowFound(i, WINDOW, spec)
            else:
                column, gap = _time_column(args[0], "session_window(...)"), args[1]
                if _name(gap) == "Literal" and gap.dataType().typeName() == "string":
                    # Spark's own reading of the duration (TimeWindow parses it as the analyzer does).
                    micros = jvm.org.apache.spark.sql.catalyst.expressions.TimeWindow(args[0], gap).windowDuration()
                    spec = {"column": column, "gap_ms": _ms(micros, "the session gap")}
                else:
                    # A gap per row: Spark's partials give each row its session [ts, ts + gap(row)).
                    spec = {"column": column, "gap": str(gap.sql())}
                found = WindowFound(i, SESSION, spec)
    if found is None and _name(analyzed) == "Aggregate":
        for expression in _seq(analyzed.groupingExpressions()):
            metadata = str(expression.metadata().json()) if _name(expression) == "AttributeReference" else ""
            if _TIME_WINDOW_MARK in metadata or _SESSION_WINDOW_MARK in metadata:
                raise TransformError(f"the groupBy column {expression.name()!r} is a window computed before the "
                                     "groupBy: write window(...) or session_window(...) in the groupBy itself, "
                                     "so that its size and watermark are known")
    return found


# -- what is refused at start (item 18) ------------------------------------------------------------------

def _is_source(node: Any) -> bool:
    if _name(node) not in ("MapInArrow", "PythonMapInArrow") or _name(node.child()) != "Range":
        return False
    return _SOURCE_COLUMNS <= {str(a.name()) for a in _seq(node.output())}


def _reaches_source(node: Any, is_source: Any = None) -> bool:
    if (is_source or _is_source)(node):
        return True
    return any(_reaches_source(child, is_source) for child in _seq(node.children()))


def stream_stream_join(frame: Any) -> str | None:
    """Why `frame` (the transform's output) must be refused: a join whose two sides both read
    the batch that DataFrame.join did not record as a stream-stream join (operators/join.py)
    would meet partners only within one batch; None when it has none."""
    stack = [frame._jdf.queryExecution().analyzed()]
    while stack:
        node = stack.pop()
        children = _seq(node.children())
        if _name(node) == "Join" and len(children) == 2 and all(_reaches_source(c) for c in children):
            return ("the transform joins two streams in a way txstream does not see as a join of DataFrames (SQL text, "
                    "or a join its stateful rewrite did not record): write it as left.join(right, condition, how) "
                    "(docs/joins.md)")
        stack.extend(children)
    return None


ARBITRARY_STATE = ("applyInPandasWithState", "transformWithStateInPandas", "transformWithState")


def arbitrary_state_refusal(name: str) -> str:
    return (f"{name} is not supported yet: txstream would run it on each batch alone, its per-key state starting "
            "empty every batch and its timers never firing; arbitrary per-key state comes next, on this "
            "foundation (docs/state.md, 'What is refused')")


# -- nothing between the merge and the publisher (item 3) -----------------------------------------------

# Operators that keep each row in the task that merged it: a projection, a filter, a row-wise
# Python UDF, and the wrappers Spark puts around them.
_ROW_WISE = ("ProjectExec", "FilterExec", "WholeStageCodegenExec", "InputAdapter", "ColumnarToRowExec",
             "RowToColumnarExec", "ArrowEvalPythonExec", "BatchEvalPythonExec")


def after_merge(executed: Any) -> list[str]:
    """The operators of a physical plan between its root and the first MapInArrow (the state
    merge), that are not row-wise: a coalesce, a shuffle, a sort, a limit, a second input...
    each of which would move rows away from the unit that merged them."""
    node = executed
    if _name(node) == "AdaptiveSparkPlanExec":
        node = node.inputPlan()
    moved: list[str] = []
    while node is not None:
        kind = _name(node)
        if kind in ("MapInArrowExec", "PythonMapInArrowExec"):
            return moved
        children = _seq(node.children())
        if kind not in _ROW_WISE or len(children) != 1:
            moved.append(str(node.nodeName()))
        node = children[0] if children else None
    return moved


# -- the event time's type (item 12) -----------------------------------------------------------------------

def watermark_refusal(schema: Any, column: str) -> str | None:
    """Why `withWatermark(column, ...)` on a frame of `schema` must be refused: Structured Streaming
    refuses a watermark on a TimestampNTZ column (EVENT_TIME_IS_NOT_ON_TIMESTAMP_TYPE), whose wall-clock
    times a late filter against TIMESTAMP values would shift by spark.sql.session.timeZone."""
    from pyspark.sql.types import TimestampNTZType

    for f in schema.fields:
        if f.name == column and isinstance(f.dataType, TimestampNTZType):
            return (f"the event time {column!r} is TIMESTAMP_NTZ: Structured Streaming refuses a watermark on it "
                    "(EVENT_TIME_IS_NOT_ON_TIMESTAMP_TYPE: it needs TIMESTAMP). Cast it to TIMESTAMP before "
                    f"withWatermark (col({column!r}).cast('timestamp') reads it in spark.sql.session.timeZone)")
    return None


# Operators that pass every row of their input on (what lies between withWatermark and the stateful
# operator may be these): Spark's watermark and txstream's then see the same rows.
_KEEPS_ROWS = {"Project", "SubqueryAlias", "Sort", "Repartition", "RepartitionByExpression", "RebalancePartitions",
               "Window", "ResolvedHint"}
# Joins that keep every row of one side (the side's index; None: both).
_KEEPING_JOINS = {"LeftOuter": (0,), "RightOuter": (1,), "FullOuter": (0, 1)}


def _contains(node: Any, target: Any) -> bool:
    return node.equals(target) or any(_contains(child, target) for child in _seq(node.children()))


def watermark_column_at(source: Any, watermarked: Any, column: str, call: str) -> str:
    """The name the watermark's column has where the stateful operator reads it (`source`):
    Structured Streaming carries the watermark through an alias (the attribute's metadata), so
    `withWatermark("ts", ...).select(col("ts").alias("t")).groupBy(window("t"))` closes by `t`.

    Refuses (TransformError) what lies between `watermarked`, the frame withWatermark returned,
    and `source` that can remove rows: Spark computes the watermark where withWatermark is (its
    EventTimeWatermark node), so the rows an operator above it removes still move the watermark,
    while txstream's comes from the rows its units merge. The same rows reach both only through
    operators that keep every row, and filters Spark pushes below the watermark (deterministic,
    not reading the event time: PushPredicateThroughNonJoin)."""
    top = source._jdf.queryExecution().analyzed()
    target = watermarked._jdf.queryExecution().analyzed()
    event = next((a for a in _seq(target.output()) if str(a.name()) == column), None)
    path: list[Any] = []
    node = top
    while not node.equals(target):
        children = _seq(node.children())
        sides = [i for i, child in enumerate(children) if _contains(child, target)]
        if len(sides) != 1:
            return column   # not below: nothing to follow
        path.append(node)
        removes = _removes_rows(node, sides[0], event)
        if removes is not None:
            raise TransformError(
                f"the transform applies {removes} between withWatermark({column!r}, ...) and {call}: Structured "
                "Streaming computes the watermark where withWatermark is, so the rows it removes still move the "
                "watermark, while txstream sees only the rows that reach the stateful operator. Call "
                f"withWatermark after it, just before {call} (a filter that does not read the event time may stay)")
        node = children[sides[0]]
    for op in reversed(path):   # upwards: the event time's attribute under each projection's names
        if event is None or _name(op) != "Project":
            continue
        outputs = _seq(op.projectList())
        if any(_name(e) == "AttributeReference" and e.exprId().equals(event.exprId()) for e in outputs):
            continue
        aliased = [e for e in outputs if _name(e) == "Alias" and _name(e.child()) == "AttributeReference"
                   and e.child().exprId().equals(event.exprId())]
        event = aliased[0].toAttribute() if aliased else None
    return str(event.name()) if event is not None else column


def _removes_rows(node: Any, side: int, event: Any) -> str | None:
    """What `node` (its input `side` the watermarked one) removes of its rows, or None."""
    kind = _name(node)
    if kind == "Filter":
        condition = node.condition()
        if _name(condition) == "IsNotNull":
            return None   # a null event time moves no watermark (Spark's own window() adds this filter)
        if not condition.deterministic() or (event is not None and condition.references().contains(event)):
            return f"a filter on the event time ({condition.sql()})"
        return None
    if kind == "Join":
        join_type = _name(node.joinType()).rstrip("$")
        return None if side in _KEEPING_JOINS.get(join_type, ()) else \
            f"a join ({join_type}: its rows without a partner are removed)"
    if kind == "Generate":
        return None if node.outer() else "an explode (a row with an empty array is removed; explode_outer keeps it)"
    return None if kind in _KEEPS_ROWS else f"a {kind}"
