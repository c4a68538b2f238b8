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

from txstream.serde import columns
from txstream.serde.avro import AvroCodec, load_schema, trailing_bytes_message

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
    assert columnar.equals(codec._to_arrow_rowwise(decoded))  # noqa: SLF001 - checks the codec against its own row path
    # And back: what the publisher hands the encoder re-encodes to the same bytes.
    assert [encode(v) for v in codec.from_arrow(columnar)] == payloads
    # The logical values are fastavro's own.
    assert columnar.to_pylist() == [fastavro.schemaless_reader(io.BytesIO(p), schema, None)
                                    for p in payloads]


def _as_wire(codec: AvroCodec, record: dict) -> dict:
    """A record with its top-level timestamps as epoch integers, as the encoder takes them."""
    out = dict(record)
    for name, factor in codec._timestamps.items():  # noqa: SLF001 - the codec's timestamp fields
        value = out[name]
        if value is not None:
            out[name] = int(value.timestamp() * 1_000_000) // factor
    return out


def test_the_wire_schema_is_parsed_once() -> None:
    """fastavro re-parses a schema without its 'parsed' mark on every call (2-3x a record's cost)."""
    codec = AvroCodec(load_schema("schemas/order.avsc"))
    assert codec._wire is not codec.schema  # noqa: SLF001 - the parsed wire schema is under test
    assert "__fastavro_parsed" in codec._wire  # noqa: SLF001


def test_a_bad_payload_still_fails_with_a_clear_error() -> None:
    codec = AvroCodec(load_schema("schemas/order.avsc"))
    decode = codec.decoder_for_arrow()
    with pytest.raises(ValueError, match="null where an Avro value is required"):
        decode(None)
    good = codec.encoder()(
        {"id": "a", "customer_id": "b", "amount": 1.0, "currency": "EUR", "created_at": 1, "items": 1, "note": None})
    with pytest.raises(ValueError, match="^1 byte left after the record ends"):
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


# ---------------------------------------------------------------------------------------------
# Whole batches at once (serde/columns.py): the same values and bytes as fastavro, row by row
# ---------------------------------------------------------------------------------------------

FLAT = {"type": "record", "name": "Flat", "fields": [
    {"name": "s", "type": "string"}, {"name": "b", "type": "bytes"}, {"name": "i", "type": "int"},
    {"name": "l", "type": "long"}, {"name": "f", "type": "float"}, {"name": "d", "type": "double"},
    {"name": "t", "type": "boolean"},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "tu", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "ns", "type": ["null", "string"]}, {"name": "nl", "type": ["long", "null"]},
    {"name": "nd", "type": ["null", "double"]}]}


def _flat_records(n: int, seed: int = 7, longest: int = 20) -> list[dict]:
    """`longest`: characters in the longest string (bytes: a quarter; the nullable string: 1/6)."""
    import random

    rnd = random.Random(seed)

    def a_long() -> int:
        return rnd.choice([0, 1, -1, 63, 64, -64, -65, 2 ** 63 - 1, -2 ** 63,
                           rnd.randint(-2 ** 40, 2 ** 40), rnd.randint(-300, 300)])

    return [{"s": "".join(rnd.choice("aé€😀z") for _ in range(rnd.randint(0, longest))),
             "b": bytes(rnd.randrange(256) for _ in range(rnd.randint(0, longest // 4))),
             "i": rnd.choice([0, 2 ** 31 - 1, -2 ** 31, rnd.randint(-1000, 1000)]), "l": a_long(),
             "f": rnd.choice([0.5, -1.25, 3.0e10]), "d": rnd.choice([0.1, -1e300, float("inf")]),
             "t": rnd.random() < 0.5, "ts": rnd.randint(-10 ** 12, 10 ** 13),
             "tu": None if rnd.random() < 0.3 else rnd.randint(-10 ** 15, 10 ** 16),
             "day": dt.date(2020, 1, 1) + dt.timedelta(days=rnd.randint(-1000, 1000)),
             "ns": None if rnd.random() < 0.5 else "x" * rnd.randint(0, longest // 6),
             "nl": None if rnd.random() < 0.5 else a_long(), "nd": None if rnd.random() < 0.5 else 2.5}
            for _ in range(n)]


def _flat_codec(**kwargs) -> AvroCodec:
    codec = AvroCodec(load_schema(json.dumps(FLAT)), **kwargs)
    assert codec._columnar_decoder is not None and codec._columnar_encoder is not None  # noqa: SLF001 - the columnar path is under test
    return codec


def _rowwise(codec: AvroCodec, payloads: list) -> pa.Array:
    return codec.to_arrow([codec.decoder_for_arrow()(p) for p in payloads])


@pytest.fixture(params=["indexed", "sliced"])
def strings_moved(request, monkeypatch) -> str:
    """Both ways strings and bytes move between payloads and Arrow (columns._SLICED_FROM: by
    a numpy index per byte while short on average, by a slice per row when long), whatever the
    records' lengths."""
    monkeypatch.setattr(columns, "_SLICED_FROM", 10 ** 9 if request.param == "indexed" else 0)
    return request.param


LENGTHS = pytest.mark.parametrize("longest", [20, 2400], ids=["short", "long"])


@LENGTHS
def test_a_batch_decodes_and_encodes_to_exactly_what_fastavro_gives(strings_moved, longest) -> None:
    codec = _flat_codec()
    encode = codec.encoder()
    payloads = [encode(r) for r in _flat_records(2000, longest=longest)]

    column, errors = codec.decode_column(payloads)
    assert errors == {}
    assert column.equals(_rowwise(codec, payloads))
    assert codec.encode_column(column) == payloads
    assert codec.encode_column(column.slice(7, 100)) == payloads[7:107]  # an offset into the buffers
    assert codec.encode_column(column.slice(0, 0)) == []


@LENGTHS
def test_a_batch_with_corrupt_records_loses_exactly_the_records_fastavro_refuses(strings_moved, longest) -> None:
    import math
    import random

    codec = _flat_codec()
    encode = codec.encoder()
    rnd = random.Random(3)
    payloads, appended = [], set()
    for record in _flat_records(1500, longest=longest):
        raw = bytearray(encode(record))
        roll = rnd.random()
        if roll < 0.3:
            raw = raw[:rnd.randrange(len(raw))]          # truncated
        elif roll < 0.6:
            raw[rnd.randrange(len(raw))] = rnd.randrange(256)  # one byte flipped
        elif roll < 0.8:
            raw += b"\x01"                                  # trailing bytes
            appended.add(len(payloads))
        payloads.append(bytes(raw))

    column, errors = codec.decode_column(payloads)
    refused = {}
    for row, payload in enumerate(payloads):
        try:
            codec.decoder_for_arrow()(payload)
        except Exception as exc:  # collected
            refused[row] = type(exc).__name__
    assert 100 < len(refused) < len(payloads) - 100  # the corruption hit some, not all
    # Every row fastavro refuses, in fastavro's words (without its buffer's address)...
    assert all(errors[row].startswith(refused[row] + ":") and "BytesIO" not in errors[row] for row in refused)
    # ...and rows fastavro reads although Avro forbids them: a boolean byte other than 0 and 1,
    # an int beyond 32 bits (which fastavro hands on and Arrow then cannot hold).
    assert all("holds a value its Avro type does not allow" in errors[row] for row in set(errors) - set(refused))
    # A whole record with a byte after it is refused for that byte (a flipped byte may leave some too).
    assert all(errors[row] == "ValueError: 1 byte left after the record ends (written with another schema?)"
               for row in appended)
    kept = [row for row in range(len(payloads)) if row not in errors]
    ours, theirs = column.take(pa.array(kept)), _rowwise(codec, [payloads[r] for r in kept])
    for i, field in enumerate(theirs.type):
        a, b = ours.field(i), theirs.field(i)
        # A flipped byte inside a double can make a NaN, and NaN != NaN.
        assert a.equals(b) or field.name == "d" and all(
            x == y or math.isnan(x) and math.isnan(y)
            for x, y in zip(a.to_pylist(), b.to_pylist(), strict=True)), field.name


def test_values_avro_forbids_are_refused_even_where_fastavro_reads_them() -> None:
    codec = AvroCodec(load_schema(json.dumps({"type": "record", "name": "R", "fields": [
        {"name": "flag", "type": "boolean"}, {"name": "count", "type": "int"}]})))
    payloads = [b"\x01\x02", b"\x02\x02", b"\x00\x80\x80\x80\x80\x10"]  # ok, boolean 2, int 2^31
    column, errors = codec.decode_column(payloads)
    assert set(errors) == {1, 2}
    assert "`flag`" in errors[1] and "`count`" in errors[2]
    assert column.slice(0, 1).to_pylist() == [{"flag": True, "count": 1}]


@LENGTHS
def test_invalid_utf8_falls_back_to_row_by_row_and_only_that_record_is_lost(strings_moved, longest) -> None:
    codec = _flat_codec()
    records = _flat_records(3, longest=longest)
    records[1]["s"] = "ééé"
    good = [codec.encoder()(r) for r in records]
    broken = bytearray(good[1])
    broken[broken.index(b"\xc3")] = 0xFF  # the first string is no longer UTF-8
    column, errors = codec.decode_column([good[0], bytes(broken), good[2]])
    assert list(errors) == [1] and "utf-8" in errors[1].lower(), errors
    assert column.take(pa.array([0, 2])).equals(_rowwise(codec, [good[0], good[2]]))


def test_keys_may_be_null_values_may_not() -> None:
    codec = AvroCodec(load_schema("schemas/order.avsc"))
    payload = codec.encoder()(
        {"id": "a", "customer_id": "b", "amount": 1.0, "currency": "EUR", "created_at": 1, "items": 1, "note": None})
    column, errors = codec.decode_column([payload, None], nullable=True)
    assert errors == {} and column.null_count == 1
    column, errors = codec.decode_column([payload, None])
    assert list(errors) == [1] and "null where an Avro value is required" in errors[1]


def test_framed_batches_are_checked_and_stripped_column_wise() -> None:
    framed = AvroCodec(load_schema("schemas/order.avsc"), registry_schema_id=42)
    order = {"id": "a", "customer_id": "b", "amount": 1.0, "currency": "EUR", "created_at": 1, "items": 1, "note": "n"}
    payload = framed.encoder()(order)
    column, errors = framed.decode_column([payload, payload[5:], payload])
    assert list(errors) == [1] and "missing schema-registry framing" in errors[1]
    assert framed.encode_column(column.take(pa.array([0, 2]))) == [payload, payload]


def test_columns_the_batch_encoder_cannot_vouch_for_get_fastavro_and_its_errors() -> None:
    codec = AvroCodec(load_schema("schemas/order.avsc"))
    order = {"id": "a", "customer_id": "b", "amount": 1.0, "currency": "EUR",
             "created_at": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc), "items": 1, "note": None}
    column = pa.array([order], codec.arrow)
    expected = codec.encode_column(column)
    # `items` as int64 (Spark's lenient long for an Avro int) and `amount` as float32: the same bytes.
    widened = pa.StructArray.from_arrays(
        [column.field(i).cast(pa.int64()) if f.name == "items" else column.field(i) for i, f in enumerate(column.type)],
        fields=[pa.field(f.name, pa.int64()) if f.name == "items" else f for f in column.type])
    assert codec.encode_column(widened) == expected
    # A null where the schema has none: fastavro refuses it, naming nothing silently away.
    nulled = pa.StructArray.from_arrays(
        [pa.array([None], pa.string()) if f.name == "id" else column.field(i) for i, f in enumerate(column.type)],
        fields=list(column.type))
    assert codec._columnar_encoder.encode(nulled) is None  # noqa: SLF001 - the columnar encoder alone
    with pytest.raises(Exception):  # noqa: B017 - fastavro's own error type
        codec.encode_column(nulled)
    # A schema with an array field is never batch-decoded.
    assert AvroCodec(load_schema(json.dumps(NESTED)))._columnar_decoder is None  # noqa: SLF001 - pins which decoder runs


# ---------------------------------------------------------------------------------------------
# Strict decoding: a payload must end where its record ends (issue 12, item 2)
# ---------------------------------------------------------------------------------------------

SENSOR = {"type": "record", "name": "Reading", "fields": [
    {"name": "sensor", "type": "string"}, {"name": "celsius", "type": "double"}]}

EVENT = {"type": "record", "name": "Event", "fields": [  # enum, map, fixed: fastavro's, never columnar
    {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B", "C"]}},
    {"name": "counts", "type": {"type": "map", "values": "long"}},
    {"name": "digest", "type": {"type": "fixed", "name": "Digest", "size": 4}},
    {"name": "note", "type": ["null", "string"], "default": None}]}


def _fastavro_twin(codec: AvroCodec) -> AvroCodec:
    """The same codec with the columnar decoder switched off: every batch goes row by row."""
    twin = AvroCodec(codec.schema, codec.registry_schema_id, codec.lenient_trailing_bytes)
    twin._columnar_decoder = None  # noqa: SLF001 - pins which decoder runs
    return twin


def test_bytes_after_the_record_are_a_decode_error_naming_how_many() -> None:
    codec = AvroCodec(load_schema(json.dumps(SENSOR)))
    assert codec._columnar_decoder is not None  # noqa: SLF001 - pins which decoder runs
    reading = codec.encoder()({"sensor": "boiler-3", "celsius": 71.5})
    for decoder in (codec, _fastavro_twin(codec)):
        column, errors = decoder.decode_column([reading, reading + b"abc", reading])
        assert errors == {1: "ValueError: 3 bytes left after the record ends (written with another schema?)"}
        assert column.take(pa.array([0, 2])).to_pylist() == [{"sensor": "boiler-3", "celsius": 71.5}] * 2
    with pytest.raises(ValueError, match=r"^3 bytes left after the record ends \(written with another schema\?\)$"):
        codec.decode(reading + b"abc")

    # The example, b"\x00\x01garbage", is 9 bytes: a string of length 0 and 8 bytes of a
    # double, exactly one {sensor, celsius: double} record, so nothing is left over to refuse it
    # by. With a float (4 bytes) in place of the double, 4 bytes are left and it is refused.
    example = b"\x00\x01garbage"
    assert fastavro.schemaless_reader(io.BytesIO(example), codec.schema, None)["sensor"] == ""
    assert codec.decode_column([example])[1] == {}
    as_float = AvroCodec(load_schema(json.dumps(
        dict(SENSOR, fields=[SENSOR["fields"][0], {"name": "celsius", "type": "float"}]))))
    for decoder in (as_float, _fastavro_twin(as_float)):
        assert decoder.decode_column([example])[1] == {
            0: "ValueError: 4 bytes left after the record ends (written with another schema?)"}


def test_lenient_trailing_bytes_reads_the_leading_record_as_before() -> None:
    strict = AvroCodec(load_schema(json.dumps(SENSOR)))
    lenient = AvroCodec(load_schema(json.dumps(SENSOR)), lenient_trailing_bytes=True)
    reading = strict.encoder()({"sensor": "boiler-3", "celsius": 71.5})
    expected = strict.decode_column([reading, reading])[0]
    for decoder in (lenient, _fastavro_twin(lenient)):
        column, errors = decoder.decode_column([reading, reading + b"abc"])
        assert errors == {} and column.equals(expected)
    assert lenient.decode(reading + b"abc") == {"sensor": "boiler-3", "celsius": 71.5}
    # Lenient about what follows the record only: a record cut short is still an error.
    assert list(lenient.decode_column([reading[:-1], reading])[1]) == [0]


def _sensor_records(n: int, rnd) -> list[dict]:  # noqa: ANN001
    return [{"sensor": "".join(rnd.choice("ab€😀") for _ in range(rnd.randint(0, 9))),
             "celsius": rnd.uniform(-40, 120)} for _ in range(n)]


def _order_records(n: int, rnd) -> list[dict]:  # noqa: ANN001
    return [{"id": f"o-{i}", "customer_id": f"c-{rnd.randint(0, 99)}", "amount": rnd.uniform(-5, 500),
             "currency": rnd.choice(["EUR", "USD"]), "created_at": rnd.randint(0, 10 ** 13),
             "items": rnd.randint(-2 ** 31, 2 ** 31 - 1), "note": rnd.choice([None, "", "gift"])}
            for i in range(n)]


def _nested_records(n: int, rnd) -> list[dict]:  # noqa: ANN001
    codec = AvroCodec(load_schema(json.dumps(NESTED)))
    return [_as_wire(codec, r) for r in _records(n)]


def _event_records(n: int, rnd) -> list[dict]:  # noqa: ANN001
    return [{"kind": rnd.choice("ABC"), "counts": {f"k{j}": rnd.randint(-10 ** 9, 10 ** 9) for j in range(rnd.randint(0, 3))},
             "digest": bytes(rnd.randrange(256) for _ in range(4)), "note": rnd.choice([None, "x"])}
            for _ in range(n)]


# (schema, records, registry schema id): the first four go columnar, the last three to fastavro.
_TRAILING_CASES = [
    (SENSOR, _sensor_records, None),
    (FLAT, lambda n, rnd: _flat_records(n, seed=rnd.randrange(10 ** 6)), None),
    ("schemas/order.avsc", _order_records, None),
    ("schemas/order.avsc", _order_records, 42),
    (NESTED, _nested_records, None),
    (EVENT, _event_records, None),
    (EVENT, _event_records, 7),
]


def _appended(payloads: list[bytes], rnd, most: int = 20) -> tuple[list[bytes], list[int]]:  # noqa: ANN001
    """The payloads, most with 1..`most` random bytes after them, and how many each got."""
    left = [0 if rnd.random() < 0.35 else rnd.randint(1, most) for _ in payloads]
    return [p + bytes(rnd.randrange(256) for _ in range(k)) for p, k in zip(payloads, left, strict=False)], left


@pytest.mark.parametrize("case", range(len(_TRAILING_CASES)))
def test_columnar_and_fastavro_refuse_the_same_records_with_trailing_bytes(case: int) -> None:
    import random

    schema, make, schema_id = _TRAILING_CASES[case]
    rnd = random.Random(1000 + case)
    codec = AvroCodec(load_schema(schema if isinstance(schema, str) else json.dumps(schema)), schema_id)
    assert (codec._columnar_decoder is not None) == (case < 4)  # noqa: SLF001 - pins which decoder runs
    twin = _fastavro_twin(codec)
    encode = codec.encoder()
    clean = [encode(r) for r in make(400, rnd)]
    expected, clean_errors = twin.decode_column(clean)
    assert clean_errors == {}
    payloads, left = _appended(clean, rnd)
    assert sum(k == 0 for k in left) > 50 and sum(k > 0 for k in left) > 150

    ours, ours_errors = codec.decode_column(payloads)
    theirs, their_errors = twin.decode_column(payloads)
    # Exactly the payloads that go on after their record, in the same words on both paths.
    want = {row: "ValueError: " + trailing_bytes_message(k) for row, k in enumerate(left) if k}
    assert ours_errors == want
    assert their_errors == want
    kept = pa.array([row for row, k in enumerate(left) if not k])
    assert ours.take(kept).equals(expected.take(kept)) and theirs.take(kept).equals(expected.take(kept))

    # Lenient: nothing refused, every value the value of the record in front of the extra bytes.
    lenient = AvroCodec(codec.schema, schema_id, lenient_trailing_bytes=True)
    for decoder in (lenient, _fastavro_twin(lenient)):
        column, errors = decoder.decode_column(payloads)
        assert errors == {} and column.equals(expected)


KEY = {"type": "record", "name": "Key", "fields": [
    {"name": "id", "type": "string"}, {"name": "region", "type": ["null", "int"]}]}


@pytest.mark.parametrize("schema", [KEY, "string"], ids=["record", "string"])
def test_keys_with_trailing_bytes_are_refused_on_both_paths(schema) -> None:  # noqa: ANN001
    """A batch of keys with a null in it goes to fastavro, one without to the columnar decoder."""
    import random

    rnd = random.Random(11)
    codec = AvroCodec(fastavro.parse_schema(schema))
    encode = codec.encoder()
    if isinstance(schema, dict):
        keys = [{"id": f"k{i}", "region": rnd.choice([None, rnd.randint(-500, 500)])} for i in range(600)]
    else:
        keys = [f"k{i}-{'é' * rnd.randint(0, 4)}" for i in range(600)]
    payloads, left = _appended([encode(k) for k in keys], rnd)
    with_nulls = list(payloads)
    for row in range(0, len(with_nulls), 7):
        with_nulls[row] = None

    want = {row: "ValueError: " + trailing_bytes_message(k) for row, k in enumerate(left) if k}
    column, errors = codec.decode_column(with_nulls, nullable=True)  # fastavro, row by row
    assert errors == {row: e for row, e in want.items() if row % 7}
    assert column.null_count >= len(range(0, len(payloads), 7))
    present = [row for row in range(len(payloads)) if row % 7]
    batch, batch_errors = codec.decode_column([payloads[row] for row in present], nullable=True)
    assert {present[i]: e for i, e in batch_errors.items()} == {row: e for row, e in want.items() if row % 7}
    kept = [i for i, row in enumerate(present) if not left[row]]
    assert batch.take(pa.array(kept)).equals(column.take(pa.array([present[i] for i in kept])))
    assert batch.take(pa.array(kept)).to_pylist() == [keys[present[i]] for i in kept]
