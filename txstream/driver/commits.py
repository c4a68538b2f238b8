"""Offsets the driver commits, under the weaker guarantees (exactly-once commits in the tasks)."""
from __future__ import annotations

from typing import Any

from txstream.constants import ACKED, AT_LEAST_ONCE, AT_MOST_ONCE


class DriverCommits:
    """Where at-most-once and at-least-once commit offsets; exactly-once commits in the tasks.

    at-most-once: the ranges' end offsets are committed before the batch runs, so a crash
    loses the range and never repeats it. at-least-once: committed synchronously after every
    output record of the range is acknowledged, so a crash repeats the range and never loses it.
    """

    def __init__(self, guarantee: str, membership: Any) -> None:
        self.guarantee = guarantee
        self.membership = membership

    @staticmethod
    def _offsets(plans: list) -> list:
        from confluent_kafka import TopicPartition

        return [TopicPartition(p.topic, p.partition, p.end) for p in plans]

    def before_batch(self, plans: list) -> None:
        if self.guarantee == AT_MOST_ONCE:
            self.membership.commit(self._offsets(plans))

    def after_batch(self, plans: list, rows: list[dict]) -> None:
        if self.guarantee == AT_LEAST_ONCE:
            acked = {row["index"] for row in rows if row["status"] == ACKED}
            self.membership.commit(self._offsets([p for i, p in enumerate(plans) if i in acked]))
