"""Columnar Avro: a whole batch of records to Arrow and back with numpy, not a dict per record.

fastavro builds a Python dict per record each way, which Arrow then takes apart again. Here each
field is one numpy pass over the whole batch (all varints of a field at once, all short strings
gathered at once, long ones a slice per row), an order of magnitude less Python per record.

It covers records whose fields are primitives, timestamps, dates and `[null, T]` unions of those,
the shape of most event schemas. For any other schema, and for any batch it cannot vouch for
(invalid UTF-8, a column of an unexpected Arrow type, nulls where the schema has none), the caller
goes back to fastavro, so the bytes written and the errors reported stay fastavro's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_KINDS = ("boolean", "int", "long", "float", "double", "string", "bytes")
_LOGICAL = {"timestamp-millis": "long", "timestamp-micros": "long", "date": "int"}
_TS_FACTOR = {"timestamp-millis": 1000, "timestamp-micros": 1}  # to Arrow microseconds
_INT32_MIN, _INT32_MAX = -(2 ** 31), 2 ** 31 - 1

_K = np.arange(10)
_SHIFTS = (7 * _K).astype(np.uint64)
_PAD = bytes(16)  # a varint or a double may be read past a record's end; its row is then bad
# Strings and bytes move by one numpy index per byte while they are short, and by one slice per
# row once a batch's average is this long: the index's cost grows with the bytes (three int64
# arrays of their length), a slice's is a fixed bit of Python per row; they break even near 100 B.
_SLICED_FROM = 128


@dataclass(frozen=True)
class _Field:
    name: str
    kind: str               # one of _KINDS: how the bytes look
    logical: str | None     # timestamp-millis / timestamp-micros / date
    null_branch: int | None  # index of "null" in a [null, T] union; None when not a union
    arrow: pa.DataType


def fields_of(schema: Any, arrow: pa.DataType) -> list[_Field] | None:
    """The record's fields when every one is covered here, else None (use fastavro)."""
    if not isinstance(schema, dict) or schema.get("type") != "record" or not pa.types.is_struct(arrow):
        return None
    fields = []
    for field, arrow_field in zip(schema["fields"], arrow, strict=False):
        typ, null_branch = field["type"], None
        if isinstance(typ, list):
            if len(typ) != 2 or "null" not in typ:
                return None
            null_branch = typ.index("null")
            typ = typ[1 - null_branch]
        logical = None
        if isinstance(typ, dict):
            logical = typ.get("logicalType")
            if logical is not None and _LOGICAL.get(logical) != typ.get("type"):
                return None  # decimal, uuid, time-*, or a logical type on the wrong base type
            typ = typ.get("type")
        if typ not in _KINDS:
            return None  # arrays, maps, enums, fixed, nested records, named references
        fields.append(_Field(field["name"], typ, logical, null_branch, arrow_field.type))
    return fields


# ---------------------------------------------------------------------------------------------
# Decoding: payloads -> Arrow struct
# ---------------------------------------------------------------------------------------------

class UndecidedBatch(Exception):
    """The batch is beyond what a columnar decode handles (over 2 GiB of strings)."""


def _read_varints(buf: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Zig-zag varints at `pos`: (values, byte counts, malformed).

    Byte k is read only for the rows whose byte k-1 said "more": a batch of small numbers
    costs one pass, a batch of timestamps six."""
    first = buf[pos]
    raw = (first & 0x7F).astype(np.uint64)
    nbytes = np.ones(len(pos), np.int64)
    rows = np.flatnonzero(first >= 0x80)
    k = 1
    while rows.size and k < 10:
        byte = buf[pos[rows] + k]
        raw[rows] |= (byte & 0x7F).astype(np.uint64) << np.uint64(7 * k)
        nbytes[rows] += 1
        rows = rows[byte >= 0x80]
        k += 1
    malformed = np.zeros(len(pos), bool)
    malformed[rows] = True
    values = (raw >> np.uint64(1)).astype(np.int64) ^ -(raw & np.uint64(1)).astype(np.int64)
    return values, nbytes, malformed


def _validity(present: np.ndarray | None) -> pa.Buffer | None:
    if present is None or present.all():
        return None
    return pa.py_buffer(np.packbits(present, bitorder="little"))


class ColumnarDecoder:
    """Decodes plain Avro payloads of one record schema into an Arrow struct array.

    `strict`: a payload that goes on after its record ends is bad (AvroCodec's
    lenient_trailing_bytes turns this off)."""

    def __init__(self, fields: list[_Field], arrow: pa.DataType, framed: bool = False,
                 strict: bool = True) -> None:
        self.fields, self.arrow, self.framed, self.strict = fields, arrow, framed, strict

    def decode(self, payloads: list) -> tuple[pa.StructArray, np.ndarray, np.ndarray, bool]:
        """(struct array, bad rows, index of the field that made each bad row bad or -1, unsure).

        Bad rows (malformed bytes, a value outside its Avro type, bytes left after the record
        when strict: culprit len(fields)) hold garbage in the array:
        the caller drops them. None payloads are bad. `unsure`: some string is not valid UTF-8
        and only a row-by-row decode can tell which rows are good."""
        n = len(payloads)
        if None in payloads:
            missing = np.fromiter((p is None for p in payloads), bool, n)
            payloads = [b"" if p is None else p for p in payloads]
        else:
            missing = np.zeros(n, bool)
        lengths = np.fromiter(map(len, payloads), np.int64, n)
        ends = np.cumsum(lengths)
        pos = ends - lengths
        buf = np.frombuffer(b"".join([*payloads, _PAD]), np.uint8)   # one copy, not two
        bad = missing.copy()
        culprit = np.full(n, -1, np.int64)
        if self.framed:  # Confluent framing: magic byte 0 and a 4-byte schema id, skipped
            bad |= (lengths < 5) | (buf[pos] != 0)
            pos = np.minimum(pos + 5, ends)

        def fail(rows: np.ndarray, index: int) -> None:
            nonlocal bad
            culprit[rows & ~bad] = index
            bad = bad | rows

        children, unsure = [], False
        for index, field in enumerate(self.fields):
            present = None
            if field.null_branch is not None:
                branch, nbytes, malformed = _read_varints(buf, pos)
                fail(malformed | (branch < 0) | (branch > 1) | (pos + nbytes > ends), index)
                pos = np.minimum(pos + nbytes, ends)
                present = branch != field.null_branch
            step, array = self._decode_field(field, buf, pos, ends, present, lambda rows, i=index: fail(rows, i))
            pos = np.minimum(pos + step, ends) if present is None else np.minimum(pos + np.where(present, step, 0), ends)
            children.append(array)
            if pa.types.is_string(field.arrow) and not unsure:
                try:
                    array.validate(full=True)
                except pa.ArrowInvalid:
                    unsure = True
        if self.strict:  # one comparison for the whole batch: every row ends where its record does
            left = pos != ends
            bad |= left
            culprit[left & (culprit < 0)] = len(self.fields)
        struct = pa.StructArray.from_arrays(children, fields=list(self.arrow))
        return struct, bad, culprit, unsure

    @staticmethod
    def _decode_field(field: _Field, buf: np.ndarray, pos: np.ndarray, ends: np.ndarray,
                      present: np.ndarray | None, fail: Any) -> tuple[np.ndarray | int, pa.Array]:
        """(bytes each row takes, the Arrow column) for one field at `pos`."""
        n = len(pos)
        live = present if present is not None else np.ones(n, bool)
        validity = _validity(present)
        kind = field.kind
        if kind in ("int", "long"):
            values, nbytes, malformed = _read_varints(buf, pos)
            wrong = malformed | (pos + nbytes > ends)
            if kind == "int":
                wrong |= (values < _INT32_MIN) | (values > _INT32_MAX)
            fail(wrong & live)
            if field.logical in _TS_FACTOR:
                values = values * _TS_FACTOR[field.logical]
            elif kind == "int":
                values = values.astype(np.int32)
            return nbytes, pa.Array.from_buffers(field.arrow, n, [validity, pa.py_buffer(values)])
        if kind in ("float", "double"):
            width = 4 if kind == "float" else 8
            raw = np.ascontiguousarray(buf[pos[:, None] + _K[:width]])
            fail((pos + width > ends) & live)
            values = raw.view("<f4" if width == 4 else "<f8").reshape(n)
            return width, pa.Array.from_buffers(field.arrow, n, [validity, pa.py_buffer(values)])
        if kind == "boolean":
            raw = buf[pos]
            fail(((raw > 1) | (pos + 1 > ends)) & live)
            bits = pa.py_buffer(np.packbits(raw.astype(bool), bitorder="little"))
            return 1, pa.Array.from_buffers(field.arrow, n, [validity, bits])
        # string / bytes: a length, then that many bytes
        size, nbytes, malformed = _read_varints(buf, pos)
        start = pos + nbytes
        wrong = (malformed | (size < 0) | (size > ends - start)) & live
        fail(wrong)
        size = np.where(live & ~wrong, size, 0)
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(size, out=offsets[1:])
        total = int(offsets[-1])
        if total >= 2 ** 31:
            raise UndecidedBatch("more than 2 GiB of strings in one batch")
        if total >= _SLICED_FROM * n:
            view = memoryview(buf)
            data = b"".join([view[a:b] for a, b in zip(start.tolist(), (start + size).tolist(), strict=True)])
        else:
            data = buf[np.repeat(start - offsets[:-1], size) + np.arange(total)]
        array = pa.Array.from_buffers(field.arrow, n, [validity, pa.py_buffer(offsets.astype(np.int32)),
                                                       pa.py_buffer(data)])
        return nbytes + size, array


# ---------------------------------------------------------------------------------------------
# Encoding: Arrow struct -> payloads
# ---------------------------------------------------------------------------------------------

def _varint_piece(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Zig-zag varints of int64 `values`: (bytes per row, the bytes in row order)."""
    values = values.astype(np.int64, copy=False)
    zigzag = ((values << 1) ^ (values >> 63)).view(np.uint64)
    nbytes = np.ones(len(values), np.int64)
    rest = zigzag >> np.uint64(7)
    while rest.any():
        nbytes += rest != 0
        rest >>= np.uint64(7)
    width = int(nbytes.max()) if len(values) else 1
    k = _K[:width]
    groups = (zigzag[:, None] >> _SHIFTS[:width]) & np.uint64(0x7F)
    groups |= (k[None, :] < (nbytes[:, None] - 1)).astype(np.uint64) << np.uint64(7)
    return nbytes, groups.astype(np.uint8)[k[None, :] < nbytes[:, None]]


def _integers(column: pa.Array) -> np.ndarray | None:
    if not pa.types.is_integer(column.type) or pa.types.is_uint64(column.type):
        return None
    return column.cast(pa.int64()).to_numpy(zero_copy_only=False)


class ColumnarEncoder:
    """Encodes an Arrow struct column into plain Avro payloads of one record schema."""

    def __init__(self, fields: list[_Field], framing: bytes = b"") -> None:
        self.fields, self.framing = fields, framing
        self._names = [f.name for f in fields]

    def encode(self, column: pa.Array) -> list[bytes] | None:
        """The payloads, or None when this column needs fastavro (to encode it or to refuse it)."""
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        if not pa.types.is_struct(column.type) or column.null_count:
            return None
        if sorted(column.type.field(i).name for i in range(column.type.num_fields)) != sorted(self._names):
            return None
        n = len(column)
        if n == 0:
            return []
        children = dict(zip((column.type.field(i).name for i in range(column.type.num_fields)), column.flatten(), strict=False))
        pieces: list[tuple[np.ndarray | int, np.ndarray]] = []
        if self.framing:
            pieces.append((len(self.framing), np.tile(np.frombuffer(self.framing, np.uint8), n)))
        for field in self.fields:
            child = children[field.name]
            present = None
            if child.null_count:
                if field.null_branch is None:
                    return None  # fastavro names the field that may not be null
                present = child.is_valid().to_numpy(zero_copy_only=False)
                pieces.append(_varint_piece(np.where(present, 1 - field.null_branch, field.null_branch)))
            elif field.null_branch is not None:
                pieces.append((1, np.full(n, 2 * (1 - field.null_branch), np.uint8)))
            piece = self._field_piece(field, child, n)
            if piece is None:
                return None
            if present is not None:
                piece = _only(piece, present, n)
            pieces.extend(piece)
        return _assemble(pieces, n)

    @staticmethod
    def _field_piece(field: _Field, child: pa.Array, n: int) -> list | None:
        typ, kind = child.type, field.kind
        if field.logical in _TS_FACTOR:
            if not pa.types.is_timestamp(typ):
                return None
            micros = child.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
            values = pc.divide(micros.fill_null(0), _TS_FACTOR[field.logical])  # as the row-wise path
            return [_varint_piece(values.to_numpy(zero_copy_only=False))]
        if field.logical == "date":
            if not pa.types.is_date32(typ):
                return None
            return [_varint_piece(child.cast(pa.int32()).fill_null(0).to_numpy(zero_copy_only=False))]
        if kind in ("int", "long"):
            values = _integers(child.fill_null(0))
            if values is None or (kind == "int" and len(values) and
                                  (values.min() < _INT32_MIN or values.max() > _INT32_MAX)):
                return None
            return [_varint_piece(values)]
        if kind == "double" and (pa.types.is_float64(typ) or pa.types.is_float32(typ)):
            values = child.cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False)
            return [(8, values.astype("<f8").view(np.uint8))]
        if kind == "float" and pa.types.is_float32(typ):
            values = child.fill_null(0.0).to_numpy(zero_copy_only=False)
            return [(4, values.astype("<f4").view(np.uint8))]
        if kind == "boolean" and pa.types.is_boolean(typ):
            return [(1, child.fill_null(False).to_numpy(zero_copy_only=False).astype(np.uint8))]
        wanted = pa.types.is_string(typ) if kind == "string" else pa.types.is_binary(typ)
        if kind in ("string", "bytes") and wanted:
            filled = child.fill_null("" if kind == "string" else b"")
            _validity_buf, offset_buf, data_buf = filled.buffers()
            offsets = np.frombuffer(offset_buf, np.int32)[filled.offset:filled.offset + n + 1].astype(np.int64)
            sizes = np.diff(offsets)
            data = (np.frombuffer(data_buf, np.uint8)[offsets[0]:offsets[-1]] if data_buf is not None
                    else np.zeros(0, np.uint8))
            return [_varint_piece(sizes), (sizes, data)]
        return None


def _only(piece: list, present: np.ndarray, n: int) -> list:
    """The same pieces with nothing written for the rows where the union holds null."""
    out = []
    for sizes, data in piece:
        if isinstance(sizes, int):
            out.append((np.where(present, sizes, 0), data.reshape(n, sizes)[present].ravel()))
        else:
            keep = np.repeat(present, sizes)
            out.append((np.where(present, sizes, 0), data[keep]))
    return out


def _assemble(pieces: list, n: int) -> list[bytes]:
    """Interleave per-field pieces into one payload per row (row i = piece 0 of i, piece 1 of i...)."""
    row_sizes = np.zeros(n, np.int64)
    for sizes, _data in pieces:
        row_sizes += sizes
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(row_sizes, out=offsets[1:])
    out = np.empty(int(offsets[-1]), np.uint8)
    cursor = offsets[:-1].copy()
    for sizes, data in pieces:
        if isinstance(sizes, (int, np.integer)):
            out[(cursor[:, None] + np.arange(sizes)).ravel()] = data
            cursor += sizes
        elif len(data) >= _SLICED_FROM * n:
            out_view, data_view, taken = memoryview(out), memoryview(data), 0
            for at, size in zip(cursor.tolist(), sizes.tolist(), strict=True):
                out_view[at:at + size] = data_view[taken:taken + size]
                taken += size
            cursor += sizes
        else:
            before = np.zeros(n, np.int64)
            np.cumsum(sizes[:-1], out=before[1:])
            out[np.repeat(cursor - before, sizes) + np.arange(int(sizes.sum()))] = data
            cursor += sizes
    if offsets[-1] >= 2 ** 31:
        return [out[a:b].tobytes() for a, b in zip(offsets[:-1], offsets[1:], strict=False)]
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets.astype(np.int32)),
                                                  pa.py_buffer(out)]).to_pylist()
