"""Stream-stream joins of two input streams through Kafka (issue 61): orders joined with their
payments within an hour, left outer, as Structured Streaming code writes it; the state of both
sides kept across batches and across a restart, every matched order once, every unpaid one once
null-padded and only after the watermark passed its hour."""
from __future__ import annotations

import json
import uuid
from collections import Counter

import pytest

from tests.support.join_processors import ORDER_SCHEMA, PAYMENT_SCHEMA, OrdersWithPayments, seed_orders_and_payments
from tests.support.kafka import read_all
from txstream import Input

pytestmark = pytest.mark.integration


def _processor(orders: str, payments: str, how: str = "leftOuter") -> type:
    inputs = {"orders": Input([orders], value_schema=ORDER_SCHEMA), "payments": Input([payments],
                                                                                     value_schema=PAYMENT_SCHEMA)}
    return type(f"Joined{uuid.uuid4().hex[:6]}", (OrdersWithPayments,), {"inputs": inputs, "how": how})


def test_a_left_outer_join_emits_every_match_once_and_every_unmatched_order_once_after_its_hour(
        bootstrap_servers, make_topic, run_processor) -> None:
    orders, payments, out = make_topic("orders", partitions=2), make_topic("payments", 2), make_topic("out", 2)
    cls = _processor(orders, payments)
    paid = seed_orders_and_payments(bootstrap_servers, orders, payments, 0, 60)
    app_id = f"joined-{uuid.uuid4().hex[:8]}"
    first = run_processor(cls, output=out, max_records_per_partition=25, app_id=app_id)
    assert first.exit_code == 0, "\n".join(first.lines)
    seen_first = {r.key.decode() for r in read_all(bootstrap_servers, out)}
    # Nothing unpaid is padded before the watermark passed its hour: the last orders' hour is open.
    assert not any(o in seen_first for o in (f"o{i}" for i in range(40, 60) if i % 3 == 0)), seen_first
    paid.update(seed_orders_and_payments(bootstrap_servers, orders, payments, 60, 30))
    # Far later events on both sides move the watermark past every order's hour (the flush's own stay).
    paid.update(seed_orders_and_payments(bootstrap_servers, orders, payments, 400, 2))
    second = run_processor(cls, output=out, max_records_per_partition=25, app_id=app_id)   # state from Kafka
    assert second.exit_code == 0, "\n".join(second.lines)
    got = [(r.key.decode(), json.loads(r.value)) for r in read_all(bootstrap_servers, out)]
    keys = [k for k, _ in got]
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)
    expected = {f"o{i}": ({"o_id": f"o{i}", "p_amount": paid[f"o{i}"]} if f"o{i}" in paid else {"o_id": f"o{i}"})
                for i in range(90)}
    for i in (400, 401):   # paid, so joined; unpaid ones of the flush would still wait
        if f"o{i}" in paid:
            expected[f"o{i}"] = {"o_id": f"o{i}", "p_amount": paid[f"o{i}"]}
    assert dict(got) == expected
    assert any("stream-stream leftouter join" in line for line in first.lines), first.lines


def test_state_show_lists_a_joins_buffered_rows(bootstrap_servers, make_topic, run_processor) -> None:
    from txstream.kafka.config import KafkaClients
    from txstream.tools.state_view import show_state

    orders, payments, out = make_topic("orders"), make_topic("payments"), make_topic("out")
    seed_orders_and_payments(bootstrap_servers, orders, payments, 0, 6)
    app_id = f"joined-{uuid.uuid4().hex[:8]}"
    driver = run_processor(_processor(orders, payments), output=out, app_id=app_id)
    assert driver.exit_code == 0, "\n".join(driver.lines)
    view = show_state(KafkaClients(bootstrap_servers), app_id, limit=0)
    entries = [e for op in view.operators for e in op.entries]
    sides = Counter(e.key[0] for e in entries)
    assert sides == {"left": 6, "right": 4}, [e.key for e in entries]   # nothing expired yet
    assert {e.key[1] for e in entries if e.key[0] == "left"} == {f"o{i}" for i in range(6)}
    assert all(e.value["matched"] == (int(e.key[1][1:]) % 3 != 0) for e in entries if e.key[0] == "left")
