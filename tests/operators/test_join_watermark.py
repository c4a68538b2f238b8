"""A stream-stream join's watermark (operators/join.py join_watermark): the least of the
watermarked sides' (Spark's default multiple-watermark policy, "min"), never moving back."""
from __future__ import annotations

from txstream.operators.join import join_watermark

BOTH = [{"column": "o_ts", "delay_ms": 600_000}, {"column": "p_ts", "delay_ms": 1_200_000}]


def test_the_least_of_the_sides_never_moving_back() -> None:
    # Orders seen to 10:00 (less 10 min), payments to 10:05 (less 20 min): the payments' 9:45 rules.
    ten, five_past = 36_000_000, 36_300_000
    assert join_watermark(None, ([ten, None], [five_past]), BOTH) == five_past - 1_200_000
    assert join_watermark(ten, ([ten], [five_past]), BOTH) == ten   # never below the last batch's
    # A unit that saw a later event moves its side; the other side still holds it back.
    assert join_watermark(None, ([ten, ten + 1_000_000], [five_past]), BOTH) == five_past - 1_200_000


def test_none_until_every_watermarked_side_has_seen_an_event() -> None:
    assert join_watermark(None, ([36_000_000], [None]), BOTH) is None
    assert join_watermark(5, ([36_000_000], [None]), BOTH) == 5
    # A side without a watermark does not hold the join's back.
    assert join_watermark(None, ([36_000_000], [None]), [BOTH[0], None]) == 36_000_000 - 600_000
    assert join_watermark(7, ([None], [None]), [None, None]) == 7
