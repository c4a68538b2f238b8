"""Aggregates that merge across batches: what Spark computes per batch (a partial), what the state
keeps per group (an accumulator), and the value emitted (docs/state.md, "Semantics").

Spark computes each batch's partials (the heavy part: one pass over the batch's rows per group);
a unit merges them into the group's accumulator here, one group at a time. An aggregate whose
partials cannot be merged exactly (first, last, percentile, collect_list: their answer depends on
the order or on every row) is refused at start with the reason (`refusal`).
"""
from __future__ import annotations

import base64
import decimal
import json
from decimal import Decimal
from typing import Any

import pyarrow as pa

from txstream.state.operator import Aggregate
from txstream.state.values import EXACT

# Spark's aggregate function classes -> our name for them.
SPARK_FUNCTIONS = {"Count": "count", "Sum": "sum", "Min": "min", "Max": "max", "Average": "avg"}
WHY_NOT = {
    "First": "it keeps whichever row comes first, and across batches that depends on how they were cut",
    "Last": "it keeps whichever row comes last, and across batches that depends on how they were cut",
    "CollectList": "its order follows the shuffle and it grows without bound",
    "CollectSet": "its order follows the shuffle and it grows without bound",
    "Percentile": "an exact percentile needs every row ever seen",
    "ApproximatePercentile": "its digest is not exposed to merge across batches",
    "StddevSamp": "not merged yet (keep sum, sum of squares and count and derive it)",
    "StddevPop": "not merged yet (keep sum, sum of squares and count and derive it)",
    "VarianceSamp": "not merged yet (keep sum, sum of squares and count and derive it)",
    "VariancePop": "not merged yet (keep sum, sum of squares and count and derive it)",
}


def refusal(spark_class: str, distinct: bool) -> str | None:
    """Why an aggregate cannot be kept across batches; None when it can."""
    if spark_class in ("Count", "HyperLogLogPlusPlus") or (spark_class in SPARK_FUNCTIONS and not distinct):
        return None
    if distinct:
        return "only count(DISTINCT ...) is kept across batches among DISTINCT aggregates"
    return WHY_NOT.get(spark_class, "txstream does not know how to merge it across batches")


def function_name(spark_class: str, distinct: bool) -> str:
    if spark_class == "Count" and distinct:
        return "count_distinct"
    if spark_class == "HyperLogLogPlusPlus":
        return "approx_count_distinct"
    return SPARK_FUNCTIONS[spark_class]


def _nullable(avro_type: Any) -> list:
    return ["null", avro_type]


# The state keeps one field per aggregate (two for avg), all nullable; min/max/sum values of any
# type are kept as JSON text (their Spark type is restored when the row is emitted).
def state_schema(aggregates: list[Aggregate], event_time: bool = False) -> dict[str, Any]:
    fields: list[dict[str, Any]] = []
    for i, agg in enumerate(aggregates):
        if agg.function in ("count", "count_distinct_n"):
            fields.append({"name": f"a{i}", "type": "long", "default": 0})
        elif agg.function == "avg":   # the sum: a double, or a decimal's exact text
            fields.append({"name": f"a{i}", "type": ["null", "double", "string"], "default": None})
            fields.append({"name": f"a{i}n", "type": "long", "default": 0})
        elif agg.function in ("count_distinct", "collect_set"):
            fields.append({"name": f"a{i}", "type": {"type": "array", "items": "string"}, "default": []})
        elif agg.function == "approx_count_distinct":
            fields.append({"name": f"a{i}", "type": _nullable("bytes"), "default": None})   # an HLL sketch
        else:   # sum, min, max
            fields.append({"name": f"a{i}", "type": _nullable("string"), "default": None})
    if event_time:
        fields.append({"name": "t", "type": _nullable("long"), "default": None})
    return {"type": "record", "name": "State", "namespace": "txstream.state", "fields": fields}


def session_schema(aggregates: list[Aggregate]) -> dict[str, Any]:
    """A group's open sessions, each its start and end (epoch µs) and its aggregates' state."""
    session = state_schema(aggregates)
    session = {"type": "record", "name": "Session", "fields": [
        {"name": "start", "type": "long"}, {"name": "end", "type": "long"}, *session["fields"]]}
    return {"type": "record", "name": "Sessions", "namespace": "txstream.state",
            "fields": [{"name": "sessions", "type": {"type": "array", "items": session}, "default": []}]}


def merge_states(aggregates: list[Aggregate], one: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Two accumulators of the same aggregates as one (two sessions that a batch joined)."""
    partials: list[Any] = []
    for i, agg in enumerate(aggregates):
        name = f"a{i}"
        if agg.function == "avg":
            partials += [other[name], other[f"{name}n"]]
        elif agg.function in ("count_distinct", "collect_set"):
            partials.append([json.loads(v) for v in other[name] or []])
        elif agg.function in ("count", "approx_count_distinct"):
            partials.append(other[name])
        else:
            partials.append(_loads(other[name]))
    return merge(aggregates, one, partials)


def empty(aggregates: list[Aggregate]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for i, agg in enumerate(aggregates):
        if agg.function == "count":
            row[f"a{i}"] = 0
        elif agg.function == "avg":
            row[f"a{i}"], row[f"a{i}n"] = None, 0
        elif agg.function in ("count_distinct", "collect_set"):
            row[f"a{i}"] = []
        else:
            row[f"a{i}"] = None
    return row


# approx_count_distinct: Spark computes a batch's Apache DataSketches HLL sketch per group
# (hll_sketch_agg); the state keeps the union, whose estimate is emitted. Spark's own HLL++ is not
# exposed to merge, and DataSketches' is the same library on both sides.
SKETCH_LG_K = 12   # 4,096 buckets: about 1.6% relative error


def _union(current: bytes | None, sketch: bytes) -> bytes:
    from datasketches import hll_sketch, hll_union

    if current is None:
        return sketch
    union = hll_union(SKETCH_LG_K)
    union.update(hll_sketch.deserialize(current))
    union.update(hll_sketch.deserialize(sketch))
    return bytes(union.get_result().serialize_compact())


def _estimate(sketch: bytes | None) -> int:
    if sketch is None:
        return 0
    from datasketches import hll_sketch

    return round(hll_sketch.deserialize(sketch).get_estimate())


# A sum, min or max is kept as JSON text that says its type: a decimal as {"d": its exact text}
# (float64 would lose digits), bytes as {"b64": base64} (as in keys), anything else as JSON.
def _untag(obj: dict) -> Any:
    if len(obj) == 1 and "d" in obj:
        return Decimal(obj["d"])
    if len(obj) == 1 and "b64" in obj:
        return base64.b64decode(obj["b64"])
    return obj


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text, object_hook=_untag)


def _decimal_text(value: Decimal) -> str:
    return '{"d":"' + str(value) + '"}'


def _decimal_loads(text: str) -> Decimal:
    return Decimal(text[6:-2]) if text.startswith('{"d":"') else Decimal(json.loads(text))


def _bytes_text(value: bytes) -> str:
    return '{"b64":"' + base64.b64encode(value).decode("ascii") + '"}'


def _bytes_loads(text: str) -> bytes:
    return base64.b64decode(json.loads(text)["b64"])


def _add(current: Any, value: Any) -> Any:
    return EXACT.add(current, value) if isinstance(value, Decimal) else current + value


# Spark's order of floating values (SQLOrderingUtil.compareDoubles): NaN above every number, so
# max is NaN once any value is, min ignores NaN unless every value is; -0.0 equals 0.0 (the value
# first kept stays, as Spark's greatest/least keep it). Python's min/max would follow the order of
# the batches instead. For any other type `x != x` is False: plain comparison.
def spark_max(current: Any, value: Any) -> Any:
    if current != current:  # noqa: PLR0124 (NaN)
        return current
    if value != value:  # noqa: PLR0124
        return value
    return value if value > current else current


def spark_min(current: Any, value: Any) -> Any:
    if current != current:  # noqa: PLR0124
        return value
    if value != value:  # noqa: PLR0124
        return current
    return value if value < current else current


_JSON = json.JSONEncoder(separators=(",", ":"))   # one encoder: json.dumps with options builds one per call


def _dumps(value: Any) -> str | None:
    return None if value is None else _JSON.encode(value)


# The text of a sum, min or max, read and written by the partial's own Python type where that is
# exactly what json does (float(text) reads any number json wrote, as a float; repr is json's text
# of a finite float, str of an int), at a tenth of json's cost per call; anything else goes through json.
def _float_text(value: float) -> str:
    return repr(value) if value - value == 0 else _JSON.encode(value)   # NaN and infinities: json's words


def _int_loads(text: str) -> Any:
    return int(text) if text.isdigit() else json.loads(text)   # a negative, or a float's text


_NUMBER_TEXT = {float: (float, _float_text), int: (_int_loads, str), Decimal: (_decimal_loads, _decimal_text),
                bytes: (_bytes_loads, _bytes_text)}
_JSON_TEXT = (_loads, _JSON.encode)


def merge(aggregates: list[Aggregate], state: dict[str, Any], partials: list[Any]) -> dict[str, Any]:
    """`state` with one batch's `partials` (in the order `partial_columns` gives them) merged in;
    partial values are plain Python (numbers, strings, lists), timestamps as epoch microseconds."""
    return merge_rows(aggregates, [dict(state)], [[value] for value in partials])[0]


def merge_rows(aggregates: list[Aggregate], states: list[dict[str, Any] | None],
               partials: list[list[Any]]) -> list[dict[str, Any]]:
    """`merge` for many groups at once: `states[j]` (None: a new group) with row j of the partial
    columns `partials` merged in, updated in place. One aggregate at a time over the whole column,
    so the cost per group is its arithmetic, not the dispatch on the aggregate's function."""
    blank = empty(aggregates)
    out = [state if state is not None else dict(blank) for state in states]
    p = 0
    for i, agg in enumerate(aggregates):
        name, column = f"a{i}", partials[p]
        p += 1
        if agg.function == "count":
            for row, value in zip(out, column, strict=True):
                if value:
                    row[name] = (row[name] or 0) + value
        elif agg.function == "avg":
            counts = partials[p]
            p += 1
            for row, value, count in zip(out, column, counts, strict=True):
                if isinstance(value, (Decimal, str)):   # a decimal's sum: exact, kept as text
                    value = Decimal(value)
                    row[name] = str(value if row[name] is None else EXACT.add(Decimal(row[name]), value))
                elif value is not None:
                    row[name] = (row[name] or 0.0) + value
                row[f"{name}n"] = (row[f"{name}n"] or 0) + (count or 0)
        elif agg.function == "approx_count_distinct":
            for row, value in zip(out, column, strict=True):
                if value is not None:
                    row[name] = _union(row[name], bytes(value))
        elif agg.function in ("count_distinct", "collect_set"):
            for row, value in zip(out, column, strict=True):
                if value:
                    seen = set(row[name] or [])
                    seen.update(json.dumps(v, separators=(",", ":"), sort_keys=True) for v in value)
                    row[name] = sorted(seen)
        else:
            pick = _add if agg.function == "sum" else (spark_min if agg.function == "min" else spark_max)
            for row, value in zip(out, column, strict=True):
                if value is None:
                    continue
                loads, dumps = _NUMBER_TEXT.get(type(value), _JSON_TEXT)
                current = row[name]
                if current is not None:
                    value = pick(loads(current), value)
                row[name] = dumps(value)
    return out


def partial_count(agg: Aggregate) -> int:
    """How many partial columns Spark computes for `agg` (avg: a sum and a count)."""
    return 2 if agg.function == "avg" else 1


def final(aggregates: list[Aggregate], state: dict[str, Any]) -> list[Any]:
    """The emitted value of each aggregate (timestamps still as epoch microseconds)."""
    return [column[0] for column in final_columns(aggregates, [state])]


def output_kinds(aggregates: list[Aggregate], schema: pa.Schema) -> list[Any]:
    """`final_columns`'s kinds: per aggregate the Python type of its emitted values when float,
    int or bytes, its Arrow type when a decimal, else None."""
    kinds: list[Any] = []
    for agg in aggregates:
        typ = schema.field(agg.name).type if agg.name in schema.names else None
        kinds.append(None if typ is None else float if pa.types.is_floating(typ) else int if pa.types.is_integer(typ)
                     else typ if pa.types.is_decimal(typ) else bytes if pa.types.is_binary(typ) else None)
    return kinds


# Spark's Decimal division: java.math.BigDecimal.divide at 38 significant digits, half up.
_DIVIDE = decimal.Context(prec=38, rounding=decimal.ROUND_HALF_UP, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)


def decimal_average(total: Decimal, count: int, typ: Any = None) -> Decimal | None:
    """avg(decimal(p, s)) as Spark computes it (Average's DecimalDivideWithOverflowCheck): the
    exact sum divided by the count at 38 significant digits, half up, then at the result type's
    scale, half up (decimal(min(38, p + 4), min(38, s + 4)), `typ`; None: s + 4 at precision
    38); None where that overflows the type (Spark's null)."""
    precision = typ.precision if typ is not None else 38
    scale = typ.scale if typ is not None else min(38, -total.as_tuple().exponent + 4)
    value = _DIVIDE.divide(total, Decimal(count)).quantize(Decimal(1).scaleb(-scale), context=EXACT)
    return None if value and value.adjusted() >= precision - scale else value


def final_columns(aggregates: list[Aggregate], states: list[dict[str, Any]],
                  kinds: list[Any] | None = None) -> list[list[Any]]:
    """`final` of many states, one column per aggregate. `kinds[i]` (`output_kinds`) is the
    Python type of aggregate i's emitted values when float, int or bytes (its sum, min or max text
    is then read as that type: the same value as json's reading, for less), its Arrow type when a
    decimal (an avg's result type), else None."""
    columns: list[list[Any]] = []
    for i, agg in enumerate(aggregates):
        name = f"a{i}"
        kind = kinds[i] if kinds is not None else None
        if agg.function == "count":
            columns.append([state[name] or 0 for state in states])
        elif agg.function == "avg":
            columns.append([None if not state[f"{name}n"] or state[name] is None
                            else decimal_average(Decimal(state[name]), state[f"{name}n"], kind)
                            if isinstance(state[name], str) else state[name] / state[f"{name}n"]
                            for state in states])
        elif agg.function == "count_distinct":
            columns.append([len(state[name] or []) for state in states])
        elif agg.function == "approx_count_distinct":
            columns.append([_estimate(state[name]) for state in states])
        elif agg.function == "collect_set":
            columns.append([[json.loads(v) for v in state[name] or []] for state in states])
        else:
            loads = _NUMBER_TEXT[kind][0] if kind in (float, int) else _loads
            columns.append([None if state[name] is None else loads(state[name]) for state in states])
    return columns
