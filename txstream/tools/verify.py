"""Audit exactly-once from the topics alone: every output names its source record.

`audit()` reads the input, output and dead-letter topics with `isolation.level=read_committed`
from the beginning up to their last stable offsets (taken once, at the start: the audit is a
snapshot), and checks, per source partition, that each source record in the audited range was
published once: not by two publications (duplicates) and, for 1:1 processors, not by none
(gaps). Lineage comes from the headers in `txstream.kafka.headers`.

The audited range of a source partition is `[log start, end)` where `end` is the app's committed
offset (its consumer group) when an app id is given, else the input's last stable offset.

Reading stops on position, never on a count (txstream.kafka.scan): transactional topics have
offset gaps (commit and abort markers, aborted records that read_committed never delivers).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Iterable

from confluent_kafka import IsolationLevel
from confluent_kafka.admin import OffsetSpec

from txstream.errors import AuditError, KafkaFailure
from txstream.kafka import headers as hdr
from txstream.kafka.config import KafkaClients, as_clients
from txstream.kafka.offsets import admin_client, cluster_topics, committed_offsets, list_offsets, watermarks
from txstream.kafka.scan import scan
from txstream.tools.verify_wide import WideAudit

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
    outputs: int = 0              # output records tracing back to those records
    dead_lettered: int = 0        # dead-letter records tracing back to them
    duplicates: int = 0           # source offsets published by more than one publication
    gaps: int = 0                 # --one-to-one: source offsets with no output, no dead letter
    unexpected: int = 0           # outputs/dead letters naming this partition outside the range
    duplicate_offsets: list[int] = field(default_factory=list)   # first SAMPLES of each
    gap_offsets: list[int] = field(default_factory=list)
    unexpected_offsets: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.topic}[{self.partition}]"


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
    unexpected_elsewhere_samples: list[tuple[str, int, int]] = field(default_factory=list)
    # Output / dead-letter records with no (or incomplete) lineage headers: cannot be audited.
    without_lineage: int = 0
    # Output / dead-letter records with lineage but no publication id (only --one-to-one can
    # tell their duplicates apart from a fan-out).
    without_publication: int = 0
    # Partitions whose transactions open when the audit began had not all ended within the
    # timeout: the audit stops at their last stable offset, before those transactions.
    open_transactions: list[str] = field(default_factory=list)
    seconds: float = 0.0
    records_read: int = 0
    # A wide app's output: per batch and unit (tools/verify_wide.py); None when there is none.
    wide: WideAudit | None = None

    @property
    def totals(self) -> dict[str, int]:
        keys = ("consumed", "outputs", "dead_lettered", "duplicates", "gaps", "unexpected")
        out = {k: sum(getattr(p, k) for p in self.partitions) for k in keys}
        out["unexpected"] += self.unexpected_elsewhere
        return out

    @property
    def clean(self) -> bool:
        t = self.totals
        return t["duplicates"] == 0 and t["gaps"] == 0 and (self.wide is None or self.wide.clean)

    def to_dict(self) -> dict:
        wide, self.wide = self.wide, None
        data = asdict(self)
        self.wide = wide
        data["wide"] = wide.to_dict() if wide is not None else None
        data["unexpected_elsewhere_samples"] = [list(s) for s in self.unexpected_elsewhere_samples]
        data["totals"] = self.totals
        data["clean"] = self.clean
        return data

    def table(self) -> str:
        cols = ("source partition", "range", "consumed", "outputs", "dead-letter", "duplicates",
                "gaps", "unexpected")
        rows = [(p.name, f"{p.start}..{p.end}", p.consumed, p.outputs, p.dead_lettered,
                 p.duplicates, p.gaps if self.one_to_one else "-", p.unexpected)
                for p in self.partitions]
        t = self.totals
        rows.append(("total", "", t["consumed"], t["outputs"], t["dead_lettered"], t["duplicates"],
                     t["gaps"] if self.one_to_one else "-", t["unexpected"]))
        widths = [max(len(str(r[i])) for r in [cols, *rows]) for i in range(len(cols))]

        def line(row: Iterable) -> str:
            cells = list(row)
            return "  ".join(str(c).ljust(w) if i < 2 else str(c).rjust(w)
                             for i, (c, w) in enumerate(zip(cells, widths, strict=False))).rstrip()

        out = [line(cols), line("-" * w for w in widths)]
        out += [line(r) for r in rows[:-1]]
        out += [line("-" * w for w in widths), line(rows[-1]), ""]
        for p in self.partitions:
            for label, count, sample in (("duplicate", p.duplicates, p.duplicate_offsets),
                                         ("gap", p.gaps, p.gap_offsets),
                                         ("unexpected", p.unexpected, p.unexpected_offsets)):
                if count:
                    more = f" (+{count - len(sample)} more)" if count > len(sample) else ""
                    out.append(f"{label} {p.name} at offsets {', '.join(map(str, sample))}{more}")
        if self.unexpected_elsewhere:
            sample = ", ".join(f"{t}[{pt}]@{o}" for t, pt, o in self.unexpected_elsewhere_samples)
            out.append(f"unexpected: {self.unexpected_elsewhere} output(s) name a source outside the "
                       f"input topics: {sample}")
        if self.open_transactions:
            out.append(f"note: transactions still open on {', '.join(self.open_transactions)}; "
                       "audited up to their last stable offset")
        if self.wide is not None:
            out += self.wide.lines()
        if self.without_lineage:
            out.append(f"note: {self.without_lineage} output/dead-letter record(s) carry no lineage "
                       "headers and were not audited")
        if self.without_publication and not self.one_to_one:
            out.append(f"note: {self.without_publication} record(s) carry no publication id; "
                       "their duplicates are detected only with --one-to-one")
        verdict = ("CLEAN: every audited source record was published at most once"
                   + (" and exactly once (or dead-lettered)" if self.one_to_one else "")
                   if self.clean else "NOT CLEAN: duplicates or gaps found")
        if self.wide is not None and self.clean:
            verdict += "; every (batch, unit) of the wide output was published once"
        out.append(f"{verdict}. {self.records_read} records read in {self.seconds:.1f}s.")
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

    # Pass 2: outputs and dead letters, attributed to source offsets.
    first_pub: dict[tuple[str, int], dict[int, bytes | None]] = {k: {} for k in rows}
    dup: dict[tuple[str, int], set[int]] = {k: set() for k in rows}
    dead_set = set(dead)
    out_ranges = {(t, p): (earliest[(t, p)], stable[(t, p)]) for t in [*outputs, *dead] for p in partitions[t]}
    lineage_of = hdr.lineage_of
    first_seq: dict[tuple[str, int], dict[int, bytes | None]] = {k: {} for k in rows}
    more_seqs: dict[tuple[str, int], dict[int, set]] = {k: {} for k in rows}
    wide = WideAudit(count_field)
    wide_lineage = WideAudit.lineage
    dead_offsets: dict[tuple[str, int], set[int]] = {k: set() for k in rows}

    def on_output(msgs: list) -> None:
        for msg in msgs:
            if msg.offset() >= out_ranges[(msg.topic(), msg.partition())][1]:
                continue  # published after the snapshot
            headers = msg.headers()
            lineage = lineage_of(headers)
            src = lineage.source if lineage is not None else None
            if src is None and msg.topic() not in dead_set:
                unit = wide_lineage(headers)
                if unit is not None:
                    wide.add(unit, msg.value())
                    continue
            if src is None:
                report.without_lineage += 1
                continue
            key = (src[0], src[1])
            offset = src[2]
            row = rows.get(key)
            if row is None:
                report.unexpected_elsewhere += 1
                if len(report.unexpected_elsewhere_samples) < SAMPLES:
                    report.unexpected_elsewhere_samples.append(src)
                continue
            if offset not in visible[key]:
                row.unexpected += 1
                if len(row.unexpected_offsets) < SAMPLES:
                    row.unexpected_offsets.append(offset)
                continue
            if msg.topic() in dead_set:
                row.dead_lettered += 1
                dead_offsets[key].add(offset)
            else:
                row.outputs += 1
            pub, seq = lineage.publication, lineage.position
            if pub is None:
                report.without_publication += 1
            seen = first_pub[key]
            if offset not in seen:
                seen[offset] = pub
                first_seq[key][offset] = seq
                continue
            if _is_duplicate(offset, pub, seq, seen[offset], first_seq[key], more_seqs[key], one_to_one):
                dup[key].add(offset)

    report.records_read += _read(clients, out_ranges, on_output, timeout)

    # A wide app's batch records (driver/wide.py writes one per closed batch, in the closing
    # transaction): read up to the snapshot's committed offsets' moment.
    markers = f"{app_id}.units" if app_id else None
    if markers and markers in known:
        marks_units = watermarks(admin, [(markers, 0)], timeout)[(markers, 0)]

        def on_batch(msgs: list) -> None:
            for msg in msgs:
                wide.add_batch(msg.value())

        report.records_read += _read(clients, {(markers, 0): (marks_units.earliest, marks_units.last_stable)},
                                     on_batch, timeout)
        # Batches closed after the snapshot of the committed offsets are not the audit's.
        wide.batches = {b: r for b, r in wide.batches.items()
                        if all(committed.get((t, p), -1) >= e for t, p, _s, e in r["ranges"] if (t, p) in rows)}
    if wide.records or wide.batches:
        wide.finish(visible, dead_offsets, committed)
        report.wide = wide

    for key, row in rows.items():
        row.duplicates = len(dup[key])
        row.duplicate_offsets = sorted(dup[key])[:SAMPLES]
        if one_to_one:
            missing = visible[key].difference(first_pub[key])
            row.gaps = len(missing)
            row.gap_offsets = sorted(missing)[:SAMPLES]
    report.seconds = time.monotonic() - began
    return report


def _is_duplicate(offset: int, pub: bytes | None, seq: bytes | None, first_pub: bytes | None,
                  first_seq: dict[int, bytes | None], more_seqs: dict[int, set], one_to_one: bool) -> bool:
    """Whether another record naming an already-seen source offset is a duplicate.

    (publication, source offset, position in the publication) is unique by construction, so
    a repeat of all three is a duplicate whatever the processor's cardinality: a verbatim copy,
    a producer retry without idempotence, a bug that produced twice in one transaction. Two
    publications of one source offset are a duplicate too (two committed transactions published
    it). Output written before positions existed has no seq: then only --one-to-one can tell."""
    if one_to_one:
        return True   # one output per input: any second record is one too many
    if pub is not None and first_pub is not None and pub != first_pub:
        return True
    if pub is None or pub != first_pub or seq is None:
        return False
    seqs = more_seqs.setdefault(offset, {first_seq.get(offset)})
    if seq in seqs:
        return True
    seqs.add(seq)
    return False


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
