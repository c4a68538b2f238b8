"""Audit exactly-once from the topics alone: every output names where it came from.

`audit()` reads the input, output and dead-letter topics with `isolation.level=read_committed`
from the beginning up to their last stable offsets (taken once, at the start: the audit is a
snapshot), and checks:
- per publication (one Kafka transaction's records of one range or unit), that no
  (publication, position) repeats, whichever topic or partition the repeat is in, and that its
  positions are contiguous from 0 (a missing one: a lost record, or a topic of the app not given);
- per source partition, that each source record in the audited range was published by one
  publication (not two: duplicates) and, for 1:1 processors, by at least one (gaps). This needs
  the source offset in the lineage; a record without it is audited by position alone.
Lineage comes from the headers in `txstream.kafka.headers`; wide output is audited per batch and
unit (tools/verify_wide.py).

The audited range of a source partition is `[log start, end)` where `end` is the app's committed
offset (its consumer group) when an app id is given, else the input's last stable offset.

Reading stops on position, never on a count (txstream.kafka.scan): transactional topics have
offset gaps (commit and abort markers, aborted records that read_committed never delivers).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from confluent_kafka import IsolationLevel
from confluent_kafka.admin import OffsetSpec

from txstream.errors import AuditError, KafkaFailure
from txstream.kafka import headers as hdr
from txstream.kafka.config import KafkaClients, as_clients
from txstream.kafka.lookups import admin_client, cluster_topics, committed_offsets, list_offsets, watermarks
from txstream.kafka.scan import scan
from txstream.records import MARKERS_SUFFIX, BatchRecord
from txstream.tools.verify_wide import WideAudit, changelog_problems

SAMPLES = 20  # offsets listed per partition and problem kind; counts are always complete
# Big fetches: an audit reads whole topics.
_FETCH = {"fetch.max.bytes": 64 * 1024 * 1024, "max.partition.fetch.bytes": 8 * 1024 * 1024,
          "queued.min.messages": 200_000}


@dataclass
class PartitionAudit:
    """One source partition: what was consumed in the audited range and what became of it."""

    topic: str
    partition: int
    start: int                    # audited range [start, end) in source offsets
    end: int
    consumed: int = 0             # source records visible under read_committed in the range
    outputs: int = 0              # output records tracing back to this partition
    dead_lettered: int = 0        # dead-letter records tracing back to it
    duplicates: int = 0           # source offsets published twice, and repeated records without an offset
    gaps: int = 0                 # --one-to-one: source offsets with no output, no dead letter
    unexpected: int = 0           # outputs/dead letters naming this partition outside the range
    without_offset: int = 0       # of the outputs and dead letters: lineage without a source offset
    duplicate_offsets: list[int] = field(default_factory=list)   # first SAMPLES of each
    gap_offsets: list[int] = field(default_factory=list)
    unexpected_offsets: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.topic}[{self.partition}]"


@dataclass
class Publications:
    """Every publication's positions, over all the audited topics: a repeated (publication,
    position) is a duplicate record wherever it lies; positions missing below a publication's
    highest are records the audit did not find."""

    positions: dict[bytes, set[int]] = field(default_factory=dict)
    first_seen: dict[tuple[bytes, int], str] = field(default_factory=dict)
    repeats: int = 0
    repeat_samples: list[str] = field(default_factory=list)
    incomplete: int = 0
    incomplete_samples: list[str] = field(default_factory=list)

    def add(self, publication: bytes | None, position: bytes | None, msg: Any) -> bool:
        """Note the record `msg` (a consumed message); True when it repeats one seen."""
        if publication is None or position is None:
            return False
        try:
            pos = int(position)
        except ValueError:
            return False
        seen = self.positions.setdefault(publication, set())
        if pos not in seen:
            seen.add(pos)
            if len(self.first_seen) < 100_000:
                self.first_seen[(publication, pos)] = _where(msg)
            return False
        self.repeats += 1
        if len(self.repeat_samples) < SAMPLES:
            first = self.first_seen.get((publication, pos))
            self.repeat_samples.append(f"{_where(msg)} repeats publication {publication.decode(errors='replace')} "
                                       f"position {pos}" + (f" (first at {first})" if first else ""))
        return True

    def finish(self) -> None:
        for publication, seen in self.positions.items():
            missing = max(seen) + 1 - len(seen)
            if missing:
                self.incomplete += 1
                if len(self.incomplete_samples) < SAMPLES:
                    absent = sorted(set(range(max(seen) + 1)) - seen)
                    more = f" (+{missing - 5} more)" if missing > 5 else ""
                    self.incomplete_samples.append(f"publication {publication.decode(errors='replace')}: positions "
                                                   f"{', '.join(map(str, absent[:5]))}{more} not found")


@dataclass
class AuditReport:
    inputs: list[str]
    outputs: list[str]
    dead_letter: list[str]
    app_id: str | None
    one_to_one: bool
    partitions: list[PartitionAudit]
    # Outputs whose lineage names a topic/partition that is not an audited input partition.
    unexpected_elsewhere: int = 0
    unexpected_elsewhere_samples: list[tuple[str, int, int | None]] = field(default_factory=list)
    # Output / dead-letter records with no txstream lineage header at all: written outside
    # txstream (or with --no-lineage), so they cannot be audited.
    without_lineage: int = 0
    # Output / dead-letter records with lineage but no publication id (only --one-to-one can
    # tell their duplicates apart from a fan-out).
    without_publication: int = 0
    # Partitions whose transactions open when the audit began had not all ended within the
    # timeout: the audit stops at their last stable offset, before those transactions.
    open_transactions: list[str] = field(default_factory=list)
    seconds: float = 0.0
    records_read: int = 0
    publications: Publications = field(default_factory=Publications)
    # A wide app's output: per batch and unit (tools/verify_wide.py); None when there is none.
    wide: WideAudit | None = None

    @property
    def totals(self) -> dict[str, int]:
        keys = ("consumed", "outputs", "dead_lettered", "duplicates", "gaps", "unexpected", "without_offset")
        out = {k: sum(getattr(p, k) for p in self.partitions) for k in keys}
        out["unexpected"] += self.unexpected_elsewhere
        out["wide_outputs"] = self.wide.records if self.wide is not None else 0
        out["dead_lettered"] += self.wide.dead_letters if self.wide is not None else 0
        out["repeated_records"] = self.publications.repeats
        out["incomplete_publications"] = self.publications.incomplete
        return out

    @property
    def clean(self) -> bool:
        t = self.totals
        return (t["duplicates"] == 0 and t["gaps"] == 0 and t["repeated_records"] == 0
                and t["incomplete_publications"] == 0 and (self.wide is None or self.wide.clean))

    def to_dict(self) -> dict:
        wide, self.wide = self.wide, None
        publications, self.publications = self.publications, Publications()
        data = asdict(self)
        self.wide, self.publications = wide, publications
        data["wide"] = wide.to_dict() if wide is not None else None
        data["publications"] = {"seen": len(publications.positions), "repeated_records": publications.repeats,
                                "repeated_samples": publications.repeat_samples,
                                "incomplete": publications.incomplete,
                                "incomplete_samples": publications.incomplete_samples}
        data["unexpected_elsewhere_samples"] = [list(s) for s in self.unexpected_elsewhere_samples]
        data["totals"] = self.totals
        data["clean"] = self.clean
        data["verdict"] = self.verdict
        return data

    @property
    def verdict(self) -> str:
        if not self.clean:
            return "NOT CLEAN: " + "; ".join(self._findings())
        text = ("CLEAN: every audited source record was published at most once"
                + (" and exactly once (or dead-lettered)" if self.one_to_one else ""))
        if self.wide is not None:
            text += "; every (batch, unit) of the wide output was published once"
        return text

    def _findings(self) -> list[str]:
        t = self.totals
        found = []
        if t["duplicates"]:
            found.append(f"{t['duplicates']} duplicate(s)")
        if t["repeated_records"]:
            found.append(f"{t['repeated_records']} repeated record(s)")
        if t["gaps"]:
            found.append(f"{t['gaps']} gap(s)")
        if t["incomplete_publications"]:
            found.append(f"{t['incomplete_publications']} incomplete publication(s)")
        if self.wide is not None and not self.wide.clean:
            found.append(f"{self.wide.problem_count} wide problem(s)")
        return found

    def table(self) -> str:
        cols = ("source partition", "range", "consumed", "outputs", "dead-letter", "duplicates",
                "gaps", "unexpected")
        wide = self.wide is not None and self.wide.records > 0
        # A wide output record names its batch, not a source partition: its count is in the total.
        rows = [(p.name, f"{p.start}..{p.end}", p.consumed, "-" if wide and not p.outputs else p.outputs,
                 p.dead_lettered, p.duplicates, p.gaps if self.one_to_one else "-", p.unexpected)
                for p in self.partitions]
        t = self.totals
        rows.append(("total", "", t["consumed"], t["outputs"] + t["wide_outputs"], t["dead_lettered"],
                     t["duplicates"], t["gaps"] if self.one_to_one else "-", t["unexpected"]))
        widths = [max(len(str(r[i])) for r in [cols, *rows]) for i in range(len(cols))]

        def line(row: Iterable) -> str:
            cells = list(row)
            return "  ".join(str(c).ljust(w) if i < 2 else str(c).rjust(w)
                             for i, (c, w) in enumerate(zip(cells, widths, strict=False))).rstrip()

        out = [line(cols), line("-" * w for w in widths)]
        out += [line(r) for r in rows[:-1]]
        out += [line("-" * w for w in widths), line(rows[-1]), ""]
        if wide:
            out.append(f"outputs: {t['wide_outputs']} wide output record(s), counted per batch and unit below")
        for p in self.partitions:
            for label, count, sample in (("duplicate", p.duplicates, p.duplicate_offsets),
                                         ("gap", p.gaps, p.gap_offsets),
                                         ("unexpected", p.unexpected, p.unexpected_offsets)):
                if count and sample:
                    more = f" (+{count - len(sample)} more)" if count > len(sample) else ""
                    out.append(f"{label} {p.name} at offsets {', '.join(map(str, sample))}{more}")
        pubs = self.publications
        out += [f"duplicate: {s}" for s in pubs.repeat_samples]
        if pubs.repeats > len(pubs.repeat_samples):
            out.append(f"duplicate: (+{pubs.repeats - len(pubs.repeat_samples)} more repeated records)")
        if pubs.incomplete:
            out.append(f"incomplete: {pubs.incomplete} publication(s) with positions missing (a record lost, or "
                       "an output or dead-letter topic of the app not given to verify, or removed by retention "
                       "or compaction)")
            out += [f"incomplete: {s}" for s in pubs.incomplete_samples]
        if self.unexpected_elsewhere:
            sample = ", ".join(f"{t}[{pt}]@{'?' if o is None else o}" for t, pt, o in self.unexpected_elsewhere_samples)
            out.append(f"unexpected: {self.unexpected_elsewhere} output(s) name a source outside the "
                       f"input topics: {sample}")
        if self.open_transactions:
            out.append(f"note: transactions still open on {', '.join(self.open_transactions)}; "
                       "audited up to their last stable offset")
        if self.wide is not None:
            out += self.wide.lines()
        if t["without_offset"]:
            out.append(f"note: {t['without_offset']} record(s) name their source partition but not the offset (the "
                       "transform's plan could not carry it: docs/guarantees.md); audited by publication and position")
        if self.without_lineage:
            out.append(f"note: {self.without_lineage} output/dead-letter record(s) carry no txstream lineage header "
                       "(written outside txstream, or with --no-lineage) and were not audited")
        if self.without_publication and not self.one_to_one:
            out.append(f"note: {self.without_publication} record(s) carry no publication id; "
                       "their duplicates are detected only with --one-to-one")
        out.append(f"{self.verdict}. {self.records_read} records read in {self.seconds:.1f}s.")
        return "\n".join(out)


# ---------------------------------------------------------------------------------------------

def _as_list(value: str | Iterable[str] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return list(value)


def audit(clients: KafkaClients | str, inputs: str | Iterable[str], outputs: str | Iterable[str],
          dead_letter: str | Iterable[str] | None = None, app_id: str | None = None,
          one_to_one: bool = False, timeout: float = 30.0, count_field: str | None = None) -> AuditReport:
    """Audit `outputs` (and `dead_letter`) against `inputs`; see the module docstring.

    `timeout` bounds each broker round trip and the longest stall while reading.
    Raises AuditError for bad arguments or a missing topic, KafkaUnreachable when no broker
    answers (both TxstreamErrors).
    """
    clients = as_clients(clients)
    bootstrap = clients.bootstrap_servers
    began = time.monotonic()
    inputs, outputs, dead = _as_list(inputs), _as_list(outputs), _as_list(dead_letter)
    if not inputs or not outputs:
        raise AuditError("At least one input and one output topic are required.")
    overlap = (set(inputs) & set(outputs)) | (set(inputs) & set(dead)) | (set(outputs) & set(dead))
    if overlap:
        raise AuditError(f"A topic cannot play two roles (input/output/dead-letter): {sorted(overlap)}")

    admin = admin_client(clients)
    known = cluster_topics(admin, timeout)
    partitions: dict[str, list[int]] = {}
    for topic in [*inputs, *outputs, *dead]:
        if topic not in known:
            raise AuditError(f"Topic {topic!r} does not exist at {bootstrap}.")
        partitions[topic] = list(range(known[topic]))

    # The snapshot, in this order: the app's committed offsets first, then the last stable
    # offsets. Every output of a committed range is then inside the snapshot (no false gaps or
    # duplicates); an output committed while the audit starts shows up as "unexpected" at worst.
    input_tps = [(t, p) for t in inputs for p in partitions[t]]
    committed: dict[tuple[str, int], int] = {}
    if app_id:
        committed = {k: o for k, o in committed_offsets(admin, app_id, input_tps, timeout=timeout).items()
                     if o is not None}
    # commit_transaction() returns before the commit markers reach the partitions: wait until
    # each partition's last stable offset passes everything written so far (every transaction
    # open now, the app's last committed one included, has its markers), within `timeout`.
    all_tps = [(t, p) for t, ps in partitions.items() for p in ps]
    # Every wide app's markers topic (`<app>.units`) in the snapshot too: the apps a wide output
    # names are known only once it is read, and their batch records must stop where it does.
    markers_tps = [(t, 0) for t in sorted(known) if t.endswith(MARKERS_SUFFIX) and t not in partitions]
    all_tps += markers_tps
    marks = watermarks(admin, all_tps, timeout)
    written = {k: m.log_end for k, m in marks.items()}
    earliest = {k: m.earliest for k, m in marks.items()}
    stable = {k: m.last_stable for k, m in marks.items()}
    settle_by = time.monotonic() + timeout
    while True:
        unsettled = sorted(tuple(k) for k in stable if stable[k] < written[k])
        if not unsettled or time.monotonic() > settle_by:
            break
        time.sleep(0.05)
        stable = list_offsets(admin, {k: OffsetSpec.latest() for k in all_tps}, IsolationLevel.READ_COMMITTED,
                              "reading last stable offsets", timeout)

    rows: dict[tuple[str, int], PartitionAudit] = {}
    for key in input_tps:
        start = earliest[key]
        end = min(committed.get(key, start), stable[key]) if app_id else stable[key]
        rows[key] = PartitionAudit(key[0], key[1], start, max(start, end))

    report = AuditReport(inputs, outputs, dead, app_id, one_to_one,
                         [rows[key] for key in input_tps],
                         open_transactions=[f"{t}[{p}]" for t, p in unsettled])

    # Pass 1: the inputs (visible offsets in each audited range).
    visible: dict[tuple[str, int], set[int]] = {k: set() for k in rows}
    read_ranges = {k: (r.start, r.end) for k, r in rows.items()}

    def on_input(msgs: list) -> None:
        for msg in msgs:
            key = (msg.topic(), msg.partition())
            offset = msg.offset()
            if offset < read_ranges[key][1]:
                visible[key].add(offset)

    report.records_read += _read(clients, read_ranges, on_input, timeout)
    for key, row in rows.items():
        row.consumed = len(visible[key])

    # Pass 2: outputs and dead letters, attributed to publications and source offsets.
    first_pub: dict[tuple[str, int], dict[int | tuple[int, bytes], bytes | None]] = {k: {} for k in rows}
    covered: dict[tuple[str, int], set[int]] = {k: set() for k in rows}
    dup: dict[tuple[str, int], set[int]] = {k: set() for k in rows}
    repeated_without_offset: dict[tuple[str, int], int] = {k: 0 for k in rows}
    dead_set = set(dead)
    out_ranges = {(t, p): (earliest[(t, p)], stable[(t, p)]) for t in [*outputs, *dead] for p in partitions[t]}
    lineage_of = hdr.lineage_of
    wide = WideAudit(count_field)
    wide_lineage = WideAudit.lineage
    dead_offsets: dict[tuple[str, int], set[int]] = {k: set() for k in rows}
    publications = report.publications

    def on_output(msgs: list) -> None:
        for msg in msgs:
            if msg.offset() >= out_ranges[(msg.topic(), msg.partition())][1]:
                continue  # published after the snapshot
            headers = msg.headers()
            lineage = lineage_of(headers)
            if lineage is None:
                unit = wide_lineage(headers)
                if unit is None:
                    report.without_lineage += 1
                else:
                    publications.add(unit.publication, unit.position, msg)
                    # A stateful unit's late row, dead-lettered in its transaction: a dead letter, not an output.
                    late = msg.topic() in dead_set and (hdr.DLQ_STAGE, b"late") in headers
                    wide.add(unit, msg.value(), next((v for k, v in headers if k == hdr.STATE_KEY), None),
                             next((v for k, v in headers if k == hdr.STATE_EXPIRES), None), dead_letter=late)
                continue
            repeated = publications.add(lineage.publication, lineage.position, msg)
            key = (lineage.topic, lineage.partition)
            offset = lineage.offset
            row = rows.get(key)
            if row is None:
                report.unexpected_elsewhere += 1
                if len(report.unexpected_elsewhere_samples) < SAMPLES:
                    report.unexpected_elsewhere_samples.append((lineage.topic, lineage.partition, offset))
                continue
            if offset is not None and offset not in visible[key]:
                row.unexpected += 1
                if len(row.unexpected_offsets) < SAMPLES:
                    row.unexpected_offsets.append(offset)
                continue
            if msg.topic() in dead_set:
                row.dead_lettered += 1
                if offset is not None:
                    dead_offsets[key].add(offset)
            else:
                row.outputs += 1
            pub = lineage.publication
            if pub is None:
                report.without_publication += 1
            if offset is None:
                row.without_offset += 1
                if repeated:
                    repeated_without_offset[key] += 1
                continue
            if repeated:
                dup[key].add(offset)
                continue
            covered[key].add(offset)
            # A dead letter names its app: two apps dead-lettering one input record are not a duplicate.
            app = _dead_letter_app(headers) if msg.topic() in dead_set else None
            seen = first_pub[key]
            slot = offset if app is None else (offset, app)
            if slot not in seen:
                seen[slot] = pub
            elif one_to_one or (pub is not None and seen[slot] is not None and pub != seen[slot]):
                dup[key].add(offset)   # a second publication of the offset (or, 1:1, any second record)

    report.records_read += _read(clients, out_ranges, on_output, timeout)

    # A wide app's batch records (driver/wide.py writes one per closed batch, in the closing
    # transaction), for every app the wide output names and --app-id.
    apps = wide.apps | ({app_id} if app_id else set())
    ranges = {(f"{app}{MARKERS_SUFFIX}", 0): (earliest[(f"{app}{MARKERS_SUFFIX}", 0)],
                                              stable[(f"{app}{MARKERS_SUFFIX}", 0)])
              for app in sorted(apps) if (f"{app}{MARKERS_SUFFIX}", 0) in stable}

    def on_batch(msgs: list) -> None:
        for msg in msgs:
            wide.add_batch(msg.topic()[:-len(MARKERS_SUFFIX)], msg.value(), msg.offset())

    if ranges:
        report.records_read += _read(clients, ranges, on_batch, timeout)
    if app_id and wide.batches:
        # With --app-id the audit ends at the committed offsets, taken before the rest of the
        # snapshot: the batches closed after them (the last batch records) are not the audit's;
        # earlier records beyond them are batches from before an offsets reset.
        def within(record: BatchRecord) -> bool:
            return all(committed.get((t, p), -1) >= e for t, p, _s, e in record.ranges if (t, p) in rows)

        last_within = max((r.offset for (a, _b), rs in wide.batches.items() if a == app_id
                           for r in rs if within(r)), default=-1)
        wide.keep_batches(lambda a, _b, r: a != app_id or within(r) or r.offset < last_within)
    if wide.records or wide.batches:
        wide.finish(visible, dead_offsets, {k: r.end for k, r in rows.items()}, app_id)
        report.wide = wide
        operators = {(r.state.operator, r.units) for (a, _b), rs in wide.batches.items()
                     if a == app_id for r in rs if r.state}
        for operator, units in sorted(operators):
            _read_units, problems = changelog_problems(clients, app_id, operator, units, timeout)
            wide.changelogs_checked += 1
            for problem in problems:
                wide.problem(problem)

    for key, row in rows.items():
        row.duplicates = len(dup[key]) + repeated_without_offset[key]
        row.duplicate_offsets = sorted(dup[key])[:SAMPLES]
        if one_to_one:
            missing = visible[key].difference(covered[key])
            if row.without_offset:
                # Records without an offset cover some of these: only the count is known.
                row.gaps = max(0, row.consumed - row.outputs - row.dead_lettered)
                row.gap_offsets = []
            else:
                row.gaps = len(missing)
                row.gap_offsets = sorted(missing)[:SAMPLES]
    publications.finish()
    report.seconds = time.monotonic() - began
    return report


def _where(msg: Any) -> str:
    """A record as the report names it: topic[partition]@offset."""
    return f"{msg.topic()}[{msg.partition()}]@{msg.offset()}"


def _dead_letter_app(headers: list[tuple[str, bytes]]) -> bytes | None:
    for k, v in reversed(headers):
        if k == hdr.DLQ_APP_ID:
            return v
    return None


def _read(clients: KafkaClients, ranges: dict[tuple[str, int], tuple[int, int]], handle,
          timeout: float) -> int:
    """Feed `handle` batches of the records of every partition in `[start, end)`, read_committed.

    Raises AuditError when no partition makes progress for `timeout` seconds or one cannot be read.
    """
    count = 0
    try:
        for batch in scan(clients, ranges, timeout, purpose="verify", **_FETCH):
            handle(batch)
            count += len(batch)
    except KafkaFailure as exc:
        raise AuditError(str(exc)) from None
    return count
