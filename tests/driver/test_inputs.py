"""Several input streams (Processor.inputs, issue 61): each decoded with its own schema and handed
to the transform as its own DataFrame, published exactly once through the wide protocol; a
stateful operator over their union; a left outer join of two streams without a watermark refused at start."""
from __future__ import annotations

import uuid

import pytest

from tests.support.input_processors import EventsPerOrder, JoinsItsStreams, OrdersAndReturns
from tests.support.kafka import produce, read_all
from tests.support.seeding import seed_orders
from txstream import Input
from txstream.errors import SettingsError, TransformError

pytestmark = pytest.mark.integration


def _streams(cls: type, orders: str, returns: str) -> type:
    inputs = {"orders": Input([orders], value_schema="schemas/order.avsc"), "returns": Input([returns])}
    return type(f"{cls.__name__}{uuid.uuid4().hex[:6]}", (cls,), {"inputs": inputs})


def test_each_input_is_its_own_frame_and_every_record_comes_out_once(bootstrap_servers, make_topic,
                                                                     run_processor) -> None:
    orders, returns, out = make_topic("orders", partitions=2), make_topic("returns", 3), make_topic("out", 2)
    data = seed_orders(bootstrap_servers, orders, 300)
    produce(bootstrap_servers, returns, [(o["id"].encode(), b"damaged") for o in data[:40]])
    driver = run_processor(_streams(OrdersAndReturns, orders, returns), output=out, max_records_per_partition=60)
    assert driver.exit_code == 0, "\n".join(driver.lines)
    got = sorted(r.value for r in read_all(bootstrap_servers, out))
    assert got == sorted([f"order:{o['id']}".encode() for o in data] +
                         [f"return:{o['id']}:damaged".encode() for o in data[:40]])
    assert any("reads 2 input streams" in line for line in driver.lines), driver.lines
    assert driver.totals["batches"] >= 3


def test_a_stateful_operator_counts_over_the_union_of_the_inputs(bootstrap_servers, make_topic, run_processor) -> None:
    orders, returns, out = make_topic("orders"), make_topic("returns"), make_topic("out")
    data = seed_orders(bootstrap_servers, orders, 20)
    produce(bootstrap_servers, returns, [(data[0]["id"].encode(), b"late"), (data[0]["id"].encode(), b"again"),
                                         (data[1]["id"].encode(), b"size")])
    driver = run_processor(_streams(EventsPerOrder, orders, returns), output=out)
    assert driver.exit_code == 0, "\n".join(driver.lines)
    last: dict[bytes, bytes] = {}
    for r in read_all(bootstrap_servers, out):
        last[r.key] = r.value
    assert last[data[0]["id"].encode()] == f"{data[0]['id']}=3".encode()
    assert last[data[1]["id"].encode()] == f"{data[1]['id']}=2".encode()
    assert last[data[2]["id"].encode()] == f"{data[2]['id']}=1".encode() and len(last) == 20


def test_a_join_of_two_input_streams_and_misdeclared_inputs_are_refused(bootstrap_servers, make_topic,
                                                                        run_processor) -> None:
    orders, returns, out = make_topic("orders"), make_topic("returns"), make_topic("out")
    with pytest.raises(TransformError, match="stream-stream leftouter join needs a watermark"):
        run_processor(_streams(JoinsItsStreams, orders, returns), output=out)
    with pytest.raises(SettingsError, match="do not apply"):
        run_processor(_streams(OrdersAndReturns, orders, returns), inputs=[orders], output=out)
    twice = type("Twice", (OrdersAndReturns,), {"inputs": {"a": Input([orders]), "b": Input([orders])}})
    with pytest.raises(SettingsError, match="in two of"):
        run_processor(twice, output=out)
