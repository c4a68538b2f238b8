"""The Avro <-> Arrow codec on its own: the reader's and publisher's per-record path.

No broker needed: these pin the two fast paths (a schema fastavro does not re-parse per record,
records built into Arrow column by column) to the plain, row-wise results.
"""
from __future__ import annotations

import datetime as dt
import io
import json

import fastavro
import pyarrow as pa
import pytest

from txstream.serde import AvroCodec, load_schema

NESTED = {
    "type": "record", "name": "Shipment", "fields": [
        {"name": "id", "type": "string"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "seen", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}], "default": None},
        {"name": "weight", "type": ["null", "double"], "default": None},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "to", "type": {"type": "record", "name": "Address", "fields": [
            {"name": "city", "type": "string"}, {"name": "zip", "type": ["null", "int"], "default": None}]}},
    ]}


def _records(n: int) -> list[dict]:
    base = dt.datetime(2026, 11, 22, 9, 0, tzinfo=dt.timezone.utc)
    return [{"id": f"s-{i}", "at": base + dt.timedelta(milliseconds=i),
             "seen": None if i % 3 == 0 else base + dt.timedelta(microseconds=7 * i),
             "weight": None if i % 2 else i / 4, "tags": [f"t{j}" for j in range(i % 3)],
             "to": {"city": f"c{i % 5}", "zip": None if i % 4 == 0 else 1000 + i}} for i in range(n)]


@pytest.mark.parametrize("schema_source", ["schemas/order.avsc", json.dumps(NESTED)])
def test_columnar_arrow_matches_the_row_wise_conversion(schema_source: str) -> None:
    schema = load_schema(schema_source)
    codec = AvroCodec(schema)
    if schema.get("name", "").endswith("Order"):
        records = [{"id": f"o-{i}", "customer_id": "c", "amount": i - 5.5, "currency": "EUR",
                    "created_at": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=i),
                    "items": i, "note": None if i % 2 else "n"} for i in range(50)]
    else:
        records = _records(50)
    encode = codec.encoder()
    payloads = [encode(_as_wire(codec, r)) for r in records]
    decode = codec.decoder_for_arrow()
    decoded = [decode(p) for p in payloads]

    columnar = codec.to_arrow(decoded)
    assert columnar.equals(codec._to_arrow_rowwise(decoded))
    # And back: what the publisher hands the encoder re-encodes to the same bytes.
    assert [encode(v) for v in codec.from_arrow(columnar)] == payloads
    # The logical values are fastavro's own.
    assert columnar.to_pylist() == [fastavro.schemaless_reader(io.BytesIO(p), schema, None)
                                    for p in payloads]


def _as_wire(codec: AvroCodec, record: dict) -> dict:
    """A record with its top-level timestamps as epoch integers, as the encoder takes them."""
    out = dict(record)
    for name, factor in codec._timestamps.items():
        value = out[name]
        if value is not None:
            out[name] = int(value.timestamp() * 1_000_000) // factor
    return out


def test_the_wire_schema_is_parsed_once() -> None:
    """fastavro re-parses a schema without its 'parsed' mark on every call (2-3x a record's cost)."""
    codec = AvroCodec(load_schema("schemas/order.avsc"))
    assert codec._wire is not codec.schema
    assert "__fastavro_parsed" in codec._wire


def test_a_bad_payload_still_fails_with_a_clear_error() -> None:
    codec = AvroCodec(load_schema("schemas/order.avsc"))
    decode = codec.decoder_for_arrow()
    with pytest.raises(ValueError, match="null where an Avro value is required"):
        decode(None)
    good = codec.encoder()(
        {"id": "a", "customer_id": "b", "amount": 1.0, "currency": "EUR", "created_at": 1, "items": 1, "note": None})
    with pytest.raises(ValueError, match="trailing bytes"):
        decode(good + b"\x00")
    with pytest.raises(Exception):  # noqa: B017 - fastavro raises EOFError / StopIteration variants
        decode(good[:5])
    empty = codec.to_arrow([])
    assert isinstance(empty, pa.Array) and empty.type == codec.arrow


def test_schema_registry_framing_is_checked_and_stripped() -> None:
    plain = AvroCodec(load_schema("schemas/order.avsc"))
    framed = AvroCodec(load_schema("schemas/order.avsc"), registry_schema_id=42)
    order = {"id": "a", "customer_id": "b", "amount": 1.0, "currency": "EUR", "created_at": 1, "items": 1, "note": None}
    payload = framed.encoder()(order)
    assert payload[:5] == b"\x00\x00\x00\x00\x2a" and payload[5:] == plain.encoder()(order)
    assert framed.decoder_for_arrow()(payload) == plain.decoder_for_arrow()(payload[5:])
    with pytest.raises(ValueError, match="missing schema-registry framing"):
        framed.decoder_for_arrow()(payload[5:])
