"""Strict decoding through the real engine (issue 12, item 2): a value that goes on after its
record ends was written with another schema, so it is dead-lettered with the number of bytes
left, never published as the record in front of them. The codec's own tests are in test_serde.py.

Runs the order enricher (processors/enrich_orders.py) in the session's Spark against the real broker.
"""
from __future__ import annotations

import io
from pathlib import Path

import fastavro

from processors.enrich_orders import EnrichOrders
from processors.sample_orders import enriched, orders
from tests.support.kafka import avro_bytes, produce, read_all
from txstream.kafka import headers as hdr
from txstream.serde.avro import load_schema

REPO = Path(__file__).resolve().parents[2]
ORDER = load_schema(str(REPO / "schemas/order.avsc"))
ENRICHED = load_schema(str(REPO / "schemas/order_enriched.avsc"))
# A newer Order with one more field: read with the old schema, its last field is left over.
ORDER_V2 = fastavro.parse_schema({
    "type": "record", "name": "Order", "namespace": "txstream.examples",
    "fields": [dict(f) for f in ORDER["fields"]] + [{"name": "channel", "type": "string"}]})


def test_a_value_with_bytes_after_its_record_is_dead_lettered(bootstrap_servers, make_topic, run_processor):
    partitions = 2
    source, output = make_topic("orders", partitions), make_topic("orders-enriched", partitions)
    dead = make_topic("orders-dlq", 1)
    good = {o["id"]: o for o in orders(40, seed=12)}
    extra = list(orders(2, seed=13, first=900))  # order-000000900, -901: paid orders, never published
    for o in extra:
        o["amount"] = 50.0
    poison = {
        b"trailing": avro_bytes(ORDER, extra[0]) + b"xyz",
        b"newer-schema": avro_bytes(ORDER_V2, dict(extra[1], channel="web")),  # 1 + 3 bytes left
    }
    records = [(oid.encode(), avro_bytes(ORDER, o)) for oid, o in good.items()]
    produce(bootstrap_servers, source, records[:20], partition=1)
    produce(bootstrap_servers, source, poison.items(), partition=1)
    produce(bootstrap_servers, source, records[20:], partition=0)

    driver = run_processor(EnrichOrders, inputs=[source], output=output, dead_letter=dead)
    assert driver.exit_code == 0, driver.lines
    assert driver.totals["dead_letters"] == len(poison), driver.lines

    letters = {r.key: r for r in read_all(bootstrap_servers, dead)}
    assert set(letters) == set(poison), letters
    for key, left in ((b"trailing", 3), (b"newer-schema", 4)):
        r = letters[key]
        assert r.value == poison[key]
        assert r.headers[hdr.DLQ_STAGE] == b"decode", r.headers
        error = r.headers[hdr.DLQ_ERROR].decode()
        assert f"{left} bytes left after the record ends (written with another schema?)" in error, error

    published = {fastavro.schemaless_reader(io.BytesIO(r.value), ENRICHED, None)["id"]
                 for r in read_all(bootstrap_servers, output)}
    assert published == {oid for oid, o in good.items() if enriched(o) is not None}
