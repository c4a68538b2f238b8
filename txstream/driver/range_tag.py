"""Carry the readers' range tag and each row's source offset through the transform, so that the
publisher knows, for every output row, which range it came from (each range is its own
publication) and which input record (the offset in its lineage header), whatever the transform
selects.

The reader adds RANGE_COLUMN and the transform sees its input without it (task/reading.py
range_frame): a transform selects its own columns, and `struct("*")` must not pick the tag up.
The input's `offset` column is the user's to keep or drop. Here the transform's analyzed plan is
rebuilt with the reader's tag and offset attributes appended to every projection above the
reader, the same expressions otherwise, and the offset renamed OFFSET_COLUMN at the top.

What can carry them: a chain of one-input operators that keep their input's columns (a filter, a
projection, a Python UDF, an explode); the offset also crosses a join (the rows of the reader's
side keep their identity). What cannot: a union (whose rows come from two inputs), an aggregate
(an output row has no one input row), a partition map of the transform's own. Without the tag,
`carry_range_tag` returns None (the run then reads one Spark partition per range, which tags rows
by partition id); without the offset, the output rows name their range and their
position in its publication, not their input record (docs/guarantees.md).

Hand-written over Py4J: Catalyst's own rewrite (`transformUp`) takes a Scala partial function,
which Python cannot pass."""
from __future__ import annotations

from typing import Any

from txstream.constants import RANGE_COLUMN
from txstream.task.collector import OFFSET_COLUMN

_CATALYST = "org.apache.spark.sql.catalyst"
_PROJECT = f"{_CATALYST}.plans.logical.Project"
_JOIN = f"{_CATALYST}.plans.logical.Join"


def carry_range_tag(frame: Any, tag: bool = True, offset: bool = True) -> Any | None:
    """`frame` (the transform's output over the batch's reader) with, where its plan can carry
    them, the input's offset in OFFSET_COLUMN (`offset`) and the reader's RANGE_COLUMN (`tag`) as
    its last columns. With `tag`, None when the plan cannot carry the tag; without, `frame` itself
    when it cannot carry the offset (a run reading one range per Spark partition tags its rows by
    partition id)."""
    from py4j.protocol import Py4JError

    if not tag:
        if not offset or OFFSET_COLUMN in frame.columns:
            return frame
        try:
            carried = _carried(frame, tag=False)
        except Py4JError:
            carried = None
        return frame if carried is None else carried
    if RANGE_COLUMN in frame.columns:   # the transform's own column of that name: ambiguous
        return None
    try:
        carried = _carried(frame, tag=True, offset=True) if offset and OFFSET_COLUMN not in frame.columns else None
        return carried if carried is not None else _carried(frame, tag=True, offset=False)
    except Py4JError:
        return None


def _carried(frame: Any, tag: bool, offset: bool = True) -> Any | None:
    """The frame rebuilt with the reader's tag (`tag`) and offset (`offset`) carried, or None when
    its plan cannot carry what is asked."""
    from pyspark.sql import DataFrame

    spark = frame.sparkSession
    jvm = spark._jvm
    top = frame._jdf.queryExecution().analyzed()
    found = _path_to_reader(top, through_joins=not tag)
    if found is None or not found[0]:
        return None
    above, node = found
    carried = []
    if tag:
        range_attr = _named(node.output(), RANGE_COLUMN)
        if range_attr is None:
            return None
        carried.append(range_attr)
    offset_attr = _named(node.output(), "offset") if offset else None
    if offset and (offset_attr is None or top.outputSet().contains(offset_attr)):
        # No offset to carry, or the transform keeps the input's own: the publisher reads that.
        return None
    if offset_attr is not None:
        carried.insert(0, offset_attr)
    rebuilt = _rebuilt(jvm, node, above, carried)
    if rebuilt is None:
        return None
    scala = jvm.scala.jdk.javaapi.CollectionConverters
    projection = jvm.java.util.ArrayList(scala.asJava(top.output()))
    if offset_attr is not None:
        projection.add(_alias(jvm, offset_attr, OFFSET_COLUMN))
    if tag:
        projection.add(carried[-1])
    rebuilt = jvm.org.apache.spark.sql.catalyst.plans.logical.Project(scala.asScala(projection).toSeq(), rebuilt)
    jdf = jvm.org.apache.spark.sql.classic.Dataset.ofRows(spark._jsparkSession, rebuilt)
    return DataFrame(jdf, spark)


def carry_reader_columns(frame: Any, names: tuple[str, ...], prefix: str) -> Any | None:
    """`frame` with the reader's columns `names` (the input record's) as its last columns, each
    named `prefix + name`, or None when its plan cannot carry them (a union, a reader on both
    sides of a join, an aggregate)."""
    from py4j.protocol import Py4JError
    from pyspark.sql import DataFrame

    try:
        spark = frame.sparkSession
        jvm = spark._jvm
        top = frame._jdf.queryExecution().analyzed()
        found = _path_to_reader(top, through_joins=True)
        if found is None:
            return None
        above, node = found
        carried = [_named(node.output(), name) for name in names]
        if any(attribute is None for attribute in carried):
            return None
        rebuilt = _rebuilt(jvm, node, above, carried)
        if rebuilt is None:
            return None
        scala = jvm.scala.jdk.javaapi.CollectionConverters
        projection = jvm.java.util.ArrayList(scala.asJava(top.output()))
        for name, attribute in zip(names, carried, strict=True):
            projection.add(_alias(jvm, attribute, prefix + name))
        rebuilt = jvm.org.apache.spark.sql.catalyst.plans.logical.Project(scala.asScala(projection).toSeq(), rebuilt)
        return DataFrame(jvm.org.apache.spark.sql.classic.Dataset.ofRows(spark._jsparkSession, rebuilt), spark)
    except Py4JError:
        return None


def _path_to_reader(top: Any, through_joins: bool) -> tuple[list[tuple[Any, int]], Any] | None:
    """The operators from `top` down to txstream's reader, each with the index of its child
    towards it, and the reader; None when the way down forks (a union; a join, unless
    `through_joins` and the reader is on one side only)."""
    above: list[tuple[Any, int]] = []
    node = top
    while not _is_reader(node):
        children = node.children()
        if children.size() == 1:
            index = 0
        elif through_joins and node.getClass().getName() == _JOIN:
            sides = [i for i in range(children.size()) if _holds_reader(children.apply(i))]
            if len(sides) != 1:
                return None
            index = sides[0]
        else:
            return None
        above.append((node, index))
        node = children.apply(index)
    return above, node


def _rebuilt(jvm: Any, reader: Any, above: list[tuple[Any, int]], carried: list[Any]) -> Any | None:
    """The plan above the reader rebuilt with the attributes `carried` appended to every
    projection, or None when an operator drops them (an aggregate)."""
    scala = jvm.scala.jdk.javaapi.CollectionConverters
    logical = jvm.org.apache.spark.sql.catalyst.plans.logical
    rebuilt = reader
    for op, index in reversed(above):
        if op.getClass().getName() == _PROJECT:
            projection = jvm.java.util.ArrayList(scala.asJava(op.projectList()))
            for attribute in carried:
                if not op.outputSet().contains(attribute):
                    projection.add(attribute)
            rebuilt = logical.Project(scala.asScala(projection).toSeq(), rebuilt)
        else:
            children = jvm.java.util.ArrayList(scala.asJava(op.children()))
            children.set(index, rebuilt)
            rebuilt = op.withNewChildren(scala.asScala(children).toSeq())
        if not all(rebuilt.outputSet().contains(attribute) for attribute in carried):
            return None
    return rebuilt


def _is_reader(node: Any) -> bool:
    """txstream's reader: a `mapInArrow` over `spark.range` (task/reading.py range_frame)."""
    return (node.nodeName() == "MapInArrow" and node.children().size() == 1
            and node.children().apply(0).nodeName() == "Range")


def _holds_reader(node: Any) -> bool:
    return _is_reader(node) or any(_holds_reader(node.children().apply(i)) for i in range(node.children().size()))


def _alias(jvm: Any, attribute: Any, name: str) -> Any:
    """Catalyst's `Alias(attribute, name)` (its defaults spelt out: Py4J sees one constructor)."""
    expressions = jvm.org.apache.spark.sql.catalyst.expressions
    empty = jvm.scala.jdk.javaapi.CollectionConverters.asScala(jvm.java.util.ArrayList()).toSeq()
    return expressions.Alias(attribute, name, expressions.NamedExpression.newExprId(), empty,
                             jvm.scala.Option.empty(), empty)


def _named(attributes: Any, name: str) -> Any | None:
    """The attribute called `name` in a Scala Seq of attributes, if any."""
    for i in range(attributes.size()):
        attribute = attributes.apply(i)
        if attribute.name() == name:
            return attribute
    return None
