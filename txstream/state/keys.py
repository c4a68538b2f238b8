"""State keys: how a group's key (and its window) becomes the bytes a store and a changelog hold.

A windowed key starts with the window's end as 8 big-endian bytes of milliseconds (offset so that
negative times sort first), so the store's key order is the order in which the watermark closes
windows: closing them is one range scan from the start, never a scan of every key. The rest is the
group's values as compact JSON (a list: window start first for windowed keys), which sorts
equal groups together and which `txstream state show` prints as it is. Every value is kept
losslessly, for Spark's group of it is the value itself: bytes as {"b64": base64} (Kafka keys
need not be UTF-8, and no text can be mistaken for them), timestamps as epoch microseconds,
decimals as their text. (Window bounds stay milliseconds: window sizes and slides are whole ms.)

Deduplication and session windows keep an **expiry index** in the same store: for each key that
expires, a key `EXPIRY + expiry_ms (8 big-endian bytes, biased as a window's end) + the key`.
Their keys are JSON and never start with EXPIRY's byte, so the index sorts first, in expiry order:
what a watermark expires is one range scan up to `expiry_end(watermark)`, never a scan of every
key. Being keys of the store, index entries go to the changelog and into snapshots like any other
change, and are tombstoned with their key: a restore brings them back with no mechanism of its own.
"""
from __future__ import annotations

import base64
import json
import struct
from collections.abc import Sequence
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

_BIAS = 1 << 63   # end_ms + _BIAS fits an unsigned 64-bit integer for every signed end_ms


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)


def micros(value: datetime) -> int:
    """Epoch microseconds, exactly (Spark's TimestampType precision; float seconds lose the last digit)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return (value - _EPOCH) // _MICROSECOND


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return micros(value)   # two times a microsecond apart are two groups in Spark
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return tagged_bytes(value)
    return value


def tagged_bytes(value: bytes) -> dict[str, str]:
    """Bytes as JSON can hold them: never equal to a text, and read back as the same bytes."""
    return {"b64": base64.b64encode(value).decode("ascii")}


_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)   # json.dumps with options builds one per call
# What json.dumps(ensure_ascii=False) escapes in a string; a string without any is its JSON as it is.
_ESCAPED = r'["\\\x00-\x1f]'


def encode_values(values: list[Any]) -> bytes:
    return _JSON.encode([_plain(v) for v in values]).encode()


def _json_texts(column: Any) -> Any:
    """The JSON text of every value of an Arrow column, computed by Arrow (strings that need no
    escaping, integers: the columns a group key usually has); None when Python must write it."""
    typ = column.type
    if column.null_count:
        return None
    if pa.types.is_integer(typ):
        return pc.cast(column, pa.string())
    if pa.types.is_timestamp(typ):   # epoch microseconds, as `micros`
        return pc.cast(pc.cast(column.cast(pa.timestamp("us", typ.tz), safe=False), pa.int64()), pa.string())
    if (pa.types.is_string(typ) or pa.types.is_large_string(typ)) and not pc.any(
            pc.match_substring_regex(column, _ESCAPED)).as_py():
        return pc.binary_join_element_wise('"', column, '"', "")
    return None


def encode_keys(columns: Sequence[Any], length: int,
                windows: tuple[Sequence[int], Sequence[int]] | None = None) -> list[bytes]:
    """`encode_key` of each of `length` rows of `columns` (Arrow arrays), with the rows' windows
    ((starts, ends) in ms) when given: the same bytes, written column-wise by Arrow where it can
    (a merge encodes every key of its batch)."""
    parts = [pa.array(windows[0], pa.int64())] if windows is not None else []
    parts += list(columns)
    texts = [_json_texts(c) for c in parts]
    if parts and all(t is not None for t in texts):
        joined = pc.binary_join_element_wise("[", pc.binary_join_element_wise(*texts, ","), "]", "")
        keys = pc.cast(joined, pa.binary()).to_pylist()
    else:
        values = [c.to_pylist() for c in parts]
        keys = [encode_values(list(row)) for row in zip(*values, strict=True)] if values else [b"[]"] * length
    if windows is None:
        return keys
    prefixes: dict[int, bytes] = {}
    return [(prefixes.get(end) or prefixes.setdefault(end, window_prefix(end))) + key
            for end, key in zip(windows[1], keys, strict=True)]


def window_prefix(end_ms: int) -> bytes:
    """The first bytes of every key of windows that end at `end_ms`: scan up to
    `window_prefix(watermark + 1)` for every window the watermark closed."""
    return struct.pack(">Q", end_ms + _BIAS)


def encode_key(values: list[Any], window: tuple[int, int] | None = None) -> bytes:
    """A state key: the group's `values`, after `window` (start_ms, end_ms) when there is one."""
    if window is None:
        return encode_values(values)
    start, end = window
    return window_prefix(end) + encode_values([start, *values])


EXPIRY = b"\x00"   # the first byte of an expiry index key (the module docstring)
EXPIRY_END = b"\x01"     # every index key sorts before it, every other key after
EXPIRY_VALUE = b"\x01"   # an index key's value: not empty, which Kafka might carry as a tombstone


def expiry_key(expires_ms: int, key: bytes) -> bytes:
    """The index key that says `key` expires once the watermark reaches `expires_ms`."""
    return EXPIRY + window_prefix(expires_ms) + key


def expiry_end(watermark_ms: int) -> bytes:
    """Scan the index up to here (excluded) for every key that expires at `watermark_ms` or before."""
    return EXPIRY + window_prefix(watermark_ms + 1)


def expiring_key(index_key: bytes) -> bytes:
    """The key an index key names."""
    return index_key[len(EXPIRY) + 8:]


def is_index_key(key: bytes) -> bool:
    return key.startswith(EXPIRY)


def decode_key(key: bytes, windowed: bool) -> tuple[list[Any], tuple[int, int] | None]:
    """(group values, (start_ms, end_ms) or None) of a key written by `encode_key`."""
    if not windowed:
        return json.loads(key), None
    (biased,) = struct.unpack(">Q", key[:8])
    start, *values = json.loads(key[8:])
    return values, (start, biased - _BIAS)


def decode_keys(keys: Sequence[bytes], windowed: bool) -> tuple[list[list[Any]], tuple[list[int], list[int]] | None]:
    """`decode_key` of many keys: their group values a column per group column, and their
    windows' (starts, ends) when windowed. The keys' JSON lists are read as one JSON array: one
    call into json's C parser rather than one per key."""
    if not windowed:
        rows = json.loads(b"[" + b",".join(keys) + b"]")
        return [list(column) for column in zip(*rows, strict=True)], None
    ends = [biased - _BIAS for (biased,) in (struct.unpack_from(">Q", key) for key in keys)]
    rows = json.loads(b"[" + b",".join(key[8:] for key in keys) + b"]")
    starts = [row[0] for row in rows]
    return [list(column) for column in zip(*(row[1:] for row in rows), strict=True)], (starts, ends)
