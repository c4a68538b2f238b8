"""Issue 60 #1 end to end, through a real broker: a row behind the watermark whose window is
still open is counted, as Structured Streaming counts it, and is not dead-lettered."""
from __future__ import annotations

from datetime import timedelta

from processors.orders_per_currency import OrdersPerCurrency
from processors.sample_orders import EPOCH, orders
from tests.support.kafka import avro_bytes, produce, read_all
from tests.support.seeding import ORDER
from txstream.serde.avro import AvroCodec, load_schema

WINDOW = AvroCodec(load_schema("schemas/currency_window.avsc"))


def test_a_row_behind_the_watermark_in_an_open_window_counts(bootstrap_servers, make_topic, run_processor) -> None:
    """1-minute windows, 30 s delay; runs over 0:50, 1:40 | 1:05 | 3:00 (each cut its own run, so
    its own batches). At 1:05 the watermark is 1:10, but [1:00, 2:00) is open: Spark's count is 2
    (tests/test_operator_semantics.py computes the same case with Spark itself)."""
    source, sink, dlq = make_topic("lr-in", partitions=1), make_topic("lr-out"), make_topic("lr-dlq")
    app = "test-late-rows-" + source[-8:]
    template = next(iter(orders(1)))
    for i, seconds in enumerate(((50, 100), (65,), (180,))):
        rows = [dict(template, id=f"o-{i}-{s}", created_at=EPOCH + timedelta(seconds=s)) for s in seconds]
        produce(bootstrap_servers, source, [(o["customer_id"].encode(), avro_bytes(ORDER, o)) for o in rows])
        driver = run_processor(OrdersPerCurrency, inputs=[source], output=sink, dead_letter=dlq, app_id=app)
        assert driver.exit_code == 0, driver.lines
    got = {}
    for record in read_all(bootstrap_servers, sink):
        value = WINDOW.decode(record.value)
        got[(value["start"] - EPOCH).total_seconds()] = value["orders"]
    assert got == {0: 1, 60: 2}
    assert read_all(bootstrap_servers, dlq) == []
