"""Checks of the processor's output, on the driver, before anything is read or published:
the sink's columns and types, and a narrow physical plan (docs/architecture.md, invariant 3)."""
from __future__ import annotations

import re

from txstream.errors import TransformError
from txstream.serde.avro import check_struct_fits
from txstream.settings import RunSettings


def check_output(out, settings: RunSettings) -> None:
    """The transform's output has the sink's columns, of types txstream can publish."""
    from pyspark.sql import types as T

    s = settings
    fields = {f.name: f.dataType for f in out.schema.fields}
    if "value" not in fields:
        raise TransformError(
            f"{type(s.processor).__name__}.transform returned no `value` column (it has: "
            f"{', '.join(fields) or 'nothing'}). Like Spark's Kafka sink, txstream needs `value` "
            "(binary, string, or a struct encoded with output_value_schema); `key`, `topic`, "
            "`partition` and `headers` are optional.")
    for side, schema in (("value", s.output_value_schema), ("key", s.output_key_schema)):
        if side not in fields:
            continue
        typ = fields[side]
        if isinstance(typ, T.StructType):
            if schema is None:
                raise TransformError(f"The output `{side}` is a struct but the processor declares no "
                                     f"output_{side}_schema to encode it with Avro.")
            check_struct_fits(typ, schema, f"output {side}")
        elif not isinstance(typ, (T.BinaryType, T.StringType, T.NullType)):
            raise TransformError(f"The output `{side}` column is {typ.simpleString()}; it must be "
                                 "binary, string or a struct (encoded with Avro).")
    if "topic" not in fields and not s.output_topic:
        raise TransformError("The processor declares no output_topic (or --output) and the output has "
                             "no `topic` column: txstream does not know where to publish.")
    if "topic" in fields and not isinstance(fields["topic"], T.StringType):
        raise TransformError(f"The output `topic` column is {fields['topic'].simpleString()}; it must be string.")
    if "partition" in fields and not isinstance(fields["partition"], (T.IntegerType, T.LongType, T.ShortType)):
        raise TransformError(f"The output `partition` column is {fields['partition'].simpleString()}; it must be int.")


def physical_plan(frame) -> str:
    """The frame's physical plan as Spark prints it (`wide_parts`, `describe_wide` read it)."""
    return frame._jdf.queryExecution().executedPlan().toString()


def wide_parts(plan_text: str, own_coalesce: bool = False) -> list[str]:
    """The exchanges (shuffles) and partition merges of a physical plan (`physical_plan`): empty
    for a narrow transform, whose rows keep the reading task they came from. `own_coalesce`: the
    topmost merge is the driver's own, grouping ranges into slots (driver/slots.py)."""
    shuffles = [line.strip() for line in plan_text.splitlines()
                if "Exchange" in line and "BroadcastExchange" not in line]
    merges = [line.strip() for line in plan_text.splitlines() if "Coalesce" in line and "coalesce(" not in line]
    return shuffles + merges[1 if own_coalesce else 0:]


def _aliased(plan: str, name: str) -> str | None:
    """The expression the plan computes as `name` (`... AS _groupingexpression#7` in a Project:
    Spark's name for a groupBy key that is not a plain column), without its `#N` ids."""
    found = re.search(rf" AS {re.escape(name)}(?![\w#])", plan)
    if found is None:
        return None
    depth, start = 0, found.start()
    at = start
    while start > 0:   # back to the list's `[` or `, ` at the expression's own depth
        char = plan[start - 1]
        if char in ")]":
            depth += 1
        elif char in "([":
            if depth == 0:
                break
            depth -= 1
        elif char == "," and depth == 0:
            break
        start -= 1
    return re.sub(r"#\d+L?", "", plan[start:at]).strip() or None


def describe_wide(parts: list[str], plan: str = "") -> str:
    """What makes a transform wide, in words, from the first of its `wide_parts` (plan lines);
    `plan`, the whole physical plan, names the keys Spark computes under its own names."""
    part = parts[0] if parts else ""

    def columns(text: str) -> str:
        ids = [c.strip().split(" ")[0] for c in text.split(",")[:-1]]
        names = [(_aliased(plan, i) if i.startswith("_groupingexpression") else None)
                 or re.sub(r"#\d+L?$", "", i) for i in ids]
        named = [n for n in names if n and not n.startswith("_groupingexpression")]
        return ", ".join(named) if named else "a computed key"

    hashed = re.search(r"hashpartitioning\((.*)\)", part)
    if hashed:
        return f"it brings rows together by {columns(hashed.group(1))} (a shuffle)"
    ranged = re.search(r"rangepartitioning\((.*)\)", part)
    if ranged:
        return f"it sorts rows by {columns(ranged.group(1))} across partitions (a shuffle)"
    if "SinglePartition" in part:
        return "it brings every row into one partition (a global aggregate, sort or limit)"
    if "RoundRobinPartitioning" in part:
        return "it repartitions the rows (a shuffle)"
    if "Coalesce" in part:
        return "it merges partitions (coalesce)"
    return "it moves rows between partitions"


def check_narrow(frame, own_coalesce: bool = False) -> None:
    """Refuse a plan with a shuffle or a merge of partitions in a run that chose the narrow
    protocol: task i must publish range i.

    Checked on the very DataFrame the batch collects, whose physical plan Spark then reuses
    (not planned twice per batch). Checked every batch, not only at start: a join whose static side outgrows Spark's broadcast threshold turns into
    a shuffled join without the processor changing."""
    parts = wide_parts(physical_plan(frame), own_coalesce)
    if parts:
        raise TransformError(
            "The transform turned wide after the run started: its physical plan now has "
            + "; ".join(parts[:3])
            + ". The run chose the narrow protocol at start (one transaction per slot of input "
            "partitions); "
            "restart it and txstream chooses the wide protocol (docs/wide-transforms.md), or keep "
            "the join's static side under spark.sql.autoBroadcastJoinThreshold.")


def single_chain(frame) -> bool:
    """Every operator of the physical plan has at most one input: the reader is its only leaf.

    With no shuffle and no merge (check_narrow) each row then stays in the Spark partition it
    was read in, so a slot's ranges may be read in one partition without each row naming its
    range (task/reading.py range_frame). A join or a union has a second input (a broadcast
    table, another source) whose partitions or rows could mix with the slot's: those runs read
    one partition per range, whose rows are checked by the range they name (task/publish.py).

    Nor may the transform map whole partitions itself (`mapInPandas`, `mapInArrow`: the plan's
    only ones are txstream's reader and publisher): such code may rely on a Spark partition
    holding one Kafka partition's range, in offset order, which a slot read together does not."""
    plan_text = frame._jdf.queryExecution().executedPlan().toString()
    batch_maps = sum(line.lstrip(" +-:*()0123456789").startswith(("MapInArrow", "MapInPandas", "PythonMapIn"))
                     for line in plan_text.splitlines())
    return ":- " not in plan_text and batch_maps <= 2
