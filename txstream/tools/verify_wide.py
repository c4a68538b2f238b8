"""The audit of a wide app's output (docs/wide-transforms.md §8), beside tools/verify.py's.

A wide output record names no source record: it names its batch and unit (`txstream.batch`,
`txstream.unit`) and its publication. The closing transaction of each batch writes one record to
the app's markers topic (`<app>.units`, partition 0): the batch's input ranges and how many records
each unit published. The audit checks, per batch and unit:
- one publication (a second one is a unit published twice: duplicates);
- no repeated position within it;
- as many records as the batch record says (fewer: lost; more: duplicated);
- per batch, with `count_field`: the field summed over the batch's output equals the input
  records in the batch's ranges that were not dead-lettered (an aggregate's counts reconcile);
and that every closed batch's units are in the output. Units of a batch that is not closed yet
(published, the input not yet committed) are reported as pending, not as problems.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from txstream.kafka import headers as hdr

SAMPLES = 20


@dataclass
class UnitSeen:
    publications: set = field(default_factory=set)
    records: int = 0
    positions: set = field(default_factory=set)
    repeated: int = 0
    counted: int = 0        # the count field summed


@dataclass
class WideAudit:
    """Collects wide output records (`add`) and batch records (`add_batch`), then `finish`."""

    count_field: str | None = None
    batches: dict[int, dict] = field(default_factory=dict)
    units: dict[tuple[int, int], UnitSeen] = field(default_factory=dict)
    records: int = 0
    problems: list[str] = field(default_factory=list)
    problem_count: int = 0
    pending_batches: list[int] = field(default_factory=list)
    reconciled_batches: int = 0
    unreadable_counts: int = 0

    @staticmethod
    def lineage(headers: list[tuple[str, bytes]] | None) -> tuple[int, int, bytes | None, bytes | None] | None:
        """(batch, unit, publication, position) of a wide output record, or None."""
        if not headers:
            return None
        found = {k: v for k, v in headers if k in (hdr.BATCH, hdr.UNIT, hdr.PUBLICATION, hdr.PUBLICATION_SEQ)}
        if hdr.BATCH not in found or hdr.UNIT not in found:
            return None
        return int(found[hdr.BATCH]), int(found[hdr.UNIT]), found.get(hdr.PUBLICATION), found.get(hdr.PUBLICATION_SEQ)

    def add(self, lineage: tuple[int, int, bytes | None, bytes | None], value: bytes | None) -> None:
        batch, unit, publication, position = lineage
        seen = self.units.setdefault((batch, unit), UnitSeen())
        self.records += 1
        seen.records += 1
        seen.publications.add(publication)
        if position is not None:
            if (publication, position) in seen.positions:
                seen.repeated += 1
            seen.positions.add((publication, position))
        if self.count_field is not None:
            try:
                seen.counted += int(json.loads(value)[self.count_field])   # type: ignore[arg-type]
            except (TypeError, ValueError, KeyError):
                self.unreadable_counts += 1

    def add_batch(self, value: bytes) -> None:
        record = json.loads(value)
        self.batches[int(record["batch"])] = record

    def _problem(self, text: str) -> None:
        self.problem_count += 1
        if len(self.problems) < SAMPLES:
            self.problems.append(text)

    def finish(self, visible: dict[tuple[str, int], set[int]], dead_offsets: dict[tuple[str, int], set[int]],
               committed: dict[tuple[str, int], int]) -> None:
        """`visible`: the input offsets read per partition; `dead_offsets`: the dead-lettered ones;
        `committed`: the app's committed offsets (a batch ending at or before them is closed)."""
        by_batch: dict[int, dict[int, UnitSeen]] = {}
        for (batch, unit), seen in self.units.items():
            by_batch.setdefault(batch, {})[unit] = seen
        for batch, units in sorted(by_batch.items()):
            record = self.batches.get(batch)
            for unit, seen in sorted(units.items()):
                if len(seen.publications) > 1:
                    self._problem(f"batch {batch} unit {unit}: published by {len(seen.publications)} publications "
                                  f"({seen.records} records): duplicates")
                if seen.repeated:
                    self._problem(f"batch {batch} unit {unit}: {seen.repeated} record(s) repeated within one publication")
            if record is None:
                self.pending_batches.append(batch)
                continue
            expected = {int(k): v for k, v in record["unit_records"].items()}
            for unit in sorted(set(expected) | set(units)):
                got = units[unit].records if unit in units else 0
                if got != expected.get(unit, 0):
                    self._problem(f"batch {batch} unit {unit}: {got} record(s) in the output, the batch record "
                                  f"says {expected.get(unit, 0)}")
            if self.count_field is not None:
                inputs = 0
                for topic, partition, start, end in record["ranges"]:
                    key = (topic, partition)
                    offsets = visible.get(key, set())
                    dead = dead_offsets.get(key, set())
                    inputs += sum(1 for o in offsets if start <= o < end and o not in dead)
                counted = sum(s.counted for s in units.values())
                if counted != inputs:
                    self._problem(f"batch {batch}: the output's {self.count_field} add up to {counted}, the "
                                  f"batch read {inputs} input record(s) (not dead-lettered)")
                else:
                    self.reconciled_batches += 1
        for batch, record in sorted(self.batches.items()):
            if batch not in by_batch and any(v for v in record["unit_records"].values()):
                self._problem(f"batch {batch}: closed with {sum(record['unit_records'].values())} record(s), none "
                              "in the output")

    @property
    def clean(self) -> bool:
        return self.problem_count == 0

    def lines(self) -> list[str]:
        out = [f"wide output: {self.records} record(s) of {len(self.units)} (batch, unit) publications over "
               f"{len({b for b, _ in self.units})} batch(es); {len(self.batches)} closed batch record(s)"]
        if self.count_field is not None:
            out.append(f"wide output: {self.reconciled_batches} batch(es) reconciled ({self.count_field} vs input)"
                       + (f"; {self.unreadable_counts} value(s) without a readable {self.count_field}"
                          if self.unreadable_counts else ""))
        if self.pending_batches:
            out.append(f"wide output: batch(es) {self.pending_batches[:5]} published, not closed yet (pending)")
        out += [f"wide problem: {p}" for p in self.problems]
        if self.problem_count > len(self.problems):
            out.append(f"wide problem: (+{self.problem_count - len(self.problems)} more)")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"records": self.records, "publications": len(self.units), "closed_batches": len(self.batches),
                "pending_batches": self.pending_batches, "reconciled_batches": self.reconciled_batches,
                "problems": self.problems, "problem_count": self.problem_count, "clean": self.clean}
