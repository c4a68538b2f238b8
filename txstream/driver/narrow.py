"""The narrow batch protocol: a batch is one Spark job of one stage, one publishing task per slot.

Task i reads planned range i (task/reading.py), runs the processor's narrow transform, and its
slot's task publishes the slot's ranges with their end offsets in one transaction
(task/publish.py; slots: driver/slots.py). The driver only plans, runs and reports; the offsets
are committed by the tasks (exactly-once) or by `DriverCommits` (the weaker guarantees).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable

from confluent_kafka import TopicPartition

from txstream.constants import ACKED, ALREADY_DONE, COMMITTED, STALE_PLAN
from txstream.driver.commits import DriverCommits
from txstream.driver.dead_letters import publish_dead_letter
from txstream.driver.jobs import SparkJobs
from txstream.driver.membership import GroupMembership
from txstream.driver.pacing import Pacing
from txstream.driver.planning import Planner, transactional_id
from txstream.driver.report import BatchReport
from txstream.driver.slots import SlotLayout, Slots
from txstream.driver.specs import TaskSpecs
from txstream.errors import InfrastructureError, TransformError
from txstream.records import DeadLetter
from txstream.settings import RunSettings
from txstream.task.spec import JobSpec, PartitionPlan


@dataclass
class FirstJob:
    """The run's first narrow batch as `first_job` laid it out, and the transform's output over it."""

    slots: Slots
    plans: list[PartitionPlan]
    layout: SlotLayout
    per_slot: bool
    out: Any


def new_slots(settings: RunSettings, spark) -> Slots:
    """The run's slots: --task-slots of them, else one per Spark core (driver/slots.py)."""
    return Slots(settings.app_id, settings.task_slots or spark.sparkContext.defaultParallelism,
                 settings.producers_per_slot)


def fixed_shape(slots: Slots | None, per_slot_reading: bool) -> dict[str, int] | None:
    """Every slot of the owned partitions, for a layout of the same size in every batch
    (driver/slots.py Slots.layout), where padding is free: a slot read in one partition, or slots
    of one partition each. A transform that needs a Spark partition per range pays a Python
    hand-off per padded range, so its layout follows the batch's plans."""
    shape = slots.shape if slots is not None else None
    if not shape or not (per_slot_reading or max(shape.values()) == 1):
        return None
    return shape


def first_job(jobs: SparkJobs, settings: RunSettings, topic_partitions: dict[str, int]) -> FirstJob | None:
    """The first batch's layout and transform output when this driver owns every input partition
    (one instance: the usual start), so that choosing the protocol and building the first job
    apply the transform once, not twice.

    None where a dry frame decides instead: a single input partition or a single slot (its
    source is then one Spark partition, where even a groupBy plans no shuffle), a transform
    applied every batch (`transform_each_batch`: its job is built each batch anyway), and any
    failure here, which the dry frame meets again and reports."""
    s = settings
    if s.processor.transform_each_batch or sum(topic_partitions.values()) < 2:
        return None
    owned = [(t, p) for t, count in topic_partitions.items() for p in range(count)]
    slots = new_slots(s, jobs.spark)
    try:
        plans = slots.assign([PartitionPlan(t, p, 0, 0, None, transactional_id(s.app_id, t, p))
                              for t, p in owned], owned)
        layout = Slots.layout(plans, fixed_shape(slots, jobs.per_slot_reading))
        per_slot = layout.width > 1 and jobs.per_slot_reading
        if (len(layout.layout) // layout.width if per_slot else len(layout.layout)) < 2:
            return None
        return FirstJob(slots, plans, layout, per_slot, jobs.narrow_output(0, plans, layout, per_slot))
    except Exception:
        return None


class NarrowBatches:
    """The narrow protocol for one run (a `BatchProtocol`)."""

    remembers = True   # the membership answers committed() from the batches it saw commit

    def __init__(self, settings: RunSettings, specs: TaskSpecs, jobs: SparkJobs, pacing: Pacing,
                 echo: Callable[[str], None], first: FirstJob | None = None) -> None:
        self.settings = settings
        self.specs = specs
        self.jobs = jobs
        self.pacing = pacing
        self.echo = echo
        self.slots: Slots | None = None
        self.membership: GroupMembership | None = None
        self.commits: DriverCommits | None = None
        self._batch_id = 0
        # The membership's generation_changes at the end of the last batch, if that batch was
        # clean (None: the next batch's tasks fence all of their slot's ids, docs/architecture.md §3.4).
        self._clean_at: int | None = None
        if first is not None:
            self.slots = first.slots
            try:
                jobs.narrow_job(0, first.plans, first.layout, first.per_slot, first.out)
            except Exception:
                # The first batch builds its job and meets the cause there.
                jobs.forget()
                jobs.per_slot_reading = True

    @property
    def batch_id(self) -> int:
        return self._batch_id

    def describe(self) -> str:
        return "protocol: narrow (each slot's output and input offsets in one transaction)"

    def owes_batch(self, owned: list) -> bool:
        return False

    def start(self, membership: GroupMembership | None) -> None:
        if self.slots is None:
            self.slots = new_slots(self.settings, self.jobs.spark)
        self.echo(f"{self.slots.count} task slots: a batch's ranges are published by one task per slot, "
                  "through the slot's producer, in one transaction")

    def joined(self, membership: GroupMembership) -> None:
        self.membership = membership
        membership.remembers = self.remembers
        self.commits = DriverCommits(self.settings.guarantee, membership)

    @property
    def fence_all_next(self) -> bool:
        """The next batch's tasks fence all of their slot's ids: the first batch, after a failed or
        unclean batch, after a rebalance (docs/architecture.md §3.4)."""
        return self.membership is None or self._clean_at != self.membership.generation_changes

    def next_plans(self, planner: Planner, owned: list[TopicPartition],
                   committed: dict[tuple[str, int], int | None], cap: int) -> list[PartitionPlan]:
        plans = planner.plan(owned, committed, cap)
        return self.slots.assign(plans, [(t.topic, t.partition) for t in owned])

    def run_batch(self, plans: list[PartitionPlan], planned_at: float | None = None) -> BatchReport:
        membership, commits = self.membership, self.commits
        assert membership is not None and commits is not None
        self._batch_id += 1
        batch_id = self._batch_id
        started = time.monotonic()
        commits.before_batch(plans)
        layout = Slots.layout(plans, fixed_shape(self.slots, self.jobs.per_slot_reading))
        fence_all, changes = self.fence_all_next, membership.generation_changes
        self._clean_at = None   # until this batch is known clean
        spec = self.specs.for_publishing(batch_id, plans, membership.group_metadata(),
                                         layout.layout, layout.width, fence_all)
        # A slot's ranges are read in one Python hand-off where the plan keeps every row in the
        # partition it was read in (checks.single_chain) and, with lineage, can carry each row's
        # range tag to the publisher (driver/range_tag.py).
        frame = self.jobs.narrow_job(batch_id, plans, layout, layout.width > 1 and self.jobs.per_slot_reading)
        # What the Spark UI lists for the job: the batch a user finds in the batch lines.
        description = (f"txstream {self.settings.app_id} batch {batch_id} ({len(plans)} partitions in "
                       f"{layout.publishing_tasks} slots, {sum(p.size for p in plans)} records)")
        driver_s = time.monotonic() - (planned_at or started)
        rows = self.jobs.run(lambda: self.jobs.collect(frame, JobSpec(spec.read, spec)), batch_id, description,
                             membership.poll)
        if plans and not rows:
            # No publishing task ran, so nothing was read, published or committed: Spark removed
            # the input from the plan. Remembering the plans' ends as committed would be a lie.
            raise TransformError(
                "the transform's Spark plan reads none of the batch's input (Spark optimised the input "
                "away, e.g. a filter on a constant false): no input offset could be committed and no "
                "undecodable record dead-lettered; filter on the data instead")
        commits.after_batch(plans, rows)
        self.slots.note(rows)
        # Clean: every range published by one attempt's producer, nothing left open or racing;
        # and every plan's end is committed (by its transaction, or by the driver after the acks).
        if all(row["status"] in (COMMITTED, ALREADY_DONE, ACKED) for row in rows):
            self._clean_at = changes
            membership.remember({(p.topic, p.partition): p.end for p in plans}, changes)
        else:
            membership.forget()
        self.pacing.learn(rows)
        return BatchReport(batch_id, plans, rows, time.monotonic() - started, driver_s=driver_s,
                           tables=self.jobs.last_tables)

    def abandon(self, plans: list[PartitionPlan]) -> None:
        """Nothing to do: each slot's next attempt fences the failed one's producers."""

    def dead_letter(self, plan: PartitionPlan, record: DeadLetter) -> None:
        """One transaction of the partition's own transactional.id under exactly-once
        (driver/dead_letters.py)."""
        membership = self.membership
        assert membership is not None
        offset = record.offset
        current = membership.committed([TopicPartition(plan.topic, plan.partition)], fresh=True)
        spec = self.specs.for_publishing(self._batch_id, [plan], membership.group_metadata())
        membership.forget()   # the dead letter commits past its offset
        status = publish_dead_letter(spec, replace(plan, committed=current.get((plan.topic, plan.partition))),
                                     record, membership)
        if status == STALE_PLAN:
            raise InfrastructureError(f"{plan.topic}[{plan.partition}] moved on while isolating offset {offset}")

    def close(self) -> None:
        """Nothing of its own: the tasks' producers are the workers'."""
