"""What every stateful operator shares (docs/state.md, "Semantics"): the watermark's rule.

Pure functions only here for now: a test harness computes the watermark a batch runs with
without Kafka, from the units' latest event times.
"""
from __future__ import annotations


def next_watermark(last_ms: int | None, unit_events_ms: list[int | None], delay_ms: int) -> int | None:
    """The watermark of the next batch: the latest event time any unit has seen minus the delay,
    never below the last batch's (Structured Streaming's watermark does not move back); None
    while no unit has seen an event and no batch had a watermark."""
    events = max((e for e in unit_events_ms if e is not None), default=None)
    known = [w for w in (last_ms, None if events is None else events - delay_ms) if w is not None]
    return max(known) if known else None
