"""The one interface between the driver loop and a way of publishing batches.

The loop (driver/loop.py) holds one `BatchProtocol` and never asks which: narrow transforms
publish through slots (driver/narrow.py), wide ones through output units or one driver
transaction (driver/wide.py). A new way to publish a batch is a new implementation of this
interface, not an edit to the loop.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from confluent_kafka import TopicPartition

    from txstream.driver.membership import GroupMembership
    from txstream.driver.planning import Planner
    from txstream.driver.report import BatchReport
    from txstream.records import DeadLetter
    from txstream.task.spec import PartitionPlan


class BatchProtocol(Protocol):
    @property
    def batch_id(self) -> int:
        """The batch last started (0: none yet)."""

    def describe(self) -> str:
        """The run's line that says how batches are published."""

    def start(self, membership: GroupMembership | None) -> None:
        """Before the run's first plan, before the loop joins the group unless it joined already
        (then `membership` is its own, assigned): refuse what cannot run, prepare producers."""

    def joined(self, membership: GroupMembership) -> None:
        """The group membership every batch plans and commits under, for the rest of the run."""

    def next_plans(self, planner: Planner, owned: list[TopicPartition],
                   committed: dict[tuple[str, int], int | None], cap: int) -> list[PartitionPlan]:
        """The next batch's ranges over the owned partitions ([]: nothing to do now)."""

    def owes_batch(self, owned: list[TopicPartition]) -> bool:
        """A batch is due although no input waits (a stateful protocol's batch with no records,
        which emits what an advanced watermark closed): `--until-caught-up` runs it first."""

    def run_batch(self, plans: list[PartitionPlan], planned_at: float | None = None) -> BatchReport:
        """Run and publish one batch over `plans` (planning began at `planned_at`, monotonic)."""

    def abandon(self, plans: list[PartitionPlan]) -> None:
        """A failed batch is about to be re-planned by the poison isolator: make sure no attempt
        of it can still commit, or raise when it cannot be replaced."""

    def dead_letter(self, plan: PartitionPlan, record: DeadLetter) -> None:
        """`record` (a raw input record of `plan`'s partition) to the dead-letter topic, and the
        partition's committed offset past it."""

    def close(self) -> None:
        """Release what `start` made."""
