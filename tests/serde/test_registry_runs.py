"""Schema registry (issue 53) against a real registry server (the `schema_registry` fixture:
Apicurio's Confluent API, or TXSTREAM_SCHEMA_REGISTRY_URL's) and the real broker: input written by
confluent-kafka's own AvroSerializer in two schema versions, read with no .avsc file; output
registered at start and readable by confluent-kafka's AvroDeserializer; the failure kinds.
"""
from __future__ import annotations

import json
import os
import signal
import uuid

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.support.kafka import avro_bytes, committed, produce, read_all
from tests.support.registry_processors import (
    PRICED,
    PriceOrders,
    PriceOrdersByCustomer,
    PriceOrdersIncompatibly,
    produce_orders,
)
from tests.support.registry_schemas import ORDER_V1, ORDER_V2
from tests.support.running import DriverThread, resolve_settings
from tests.support.waiting import wait_until
from txstream.errors import SchemaRegistryRefused
from txstream.kafka import headers as hdr
from txstream.serde.avro import load_schema


@pytest.fixture
def registry(schema_registry: str) -> str:
    """The registry's Confluent-API base URL (the session's: tests/conftest.py)."""
    return schema_registry


def _orders(count: int, first: int = 0) -> list[tuple[dict, dict]]:
    """Orders alternating between the two schema versions, v1 first (registered first)."""
    return [(ORDER_V2, {"id": i, "amount": i / 4, "currency": "USD" if i % 3 else "GBP"}) if i % 2 else
            (ORDER_V1, {"id": i, "note": f"n{i}", "amount": i / 4})
            for i in range(first, first + count)]


def _priced(schema_and_order: tuple[dict, dict]) -> dict:
    schema, order = schema_and_order
    return {"id": order["id"], "cents": round(order["amount"] * 100),
            "currency": order.get("currency", "EUR")}   # v1 records: v2's default


def test_two_versions_read_by_id_and_the_output_registered_for_confluents_deserializer(
        bootstrap_servers, make_topic, run_processor, registry):
    source, output = make_topic("orders", 2), make_topic("priced", 2)
    orders = _orders(300)
    produce_orders(bootstrap_servers, registry, source, orders, 2)

    driver = run_processor(PriceOrders, inputs=[source], output=output, schema_registry_url=registry)
    assert driver.exit_code == 0, driver.lines
    assert driver.totals["dead_letters"] == 0, driver.lines

    client = SchemaRegistryClient({"url": registry})
    registered = client.get_latest_version(f"{output}-value")
    deserialize = AvroDeserializer(client)
    context = SerializationContext(output, MessageField.VALUE)
    out = read_all(bootstrap_servers, output)
    assert {int.from_bytes(r.value[1:5], "big") for r in out} == {registered.schema_id}
    got = sorted((deserialize(r.value, context) for r in out), key=lambda v: v["id"])
    assert got == [_priced(o) for o in orders]
    assert json.loads(registered.schema.schema_str)["name"] in ("Priced", "shop.Priced")


def test_keys_framed_by_the_registry_are_read_as_the_key_subjects_latest(
        bootstrap_servers, make_topic, run_processor, registry):
    source, output = make_topic("orders", 1), make_topic("priced", 1)
    orders = _orders(20)
    produce_orders(bootstrap_servers, registry, source, orders, 1, keyed=True)
    driver = run_processor(PriceOrdersByCustomer, inputs=[source], output=output, schema_registry_url=registry)
    assert driver.exit_code == 0 and driver.totals["dead_letters"] == 0, driver.lines
    assert [r.key for r in read_all(bootstrap_servers, output)] == [f"c{o['id'] % 7}".encode() for _, o in orders]


def test_an_output_schema_the_subject_refuses_stops_the_run_before_anything_is_read(
        bootstrap_servers, make_topic, run_processor, registry):
    source, output = make_topic("orders", 1), make_topic("priced", 1)
    produce_orders(bootstrap_servers, registry, source, _orders(20), 1)
    client = SchemaRegistryClient({"url": registry})
    client.set_compatibility(f"{output}-value", "BACKWARD")
    client.register_schema(f"{output}-value", Schema(json.dumps(PRICED), "AVRO"))
    app_id = f"test-refused-{uuid.uuid4().hex[:8]}"

    with pytest.raises(SchemaRegistryRefused) as refused:
        run_processor(PriceOrdersIncompatibly, inputs=[source], output=output, schema_registry_url=registry,
                      app_id=app_id)
    assert f"{output}-value" in str(refused.value) and "HTTP 409" in str(refused.value), str(refused.value)
    assert read_all(bootstrap_servers, output, isolation="read_uncommitted") == []
    assert committed(bootstrap_servers, app_id, source, 1) == {0: None}
    assert len(client.get_versions(f"{output}-value")) == 1


def test_an_unknown_schema_id_is_dead_lettered_naming_the_id_and_the_subject(
        bootstrap_servers, make_topic, run_processor, registry):
    source, output, dead = make_topic("orders", 1), make_topic("priced", 1), make_topic("dlq", 1)
    produce_orders(bootstrap_servers, registry, source, _orders(10), 1)
    unknown = b"\x00" + (2 ** 31 - 7).to_bytes(4, "big") + b"\x02\x00"
    produce(bootstrap_servers, source, [(b"stranger", unknown)])
    produce_orders(bootstrap_servers, registry, source, _orders(10, first=10), 1)

    driver = run_processor(PriceOrders, inputs=[source], output=output, dead_letter=dead,
                           schema_registry_url=registry)
    assert driver.exit_code == 0, driver.lines
    letters = read_all(bootstrap_servers, dead)
    assert [(r.key, r.value) for r in letters] == [(b"stranger", unknown)]   # the input's bytes as they were
    error = letters[0].headers[hdr.DLQ_ERROR].decode()
    assert letters[0].headers[hdr.DLQ_STAGE] == b"decode"
    assert f"schema id {2 ** 31 - 7}" in error and f"{source}-value" in error, error
    assert len(read_all(bootstrap_servers, output)) == 20


def test_an_unreachable_registry_is_retried_then_stops_the_run_naming_it_and_dead_letters_nothing(
        bootstrap_servers, make_topic, spark):
    """The run's registry (a private one) is killed with SIGKILL mid-run while a schema id the
    workers have not fetched yet arrives."""
    from txstream.local.cluster import free_port_block
    from txstream.local.registry import LocalRegistry

    private = LocalRegistry(port=free_port_block(2, blocks=1), die_with_parent=True)
    registry = private.start(timeout=180)
    source, output, dead = make_topic("orders", 1), make_topic("priced", 1), make_topic("dlq", 1)
    produce_orders(bootstrap_servers, registry, source, [(ORDER_V2, {"id": i, "amount": 1.0, "currency": "EUR"})
                                                         for i in range(10)], 1)
    # An id the workers have not fetched (registered elsewhere: the input subject's latest stays v2).
    client = SchemaRegistryClient({"url": registry})
    v1_id = client.register_schema(f"{source}-archive-value", Schema(json.dumps(ORDER_V1), "AVRO"))
    late = b"\x00" + v1_id.to_bytes(4, "big") + avro_bytes(load_schema(ORDER_V1), {"id": 99, "note": None,
                                                                                  "amount": 2.0})
    settings = resolve_settings(PriceOrders, bootstrap_servers, inputs=[source], output=output, dead_letter=dead,
                                schema_registry_url=registry, max_consecutive_failures=2,
                                schema_registry_properties={"max.retries": "0"})
    run = DriverThread(settings, spark).start()
    try:
        wait_until(lambda: committed(bootstrap_servers, settings.app_id, source, 1) == {0: 10}, 180,
                   "the first records published", every=0.2)
        os.kill(private.pid, signal.SIGKILL)
        produce(bootstrap_servers, source, [(b"o99", late)])
        wait_until(lambda: not run.alive(), 240, "the run to stop", every=0.2,
                   state=lambda: "\n".join(run.lines[-8:]))
    finally:
        if run.alive():
            run.stop()
        private.stop()
    error = run.outcome.get("error")
    assert error is not None, run.lines[-10:]
    assert registry.split("/apis")[0] in str(error), str(error)
    assert any(e.get("event") == "retry" for e in run.events), [e.get("event") for e in run.events]
    assert read_all(bootstrap_servers, dead) == []
    assert committed(bootstrap_servers, settings.app_id, source, 1) == {0: 10}


def test_exactly_once_through_kill_9_with_the_registry_in_the_loop(bootstrap_servers, make_topic, registry):
    """`txstream run --schema-registry` killed with kill -9 while a batch is in flight, restarted
    until caught up: every order published once, framed with the registered id."""
    from collections import Counter

    from tests.support.running import App
    from txstream.tools.verify import audit

    partitions = 2
    source, output = make_topic("orders", partitions), make_topic("priced", partitions)
    orders = _orders(40_000)
    produce_orders(bootstrap_servers, registry, source, orders, partitions)
    app = App(bootstrap_servers, source, output, partitions, processor="tests/support/registry_processors.py:PriceOrders",
              cap=4_000, extra=["--schema-registry", registry])
    try:
        run = app.start()
        baseline = app.baseline()
        assert wait_until(app.progressed_since(baseline), 300, "the first commit", every=0.05, run=run), run.tail()
        run.kill9()
        # Once readable: a kill inside a transaction leaves its offsets pending until the
        # coordinator aborts it, and a stable read answers nothing before.
        at_kill = app.baseline()
        codes = app.until_done(4)
    finally:
        app.destroy_all()
    client = SchemaRegistryClient({"url": registry})
    deserialize = AvroDeserializer(client)
    context = SerializationContext(output, MessageField.VALUE)
    out = read_all(bootstrap_servers, output)
    ids = Counter(deserialize(r.value, context)["id"] for r in out)
    assert at_kill is not None and 0 < at_kill < len(orders), at_kill   # the kill landed mid-run
    assert set(ids) == {o["id"] for _, o in orders} and max(ids.values()) == 1, (codes, ids.most_common(3))
    report = audit(bootstrap_servers, source, output, app_id=app.app_id)
    assert report.clean, report.table()
    app.passed()


def test_produce_and_consume_through_the_registry(bootstrap_servers, make_topic, registry, tmp_path):
    """`txstream produce --schema-registry`: JSON lines in, framed Avro out (the schema registered
    under TOPIC-value, then the latest reused); `consume --schema-registry`: decoded, the id shown."""
    from click.testing import CliRunner

    from txstream.cli.main import main

    topic = make_topic("orders", 1)
    schema = tmp_path / "order.avsc"
    schema.write_text(json.dumps(ORDER_V2))
    lines = "".join(json.dumps({"id": i, "amount": i / 2, "currency": "EUR"}) + "\n" for i in range(3))
    base = [topic, "-b", bootstrap_servers, "--schema-registry", registry]
    produced = CliRunner().invoke(main, ["produce", *base, "--value-schema", str(schema)], input=lines)
    assert produced.exit_code == 0, produced.output
    again = CliRunner().invoke(main, ["produce", *base, "--use-latest-version"], input=lines)
    assert again.exit_code == 0, again.output

    client = SchemaRegistryClient({"url": registry})
    registered = client.get_latest_version(f"{topic}-value")
    deserialize = AvroDeserializer(client)
    context = SerializationContext(topic, MessageField.VALUE)
    assert [deserialize(r.value, context)["id"] for r in read_all(bootstrap_servers, topic)] == [0, 1, 2] * 2

    consumed = CliRunner().invoke(main, ["consume", *base, "--max", "6"])
    assert consumed.exit_code == 0, consumed.output
    records = [json.loads(line) for line in consumed.stdout.splitlines() if line.startswith("{")]
    assert [(r["schema_id"], r["value"]["id"]) for r in records] == [(registered.schema_id, i) for i in (0, 1, 2)] * 2


def test_registry_client_properties_reach_the_client_from_dash_x_and_the_file(bootstrap_servers, make_topic, registry,
                                                                              tmp_path):
    """`-X schema.registry.<property>` and `--schema-registry-config FILE` are SchemaRegistryClient
    properties (a property it does not know is refused by name: it reached the client); on a
    command without a registry, -X schema.registry.* is refused."""
    from click.testing import CliRunner

    from txstream.cli.main import main

    topic = make_topic("orders", 1)
    base = [topic, "-b", bootstrap_servers, "--schema-registry", registry, "--use-latest-version"]
    refused = CliRunner().invoke(main, ["produce", *base, "-X", "schema.registry.no.such.property=1"], input="{}\n")
    assert refused.exit_code != 0 and "no.such.property" in refused.output, refused.output
    schema = tmp_path / "order.avsc"
    schema.write_text(json.dumps(ORDER_V2))
    lines = json.dumps({"id": 1, "amount": 0.5, "currency": "EUR"}) + "\n"
    produced = CliRunner().invoke(main, ["produce", *base[:-1], "--value-schema", str(schema)], input=lines)
    assert produced.exit_code == 0, produced.output
    config = tmp_path / "registry.properties"
    config.write_text("no.such.file.property=1\n")
    refused = CliRunner().invoke(main, ["consume", *base[:-1], "--schema-registry-config", str(config)])
    assert refused.exit_code != 0 and "no.such.file.property" in refused.output, refused.output
    accepted = CliRunner().invoke(main, ["consume", *base[:-1], "-X", "schema.registry.max.retries=1", "--max", "1",
                                         "--timeout", "5"])
    assert accepted.exit_code == 0, accepted.output
    elsewhere = CliRunner().invoke(main, ["offsets", "show", "--app-id", "x", "-b", bootstrap_servers,
                                          "-X", "schema.registry.max.retries=1"])
    assert elsewhere.exit_code != 0 and "uses no schema registry" in elsewhere.output, elsewhere.output


def test_a_registry_over_tls_is_reached_with_its_ca(bootstrap_servers, make_topic, run_processor, tmp_path):
    """A registry serving HTTPS only (a private one, its certificate signed by a throwaway CA):
    the client settings (-X schema.registry.ssl.ca.location, --schema-registry-config) reach the
    commands' and the run's clients, the tasks' included; without the CA, one clear line."""
    from click.testing import CliRunner

    from txstream.cli.main import main
    from txstream.local.cluster import free_port_block
    from txstream.local.registry import LocalRegistry

    private = LocalRegistry(port=free_port_block(3, blocks=1), die_with_parent=True, tls_dir=str(tmp_path / "tls"))
    try:
        url = private.start(timeout=180)
        assert url.startswith("https://")
        ca = private.client_properties()["ssl.ca.location"]
        source, output = make_topic("orders", 1), make_topic("priced", 1)
        schema = tmp_path / "order.avsc"
        schema.write_text(json.dumps(ORDER_V2))
        lines = "".join(json.dumps({"id": i, "amount": i / 2, "currency": "EUR"}) + "\n" for i in range(5))
        base = [source, "-b", bootstrap_servers, "--schema-registry", url]
        produced = CliRunner().invoke(main, ["produce", *base, "--value-schema", str(schema),
                                             "-X", f"schema.registry.ssl.ca.location={ca}"], input=lines)
        assert produced.exit_code == 0, produced.output
        config = tmp_path / "registry.properties"
        config.write_text(f"ssl.ca.location={ca}\n")
        consumed = CliRunner().invoke(main, ["consume", *base, "--schema-registry-config", str(config)])
        assert consumed.exit_code == 0, consumed.output
        assert len([line for line in consumed.stdout.splitlines() if line.startswith("{")]) == 5
        refused = CliRunner().invoke(main, ["consume", *base, "--timeout", "5"])
        assert refused.exit_code != 0 and "cannot be reached" in refused.output, refused.output

        driver = run_processor(PriceOrders, inputs=[source], output=output, schema_registry_url=url,
                               schema_registry_properties={"ssl.ca.location": ca})
        assert driver.exit_code == 0, driver.lines
        out = read_all(bootstrap_servers, output)
        assert len(out) == 5 and all(r.value[:1] == b"\x00" for r in out)
    finally:
        private.stop()
