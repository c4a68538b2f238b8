"""Carry the readers' range tag through the transform, so that a slot read in one Spark
partition still tells its publisher which range each output row came from (the lineage
headers name the source partition; each range is its own publication).

The reader adds RANGE_COLUMN and the transform sees its input without it (task/reading.py
range_frame): a transform selects its own columns, and `struct("*")` must not pick the tag up.
Here the transform's analyzed plan is rebuilt with the tag appended to every projection above
the reader, the same expressions otherwise, so the tag reaches the output. Only a chain of
one-input operators that keep their input's columns (a filter, a projection, a Python UDF, an
explode) can carry it: a join or a union (a second input), an aggregate, a partition map of the
transform's own leaves the tag behind, and `carry_range_tag` returns None (the run then reads
one Spark partition per range, which tags rows by partition id instead).

Hand-written over Py4J: Catalyst's own rewrite (`transformUp`) takes a Scala partial function,
which Python cannot pass. It costs a handful of Py4J round trips per operator (tens of
milliseconds of driver time per batch for a typical transform)."""
from __future__ import annotations

from typing import Any

from txstream.protocol import RANGE_COLUMN

_PROJECT = "org.apache.spark.sql.catalyst.plans.logical.Project"


def carry_range_tag(frame: Any) -> Any | None:
    """`frame` (the transform's output over a tagged reader) with RANGE_COLUMN as its last
    column, or None when its plan cannot carry it."""
    from py4j.protocol import Py4JError

    if RANGE_COLUMN in frame.columns:   # the transform's own column of that name: ambiguous
        return None
    try:
        return _carried(frame)
    except Py4JError:
        return None


def _carried(frame: Any) -> Any | None:
    from pyspark.sql import DataFrame

    spark = frame.sparkSession
    jvm = spark._jvm
    node = frame._jdf.queryExecution().analyzed()
    above: list[Any] = []
    tag = None
    while tag is None:
        output = node.output()
        tag = _named(output, RANGE_COLUMN) if f"{RANGE_COLUMN}#" in output.toString() else None
        if tag is None:
            if node.children().size() != 1:
                return None
            above.append(node)
            node = node.children().apply(0)
    if not above or node.nodeName() != "MapInArrow":   # not the reader's tag
        return None
    scala = jvm.scala.jdk.javaapi.CollectionConverters
    rebuilt = node
    for op in reversed(above):
        if op.getClass().getName() == _PROJECT:
            projection = jvm.java.util.ArrayList(scala.asJava(op.projectList()))
            projection.add(tag)
            rebuilt = jvm.org.apache.spark.sql.catalyst.plans.logical.Project(scala.asScala(projection).toSeq(), rebuilt)
        else:
            child = jvm.java.util.ArrayList()
            child.add(rebuilt)
            rebuilt = op.withNewChildren(scala.asScala(child).toSeq())
        if not rebuilt.outputSet().contains(tag):
            return None
    jdf = jvm.org.apache.spark.sql.classic.Dataset.ofRows(spark._jsparkSession, rebuilt)
    return DataFrame(jdf, spark)


def _named(attributes: Any, name: str) -> Any | None:
    """The attribute called `name` in a Scala Seq of attributes, if any."""
    for i in range(attributes.size()):
        attribute = attributes.apply(i)
        if attribute.name() == name:
            return attribute
    return None
