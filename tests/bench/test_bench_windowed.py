"""benchmarks/windowed.py's checker: what the windowed benchmark calls exact, from windows built
by hand (no broker: the benchmark itself runs the contenders)."""
from __future__ import annotations

from collections import namedtuple

from benchmarks.common import encode, load_schema
from benchmarks.windowed import (
    DELAY_MS,
    EVENT_START_MS,
    WINDOW_MS,
    WINDOW_SCHEMA_PATH,
    WindowedInput,
    check_windows,
    event_time_ms,
    expected_windows,
)

Rec = namedtuple("Rec", "key value")
SCHEMA = load_schema(WINDOW_SCHEMA_PATH)
W0, W1, W2 = EVENT_START_MS, EVENT_START_MS + WINDOW_MS, EVENT_START_MS + 2 * WINDOW_MS


def _input(last_event_ms: int) -> WindowedInput:
    inp = WindowedInput(topic="t", records=6, step_ms=1)
    inp.windows = {(W0, "EUR"): [3, 30.5], (W0, "USD"): [1, 2.25], (W1, "EUR"): [2, 7.0], (W2, "EUR"): [1, 1.0]}
    inp.max_event_ms = last_event_ms
    return inp


def _out(start: int, currency: str, orders: int, amount: float, key: bytes | None = None) -> Rec:
    value = encode(SCHEMA, {"start": start, "end": start + WINDOW_MS, "currency": currency, "orders": orders,
                            "amount": amount})
    return Rec(currency.encode() if key is None else key, value)


def test_event_time_advances_a_fixed_step_from_a_window_boundary():
    assert EVENT_START_MS % WINDOW_MS == 0
    assert [event_time_ms(i, 2.0) - EVENT_START_MS for i in (0, 1, 30_000)] == [0, 2, 60_000]
    assert event_time_ms(3, 0.5) == EVENT_START_MS + 1


def test_the_final_watermark_closes_windows_ending_before_it_and_the_edge_is_optional():
    # Watermark = W2 + 30 s - 30 s = W2: W0's window (ends W1) must close; W1's ends at W2, the
    # watermark itself, within the edge: optional; W2's is open.
    must, may = expected_windows(_input(W2 + DELAY_MS))
    assert set(must) == {(W0, "EUR"), (W0, "USD")}
    assert set(may) == {(W1, "EUR")}
    update_must, update_may = expected_windows(_input(W2 + DELAY_MS), update=True)
    assert len(update_must) == 4 and not update_may


def test_exact_output_passes_and_each_kind_of_mistake_is_named():
    must, may = expected_windows(_input(W2 + DELAY_MS))
    exact = [_out(W0, "EUR", 3, 30.5), _out(W0, "USD", 1, 2.25)]
    assert check_windows(exact, must, may, True, False, SCHEMA)["ok"]
    assert check_windows(exact + [_out(W1, "EUR", 2, 7.0)], must, may, True, False, SCHEMA)["ok"]

    missing = check_windows(exact[:1], must, may, True, False, SCHEMA)
    assert not missing["ok"] and missing["missing"] == 1
    wrong = check_windows([_out(W0, "EUR", 2, 30.5), _out(W0, "USD", 1, 2.5)], must, may, True, False, SCHEMA)
    assert (wrong["wrong_counts"], wrong["wrong_sums"]) == (1, 1) and not wrong["ok"]
    early = check_windows(exact + [_out(W2, "EUR", 1, 1.0)], must, may, True, False, SCHEMA)
    assert early["unexpected"] == 1 and not early["ok"]
    bad_key = check_windows([_out(W0, "EUR", 3, 30.5, key=b"USD"), exact[1]], must, may, True, False, SCHEMA)
    assert not bad_key["ok"]


def test_duplicates_fail_exactly_once_and_are_counted_for_at_least_once():
    must, may = expected_windows(_input(W2 + DELAY_MS))
    twice = [_out(W0, "EUR", 3, 30.5), _out(W0, "EUR", 3, 30.5), _out(W0, "USD", 1, 2.25)]
    assert not check_windows(twice, must, may, True, False, SCHEMA)["ok"]
    at_least_once = check_windows(twice, must, may, False, False, SCHEMA)
    assert at_least_once["ok"] and at_least_once["duplicates"] == 1
    conflicting = [_out(W0, "EUR", 2, 30.5)] + twice
    assert not check_windows(conflicting, must, may, False, False, SCHEMA)["ok"]


def test_update_mode_is_checked_on_each_windows_last_value():
    must, may = expected_windows(_input(W2 + DELAY_MS), update=True)
    updates = [_out(W0, "EUR", 1, 10.0), _out(W0, "EUR", 3, 30.5), _out(W0, "USD", 1, 2.25),
               _out(W1, "EUR", 2, 7.0), _out(W2, "EUR", 1, 1.0)]
    assert check_windows(updates, must, may, True, True, SCHEMA)["ok"]
    assert not check_windows(updates[:1] + updates[2:], must, may, True, True, SCHEMA)["ok"]


def test_txstream_contender_is_unavailable_without_its_processor(monkeypatch):
    from benchmarks import windowed

    assert windowed.txstream_available() is None   # this tree has the processor and the engine
    monkeypatch.setattr(windowed, "PROCESSOR", "processors/no_such_processor.py:Nope")
    why = windowed.txstream_available()
    assert why and "processors/no_such_processor.py is not in this tree" in why
