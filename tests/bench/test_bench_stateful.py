"""benchmarks/stateful.py's checkers, options and figures: what the running-totals and dedup
benchmarks call exact, from output built by hand (no broker: the benchmark itself runs the
contenders)."""
from __future__ import annotations

from collections import namedtuple

import pytest

from benchmarks import figures
from benchmarks.common import ORDER_SCHEMA, encode, load_schema
from benchmarks.stateful import WORKLOADS, check_dedup, check_totals
from benchmarks.windowed import markdown, parse_args, summarize

Rec = namedtuple("Rec", "key value")
TOTALS = WORKLOADS["totals"]
TOTAL_SCHEMA = load_schema(TOTALS.output_schema_path)


def _total(customer: str, orders: int, amount: float, largest: float) -> Rec:
    return Rec(customer.encode(), encode(TOTAL_SCHEMA, {"customer_id": customer, "orders": orders, "amount": amount,
                                                         "largest": largest}))


def _order(i: int) -> Rec:
    order = {"id": f"order-{i}", "customer_id": "c", "amount": 1.5, "currency": "EUR", "created_at": 1_000 + i,
             "items": 1, "note": None}
    return Rec(order["id"].encode(), encode(ORDER_SCHEMA, order))


WANT = {"a": [2, 30.5, 20.5], "b": [1, 4.0, 4.0]}


def test_totals_pass_on_each_customers_last_value_and_name_each_mistake():
    updates = [_total("a", 1, 10.0, 10.0), _total("b", 1, 4.0, 4.0), _total("a", 2, 30.5, 20.5)]
    assert check_totals(updates, WANT, True, TOTAL_SCHEMA)["ok"]
    assert "1 of 2 customers missing (first ['b'])" in check_totals(updates[::2], WANT, True, TOTAL_SCHEMA)["problems"]
    stale = check_totals(updates[:2], WANT, True, TOTAL_SCHEMA)
    assert not stale["ok"] and stale["wrong"] == 1
    extra = check_totals([*updates, _total("z", 1, 1.0, 1.0)], WANT, True, TOTAL_SCHEMA)
    assert "1 customers that ordered nothing (first ['z'])" in extra["problems"]
    backwards = check_totals([*updates, _total("a", 1, 10.0, 10.0)], WANT, False, TOTAL_SCHEMA)
    assert "1 updates whose order count did not increase" in backwards["problems"]


def test_a_repeated_update_fails_exactly_once_and_is_counted_for_at_least_once():
    updates = [_total("a", 2, 30.5, 20.5), _total("a", 2, 30.5, 20.5), _total("b", 1, 4.0, 4.0)]
    assert not check_totals(updates, WANT, True, TOTAL_SCHEMA)["ok"]
    alo = check_totals(updates, WANT, False, TOTAL_SCHEMA)
    assert alo["ok"] and alo["duplicates"] == 1


def test_the_totals_watcher_counts_orders_added_so_repeats_and_updates_sum_to_the_total():
    added = TOTALS.weight("kafka-streams-totals", TOTAL_SCHEMA)
    values = [_total("a", 1, 10.0, 10.0), _total("a", 2, 30.5, 20.5), _total("a", 2, 30.5, 20.5),
              _total("b", 1, 4.0, 4.0)]
    assert sum(added(v.value) for v in values) == 3


def test_dedup_wants_every_id_exactly_once():
    ids = {"order-1", "order-2"}
    assert check_dedup([_order(1), _order(2)], ids, True, ORDER_SCHEMA)["ok"]
    twice = [_order(1), _order(2), _order(2)]
    assert "1 ids emitted more than once" in check_dedup(twice, ids, True, ORDER_SCHEMA)["problems"]
    assert check_dedup(twice, ids, False, ORDER_SCHEMA)["duplicates"] == 1
    assert "1 of 2 ids missing" in check_dedup([_order(1)], ids, True, ORDER_SCHEMA)["problems"]
    assert "1 ids not in the input" in check_dedup([_order(1), _order(2), _order(3)], ids, True,
                                                    ORDER_SCHEMA)["problems"]


def test_options_keys_set_the_input_and_quick_is_small():
    totals = parse_args(["--quick"], WORKLOADS["totals"])
    assert (totals.keys, totals.records, totals.runs) == (20_000, 40_000, 1)
    assert parse_args(["--keys", "1000", "--records", "5000"], WORKLOADS["totals"]).records == 5_000
    dedup = parse_args(["--keys", "1000000"], WORKLOADS["dedup"])
    assert dedup.records == 1_100_000 and dedup.contender_names == list(WORKLOADS["dedup"].contenders)
    with pytest.raises(SystemExit):
        parse_args(["--contenders", "txstream-windowed"], WORKLOADS["dedup"])


def _results(mode: str) -> dict:
    work = WORKLOADS[mode]
    base, spark, kstreams = list(work.contenders)
    runs = [{"contender": base, "round": 1, "completed": True, "ok": True, "records_per_s": 20_000, "seconds": 100.0,
             "steady_records_per_s": 30_000, "cpu_s_per_m": 60.0, "loadavg_before": 1.0, "loadavg_after": 2.0,
             "check": {"emitted": 10, "expected": 10, "duplicates": 0}},
            {"contender": spark, "round": 1, "completed": True, "ok": True, "records_per_s": 10_000, "seconds": 200.0,
             "steady_records_per_s": 15_000, "cpu_s_per_m": 120.0, "loadavg_before": 1.0, "loadavg_after": 2.0,
             "check": {"emitted": 10, "expected": 10, "duplicates": 2}},
            {"contender": kstreams, "round": 1, "ok": False, "seconds": 0.0, "records_per_s": 0,
             "loadavg_before": 1.0, "loadavg_after": 1.0, "problem": "process exited (1)"}]
    hardware = {"cpu_model": "cpu", "logical_cores": 2, "memory_gib": 23.5, "loadavg_at_start": [3.0, 0, 0],
                "loadavg_at_end": [4.0, 0, 0]}
    return {"mode": mode, "started_at": "2026-11-28T22:00:00+00:00", "baseline": base, "hardware": hardware,
            "args": {"quick": False, "runs": 1, "partitions": 4, "records": 1_100_000},
            "contenders": work.contenders, "logs": "/tmp/x", "unavailable": {},
            "input": {"records": 1_100_000, "keys": 1_000_000, "ids": 1_000_000, "duplicates": 100_000,
                      "customers_with_orders": 990_000, "orders_counted": 1_800_000, "records_per_batch": 40_000},
            "summary": summarize(runs, list(work.contenders), base), "runs": runs}


@pytest.mark.parametrize("mode", ["totals", "dedup"])
def test_report_and_figures_show_ratios_against_txstream_and_the_failed_contender(mode, tmp_path):
    results = _results(mode)
    work = WORKLOADS[mode]
    text = markdown(results, results["runs"], results["summary"], {}, work)
    assert ("Running totals over 1,000,000 customers" if mode == "totals" else "Dedup over 1,000,000 ids") in text
    assert "| 2.00x | 2.00x | 0.50x | exact (1/1 runs) |" in text
    path = tmp_path / f"20261128-220000-{mode}.json"
    path.write_text("{}")
    assert figures.kind_of(results, path) == mode
    lines = "\n".join(figures.stateful_section(path, results, tmp_path))
    assert f"--stateful {mode}" in lines and "| 1 (baseline) | 1 (baseline) | 1 (baseline) | exact |" in lines
    assert "| 20,000 | 30,000 |" in lines and "| 2.00× | 2.00× | 0.50× | exact |" in lines
    assert "failed: process exited (1)" in lines
