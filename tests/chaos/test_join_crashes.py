"""A stream-stream left outer join (orders with their payments within an hour, issue 61) as a real
`txstream run` subprocess killed with -9 at the wide protocol's dangerous points and restarted
until a run exits 0: both sides' rows are state in the units' changelog, so a kill between a
unit's commit and the batch's close, or before the plan's log, must neither lose a buffered order
nor emit a match or a null-padded order twice."""
from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.chaos import harness as h
from tests.support.join_processors import seed_orders_and_payments
from tests.support.kafka import read_all
from tests.support.running import App

pytestmark = pytest.mark.chaos
PROCESSOR = "tests.support.join_processors:OrdersWithPaymentsFromEnv"


@pytest.mark.timeout(1500)
def test_kills_of_a_left_outer_join_emit_every_match_and_every_unmatched_order_once(bootstrap_servers,
                                                                                     make_topic) -> None:
    count = h.scale(1_500, 30_000)
    orders, payments, sink = make_topic("jc-orders", 3), make_topic("jc-payments", 2), make_topic("jc-out", 3)
    paid = seed_orders_and_payments(bootstrap_servers, orders, payments, 0, count)
    paid.update(seed_orders_and_payments(bootstrap_servers, orders, payments, count + 300, 3))   # far later: every hour passes
    faults = "driver.after_plan_log=kill@2,publish.after_commit=kill@4,driver.before_close=kill@7"
    app = App(bootstrap_servers, None, sink, 3, processor=PROCESSOR, cap=h.scale(60, 2_000),
              extra=["--output-units", "3", "-X", "consumer.session.timeout.ms=6000"], faults=faults,
              env_extra={"TXSTREAM_TEST_ORDERS": orders, "TXSTREAM_TEST_PAYMENTS": payments})
    try:
        codes = app.until_done(6)
        assert codes.count(0) == 1 and len(codes) >= 4, f"exit codes {codes}: not every kill fired"
        replays = [m for m in app.events().messages() if "re-running its logged plan" in m]
        assert replays, app.log_text()[-3000:]
        out = [(r.key.decode(), json.loads(r.value)) for r in read_all(bootstrap_servers, sink, timeout=300)]
        twice = [k for k, n in Counter(k for k, _ in out).items() if n > 1]
        assert not twice, f"published twice: {sorted(twice)[:10]}"
        expected = {f"o{i}": {"o_id": f"o{i}", **({"p_amount": paid[f"o{i}"]} if f"o{i}" in paid else {})}
                    for i in range(count)}
        expected.update({o: {"o_id": o, "p_amount": a} for o, a in paid.items() if int(o[1:]) >= count})
        got = dict(out)
        missing = sorted(set(expected) - set(got))
        assert not missing, f"never published: {missing[:10]}"
        wrong = sorted(k for k in expected if got[k] != expected[k])
        assert not wrong, [(k, got[k], expected[k]) for k in wrong[:5]]
        assert set(got) == set(expected)
        print(f"join crashes: {count} orders, {len(paid)} paid, exits {codes}, {len(replays)} re-runs", flush=True)
        app.passed()
    finally:
        app.destroy_all()
