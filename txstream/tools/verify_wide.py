"""The audit of a wide app's output (docs/wide-transforms.md §8), beside tools/verify.py's.

A wide output record names no source record: it names its app, batch and unit (`txstream.app`,
`txstream.batch`, `txstream.unit`), its publication and its position (tools/verify.py checks
the positions of every publication). The closing transaction of each batch writes one record to
the app's markers topic (`<app>.units`, partition 0): the batch's input ranges and how many
records each unit published. The audit checks, per app, batch and unit:
- one publication per closing of the batch (a second one is a unit published twice: duplicates);
- as many records as the batch record says (fewer: lost; more: duplicated);
- per batch, with `count_field`: the field summed over the batch's output against the input
  records in the batch's ranges that were not dead-lettered. More is a duplicate; fewer is what a
  filtering transform leaves (reported, not a problem);
and that every closed batch's units are in the output. Units of a batch that is not closed yet
(published, the input not yet committed) are reported as pending, not as problems.

A batch closed twice (its id reused after `txstream offsets reset`: the plan log restarts) is a
replay: each closing publishes each unit once, so it is told apart from a duplicate. Batches whose
input ranges overlap an earlier batch's of the same app are reported as replays too.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from txstream.kafka import headers as hdr
from txstream.records import BatchRecord, StateFacts, read_markers

SAMPLES = 20


class WideLineage(NamedTuple):
    app: str | None          # None: the record names no app (the --app-id given, if any)
    batch: int
    unit: int
    publication: bytes | None
    position: bytes | None


@dataclass
class UnitSeen:
    publications: set = field(default_factory=set)
    records: int = 0
    counted: int = 0        # the count field summed


@dataclass
class WideAudit:
    """Collects wide output records (`add`) and batch records (`add_batch`), then `finish`."""

    count_field: str | None = None
    # (app, batch) -> its batch records (one per closing: two after a replay of the batch id)
    batches: dict[tuple[str | None, int], list[BatchRecord]] = field(default_factory=dict)
    units: dict[tuple[str | None, int, int], UnitSeen] = field(default_factory=dict)
    records: int = 0
    dead_letters: int = 0              # late rows dead-lettered in a stateful unit's transaction
    # Stateful output (docs/state.md): (app, batch, unit, state key, its expiry in ms for a
    # deduplicated key) of each output record naming one.
    emissions: list[tuple[str | None, int, int, bytes, int | None]] = field(default_factory=list)
    expired_again: int = 0             # deduplicated keys emitted again after their expiry (not duplicates)
    expired_samples: list[str] = field(default_factory=list)
    state_batches: int = 0             # batches whose state facts were checked
    state_reconciled: int = 0          # ... whose rows merged + late + dead letters = rows read
    changelogs_checked: int = 0        # stateful operators whose changelog was checked against the markers
    problems: list[str] = field(default_factory=list)
    problem_count: int = 0
    pending_batches: list[str] = field(default_factory=list)
    reconciled_batches: int = 0
    reconciled_states: int = 0         # --count-field: stateful apps' lives reconciled (append mode)
    open_records: int = 0              # ... rows merged into what was not emitted yet (open windows)
    filtered_batches: int = 0          # --count-field: output counts below the input's
    filtered_records: int = 0
    replays: list[str] = field(default_factory=list)
    unreadable_counts: int = 0
    unreconciled_batches: int = 0
    audited_end: dict = field(default_factory=dict)

    @staticmethod
    def lineage(headers: list[tuple[str, bytes]] | None) -> WideLineage | None:
        """The wide lineage of an output record, or None."""
        if not headers:
            return None
        found = {k: v for k, v in headers if k in (hdr.APP, hdr.BATCH, hdr.UNIT, hdr.PUBLICATION, hdr.PUBLICATION_SEQ)}
        if hdr.BATCH not in found or hdr.UNIT not in found:
            return None
        try:
            batch, unit = int(found[hdr.BATCH]), int(found[hdr.UNIT])
        except ValueError:
            return None
        app = found[hdr.APP].decode(errors="replace") if hdr.APP in found else None
        return WideLineage(app, batch, unit, found.get(hdr.PUBLICATION), found.get(hdr.PUBLICATION_SEQ))

    @property
    def apps(self) -> set[str]:
        """The apps the wide output names."""
        return {app for app, _, _ in self.units if app is not None}

    def add(self, lineage: WideLineage, value: bytes | None, state_key: bytes | None = None,
            expires: bytes | None = None, dead_letter: bool = False) -> None:
        """One record of the wide lineage; `dead_letter`: a late row a stateful unit dead-lettered in
        its transaction (counted in the unit's records, not as an output nor in the count field)."""
        if dead_letter:
            seen = self.units.setdefault((lineage.app, lineage.batch, lineage.unit), UnitSeen())
            seen.records += 1
            seen.publications.add(lineage.publication)
            self.dead_letters += 1
            return
        if state_key is not None:
            try:
                expires_ms = int(expires) if expires is not None else None
            except ValueError:
                expires_ms = None
            self.emissions.append((lineage.app, lineage.batch, lineage.unit, state_key, expires_ms))
        seen = self.units.setdefault((lineage.app, lineage.batch, lineage.unit), UnitSeen())
        self.records += 1
        seen.records += 1
        seen.publications.add(lineage.publication)
        if self.count_field is not None:
            try:
                seen.counted += int(json.loads(value)[self.count_field])   # type: ignore[arg-type]
            except (TypeError, ValueError, KeyError):
                self.unreadable_counts += 1

    def add_batch(self, app: str | None, value: bytes, offset: int = -1) -> None:
        """A batch record's value, read at `offset` of the app's markers topic."""
        record = BatchRecord.decode(value, offset)
        self.batches.setdefault((app, record.batch), []).append(record)

    def keep_batches(self, keep) -> None:
        """Only the batch records `keep(app, batch, record)` accepts (those inside the snapshot)."""
        self.batches = {k: kept for k, records in self.batches.items()
                        if (kept := [r for r in records if keep(k[0], k[1], r)])}

    def problem(self, text: str) -> None:
        self._problem(text)

    def _problem(self, text: str) -> None:
        self.problem_count += 1
        if len(self.problems) < SAMPLES:
            self.problems.append(text)

    def finish(self, visible: dict[tuple[str, int], set[int]], dead_offsets: dict[tuple[str, int], set[int]],
               audited_end: dict[tuple[str, int], int], default_app: str | None = None) -> None:
        """`visible`: the input offsets read per partition, up to `audited_end`; `dead_offsets`: the
        dead-lettered ones. Output records that name no app belong to `default_app` (--app-id)."""
        self.audited_end = audited_end
        by_batch: dict[tuple[str | None, int], dict[int, UnitSeen]] = {}
        for (app, batch, unit), seen in self.units.items():
            by_batch.setdefault((app or default_app, batch), {})[unit] = seen
        self._replays()
        state_counts: dict[tuple[str | None, str | None], list] = {}   # (app, epoch) -> [counted, merged, checkable]
        for (app, _batch), records in self.batches.items():
            for record in records:
                if record.state is not None:
                    life = state_counts.setdefault((app or default_app, record.state.epoch), [0, 0, True])
                    life[1] += sum(record.state.unit_merged.values())
        for (app, batch), units in sorted(by_batch.items(), key=lambda kv: (kv[0][0] or "", kv[0][1])):
            name = _name(app, batch)
            records = self.batches.get((app, batch), [])
            closings = max(1, len(records))
            for unit, seen in sorted(units.items()):
                if len(seen.publications) > closings:
                    self._problem(f"{name} unit {unit}: published by {len(seen.publications)} publications "
                                  f"({seen.records} records), closed {len(records)} time(s): duplicates")
            if not records:
                self.pending_batches.append(name)
                continue
            expected: dict[int, int] = {}
            for record in records:
                for k, v in record.unit_records.items():
                    expected[k] = expected.get(k, 0) + v
            for unit in sorted(set(expected) | set(units)):
                got = units[unit].records if unit in units else 0
                if got != expected.get(unit, 0):
                    self._problem(f"{name} unit {unit}: {got} record(s) in the output, the batch record "
                                  f"says {expected.get(unit, 0)}")
            if self.count_field is not None and any(r.state is not None for r in records):
                # A stateful batch emits what the state holds (windows its watermark closed, from rows of
                # earlier batches): reconciled over the state's life below, not batch by batch.
                life = next(r.state for r in records if r.state is not None)
                totals = state_counts.setdefault((app, life.epoch), [0, 0, True])
                totals[0] += sum(s.counted for s in units.values())
                totals[2] &= life.output_mode == "append" and life.rows_once
            elif self.count_field is not None:
                self._reconcile(name, records, units, visible, dead_offsets)
        if self.count_field is not None:
            self._reconcile_state(state_counts)
        for (app, batch), records in sorted(self.batches.items(), key=lambda kv: (kv[0][0] or "", kv[0][1])):
            closed = sum(v for r in records for v in r.unit_records.values())
            if (app, batch) not in by_batch and closed:
                self._problem(f"{_name(app, batch)}: closed with {closed} record(s), none in the output")
        self._state(visible, dead_offsets, default_app)

    def _state(self, visible: dict[tuple[str, int], set[int]], dead_offsets: dict[tuple[str, int], set[int]],
               default_app: str | None) -> None:
        """Stateful apps (their batch records carry `state`): each window or deduplicated key
        emitted once in append mode (a deduplicated key again only after the watermark passed the
        expiry its record names), and not before the watermark closed its window; in update
        mode a key at most once per batch and never after its window closed; per batch, the rows
        merged, the late rows and the undecodable records add up to no more than the rows read."""
        from txstream.state.keys import decode_key

        facts: dict[tuple[str | None, int], StateFacts] = {
            (app or default_app, batch): r.state for (app, batch), rs in self.batches.items() for r in rs if r.state}
        if not facts:
            return
        seen: dict[tuple, list[tuple[int, int | None]]] = {}
        for app, batch, _unit, key, expires in self.emissions:
            state = facts.get((app or default_app, batch))
            if state is None:
                continue
            mode, windowed = state.output_mode, state.kind in ("window", "session")
            # Keyed by the state's epoch too: a `state reset` starts every key over (docs/state.md).
            slot = (app, state.epoch, key) if mode == "append" else (app, state.epoch, key, batch)
            seen.setdefault(slot, []).append((batch, expires if state.kind == "dedup" else None))
            watermark = state.watermark_ms
            if windowed and watermark is not None:
                _values, (_start, end) = decode_key(key, windowed=True)
                if state.kind == "session":   # a session's bounds are microseconds (state format 4)
                    end = -(-end // 1000)
                if mode == "append" and end > watermark:
                    self._problem(f"{_name(app, batch)}: a window ending at {end} emitted before the watermark "
                                  f"({watermark}) closed it")
                elif mode == "update" and end <= watermark:
                    self._problem(f"{_name(app, batch)}: a window ending at {end} updated after the watermark "
                                  f"({watermark}) closed it")
        for slot, emitted in seen.items():
            if len(emitted) < 2:
                continue
            emitted.sort(key=lambda e: e[0])
            again = [b for (b1, expires), (b, _) in zip(emitted, emitted[1:], strict=False)
                     if not self._expired_between(facts, slot[0] or default_app, b1, b, expires)]
            if again:
                batches = [b for b, _ in emitted]
                what = "emitted" if len(slot) == 3 else "updated"
                self._problem(f"{_name(slot[0], batches[0])}: state key {slot[2][:60]!r} {what} {len(batches)} times "
                              f"(batches {batches[:5]})")
            else:
                self.expired_again += 1
                if len(self.expired_samples) < SAMPLES:
                    self.expired_samples.append(f"{slot[2][:60]!r} (batches {[b for b, _ in emitted][:5]})")
        # Each closing's own facts against its own ranges: a batch id may close twice (a batch with
        # no records that moved no marker, then the first batch after a `state reset`).
        closings = [(app or default_app, batch, r) for (app, batch), rs in self.batches.items() for r in rs if r.state]
        for app, batch, record in sorted(closings, key=lambda c: (c[0] or "", c[1], c[2].offset)):
            state = record.state
            read = 0
            for topic, partition, start, end in record.ranges:
                if end > self.audited_end.get((topic, partition), end):
                    read = -1
                    break
                offsets = visible.get((topic, partition), set())
                read += sum(1 for o in offsets if start <= o < end)
            if read < 0 or not state.rows_once:
                continue
            self.state_batches += 1
            accounted = sum(state.unit_merged.values()) + sum(state.unit_late.values()) + record.dead_letters
            if accounted > read:
                self._problem(f"{_name(app, batch)}: {accounted} rows merged, late or dead-lettered, more than the "
                              f"{read} record(s) the batch read: rows counted twice")
            elif accounted == read:
                self.state_reconciled += 1

    @staticmethod
    def _expired_between(facts: dict, app: str | None, first: int, then: int, expires: int | None) -> bool:
        """A deduplicated key emitted in batch `first`, expiring at `expires`, was forgotten before
        batch `then` emitted it again: some batch from `first` to `then - 1` ran with a watermark at
        or past its expiry (the merge forgets what the watermark reached after merging the batch's
        rows: task/state_unit.py). Without an expiry (no watermark) a key is never forgotten."""
        if expires is None or then == first:
            return False
        return any((state := facts.get((app, b))) is not None and state.watermark_ms is not None
                   and state.watermark_ms >= expires
                   for b in range(first, then))

    def _reconcile(self, name: str, records: list[BatchRecord], units: dict[int, UnitSeen],
                   visible: dict[tuple[str, int], set[int]], dead_offsets: dict[tuple[str, int], set[int]]) -> None:
        inputs = 0
        for record in records:
            for topic, partition, start, end in record.ranges:
                if end > self.audited_end.get((topic, partition), end):
                    self.unreconciled_batches += 1   # read beyond the audited range (before an offsets reset)
                    return
                offsets = visible.get((topic, partition), set())
                dead = dead_offsets.get((topic, partition), set())
                inputs += sum(1 for o in offsets if start <= o < end and o not in dead)
        counted = sum(s.counted for s in units.values())
        if counted > inputs:
            self._problem(f"{name}: the output's {self.count_field} add up to {counted}, more than the "
                          f"{inputs} input record(s) the batch read (not dead-lettered): duplicates")
        elif counted < inputs:
            # A transform that filters before it counts: fewer is its filter, not a loss we can see.
            self.filtered_batches += 1
            self.filtered_records += inputs - counted
        else:
            self.reconciled_batches += 1

    def _reconcile_state(self, state_counts: dict[tuple[str | None, str | None], list]) -> None:
        """A stateful app's count field over the state's life (one epoch: `state reset` starts a new
        one): in append mode each window or key is emitted once with every row merged into it, so the
        counts add up to at most the rows merged (fewer: windows still open). Update mode emits a key
        again with its running count, and a hopping window counts a row in several: not checkable."""
        for (app, epoch), (counted, merged, checkable) in sorted(state_counts.items(), key=lambda kv: str(kv[0])):
            if not checkable:
                continue
            where = f"{app or 'the app'}'s state" + (f" (epoch {epoch})" if epoch else "")
            if counted > merged:
                self._problem(f"{where}: the output's {self.count_field} add up to {counted}, more than the "
                              f"{merged} row(s) its batches merged: duplicates")
            else:
                self.reconciled_states += 1
                self.open_records += merged - counted

    def _replays(self) -> None:
        """Batches of one app whose ranges overlap an earlier closing's: an offsets reset re-read them."""
        by_app: dict[str | None, list[tuple[int, int, BatchRecord]]] = {}
        for (app, batch), records in self.batches.items():
            for record in records:
                by_app.setdefault(app, []).append((record.time_ms, batch, record))
        for app, closings in by_app.items():
            read: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
            for _, batch, record in sorted(closings, key=lambda c: (c[0], c[1])):
                earlier = set()
                for topic, partition, start, end in record.ranges:
                    for s, e, b in read.get((topic, partition), []):
                        if start < e and s < end:
                            earlier.add(b)
                    read.setdefault((topic, partition), []).append((start, end, batch))
                if earlier:
                    self.replays.append(f"{_name(app, batch)} re-read input of batch(es) {sorted(earlier)[:5]}")

    @property
    def clean(self) -> bool:
        return self.problem_count == 0

    def lines(self) -> list[str]:
        out = [f"wide output: {self.records} record(s) of {len(self.units)} (batch, unit) publications over "
               f"{len({(a, b) for a, b, _ in self.units})} batch(es); "
               f"{sum(len(r) for r in self.batches.values())} closed batch record(s)"]
        if self.count_field is not None:
            out.append(f"wide output: {self.reconciled_batches} batch(es) reconciled ({self.count_field} vs input)"
                       + (f"; {self.unreadable_counts} value(s) without a readable {self.count_field}"
                          if self.unreadable_counts else ""))
            if self.reconciled_states:
                out.append(f"state: {self.reconciled_states} state(s) reconciled ({self.count_field} of every emission "
                           f"vs rows merged; {self.open_records} row(s) in what is not emitted yet)")
            if self.unreconciled_batches:
                out.append(f"wide output: {self.unreconciled_batches} batch(es) not reconciled: they read input "
                           "beyond the audited range (batches from before an offsets reset)")
            if self.filtered_batches:
                out.append(f"wide output: in {self.filtered_batches} batch(es) the {self.count_field} add up to "
                           f"{self.filtered_records} fewer than the input records: the transform filters them out "
                           "(not a duplicate, and not a loss verify can see)")
        if self.state_batches:
            out.append(f"state: {len(self.emissions)} emission(s) named their state key; {self.state_batches} "
                       f"batch(es) checked, {self.state_reconciled} with rows merged + late + dead-lettered = rows "
                       "read (fewer: the transform filters before its stateful operator); "
                       f"{self.changelogs_checked} changelog(s) checked against the markers")
        if self.expired_again:
            out.append(f"state: {self.expired_again} deduplicated key(s) emitted again after it expired (the watermark "
                       f"passed its expiry in between: not duplicates): {'; '.join(self.expired_samples[:5])}")
        if self.replays:
            out.append(f"wide output: {len(self.replays)} replayed batch(es) (input read again after an offsets "
                       f"reset: not duplicates): {'; '.join(self.replays[:5])}")
        if self.pending_batches:
            out.append(f"wide output: {', '.join(self.pending_batches[:5])} published, not closed yet (pending)")
        out += [f"wide problem: {p}" for p in self.problems]
        if self.problem_count > len(self.problems):
            out.append(f"wide problem: (+{self.problem_count - len(self.problems)} more)")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"records": self.records, "publications": len(self.units),
                "closed_batches": sum(len(r) for r in self.batches.values()),
                "pending_batches": self.pending_batches, "reconciled_batches": self.reconciled_batches,
                "filtered_batches": self.filtered_batches, "filtered_records": self.filtered_records,
                "replays": self.replays, "problems": self.problems, "problem_count": self.problem_count,
                "state_emissions": len(self.emissions), "state_batches": self.state_batches,
                "state_reconciled": self.state_reconciled, "state_expired_again": self.expired_again,
                "clean": self.clean}


def changelog_problems(clients: Any, app: str, operator: str, units: int, timeout: float) -> tuple[int, list[str]]:
    """The changelog consistent with the markers (docs/state.md, "The invariant"): no unit's
    changelog holds a record of a batch its marker does not name as published. Returns the
    records read and the problems."""
    from txstream.state import partition
    from txstream.state.changelog import HeaderReader, changelog_topic
    topic = changelog_topic(app, operator)
    markers = read_markers(clients, app, units, timeout)
    problems: list[str] = []
    seen = {"records": 0}
    with partition.reader(clients, app) as reader:
        for unit in range(units):
            headers, newest = HeaderReader(operator, unit, topic), [0]

            def take(records: list, headers: HeaderReader = headers, newest: list = newest) -> None:
                seen["records"] += len(records)
                newest[0] = max([newest[0], *(headers.batch_of(r) for r in records)])

            low, _high = partition.bounds(reader, topic, unit, timeout)
            partition.read_to_end(reader, topic, unit, low, take, timeout)
            done = markers[unit].done_through
            if newest[0] > done:
                problems.append(f"{topic}[{unit}] holds records of batch {newest[0]}, but unit {unit}'s marker says "
                                f"it published batch {done} last: state ahead of its marker")
    return seen["records"], problems


def _name(app: str | None, batch: int) -> str:
    return f"batch {batch}" if app is None else f"{app} batch {batch}"
