"""State keys: how a group's key (and its window) becomes the bytes a store and a changelog hold.

A windowed key starts with the window's end as 8 big-endian bytes of milliseconds (offset so that
negative times sort first), so the store's key order is the order in which the watermark closes
windows: closing them is one range scan from the start, never a scan of every key. The rest is the
group's values as compact JSON (a list: window start first for windowed keys), which sorts
equal groups together and which `txstream state show` prints as it is.
"""
from __future__ import annotations

import json
import struct
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any

_BIAS = 1 << 63   # end_ms + _BIAS fits an unsigned 64-bit integer for every signed end_ms


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return round(value.timestamp() * 1000)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "backslashreplace")
    return value


def encode_values(values: list[Any]) -> bytes:
    return json.dumps([_plain(v) for v in values], separators=(",", ":"), ensure_ascii=False).encode()


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


def decode_key(key: bytes, windowed: bool) -> tuple[list[Any], tuple[int, int] | None]:
    """(group values, (start_ms, end_ms) or None) of a key written by `encode_key`."""
    if not windowed:
        return json.loads(key), None
    (biased,) = struct.unpack(">Q", key[:8])
    start, *values = json.loads(key[8:])
    return values, (start, biased - _BIAS)
