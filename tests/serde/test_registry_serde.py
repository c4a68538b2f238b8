"""Registry-framed Avro, decoded grouped by schema id (serde/registry.py), against confluent-kafka's
own `mock://` SchemaRegistryClient: no server, so these are the codec's unit tests (the server's are
in tests/serde/test_registry_runs.py)."""
from __future__ import annotations

import io
import json
import struct
import uuid

import fastavro
import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import Schema

from tests.support.registry_schemas import ORDER_V1, ORDER_V2
from txstream.errors import SchemaRegistryRefused, SchemaRegistryUnreachable
from txstream.serde import registry as reg
from txstream.serde.avro import AvroCodec

V1, V2 = ORDER_V1, ORDER_V2


def _config() -> reg.RegistryConfig:
    return reg.RegistryConfig(url=f"mock://{uuid.uuid4().hex}")   # a mock of its own per test


def _framed(schema: dict, schema_id: int, value: dict) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), value)
    return struct.pack(">bI", 0, schema_id) + buf.getvalue()


def _register(config: reg.RegistryConfig, subject: str, schema: dict) -> int:
    return reg.client(config).register_schema(subject, Schema(json.dumps(schema), "AVRO"))


def test_a_batch_of_two_writer_schemas_reads_as_the_reader_schema_in_its_order():
    config = _config()
    v1, v2 = _register(config, "orders-value", V1), _register(config, "orders-value", V2)
    payloads = [_framed(V1, v1, {"id": 1, "note": "a", "amount": 1.5}),
                _framed(V2, v2, {"id": 2, "amount": 2.5, "currency": "USD"}),
                _framed(V1, v1, {"id": 3, "note": None, "amount": 3.5}),
                _framed(V2, v2, {"id": 4, "amount": 4.5, "currency": "GBP"})]
    decoder = reg.RegistryDecoder(config, fastavro.parse_schema(V2), "orders-value")
    array, errors = decoder.decode_column(payloads)
    assert errors == {}
    assert array.to_pylist() == [{"id": 1, "amount": 1.5, "currency": "EUR"},   # v1: the default
                                 {"id": 2, "amount": 2.5, "currency": "USD"},
                                 {"id": 3, "amount": 3.5, "currency": "EUR"},
                                 {"id": 4, "amount": 4.5, "currency": "GBP"}]
    assert array.type == AvroCodec(fastavro.parse_schema(V2)).arrow


def test_writer_equal_to_reader_is_the_columnar_decoder_and_a_changed_one_a_columnar_projection():
    config = _config()
    v1, v2 = _register(config, "orders-value", V1), _register(config, "orders-value", V2)
    decoder = reg.RegistryDecoder(config, fastavro.parse_schema(V2), "orders-value")
    assert (decoder.way(v1), decoder.way(v2)) == ("projection", "columnar")


def test_a_nested_writer_is_resolved_by_fastavro():
    config = _config()
    nested = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
        {"name": "id", "type": "long"}, {"name": "tags", "type": {"type": "array", "items": "string"}}]}
    reader = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
        {"name": "id", "type": "long"}, {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "channel", "type": ["null", "string"], "default": None}]}
    writer_id = _register(config, "orders-value", nested)
    decoder = reg.RegistryDecoder(config, fastavro.parse_schema(reader), "orders-value")
    array, errors = decoder.decode_column([_framed(nested, writer_id, {"id": 7, "tags": ["a", "b"]})])
    assert errors == {}
    assert array.to_pylist() == [{"id": 7, "tags": ["a", "b"], "channel": None}]
    assert decoder.way(writer_id) == "resolving"


def test_unknown_ids_unresolvable_schemas_and_missing_framing_are_errors_of_their_rows_naming_id_and_subject():
    config = _config()
    v2 = _register(config, "orders-value", V2)
    other = _register(config, "other-value", {"type": "record", "name": "Order", "namespace": "shop",
                                              "fields": [{"name": "x", "type": "int"}]})
    payloads = [_framed(V2, v2, {"id": 1, "amount": 1.0, "currency": "EUR"}),
                _framed(V2, 4242, {"id": 2, "amount": 2.0, "currency": "EUR"}),
                _framed({"type": "record", "name": "Order", "namespace": "shop",
                         "fields": [{"name": "x", "type": "int"}]}, other, {"x": 5}),
                b"plain bytes"]
    array, errors = reg.RegistryDecoder(config, fastavro.parse_schema(V2), "orders-value").decode_column(payloads)
    assert sorted(errors) == [1, 2, 3]
    assert "schema id 4242" in errors[1] and "orders-value" in errors[1]
    assert f"schema id {other}" in errors[2] and "orders-value" in errors[2] and "`id`" in errors[2]
    assert "framing" in errors[3]
    assert array[0].as_py() == {"id": 1, "amount": 1.0, "currency": "EUR"}


def test_keys_may_be_null():
    config = _config()
    key_schema = {"type": "record", "name": "Key", "fields": [{"name": "customer", "type": "string"}]}
    key_id = _register(config, "orders-key", key_schema)
    decoder = reg.RegistryDecoder(config, fastavro.parse_schema(key_schema), "orders-key")
    array, errors = decoder.decode_column([None, _framed(key_schema, key_id, {"customer": "c1"}), None],
                                          nullable=True)
    assert errors == {}
    assert array.to_pylist() == [None, {"customer": "c1"}, None]


def test_schema_ids_come_from_the_first_five_bytes():
    ids = reg.schema_ids([struct.pack(">bI", 0, 7) + b"x", b"\x01\x00\x00\x00\x07", b"\x00\x00", None,
                          struct.pack(">bI", 0, 2 ** 31 + 5)])
    assert ids.tolist() == [7, -1, -1, -2, 2 ** 31 + 5]


def test_an_unreachable_registry_is_infrastructure_not_the_records_fault():
    config = reg.RegistryConfig(url="http://127.0.0.1:9", properties=(("max.retries", "0"),))
    from confluent_kafka.schema_registry import SchemaRegistryClient

    client = SchemaRegistryClient({"url": config.url, "max.retries": 0})
    decoder = reg.RegistryDecoder(config, fastavro.parse_schema(V2), "orders-value", registry=client)
    with pytest.raises(SchemaRegistryUnreachable, match="127.0.0.1:9"):
        decoder.decode_column([_framed(V2, 1, {"id": 1, "amount": 1.0, "currency": "EUR"})])


def test_output_registration_auto_lookup_latest_and_a_refusal():
    config = _config()
    schema_id, schema = reg.register_output(config, "out-value", fastavro.parse_schema(V1))
    assert reg.client(config).get_schema(schema_id).schema_str
    again, _ = reg.register_output(config, "out-value", fastavro.parse_schema(V1))
    assert again == schema_id
    looked_up = reg.RegistryConfig(url=config.url, auto_register=False)
    assert reg.register_output(looked_up, "out-value", fastavro.parse_schema(V1))[0] == schema_id
    with pytest.raises(SchemaRegistryRefused, match="not registered under out-value"):
        reg.register_output(looked_up, "out-value", fastavro.parse_schema(V2))
    latest = reg.RegistryConfig(url=config.url, use_latest_version=True)
    assert reg.register_output(latest, "out-value", None)[0] == schema_id


def test_subject_names_follow_confluents_strategies():
    assert reg.subject_name(reg.RegistryConfig("mock://s"), "orders", False, None) == "orders-value"
    assert reg.subject_name(reg.RegistryConfig("mock://s"), "orders", True, None) == "orders-key"
    assert reg.subject_name(reg.RegistryConfig("mock://s", strategy="record"), "orders", False, "shop.Order") \
        == "shop.Order"
    assert reg.subject_name(reg.RegistryConfig("mock://s", strategy="topic-record"), "orders", False,
                            "shop.Order") == "orders-shop.Order"


def test_grouped_decoding_keeps_columnar_speed():
    """Two writer ids interleaved cost about what one costs: grouped, not a decode per record
    (fastavro record by record is several times slower than the columnar decoder)."""
    import time

    rows = 20_000
    config = _config()
    v1, v2 = _register(config, "orders-value", V1), _register(config, "orders-value", V2)
    reader = fastavro.parse_schema(V2)
    same = [_framed(V2, v2, {"id": i, "amount": 1.0, "currency": "EUR"}) for i in range(rows)]
    mixed = [_framed(V1, v1, {"id": i, "note": "n", "amount": 1.0}) if i % 2 else same[i] for i in range(rows)]
    decoder = reg.RegistryDecoder(config, reader, "orders-value")

    def best(payloads: list, decode) -> float:
        times = []
        for _ in range(5):
            started = time.perf_counter()
            array, errors = decode(payloads)
            times.append(time.perf_counter() - started)
            assert not errors and len(array) == len(payloads)
        return min(times)

    grouped = best(mixed, decoder.decode_column)
    plain = best([p[5:] for p in same], AvroCodec(reader).decode_column)
    codec = AvroCodec(reader)
    per_record = best([p[5:] for p in same], lambda ps: (pa.array([codec.decode(p) for p in ps]), {}))
    print(f"grouped {grouped * 1e3:.1f} ms, one schema columnar {plain * 1e3:.1f} ms, per record {per_record * 1e3:.1f} ms")
    # Quiet machine: 6 ms grouped, 3 ms one schema, 41 ms per record; under load all three swell.
    assert grouped * 2 < per_record, (grouped, plain, per_record)


def test_promotions_are_projected_and_may_round_as_avro_allows():
    config = _config()
    writer = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}, {"name": "b", "type": "int"}]}
    reader = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "float"}, {"name": "b", "type": "long"}]}
    writer_id = _register(config, "t-value", writer)
    decoder = reg.RegistryDecoder(config, fastavro.parse_schema(reader), "t-value")
    array, errors = decoder.decode_column([_framed(writer, writer_id, {"a": 2 ** 40 + 1, "b": 5})])
    assert decoder.way(writer_id) == "projection" and errors == {}
    assert array.to_pylist() == [{"a": float(2 ** 40), "b": 5}]
