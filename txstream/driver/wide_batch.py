"""One wide batch as the driver plans and runs it: its id, units, time, plans, and what a
stateful batch adds (watermarks, state facts, merge spec); the table version it joins against.
Its own module so that the protocol (driver/wide.py) and the stateful layer it composes
(driver/stateful.py) both use it without importing each other."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from txstream.records import PlanShare, StateFacts
from txstream.task.spec import PartitionPlan
from txstream.task.tables import TableVersion, encode_versions


@dataclass
class WideBatch:
    batch_id: int
    units: int
    timestamp_ms: int
    plans: list[PartitionPlan]
    recovered: bool   # re-running a logged plan found pending at start or after a failure
    watermark_ms: int | None = None   # a stateful batch's (driver/stateful.py): what its state closes by
    late_ms: int | None = None        # ... and what its late rows are judged by (the previous batch's)
    state: StateFacts | None = None   # a stateful batch's facts for its record (`txstream verify` reads them)
    merge: Any = None                 # a stateful batch's merge spec (operators/base.py MergeSpec), for its job
    tables: tuple[TableVersion, ...] | None = None   # the version of the processor's tables it joins against

    def share(self, end: int) -> PlanShare:
        """This batch's share of the plan log for a partition ending at `end`."""
        return PlanShare(self.batch_id, end, self.units, self.timestamp_ms, self.watermark_ms, self.late_ms,
                         encode_versions(self.tables) if self.tables else None)

    @property
    def plan_id(self) -> str:
        """The plan's digest, which each unit's marker names. Empty ranges are left out: a re-run
        from the log lists every partition, also those the first attempt had nothing to read in."""
        text = ";".join(f"{p.topic}:{p.partition}:{p.start}:{p.end}" for p in self.plans if p.end > p.start)
        return hashlib.sha1(f"{self.batch_id};{self.units};{self.timestamp_ms};{text}".encode()).hexdigest()[:12]
