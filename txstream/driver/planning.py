"""Planning (docs/architecture.md): for each owned partition, the range the next batch publishes.

`start` is the group's committed offset, read stably (a commit pending in an open transaction
is resolved first); with none, `auto.offset.reset` decides. `end` is the last stable offset,
capped. A committed offset that no longer exists (retention deleted it) is reset by the policy
and reported loudly, never skipped silently.
"""
from __future__ import annotations

import logging

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from txstream.errors import NoCommittedOffsetError
from txstream.kafka import lookups
from txstream.kafka.lookups import Partition, Watermarks
from txstream.kafka.retry import retriable
from txstream.task.spec import PartitionPlan

log = logging.getLogger("txstream")


def transactional_id(app_id: str, topic: str, partition: int) -> str:
    """Stable per input partition, so a retried or speculative attempt fences the earlier one."""
    return f"{app_id}-{topic}-{partition}"


def watermarks(admin: AdminClient, partitions: list[TopicPartition], timeout: float = 30) -> dict[Partition, Watermarks]:
    """The owned partitions' watermarks (txstream.kafka.lookups), keyed (topic, partition).

    A leader that just moved answers FENCED_LEADER_EPOCH & co.: ask again briefly; if it
    persists, the driver starts a new admin client (its metadata is stale)."""
    if not partitions:
        return {}
    return retriable(lambda: lookups.watermarks(admin, [(tp.topic, tp.partition) for tp in partitions],
                                                timeout, retry_s=0), 5)


class Planner:
    def __init__(self, admin: AdminClient, app_id: str, auto_offset_reset: str, cap: int) -> None:
        self.admin = admin
        self.app_id = app_id
        self.auto_offset_reset = auto_offset_reset
        self.cap = cap
        self.warnings: list[str] = []
        self.marks: dict[tuple[str, int], Watermarks] = {}   # the last plan's (driver/metrics.py)
        # auto.offset.reset=latest picks a partition's start once, when first planned without a
        # committed offset, and keeps it until something is committed (as a consumer's position
        # does): records produced after that moment are processed, not skipped by a later reset.
        self._reset_positions: dict[tuple[str, int], int] = {}

    def plan(self, owned: list[TopicPartition], committed: dict[tuple[str, int], int | None],
             cap: int | None = None) -> list[PartitionPlan]:
        """Plans for partitions with something to do, in a stable order."""
        marks = self.marks = watermarks(self.admin, owned)
        cap = cap or self.cap
        missing = [f"{t}[{p}]" for (t, p), c in sorted(committed.items()) if c is None]
        if missing and self.auto_offset_reset == "none":
            raise NoCommittedOffsetError(
                f"auto.offset.reset=none and the group {self.app_id!r} has no committed offset for "
                f"{', '.join(missing)}. Set one with `txstream offsets reset --app-id {self.app_id} "
                "--to-earliest --execute` (or choose --auto-offset-reset earliest|latest).")
        plans = []
        for tp in sorted(owned, key=lambda t: (t.topic, t.partition)):
            key = (tp.topic, tp.partition)
            mark = marks[key]
            done = committed.get(key)
            start = done
            if done is None:
                if self.auto_offset_reset == "earliest":
                    start = mark.earliest
                elif key in self._reset_positions and mark.earliest <= self._reset_positions[key] <= mark.last_stable:
                    start = self._reset_positions[key]
                else:
                    start = self._reset_positions[key] = mark.last_stable
                    self.warnings.append(
                        f"{tp.topic}[{tp.partition}]: no committed offset; starting at the last stable offset "
                        f"{start} (auto.offset.reset=latest): the {start - mark.earliest} record(s) before it "
                        "are not processed")
            elif done < mark.earliest or done > mark.last_stable:
                start = mark.earliest if self.auto_offset_reset != "latest" else mark.last_stable
                if self.auto_offset_reset == "none":
                    raise NoCommittedOffsetError(
                        f"{tp.topic}[{tp.partition}]: committed offset {done} is out of range "
                        f"[{mark.earliest}, {mark.last_stable}] and auto.offset.reset=none. Move it with `txstream offsets "
                        f"reset --app-id {self.app_id} --topic {tp.topic}:{tp.partition} --to-earliest --execute` "
                        "(or choose --auto-offset-reset earliest|latest).")
                message = (f"WARNING {tp.topic}[{tp.partition}]: committed offset {done} is out of range "
                           f"[{mark.earliest}, {mark.last_stable}] (deleted by retention, or the topic was "
                           f"recreated); resetting to {start} by auto.offset.reset={self.auto_offset_reset}")
                log.info(message)  # the driver prints it (echo): once, loudly
                self.warnings.append(message)
            else:
                self._reset_positions.pop(key, None)
            end = min(mark.last_stable, start + cap)
            if end > start or (done != start and end >= start and done is not None):
                plans.append(PartitionPlan(tp.topic, tp.partition, start, end, done,
                                           transactional_id(self.app_id, tp.topic, tp.partition)))
        return plans
