"""Avro on the wire, Arrow in between, Spark types at the top: the three must agree exactly.

Why one module: a Spark column declared `int` over an Arrow int64 array fails deep in the JVM
("Cannot call the method getInt"), so the Spark schema, the Arrow schema and the fastavro
encoder/decoder are all derived from the same parsed Avro schema here.

Wire format is plain Avro binary. Batches cross with `decode_column` / `encode_column`: whole
columns at once (serde/columns.py) where the schema allows, fastavro's schemaless reader/writer
record by record otherwise, and fastavro has the last word on any record refused. With
`schema_registry_framing=True` values carry Confluent's 5-byte prefix (magic 0 + schema id),
which is stripped on read and written with the configured id.

Decoding is strict where fastavro and Java's DatumReader are not: a payload must end exactly where
its record ends. Bytes left over mean it was written with another schema (a newer one with more
fields, or another type altogether), and its fields were read from the wrong bytes.
"""
from __future__ import annotations

import io
import json
import operator
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txstream.errors import SchemaError
from txstream.serde import columns as avro_columns


def load_schema(path_or_json: str | dict, base_dir: str | Path | None = None) -> dict:
    """Parse an .avsc path (relative to base_dir if given) or an inline schema."""
    if isinstance(path_or_json, dict):
        raw = path_or_json
    elif path_or_json.lstrip().startswith("{"):
        raw = json.loads(path_or_json)
    else:
        path = Path(path_or_json)
        if not path.is_absolute() and base_dir is not None and not path.exists():
            path = Path(base_dir) / path
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise SchemaError(f"Avro schema file not found: {path_or_json}") from None
        except json.JSONDecodeError as exc:
            raise SchemaError(f"Avro schema {path} is not valid JSON: {exc}") from None
    try:
        return fastavro.parse_schema(raw)
    except Exception as exc:
        raise SchemaError(f"Invalid Avro schema {path_or_json if isinstance(path_or_json, str) else ''}: {exc}") from None


# ---------------------------------------------------------------------------------------------
# Avro -> Arrow / Spark types
# ---------------------------------------------------------------------------------------------

_PRIMITIVES = {
    "null": (pa.null(), "void"),
    "boolean": (pa.bool_(), "boolean"),
    "int": (pa.int32(), "int"),
    "long": (pa.int64(), "long"),
    "float": (pa.float32(), "float"),
    "double": (pa.float64(), "double"),
    "bytes": (pa.binary(), "binary"),
    "string": (pa.string(), "string"),
}


def arrow_type(schema: Any) -> pa.DataType:
    """The Arrow type that fastavro's decoded Python values of `schema` become."""
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return _PRIMITIVES[schema][0]
        raise SchemaError(f"Unsupported Avro type reference {schema!r}")
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        if len(branches) != 1:
            raise SchemaError(f"Only unions of null and one type are supported, got {schema}")
        return arrow_type(branches[0])
    kind = schema["type"]
    logical = schema.get("logicalType")
    if logical in ("timestamp-millis", "timestamp-micros"):
        return pa.timestamp("us", tz="UTC")
    if logical == "date":
        return pa.date32()
    if logical == "decimal":
        return pa.decimal128(schema["precision"], schema.get("scale", 0))
    if kind == "record":
        # Nullable like the fields of a Spark struct declared in DDL: the two must match exactly.
        return pa.struct([pa.field(f["name"], arrow_type(f["type"])) for f in schema["fields"]])
    if kind == "array":
        return pa.list_(arrow_type(schema["items"]))
    if kind == "map":
        return pa.map_(pa.string(), arrow_type(schema["values"]))
    if kind == "enum":
        return pa.string()
    if kind == "fixed":
        return pa.binary()
    if isinstance(kind, (dict, list)) or kind in _PRIMITIVES:
        return arrow_type(kind)
    raise SchemaError(f"Unsupported Avro type {kind!r}")


def _arrow_to_ddl(typ: pa.DataType) -> str:
    if pa.types.is_struct(typ):
        return "struct<" + ",".join(f"`{f.name}`:{_arrow_to_ddl(f.type)}" for f in typ) + ">"
    if pa.types.is_list(typ):
        return f"array<{_arrow_to_ddl(typ.value_type)}>"
    if pa.types.is_map(typ):
        return f"map<{_arrow_to_ddl(typ.key_type)},{_arrow_to_ddl(typ.item_type)}>"
    if pa.types.is_timestamp(typ):
        return "timestamp"
    if pa.types.is_date(typ):
        return "date"
    if pa.types.is_decimal(typ):
        return f"decimal({typ.precision},{typ.scale})"
    for arrow, ddl in _PRIMITIVES.values():
        if typ == arrow:
            return ddl
    raise SchemaError(f"No Spark type for Arrow {typ}")


# ---------------------------------------------------------------------------------------------
# Codecs
# ---------------------------------------------------------------------------------------------

_CONFLUENT_MAGIC = 0


_TIMESTAMP_FACTORS = {"timestamp-millis": 1000, "timestamp-micros": 1}  # to Arrow microseconds


def _timestamp_fields(schema: Any) -> dict[str, int]:
    """Top-level record fields that are Avro timestamps, with their factor to microseconds."""
    if not isinstance(schema, dict) or schema.get("type") != "record":
        return {}
    found = {}
    for field in schema["fields"]:
        typ = field["type"]
        if isinstance(typ, list):
            typ = next((b for b in typ if b != "null"), typ)
        if isinstance(typ, dict) and typ.get("logicalType") in _TIMESTAMP_FACTORS:
            found[field["name"]] = _TIMESTAMP_FACTORS[typ["logicalType"]]
    return found


def _without_timestamp_logical_types(schema: dict, names: set[str]) -> dict:
    """The same wire format, with those fields read and written as plain longs."""
    def plain(typ: Any) -> Any:
        if isinstance(typ, list):
            return [plain(b) for b in typ]
        if isinstance(typ, dict) and typ.get("logicalType") in _TIMESTAMP_FACTORS:
            return "long"
        return typ

    raw = {k: v for k, v in schema.items() if not k.startswith("__")}
    raw["fields"] = [dict(f, type=plain(f["type"])) if f["name"] in names else f for f in schema["fields"]]
    # Parsed normally, so it carries fastavro's "parsed" mark: without it schemaless_reader and
    # schemaless_writer parse the schema again on every call, which costs more than the record.
    return fastavro.parse_schema(raw)


def trailing_bytes_message(left: int) -> str:
    """Why a payload that goes on after its record ends is refused (both decode paths say this)."""
    return f"{left} byte{'s' if left != 1 else ''} left after the record ends (written with another schema?)"


def _describe(exc: BaseException) -> str:
    """A decode error for a dead letter's header, without fastavro's buffer address."""
    return f"{type(exc).__name__}: {_BUFFER_REPR.sub('', str(exc))}"


_BUFFER_REPR = re.compile(r" from <_io\.BytesIO object at 0x[0-9a-f]+>")


@dataclass
class AvroCodec:
    """Encode/decode one side (key or value) of a topic's records with one Avro schema.

    Timestamps are the expensive part of the per-record path: fastavro turns them into
    timezone-aware datetimes and Arrow turns those back into integers. So top-level timestamp
    fields cross as plain epoch integers and are converted column-wise in Arrow instead.

    `lenient_trailing_bytes`: by default a payload with bytes after the end of its record is not
    a value of this schema (it was written with another one) and is a decode error naming how
    many bytes were left, so the reader dead-letters it. True reads such a payload's leading
    record and ignores the rest, as fastavro and Java's DatumReader do: only for producers known
    to append bytes on purpose. Both decode paths (columnar and fastavro) follow the option.
    """

    schema: dict
    registry_schema_id: int | None = None  # Confluent wire framing when set
    lenient_trailing_bytes: bool = False

    def __post_init__(self) -> None:
        self._timestamps = _timestamp_fields(self.schema)
        self._wire = (_without_timestamp_logical_types(self.schema, set(self._timestamps))
                      if self._timestamps else self.schema)
        self.arrow = arrow_type(self.schema)
        self._decode_logical = self._decoder(self.schema)
        self._decode_wire = self._decoder(self._wire)
        # Whole batches at once with numpy where the schema allows (serde/columns.py), else fastavro.
        fields = avro_columns.fields_of(self.schema, self.arrow)
        self._framing = (struct.pack(">bI", _CONFLUENT_MAGIC, self.registry_schema_id)
                         if self.registry_schema_id is not None else b"")
        self._columnar_decoder = (avro_columns.ColumnarDecoder(fields, self.arrow, bool(self._framing),
                                                               strict=not self.lenient_trailing_bytes)
                                  if fields else None)
        self._columnar_encoder = avro_columns.ColumnarEncoder(fields, self._framing) if fields else None

    @property
    def wire_schema(self) -> dict:
        """The schema values cross `decoder_for_arrow` in (top-level timestamps as longs)."""
        return self._wire

    def decode(self, payload: bytes) -> Any:
        """The Python value, with logical types (timestamps as datetimes)."""
        return self._decode_logical(payload)

    def decoder_for_arrow(self):
        """The reader's per-record call: values for `to_arrow` (timestamps as epoch integers)."""
        return self._decode_wire

    def _decoder(self, schema: dict):
        """One decode function per schema, built once, with everything it needs bound locally."""
        read, new_buffer = fastavro.schemaless_reader, io.BytesIO
        framed = self.registry_schema_id is not None
        strict = not self.lenient_trailing_bytes

        def decode(payload: bytes) -> Any:
            if payload is None:
                raise ValueError("null where an Avro value is required")
            if framed:
                if len(payload) < 5 or payload[0] != _CONFLUENT_MAGIC:
                    raise ValueError("missing schema-registry framing (magic byte 0 + schema id)")
                payload = payload[5:]
            buf = new_buffer(payload)
            record = read(buf, schema, None)
            if strict and buf.tell() != len(payload):
                raise ValueError(trailing_bytes_message(len(payload) - buf.tell()))
            return record

        return decode

    def decode_column(self, payloads: list, nullable: bool = False) -> tuple[pa.Array, dict[int, str]]:
        """A batch of payloads as one Arrow column, and {row: error} for the rows that are not
        valid Avro of this schema. Those rows hold nulls or garbage: the caller drops them.
        With `nullable` (keys), a None payload is a null value, not an error."""
        if not payloads:
            return self.to_arrow([]), {}
        columnar = self._columnar_decoder
        if columnar is not None and not (nullable and None in payloads):
            try:
                array, bad, culprit, unsure = columnar.decode(payloads)
            except avro_columns.UndecidedBatch:
                pass
            else:
                errors = {}
                # Invalid UTF-8 somewhere: fastavro judges every row. Otherwise only the bad
                # ones, for its words on what is wrong.
                for row in (range(len(payloads)) if unsure else np.flatnonzero(bad).tolist()):
                    try:
                        self._decode_wire(payloads[row])
                    except Exception as exc:
                        errors[row] = _describe(exc)
                    else:
                        if bad[row]:
                            where = columnar.fields[culprit[row]].name if culprit[row] < len(columnar.fields) else "?"
                            errors[row] = f"ValueError: field `{where}` holds a value its Avro type does not allow"
                return array, errors
        decode, values, errors = self._decode_wire, [], {}
        for row, payload in enumerate(payloads):
            if payload is None and nullable:
                values.append(None)
                continue
            try:
                values.append(decode(payload))
            except Exception as exc:
                errors[row] = _describe(exc)
                values.append(None)
        try:
            return self.to_arrow(values), errors
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            pass
        # A value fastavro reads but Arrow cannot hold (an int beyond 32 bits): find its rows.
        for row, value in enumerate(values):
            if value is not None:
                try:
                    self.to_arrow([value])
                except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
                    errors[row] = f"ValueError: the value does not fit its Avro type: {exc}"
                    values[row] = None
        return self.to_arrow(values), errors

    def encode_column(self, column: pa.Array) -> list:
        """Payloads (None for a null value) of an Arrow struct column."""
        if self._columnar_encoder is not None:
            payloads = self._columnar_encoder.encode(column)
            if payloads is not None:
                return payloads
        encode = self.encoder()
        return [encode(v) if v is not None else None for v in self.from_arrow(column)]

    def to_arrow(self, decoded: list) -> pa.Array:
        """Arrow array of the values `decoder_for_arrow()` returns.

        A record is built column by column (one list per field, one `pa.array` each): Arrow's
        conversion of a list of dicts into a struct array costs several times more per record."""
        if not pa.types.is_struct(self.arrow) or not decoded or any(d is None for d in decoded):
            return self._to_arrow_rowwise(decoded)
        fields = list(self.arrow)
        if len(fields) == 1:
            columns = [[d[fields[0].name] for d in decoded]]
        else:
            columns = list(zip(*map(operator.itemgetter(*[f.name for f in fields]), decoded), strict=False))
        children = []
        for f, values in zip(fields, columns, strict=False):
            factor = self._timestamps.get(f.name)
            if factor is not None:
                children.append(pc.multiply(pa.array(values, pa.int64()), factor).cast(f.type))
            else:
                children.append(pa.array(values, f.type))
        return pa.StructArray.from_arrays(children, fields=fields)

    def _to_arrow_rowwise(self, decoded: list) -> pa.Array:
        if not self._timestamps:
            return pa.array(decoded, self.arrow)
        wire_type = pa.struct([pa.field(f.name, pa.int64() if f.name in self._timestamps else f.type)
                               for f in self.arrow])
        raw = pa.array(decoded, wire_type)
        children = []
        for i, f in enumerate(self.arrow):
            child = raw.field(i)
            if f.name in self._timestamps:
                child = pc.multiply(child, self._timestamps[f.name]).cast(f.type)
            children.append(child)
        return pa.StructArray.from_arrays(children, fields=list(self.arrow), mask=raw.is_null())

    def from_arrow(self, column: pa.Array) -> list:
        """Python values for `encoder()` from an Arrow struct column (timestamps as integers)."""
        if not self._timestamps or not pa.types.is_struct(column.type):
            return column.to_pylist()
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        names = [column.type.field(i).name for i in range(column.type.num_fields)]
        children = []
        for i, name in enumerate(names):
            child = column.field(i)
            if name in self._timestamps and pa.types.is_timestamp(child.type):
                child = pc.divide(child.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()), self._timestamps[name])
            children.append(child)
        return pa.StructArray.from_arrays(children, names=names, mask=column.is_null()).to_pylist()

    def encoder(self):
        """A function value -> bytes, reusing one buffer (the hot path of publishing)."""
        schema = self._wire
        writer = fastavro.schemaless_writer
        prefix = self._framing
        buf = io.BytesIO()

        def encode(value: Any) -> bytes:
            buf.seek(0)
            buf.truncate()
            writer(buf, schema, value)
            return prefix + buf.getvalue()

        return encode


def check_struct_fits(spark_struct, schema: dict, what: str) -> None:
    """Refuse, naming the field, a DataFrame struct that cannot be encoded with `schema`.

    `spark_struct` is a pyspark StructType. Missing required fields, unknown fields and
    incompatible types are errors; nullable columns for non-null Avro fields are allowed
    (Spark marks computed columns nullable) and fail per record if a null shows up.
    """
    from pyspark.sql import types as T

    def compatible(spark_type, avro) -> str | None:
        expected = arrow_type(avro)
        if pa.types.is_struct(expected):
            if not isinstance(spark_type, T.StructType):
                return f"is {spark_type.simpleString()}, the schema wants a record"
            return None
        wanted = _arrow_to_ddl(expected)
        got = {"bigint": "long", "smallint": "short", "tinyint": "byte"}.get(
            spark_type.simpleString(), spark_type.simpleString())
        lenient = {("int", "long"), ("long", "int"), ("float", "double"), ("double", "float"),
                   ("string", "binary"), ("binary", "string"), ("int", "short"), ("int", "byte"),
                   ("long", "short"), ("long", "byte")}
        if got == wanted or (wanted, got) in lenient:
            return None
        if wanted == "timestamp" and got in ("timestamp", "timestamp_ntz"):
            return None
        return f"is {got}, the schema wants {wanted}"

    def walk(struct_type, record: dict, path: str) -> None:
        columns = {f.name: f for f in struct_type.fields}
        for field in record["fields"]:
            name = field["name"]
            full = f"{path}.{name}"
            if name not in columns:
                if "default" in field:
                    continue
                raise SchemaError(f"{what}: field `{full}` is required by the Avro schema "
                                  f"{record.get('name', '')} but the DataFrame has no such column "
                                  f"(it has: {', '.join(columns) or 'nothing'})")
            problem = compatible(columns[name].dataType, field["type"])
            if problem:
                raise SchemaError(f"{what}: field `{full}` {problem}")
            sub = field["type"]
            if isinstance(sub, list):
                sub = next(b for b in sub if b != "null")
            if isinstance(sub, dict) and sub.get("type") == "record":
                walk(columns[name].dataType, sub, full)
        known = {f["name"] for f in record["fields"]}
        extra = [c for c in columns if c not in known]
        if extra:
            raise SchemaError(f"{what}: column(s) {', '.join(f'`{path}.{c}`' for c in extra)} are not "
                              f"in the Avro schema {record.get('name', '')}")

    if schema.get("type") != "record":
        return
    if not isinstance(spark_struct, T.StructType):
        raise SchemaError(f"{what}: is {spark_struct.simpleString()}, the Avro schema wants a record")
    walk(spark_struct, schema, "value" if "value" in what else "key")
