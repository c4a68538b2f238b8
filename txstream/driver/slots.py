"""Slots: how a narrow batch's ranges are grouped into publishing tasks (docs/architecture.md §3.4).

One task per input partition would pay, per partition and batch, a Spark task, two Python
hand-offs, a producer (and its `init_transactions` whenever the task landed on another Python
worker) and a transaction: a batch's cost would grow with its partitions, not its records. Kafka
Streams' exactly_once_v2 (KIP-447) answers the same problem with one producer per thread for
all its partitions. Here: a batch has one publishing task per *slot* (by default as many slots as
Spark has cores), a slot's ranges are read one after another inside its task and published
through the slot's producer in one transaction with all their end offsets.

Zombie fencing, the argument (docs/architecture.md §3.4 says it in full):
- A partition's slot is its position among the partitions this instance owns, modulo the slot
  count (fixed for the run). The owned set changes only with the group's generation, so within a
  generation every attempt at a range (a retry, a speculative copy, a re-plan after a failed
  batch) runs under the slot's ids, and an attempt that initialises them fences the earlier
  attempt, whose re-check then finds the range done.
- Across generations (a rebalance, a restarted driver) a partition may move to another slot or
  another instance: the earlier attempt's `send_offsets_to_transaction` carries the earlier
  generation and is refused (ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID), so its transaction
  cannot commit those offsets; and what it committed before the new generation's plan is what
  that plan starts from (offsets are read stably, KIP-447).
- A slot's `transactional.id`s are its first partition's, `<app>-<topic>-<partition>`, and
  that id with `~1`... (`--producers-per-slot`): two instances of an app own different
  partitions, so their slots never fence each other; and a restarted driver that owns what the
  dead one owned fences all of the same ids in its first batch, which aborts what the dead one
  left open (read_committed consumers would otherwise wait for its transaction timeout).
- Several ids per slot: Spark hands a slot's task to whichever Python worker is idle, so with one
  id a task would pay `init_transactions` whenever the slot last ran on another worker. With several, a worker keeps
  publishing through the id it holds; which attempts may skip the init and why the rest fence
  all ids is docs/architecture.md §3.4 (a).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from txstream.driver.planning import transactional_id
from txstream.task.spec import PartitionPlan


@dataclass(frozen=True)
class SlotLayout:
    """Reading task k reads plan layout[k] (-1: padding); publishing task j covers reading
    tasks [j * width, (j + 1) * width): Spark's `coalesce` without a shuffle groups a parent's
    partitions into equal consecutive runs when they have no preferred hosts."""

    layout: tuple[int, ...]
    width: int

    @property
    def publishing_tasks(self) -> int:
        return len(self.layout) // self.width if self.width else 0


def slot_pool(base: str, producers: int) -> tuple[str, ...]:
    """A slot's transactional.ids: its first partition's id, then `<id>~1` ... `<id>~(n-1)`."""
    return (base, *(f"{base}~{i}" for i in range(1, producers)))


class Slots:
    """The run's slots: which transactional.ids publish which partition, and which of a slot's
    ids a task that holds no producer of the slot initialises this batch (its claim id)."""

    def __init__(self, app_id: str, count: int, producers: int = 1) -> None:
        if count < 1:
            raise ValueError(f"task slots must be at least 1, not {count}")
        if producers < 1:
            raise ValueError(f"producers per slot must be at least 1, not {producers}")
        self.app_id, self.count, self.producers = app_id, count, producers
        self._used: dict[str, int] = {}   # transactional.id -> the batch that last published through it
        self._batches = 0
        self.shape: dict[str, int] = {}   # each slot of the owned partitions (its first id) -> partitions it owns

    def assign(self, plans: list[PartitionPlan], owned: list[tuple[str, int]]) -> list[PartitionPlan]:
        """The plans, each with its slot's ids (named after its first owned partition) and the
        batch's claim id: the slot's id used least recently (most likely held by no worker)."""
        ordered = sorted(owned)
        # Each owned partition's slot, named by the slot's first partition's id.
        slot_of = {key: transactional_id(self.app_id, *ordered[i % self.count]) for i, key in enumerate(ordered)}
        self.shape = dict(Counter(slot_of.values()))
        assigned = []
        for p in plans:
            key = (p.topic, p.partition)
            pool = slot_pool(slot_of.get(key) or transactional_id(self.app_id, *key), self.producers)
            claim = min(pool, key=lambda tid: self._used.get(tid, -1))   # ties: the first
            assigned.append(replace(p, transactional_id=claim, pool=pool if len(pool) > 1 else ()))
        return assigned

    def note(self, rows: list[dict]) -> None:
        """A finished batch's results: which ids published (task/result.py)."""
        self._batches += 1
        for row in rows:
            if row.get("transactional_id"):
                self._used[row["transactional_id"]] = self._batches

    @staticmethod
    def layout(plans: list[PartitionPlan], shape: dict[str, int] | None = None) -> SlotLayout:
        """Group the plans by slot (their ids) into equal-width runs of reading tasks.

        With `shape` (`Slots.shape`: every slot of the owned partitions and how many it owns),
        every slot, as wide as the widest, whether its partitions have records this batch or
        not. The batch's Spark job is built for its layout's size (driver/jobs.py), so without
        it a sparse stream, a different set of partitions with records in every batch, would
        build a job every batch. A slot of padding only reads and
        publishes nothing (task/publish.py publish_slot)."""
        groups: dict[str, list[int]] = {}
        for index, plan in enumerate(plans):
            groups.setdefault(plan.transactional_ids[0], []).append(index)
        width = max((len(g) for g in groups.values()), default=1)
        if shape and set(groups) <= set(shape):
            for tid in shape:
                groups.setdefault(tid, [])
            width = max(width, *shape.values())
        layout: list[int] = []
        for tid in sorted(groups):
            members = groups[tid]
            layout += members + [-1] * (width - len(members))
        return SlotLayout(tuple(layout), width)
