"""Values between Arrow columns and the state: partials as the merge takes them (timestamps as
epoch microseconds, decimals exact) and the state's values back in their column's type."""
from __future__ import annotations

import base64
import decimal
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from txstream.state.keys import micros, tagged_bytes

# Decimal arithmetic is exact: Spark's widest decimal has 38 digits and a sum of them a few more,
# so a context of 100 digits never rounds (Python's default context rounds at 28).
EXACT = decimal.Context(prec=100, rounding=decimal.ROUND_HALF_UP, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)


def ms(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return round(value.timestamp() * 1000)
    return int(value)


def plain(value: Any) -> Any:
    """A partial's value as the merge takes it: timestamps as epoch microseconds, dates as ISO
    text, decimals and bytes as they are (exact; the state's text tags them), a set's elements
    JSON-able (`_element`)."""
    if isinstance(value, datetime):
        return micros(value)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, list):
        return [_element(v) for v in value]
    return value


def _element(value: Any) -> Any:
    """An element of a distinct set, as JSON text equal exactly when Spark's distinct calls the
    values equal: -0.0 is 0.0 (NaN's JSON is one word already), bytes tagged as in keys,
    decimals as their text, structs (count(DISTINCT a, b)) field by field."""
    if isinstance(value, float):
        return value + 0.0   # -0.0 + 0.0 is 0.0
    if isinstance(value, (bytes, bytearray)):
        return tagged_bytes(bytes(value))
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dict):
        return {k: _element(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_element(v) for v in value]
    return plain(value)


def typed(value: Any, typ: pa.DataType) -> Any:
    """A value the state or a key kept, back in its column's type."""
    if value is None:
        return None
    if pa.types.is_date(typ) and isinstance(value, str):
        return date.fromisoformat(value)
    if _is_binary(typ) and isinstance(value, dict):
        return base64.b64decode(value["b64"])   # keys.tagged_bytes
    if pa.types.is_decimal(typ):
        return _decimal(Decimal(value) if isinstance(value, (str, int)) else value, typ)
    return value


def _decimal(value: Decimal, typ: Any) -> Decimal | None:
    """`value` at the column's scale (half up, as Spark's cast), None where it overflows the
    column's precision (Spark's null; Arrow would refuse the batch)."""
    value = value.quantize(Decimal(1).scaleb(-typ.scale), context=EXACT)
    return None if value.adjusted() >= typ.precision - typ.scale and value else value


def plain_column(column: Any) -> list[Any]:
    """A partial column's values as `plain` gives them, converted by Arrow where it can
    (timestamps to epoch microseconds; decimals stay Python decimals, exact)."""
    typ = column.type
    if pa.types.is_timestamp(typ):
        return pc.cast(column.cast(pa.timestamp("us", typ.tz), safe=False), pa.int64()).to_pylist()
    if pa.types.is_date(typ) or pa.types.is_list(typ) or pa.types.is_large_list(typ):
        return [plain(value) for value in column.to_pylist()]
    return column.to_pylist()


def ms_column(column: Any) -> list[int | None]:
    """Epoch milliseconds of a timestamp column (`ms` of each value)."""
    micros = pc.cast(column.cast(pa.timestamp("us", column.type.tz), safe=False), pa.int64())
    return pc.cast(pc.round(pc.divide(micros, 1000.0), round_mode="half_to_even"), pa.int64()).to_pylist()


def arrow_column(values: list[Any], typ: pa.DataType, scale: int = 1) -> pa.Array:
    """Values the state or a key kept, as an Arrow column of `typ` (`typed` for each value);
    `scale` turns a timestamp's integers into microseconds (window bounds in keys are milliseconds)."""
    if pa.types.is_timestamp(typ):
        return pa.array([v * scale if isinstance(v, int) else v for v in values], typ)
    if pa.types.is_date(typ) or _is_binary(typ) or pa.types.is_decimal(typ):
        return pa.array([typed(v, typ) for v in values], typ)
    return pa.array(values, typ)


def _is_binary(typ: pa.DataType) -> bool:
    return pa.types.is_binary(typ) or pa.types.is_large_binary(typ) or pa.types.is_fixed_size_binary(typ)
