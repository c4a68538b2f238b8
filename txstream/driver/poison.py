"""Isolating a record that makes the transform fail, so it never blocks its partition.

A row-level error inside a DataFrame transform (a UDF that raises, an ANSI cast or division
error) fails the whole Spark task: Spark cannot say which row. When a batch fails with a
`DataError` (txstream.errors recognises one positively: an exception raised while computing a
row), the driver re-runs the transform without publishing (dry runs), bisects each failing
partition's range down to its first failing record, and **confirms** it before acting: the
record fails again alone, and the range before it computes. Then the good records before it are
published as a normal batch and the record goes to the dead-letter topic (stage `transform`) in
a transaction that also moves the offset past it.

Anything else a dry run meets -- a Python worker that cannot start or is killed, an import that
fails on an executor, a side directory that cannot be written, a lost executor, Kafka -- is not
the data's fault: isolation stops and the error goes back to the driver, which retries the batch
with back-off and finally stops the run naming the cause. A good record is never dead-lettered
because the machinery failed.

The isolator sees the driver only through `IsolationTarget`.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Protocol

from txstream.errors import DataError, InfrastructureError, TxstreamError
from txstream.task.spec import PartitionPlan


class IsolationTarget(Protocol):
    """What the isolator may ask of the driver."""

    def dry_run(self, plans: list[PartitionPlan]) -> TxstreamError | None:
        """Compute the transform over `plans` without publishing: None, or why it failed."""

    def publish(self, plans: list[PartitionPlan]) -> None:
        """Publish `plans` as a normal batch."""

    def dead_letter(self, plan: PartitionPlan, offset: int, message: str) -> None:
        """Send the record at `offset` to the dead-letter topic and commit past it."""


class PoisonIsolator:
    def __init__(self, target: IsolationTarget, echo: Callable[[str], None], dead_letter_topic: str | None) -> None:
        self.target = target
        self.echo = echo
        self.dead_letter_topic = dead_letter_topic
        self.dry_runs = 0

    def isolate(self, plans: list[PartitionPlan]) -> bool:
        """Publish around the first poison record of each failing partition. False when the
        failure does not reproduce (the batch is simply retried); raises the error when a dry
        run fails for a reason that is not the data."""
        if self._dry(plans) is None:
            return False
        found = False
        for plan in plans:
            hit = self.first_failing_record(plan)
            if hit is None:
                continue
            offset, error = hit
            if offset > plan.start:
                self.target.publish([replace(plan, end=offset)])
            self.target.dead_letter(plan, offset, str(error))
            self.echo(f"{plan.topic}[{plan.partition}]@{offset} failed in the transform ({error}); "
                      f"sent to {self.dead_letter_topic}")
            found = True
        return found

    def first_failing_record(self, plan: PartitionPlan) -> tuple[int, DataError] | None:
        """Bisect `plan`'s range with dry runs and confirm: (offset of the first failing record,
        its error), or None when the range computes."""
        error = self._dry([plan])
        if error is None:
            return None
        # Invariant: [start, lo) computes (or is empty), [start, hi) fails.
        lo, hi = plan.start, plan.end
        while hi - lo > 1:
            mid = (lo + hi) // 2
            left = self._dry([replace(plan, end=mid)])
            if left is None:
                lo = mid
            else:
                hi, error = mid, left
        alone = self._dry([replace(plan, start=lo, end=lo + 1)])
        if alone is None:
            raise InfrastructureError(
                f"{plan.topic}[{plan.partition}]: the transform failed on [{plan.start}, {hi}) but record {lo} "
                f"computes alone ({error}); the failure is not reproducible, so nothing is dead-lettered")
        return lo, alone

    def _dry(self, plans: list[PartitionPlan]) -> DataError | None:
        """A dry run: None when it computes, the DataError when a row fails; any other failure
        (the machinery's) is raised."""
        self.dry_runs += 1
        error = self.target.dry_run(plans)
        if error is None or isinstance(error, DataError):
            return error
        raise error
