"""Each example processor end to end: real broker, real Spark, exact output contents."""
from __future__ import annotations

import json
from collections import Counter

from processors.enrich_orders import EnrichOrders
from processors.fanout_items import FanOutItems
from processors.passthrough import PassThrough
from processors.route_by_currency import RouteByCurrency
from processors.sample_orders import enriched
from tests.support.kafka import committed, java_partition, murmur2, produce, read_all
from tests.support.seeding import seed_orders
from txstream.serde.avro import AvroCodec, load_schema

ENRICHED = load_schema("schemas/order_enriched.avsc")


def test_murmur2_reference_matches_kafkas_java_test_vectors() -> None:
    # From Kafka's UtilsTest.testMurmur2.
    vectors = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
               b"a-little-bit-longer-string": -1486304829,
               b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971, b"abc": 479470107}
    assert {k: murmur2(k) for k in vectors} == vectors


def test_passthrough_copies_everything_once_to_java_partitions(bootstrap_servers, make_topic, run_processor) -> None:
    source, sink = make_topic("in", partitions=3), make_topic("out", partitions=5)
    records = [(f"key-{i}".encode(), f"value-{i}".encode()) for i in range(3000)]
    produce(bootstrap_servers, source, records)
    driver = run_processor(PassThrough, inputs=[source], output=sink)
    assert driver.exit_code == 0
    out = read_all(bootstrap_servers, sink)
    assert Counter((r.key, r.value) for r in out) == Counter(records)
    # Keys land where Kafka's Java producer (murmur2) would put them.
    assert all(r.partition == java_partition(r.key, 5) for r in out)
    # Lineage: each output names its source record exactly.
    source_records = {(r.partition, r.offset): r.value for r in read_all(bootstrap_servers, source)}
    for r in out:
        topic, partition, offset = r.lineage.source
        assert topic == source and source_records[(partition, offset)] == r.value
    assert committed(bootstrap_servers, driver.settings.app_id, source, 3) == {
        p: max(o for (q, o) in source_records if q == p) + 1 for p in range(3)}


def test_enricher_decodes_filters_computes_and_encodes_avro(bootstrap_servers, make_topic, run_processor) -> None:
    source, sink = make_topic("orders", partitions=2), make_topic("enriched", partitions=2)
    data = seed_orders(bootstrap_servers, source, 2000)
    driver = run_processor(EnrichOrders, inputs=[source], output=sink, dead_letter=make_topic("dlq"),
                           max_records_per_partition=400)
    codec = AvroCodec(ENRICHED)
    out = read_all(bootstrap_servers, sink)
    got = sorted((r.key.decode(), json.dumps(codec.decode(r.value), default=str, sort_keys=True)) for r in out)
    expected = sorted((o["customer_id"], json.dumps(enriched(o), default=str, sort_keys=True))
                      for o in data if enriched(o) is not None)
    assert got == expected
    assert 0 < len(expected) < len(data)  # the filter really dropped the void orders
    assert driver.totals["records_in"] == 2000 and driver.totals["batches"] >= 3  # 400 per partition per batch
    assert all(r.partition == java_partition(r.key, 2) for r in out)


def test_fanout_publishes_one_record_per_item_in_one_transaction(bootstrap_servers, make_topic, run_processor) -> None:
    source, sink = make_topic("orders"), make_topic("items", partitions=3)
    data = seed_orders(bootstrap_servers, source, 500)
    driver = run_processor(FanOutItems, inputs=[source], output=sink)
    assert driver.exit_code == 0, "\n".join(driver.lines)
    schema = load_schema("schemas/order_item.avsc")
    out = read_all(bootstrap_servers, sink)
    lines = Counter((v["order_id"], v["line"]) for v in (AvroCodec(schema).decode(r.value) for r in out))
    assert lines == Counter((o["id"], n) for o in data for n in range(1, o["items"] + 1))
    # All lines of one order came from one source offset and one publication.
    by_offset: dict[int, set[bytes]] = {}
    for r in out:
        by_offset.setdefault(r.lineage.offset, set()).add(r.lineage.publication)
    assert len(by_offset) == 500 and all(len(p) == 1 for p in by_offset.values())


def test_router_writes_to_several_topics_through_the_topic_column(bootstrap_servers, make_topic, run_processor,
                                                                  admin) -> None:
    from confluent_kafka.admin import NewTopic

    source = make_topic("orders")
    prefix = source + "-"
    other = make_topic("other")
    routed = {c: prefix + c.lower() for c in ("EUR", "USD")}
    for topic in routed.values():
        admin.create_topics([NewTopic(topic, 1)])[topic].result(30)
    try:
        data = seed_orders(bootstrap_servers, source, 400)
        Router = type("Router", (RouteByCurrency,), {"topic_prefix": prefix})
        run_processor(Router, inputs=[source], output=other)
        for currency in ("EUR", "USD"):
            got = [json.loads(r.value)["id"] for r in read_all(bootstrap_servers, routed[currency])]
            assert sorted(got) == sorted(o["id"] for o in data if o["currency"] == currency)
        rest = [json.loads(r.value)["currency"] for r in read_all(bootstrap_servers, other)]
        assert Counter(rest) == Counter(o["currency"] for o in data if o["currency"] not in routed)
    finally:
        admin.delete_topics(list(routed.values()))
