"""Values between Arrow columns and the state: partials as the state keeps them (JSON-able,
timestamps as epoch microseconds) and the state's values back in their column's type."""
from __future__ import annotations

import base64
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from txstream.state.keys import micros


def ms(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return round(value.timestamp() * 1000)
    return int(value)


def plain(value: Any) -> Any:
    """A partial's value as the state keeps it (JSON-able; timestamps as epoch microseconds)."""
    if isinstance(value, datetime):
        return micros(value)
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def typed(value: Any, typ: pa.DataType) -> Any:
    """A value the state or a key kept, back in its column's type."""
    if value is None:
        return None
    if pa.types.is_date(typ) and isinstance(value, str):
        return date.fromisoformat(value)
    if _is_binary(typ) and isinstance(value, dict):
        return base64.b64decode(value["b64"])   # keys.tagged_bytes
    if pa.types.is_decimal(typ):
        return Decimal(str(value))
    return value


def plain_column(column: Any) -> list[Any]:
    """A partial column's values as `plain` gives them, converted by Arrow where it can
    (timestamps to epoch microseconds, decimals to floats)."""
    typ = column.type
    if pa.types.is_timestamp(typ):
        return pc.cast(column.cast(pa.timestamp("us", typ.tz), safe=False), pa.int64()).to_pylist()
    if pa.types.is_decimal(typ):
        return pc.cast(column, pa.float64()).to_pylist()
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
