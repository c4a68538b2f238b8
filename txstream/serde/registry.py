"""Avro behind a schema registry: Confluent's framing (magic byte 0 + a 4-byte schema id), the
writer schema fetched by id, resolved against the reader's (docs/schemas.md).

Decoding stays columnar: a batch is grouped by schema id (numpy over the first 5 bytes), each
group decoded by one decoder for (writer id, reader) and the groups put back in their order.
Writer == reader (by Avro's parsing canonical form) is AvroCodec's columnar decoder as is; a
writer whose fields differ only by fields added (with a default) or removed is the columnar
decode of the writer's fields projected onto the reader's; anything else is fastavro's
schemaless_reader with both schemas, record by record.

What can go wrong, by kind: an id the registry does not know, or a writer schema that cannot be
resolved to the reader's, is the record's fault (a dead letter naming the id and the subject); a
registry that does not answer is the machinery's (SchemaRegistryUnreachable: retried, never a
dead letter). confluent_kafka.schema_registry is imported only where a registry is used: every
Spark Python worker imports this module's callers.
"""
from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
from fastavro.schema import to_parsing_canonical_form

from txstream.errors import SchemaError, SchemaRegistryRefused, SchemaRegistryUnreachable, SettingsError
from txstream.kafka.config import redacted
from txstream.serde import columns as avro_columns
from txstream.serde.avro import (
    AvroCodec,
    _describe,
    _timestamp_fields,
    _without_timestamp_logical_types,
    arrow_type,
    load_schema,
    trailing_bytes_message,
)

SUBJECT_STRATEGIES = {"topic": "TopicNameStrategy", "record": "RecordNameStrategy",
                      "topic-record": "TopicRecordNameStrategy"}
_NO_FRAMING, _NULL = -1, -2   # pseudo ids: a payload without Confluent's framing, a None payload


@dataclass(frozen=True, repr=False)
class RegistryConfig:
    """Where the registry is and how the run uses it; plain values, shipped in the task specs.

    `properties`: SchemaRegistryClient's own (basic.auth.user.info, ssl.*, bearer.auth.*, ...)."""

    url: str
    properties: tuple[tuple[str, str], ...] = ()
    strategy: str = "topic"               # SUBJECT_STRATEGIES
    auto_register: bool = True            # the output schema registered at start if it is new
    use_latest_version: bool = False      # publish with the output subject's latest version

    def __post_init__(self) -> None:
        if self.strategy not in SUBJECT_STRATEGIES:
            raise SchemaError(f"subject name strategy must be one of {', '.join(SUBJECT_STRATEGIES)}, "
                              f"got {self.strategy!r}")

    def __repr__(self) -> str:
        return (f"RegistryConfig({self.url!r}, properties={redacted(dict(self.properties))}, strategy={self.strategy!r}, "
                f"auto_register={self.auto_register}, use_latest_version={self.use_latest_version})")

    def client_config(self) -> dict[str, Any]:
        """SchemaRegistryClient's configuration (numbers as numbers: it refuses "3" for max.retries)."""
        return {"url": self.url, **{k: _number(v) for k, v in self.properties}}


def _number(value: str) -> Any:
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


# What `client` imports lazily (most runs have no registry): a registry run's workers import it up front.
CLIENT_MODULES = ("confluent_kafka.schema_registry",)

_CLIENTS: dict[tuple, Any] = {}   # per process: one client (and its schema cache) per configuration


def client(config: RegistryConfig) -> Any:
    """The process's SchemaRegistryClient of `config` (a `mock://` URL: confluent-kafka's mock)."""
    key = (config.url, config.properties)
    found = _CLIENTS.get(key)
    if found is None:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        try:
            found = _CLIENTS[key] = SchemaRegistryClient.new_client(config.client_config())
        except ValueError as exc:   # a property it does not know, or a bad value: the user's settings
            raise SettingsError(f"schema registry client properties: {exc}") from None
    return found


def subject_name(config: RegistryConfig, topic: str, is_key: bool, record_name: str | None) -> str:
    """The subject a topic's keys or values are registered under, by confluent-kafka's strategies."""
    from confluent_kafka.schema_registry import (
        record_subject_name_strategy,
        topic_record_subject_name_strategy,
        topic_subject_name_strategy,
    )
    from confluent_kafka.serialization import MessageField, SerializationContext

    strategy = {"topic": topic_subject_name_strategy, "record": record_subject_name_strategy,
                "topic-record": topic_record_subject_name_strategy}[config.strategy]
    if config.strategy != "topic" and not record_name:
        raise SchemaError(f"the {SUBJECT_STRATEGIES[config.strategy]} names subjects after the record: "
                          f"give the {'key' if is_key else 'value'} schema (an .avsc) for topic {topic!r}")
    context = SerializationContext(topic, MessageField.KEY if is_key else MessageField.VALUE)
    return strategy(context, record_name)


class NotFound(Exception):
    """The registry answered 404: no such id, subject or version."""


def call(config: RegistryConfig, what: str, fn: Any, *args: Any) -> Any:
    """`fn(*args)` against the registry, its failures as txstream's types: 404 -> NotFound;
    no answer, 5xx, 408, 429 -> SchemaRegistryUnreachable (retried); 401/403 and other
    refusals -> SchemaRegistryRefused, with the registry's answer."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    try:
        return fn(*args)
    except SchemaRegistryError as exc:
        status = exc.http_status_code
        if status == 404:
            raise NotFound(str(exc)) from None
        if status is None or status >= 500 or status in (408, 429) or status < 0:
            raise SchemaRegistryUnreachable(f"the schema registry at {config.url} failed {what}: {exc}") from None
        raise SchemaRegistryRefused(f"the schema registry at {config.url} refused {what}: "
                                    f"{exc.error_message} (HTTP {status}, code {exc.error_code})") from None
    except (SchemaRegistryUnreachable, SchemaRegistryRefused):
        raise
    except Exception as exc:  # httpx's transport errors (refused, reset, timeouts): no answer
        raise SchemaRegistryUnreachable(f"the schema registry at {config.url} cannot be reached ({what}): "
                                        f"{type(exc).__name__}: {exc}") from None


def latest_schema(config: RegistryConfig, subject: str) -> tuple[int, dict] | None:
    """(id, parsed schema) of the subject's latest version; None when the subject has none."""
    try:
        registered = call(config, f"the latest version of {subject}", client(config).get_latest_version, subject)
    except NotFound:
        return None
    return registered.schema_id, parse_registered(registered.schema, f"subject {subject}")


def parse_registered(schema: Any, where: str) -> dict:
    """A registered schema (confluent_kafka's Schema) parsed by fastavro."""
    if (schema.schema_type or "AVRO") != "AVRO":
        raise SchemaError(f"{where} is a {schema.schema_type} schema, not Avro")
    if schema.references:
        raise SchemaError(f"{where} has schema references, which txstream does not resolve")
    return load_schema(json.loads(schema.schema_str))


def register_output(config: RegistryConfig, subject: str, schema: dict | None) -> tuple[int, dict]:
    """The id the output is framed with, and the schema it is encoded with, decided once at
    start: the subject's latest (use_latest_version), else `schema` registered (auto_register) or
    looked up. A schema the subject's compatibility rule refuses raises SchemaRegistryRefused
    with the registry's answer."""
    from confluent_kafka.schema_registry import Schema

    if config.use_latest_version:
        found = latest_schema(config, subject)
        if found is None:
            raise SchemaRegistryRefused(f"use.latest.version: subject {subject} has no version in the "
                                        f"schema registry at {config.url}")
        return found
    if schema is None:
        raise SchemaError(f"output subject {subject}: give output_value_schema, or use the latest version")
    text = json.dumps(_plain(schema))
    registry = client(config)
    if config.auto_register:
        try:
            return call(config, f"the output schema under {subject}", registry.register_schema, subject,
                        Schema(text, "AVRO")), schema
        except NotFound as exc:
            raise SchemaRegistryRefused(f"the schema registry at {config.url} refused the output schema "
                                        f"under {subject}: {exc}") from None
    try:
        registered = call(config, f"the output schema under {subject}", registry.lookup_schema, subject,
                          Schema(text, "AVRO"))
    except NotFound:
        raise SchemaRegistryRefused(f"the output schema is not registered under {subject} in the schema registry "
                                    f"at {config.url}, and auto-registration is off (--no-auto-register)") from None
    return registered.schema_id, schema


def _plain(schema: Any) -> Any:
    """A parsed schema without fastavro's own keys (`__fastavro_parsed`, `__named_schemas`)."""
    if isinstance(schema, dict):
        return {k: _plain(v) for k, v in schema.items() if not k.startswith("__")}
    if isinstance(schema, list):
        return [_plain(v) for v in schema]
    return schema


def canonical(schema: dict) -> str:
    return to_parsing_canonical_form(schema)


# ---------------------------------------------------------------------------------------------
# Decoding, grouped by schema id
# ---------------------------------------------------------------------------------------------

def schema_ids(payloads: list) -> np.ndarray:
    """Each payload's schema id: -1 without Confluent's framing, -2 for None. The first 5 bytes
    of every payload gathered at once (one Arrow copy of the bytes, then numpy)."""
    n = len(payloads)
    array = pa.array(payloads, pa.large_binary())
    _validity, offsets_buf, data_buf = array.buffers()
    offsets = np.frombuffer(offsets_buf, np.int64)[:n + 1]
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    if not len(data):
        data = np.zeros(1, np.uint8)
    # Indices past the end are clipped: those rows are shorter than 5 bytes, so not framed anyway.
    heads = data[np.minimum(offsets[:-1, None] + np.arange(5), len(data) - 1)].astype(np.int64)
    framed = (np.diff(offsets) >= 5) & (heads[:, 0] == 0)
    ids = np.where(framed, (heads[:, 1] << 24) | (heads[:, 2] << 16) | (heads[:, 3] << 8) | heads[:, 4], _NO_FRAMING)
    if array.null_count:
        ids[np.asarray(array.is_null())] = _NULL
    return ids


class RegistryDecoder:
    """`decode_column` as AvroCodec's, for registry-framed payloads read with `reader`.

    `subjects`: the subject(s) the input's schemas are registered under, for the error messages."""

    def __init__(self, config: RegistryConfig, reader: dict, subjects: str, lenient_trailing_bytes: bool = False,
                 registry: Any = None) -> None:
        self.config, self.reader, self.subjects = config, reader, subjects
        self.lenient = lenient_trailing_bytes
        self.arrow = arrow_type(reader)
        self._registry = registry   # tests: a client of their own; else the process's
        self._reader_form = canonical(reader)
        # The cache's key: the whole schema (the canonical form drops defaults, which a projection fills in).
        self._reader_key = json.dumps(_plain(reader), sort_keys=True)

    def decode_column(self, payloads: list, nullable: bool = False) -> tuple[pa.Array, dict[int, str]]:
        n = len(payloads)
        if not n:
            return pa.array([], self.arrow), {}
        ids = schema_ids(payloads)
        first = ids[0]
        if bool((ids == first).all()):   # the usual batch: one writer schema
            return self._group(int(first), payloads, nullable)
        pieces, rows_of, errors = [], [], {}
        for schema_id in np.unique(ids).tolist():
            rows = np.flatnonzero(ids == schema_id)
            array, group_errors = self._group(schema_id, [payloads[i] for i in rows.tolist()], nullable)
            pieces.append(array)
            rows_of.append(rows)
            errors.update({int(rows[i]): message for i, message in group_errors.items()})
        order = np.empty(n, np.int64)
        order[np.concatenate(rows_of)] = np.arange(n)
        return pa.concat_arrays(pieces).take(pa.array(order)), errors

    def _group(self, schema_id: int, payloads: list, nullable: bool) -> tuple[pa.Array, dict[int, str]]:
        n = len(payloads)
        if schema_id == _NULL:
            if nullable:
                return pa.nulls(n, self.arrow), {}
            return pa.nulls(n, self.arrow), dict.fromkeys(range(n), "ValueError: null where an Avro value is required")
        if schema_id == _NO_FRAMING:
            return pa.nulls(n, self.arrow), dict.fromkeys(
                range(n), "ValueError: missing schema-registry framing (magic byte 0 + schema id)")
        decoder = self._decoder(schema_id)
        if isinstance(decoder, str):   # the id is unknown, or its schema cannot be read as the reader's
            return pa.nulls(n, self.arrow), dict.fromkeys(range(n), decoder)
        return decoder.decode_column(payloads)   # None payloads are a group of their own (_NULL)

    def way(self, schema_id: int) -> str:
        """How a writer id is decoded: columnar, projection, resolving, or the reason it is not."""
        decoder = self._decoder(schema_id)
        if isinstance(decoder, str):
            return decoder
        return {AvroCodec: "columnar", _Projection: "projection", _Resolving: "resolving"}[type(decoder)]

    def _decoder(self, schema_id: int) -> Any:
        key = (self.config.url, self.config.properties, schema_id, self._reader_key, self.lenient)
        found = _DECODERS.get(key)
        if found is None:
            found = self._build(schema_id)
            if found is not None:
                _DECODERS[key] = found
        return found if found is not None else self._unknown(schema_id)

    def _unknown(self, schema_id: int) -> str:
        return f"SchemaRegistryError: schema id {schema_id} is not in the schema registry (subject {self.subjects})"

    def _build(self, schema_id: int) -> Any:
        """The decoder of one writer id (None: the registry does not know the id)."""
        registry = self._registry or client(self.config)
        try:
            registered = call(self.config, f"schema id {schema_id}", registry.get_schema, schema_id)
        except NotFound:
            return None
        where = f"schema id {schema_id} (subject {self.subjects})"
        try:
            writer = parse_registered(registered, where)
        except SchemaError as exc:
            return f"SchemaError: {exc}"
        if canonical(writer) == self._reader_form:
            return AvroCodec(self.reader, registry_schema_id=schema_id, lenient_trailing_bytes=self.lenient)
        problem = resolution_problem(writer, self.reader)
        if problem:
            return f"SchemaResolutionError: {where} cannot be read as the reader schema: {problem}"
        projected = _Projection.of(writer, self.reader, schema_id, self.lenient)
        return projected if projected is not None else _Resolving(writer, self.reader, where, self.lenient)


_DECODERS: dict[tuple, Any] = {}   # per process: one decoder per (registry, writer id, reader)


def resolution_problem(writer: dict, reader: dict) -> str | None:
    """Why a top-level writer record cannot be read as the reader's (Avro's resolution rules, at
    the record's level: names, reader fields without a default; deeper types are fastavro's)."""
    if not (isinstance(writer, dict) and isinstance(reader, dict)
            and writer.get("type") == "record" and reader.get("type") == "record"):
        return None
    names = {reader["name"], *(reader.get("aliases") or [])}
    if writer["name"] not in names and writer["name"].rpartition(".")[2] not in {n.rpartition(".")[2] for n in names}:
        return f"the writer's record is {writer['name']}, the reader's {reader['name']}"
    written = {f["name"] for f in writer["fields"]}
    for field in reader["fields"]:
        if field["name"] not in written and not set(field.get("aliases") or []) & written and "default" not in field:
            return f"the reader's field `{field['name']}` is not in the writer's schema and has no default"
    return None


# Promotions Avro allows that an Arrow cast carries exactly.
_PROMOTIONS = {("int", "long"), ("int", "double"), ("long", "double"), ("float", "double"), ("int", "float"),
               ("long", "float")}


class _Projection:
    """Writer and reader are flat records the columnar decoder covers, and differ only by
    fields: the writer's fields decoded columnar, then the reader's taken from them by name
    (promoted where Avro promotes), a reader field the writer lacks filled with its default."""

    def __init__(self, codec: AvroCodec, take: list, arrow: pa.DataType) -> None:
        self.codec, self.take, self.arrow = codec, take, arrow

    @classmethod
    def of(cls, writer: dict, reader: dict, schema_id: int, lenient: bool) -> _Projection | None:
        reader_codec, writer_codec = AvroCodec(reader), AvroCodec(writer, registry_schema_id=schema_id,
                                                                  lenient_trailing_bytes=lenient)
        reader_fields = avro_columns.fields_of(reader, reader_codec.arrow)
        writer_fields = avro_columns.fields_of(writer, writer_codec.arrow)
        if reader_fields is None or writer_fields is None or reader.get("aliases"):
            return None
        by_name = {f.name: (i, f) for i, f in enumerate(writer_fields)}
        take = []
        for raw, field in zip(reader["fields"], reader_fields, strict=True):
            if raw.get("aliases"):
                return None
            found = by_name.get(field.name)
            if found is None:
                default = raw.get("default")
                if field.logical is not None and default is not None:
                    return None
                take.append(("default", default, field.arrow))
                continue
            index, written = found
            if written.logical != field.logical:
                return None
            if written.null_branch is not None and field.null_branch is None:
                return None   # a null written where the reader allows none: fastavro says which record
            if written.kind != field.kind and (written.kind, field.kind) not in _PROMOTIONS:
                return None
            take.append(("field", index, field.arrow))
        return cls(writer_codec, take, reader_codec.arrow)

    def decode_column(self, payloads: list) -> tuple[pa.Array, dict[int, str]]:
        written, errors = self.codec.decode_column(payloads)
        n = len(written)
        children = []
        for what, value, arrow in self.take:
            if what == "default":
                children.append(pa.nulls(n, arrow) if value is None else pa.array([value] * n, arrow))
            else:
                child = written.field(value)
                # Unchecked: Avro's long -> float promotion may round, as Java's reader does.
                children.append(child if child.type == arrow else child.cast(arrow, safe=False))
        return pa.StructArray.from_arrays(children, fields=list(self.arrow), mask=written.is_null()), errors


class _Resolving:
    """fastavro's schemaless_reader with the writer's and the reader's schemas, record by record
    (nested records, arrays, maps, enums, renames: what _Projection leaves)."""

    def __init__(self, writer: dict, reader: dict, where: str, lenient: bool) -> None:
        self.reader_codec = AvroCodec(reader)
        stamps = set(_timestamp_fields(writer))
        # Top-level timestamps cross as integers (AvroCodec): the writer's too, so they resolve.
        self.writer = _without_timestamp_logical_types(writer, stamps) if stamps else writer
        self.reader = self.reader_codec.wire_schema
        self.where, self.strict = where, not lenient

    def decode_column(self, payloads: list) -> tuple[pa.Array, dict[int, str]]:
        read, writer, reader = fastavro.schemaless_reader, self.writer, self.reader
        values, errors = [], {}
        for row, payload in enumerate(payloads):
            try:
                body = payload[5:]
                buf = io.BytesIO(body)
                value = read(buf, writer, reader)
                if self.strict and buf.tell() != len(body):
                    raise ValueError(trailing_bytes_message(len(body) - buf.tell()))
                values.append(value)
            except Exception as exc:
                errors[row] = f"{self.where}: {_describe(exc)}"
                values.append(None)
        good = [v for v in values if v is not None]
        if len(good) == len(values):
            return self.reader_codec.to_arrow(values), errors
        array = self.reader_codec.to_arrow(good) if good else pa.nulls(0, self.reader_codec.arrow)
        order = np.full(len(values), -1, np.int64)
        order[[i for i, v in enumerate(values) if v is not None]] = np.arange(len(good))
        return array.take(pa.array(order, mask=order < 0)), errors


def subjects_of(config: RegistryConfig, topics: list[str], is_key: bool, reader: dict | None) -> str:
    """The input's subject(s), for a dead letter's error: the reader's record name stands in for
    the writer's under the record strategies."""
    record = reader.get("name") if isinstance(reader, dict) else None
    try:
        return ", ".join(subject_name(config, t, is_key, record) for t in topics) or "?"
    except SchemaError:
        return "?"


class RecordReader:
    """One framed payload at a time, to Python values (`txstream consume`): the writer's schema by
    its id (fetched once per id), resolved to `reader` when given."""

    def __init__(self, config: RegistryConfig, reader: dict | None = None) -> None:
        self.config, self.reader = config, reader
        self._writers: dict[int, dict] = {}

    def read(self, payload: bytes) -> tuple[int, Any]:
        """(schema id, value); a ValueError for a payload that cannot be read (naming the id)."""
        if payload is None or len(payload) < 5 or payload[0] != 0:
            raise ValueError("missing schema-registry framing (magic byte 0 + schema id)")
        schema_id = int.from_bytes(payload[1:5], "big")
        writer = self._writers.get(schema_id)
        if writer is None:
            try:
                registered = call(self.config, f"schema id {schema_id}", client(self.config).get_schema, schema_id)
            except NotFound:
                raise ValueError(f"schema id {schema_id} is not in the schema registry") from None
            writer = self._writers[schema_id] = parse_registered(registered, f"schema id {schema_id}")
        try:
            return schema_id, fastavro.schemaless_reader(io.BytesIO(payload[5:]), writer, self.reader or writer)
        except Exception as exc:
            raise ValueError(f"schema id {schema_id}: {_describe(exc)}") from None
