"""`txstream status`: one screen on an app, whether or not an instance runs.

From Kafka alone: the group's state and members, per input partition the committed offset, last
stable offset, log end and lag (tools/offset_reset.py), and the last publication of each input
partition, read from the lineage headers at the tail of the output topics (docs/architecture.md,
§6). From a running instance, when its metrics URL is given: its live figures.
"""
from __future__ import annotations

import time
import urllib.request
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from txstream.errors import OffsetsError
from txstream.kafka import headers as hdr
from txstream.kafka import lookups as kofs
from txstream.kafka.config import KafkaClients
from txstream.kafka.scan import scan

DEFAULT_TAIL = 1000


@dataclass(frozen=True)
class LastPublication:
    """The newest output record of one input partition found at the output's tail."""
    source_offset: int           # the input offset it came from (the batch published up to here)
    publication: str | None      # the publication id: one per published range, i.e. per batch
    output: str                  # topic[partition]@offset
    timestamp_ms: int


@dataclass
class PartitionStatus:
    topic: str
    partition: int
    committed: int | None
    last_stable: int
    log_end: int
    lag: int | None              # last stable offset - committed
    owner: str | None            # member id, when an instance owns it
    last_publication: LastPublication | None = None
    live_lag: float | None = None


@dataclass
class Status:
    app_id: str
    state: str
    members: list[dict[str, Any]]
    partitions: list[PartitionStatus]
    lineage_read: list[str] = field(default_factory=list)   # what was read for the publications
    live: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        lines = [f"App {self.app_id}: group {self.state}, {len(self.members)} member(s)"]
        for m in self.members:
            lines.append(f"  {m['member_id']} ({m['client_id']} on {m['host']}): {', '.join(m['partitions']) or '-'}")
        lines.append("")
        rows = [["TOPIC", "PARTITION", "COMMITTED", "LAST-STABLE", "LOG-END", "LAG", "OWNER", "LAST PUBLISHED"]]
        for p in self.partitions:
            pub = p.last_publication
            last = (f"offset {pub.source_offset} by {pub.publication or '?'} at {_when(pub.timestamp_ms)} "
                    f"-> {pub.output}") if pub else ("-" if not self.lineage_read else "not in the tail read")
            rows.append([p.topic, str(p.partition), _s(p.committed), str(p.last_stable), str(p.log_end), _s(p.lag),
                         (p.owner or "-")[:24], last])
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1] for r in rows]
        if self.lineage_read:
            lines += ["", "Lineage: read " + "; ".join(self.lineage_read)]
        if self.live is not None:
            lines += ["", _live_text(self.live)]
        lines += [f"Note: {n}" for n in self.notes]
        return "\n".join(lines)


def _s(value: object) -> str:
    return "-" if value is None else str(value)


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000)) if ms > 0 else "?"


def _live_text(live: dict[str, Any]) -> str:
    if "error" in live:
        return f"Live ({live['url']}): not reachable ({live['error']})"
    age = live.get("seconds_since_last_batch")
    return (f"Live ({live['url']}): {live['batches']:.0f} batches, {live['records_in']:.0f} records in, "
            f"{live['records_out']:.0f} out, {live['dead_letters']:.0f} dead-lettered, "
            f"{live['transactions_aborted']:.0f} transactions aborted, {live['fenced_producers']:.0f} fenced; "
            f"owns {live['assigned_partitions']:.0f} partition(s), lag {live['lag']:.0f}"
            + (f", last batch {age:.1f}s ago" if age is not None else ""))


def last_publications(clients: KafkaClients | str, outputs: list[str], tail: int = DEFAULT_TAIL,
                      timeout: float = 30) -> tuple[dict[tuple[str, int], LastPublication], list[str]]:
    """Per input partition, its newest output record among the last `tail` offsets of each output
    partition (read_committed); and what was read, in words."""
    admin = kofs.admin_client(clients)
    partitions = kofs.topic_partition_counts(admin, outputs, timeout)
    marks = kofs.watermarks(admin, [(t, p) for t, n in partitions.items() for p in range(n)], timeout)
    found: dict[tuple[str, int], LastPublication] = {}
    read: dict[str, int] = dict.fromkeys(outputs, 0)
    ranges = {(m.topic, m.partition): (max(mark.earliest, mark.last_stable - tail), mark.last_stable)
              for m, mark in marks.items()}
    for batch in scan(clients, ranges, timeout, purpose="status"):
        for msg in batch:
            read[msg.topic()] += 1
            lineage = hdr.lineage_of(msg.headers())
            source = lineage.source if lineage is not None else None
            if source is None:
                continue
            key = (source[0], source[1])
            if key not in found or source[2] >= found[key].source_offset:
                publication = lineage.publication
                found[key] = LastPublication(source[2], publication.decode() if publication else None,
                                         f"{msg.topic()}[{msg.partition()}]@{msg.offset()}", msg.timestamp()[1])
    words = [f"the last {tail} offsets of each of the {partitions[t]} partitions of {t} "
             f"({read[t]} committed records, read_committed)" for t in outputs]
    return found, words


def live_figures(url: str, app_id: str, timeout: float = 5) -> dict[str, Any]:
    """A running instance's figures, from its /metrics (txstream run --metrics-port)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            text = response.read().decode()
    except OSError as exc:
        return {"url": url, "error": str(exc)}
    sums: dict[str, float] = defaultdict(float)
    lag: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("app") != app_id:
                continue
            sums[s.name] += s.value
            if s.name == "txstream_partition_lag_records":
                lag[f"{s.labels['topic']}[{s.labels['partition']}]"] = s.value
            elif s.name == "txstream_transactions_total":
                sums[f"transactions_{s.labels['outcome']}"] += s.value
    last = sums.get("txstream_last_batch_timestamp_seconds")
    return {
        "url": url, "batches": sums["txstream_batches_total"], "records_in": sums["txstream_records_in_total"],
        "records_out": sums["txstream_records_out_total"], "dead_letters": sums["txstream_dead_letters_total"],
        "transactions_committed": sums["transactions_committed"], "transactions_aborted": sums["transactions_aborted"],
        "fenced_producers": sums["txstream_fenced_producers_total"],
        "assigned_partitions": sums["txstream_assigned_partitions"], "rebalances": sums["txstream_rebalances_total"],
        "batch_cap": sums.get("txstream_batch_cap_records"), "lag": sum(lag.values()), "lag_by_partition": lag,
        "seconds_since_last_batch": round(time.time() - last, 3) if last else None,
    }


# Groups txstream's own tools use beside the apps' (kafka check, dead-letter isolation).
_HELPER_GROUP = ("txstream-check-group-",)
_HELPER_SUFFIX = ("-poison",)
MAX_GROUPS_EXAMINED = 200


def app_ids(admin, timeout: float) -> list[str]:
    """The consumer groups with committed offsets: the app ids `status`, `verify` and `offsets` can
    be asked about (txstream's helper groups left out; at most MAX_GROUPS_EXAMINED are read)."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    listed = kofs.kafka_call(admin, "listing consumer groups",
                             lambda: admin.list_consumer_groups(request_timeout=timeout).result(timeout), timeout)
    names = sorted(g.group_id for g in listed.valid
                   if not g.group_id.startswith(_HELPER_GROUP) and not g.group_id.endswith(_HELPER_SUFFIX))
    futures = {name: admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(name)],
                                                       request_timeout=timeout)[name]
               for name in names[:MAX_GROUPS_EXAMINED]}
    found = []
    for name, future in futures.items():
        try:
            if any(tp.offset >= 0 for tp in future.result(timeout).topic_partitions):
                found.append(name)
        except Exception:   # a group that cannot be read is not offered
            continue
    return found


def unknown_app(admin, app_id: str, timeout: float) -> str:
    """The error for an app id with no group members and no committed offsets: the ones that
    exist, the closest first."""
    import difflib

    known = app_ids(admin, timeout)
    if not known:
        return f"no app {app_id!r}: no consumer group has committed offsets on this cluster yet"
    close = difflib.get_close_matches(app_id, known, n=3, cutoff=0.5)
    hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
    return (f"no app {app_id!r}: no consumer group of that id has members or committed offsets{hint}; "
            f"app ids with committed offsets: {', '.join(known)}")


def status(clients: KafkaClients | str, app_id: str, outputs: list[str] | None = None,
           topics: list[str] | None = None, metrics_url: str | None = None, tail: int = DEFAULT_TAIL,
           timeout: float = kofs.DEFAULT_TIMEOUT) -> Status:
    admin = kofs.admin_client(clients)
    known = kofs.cluster_topics(admin, timeout)
    group = kofs.describe_group(admin, app_id, timeout)
    committed = kofs.committed_offsets(admin, app_id, None, stable=False, timeout=timeout)
    if not group.members and not committed:
        raise OffsetsError(unknown_app(admin, app_id, timeout))
    notes = []
    # The group's committed partitions, those of its members, and of the topics named.
    parts = {p for p in committed if p.topic in known}
    parts |= {p for m in group.members for p in m.partitions}
    for topic in topics or []:
        if topic not in known:
            notes.append(f"topic {topic} does not exist")
            continue
        parts |= {kofs.Partition(topic, i) for i in range(known[topic])}
    gone = sorted({p.topic for p in committed if p.topic not in known})
    notes += [f"topic {t} no longer exists; the group still has offsets committed for it" for t in gone]
    if not parts:
        notes.append(f"group {app_id} has no committed offsets and no members; name its input with --topic")
    marks = kofs.watermarks(admin, sorted(parts), timeout)
    owner = {p: m.member_id for m in group.members for p in m.partitions}
    rows = []
    for p in sorted(parts):
        current, mark = committed.get(p), marks[p]
        rows.append(PartitionStatus(p.topic, p.partition, current, mark.last_stable, mark.log_end,
                                    None if current is None else mark.last_stable - current, owner.get(p)))
    result = Status(app_id, group.state,
                    [{"member_id": m.member_id, "client_id": m.client_id, "host": m.host,
                      "partitions": [f"{p.topic}[{p.partition}]" for p in m.partitions]} for m in group.members],
                    rows, notes=notes)
    present = [o for o in outputs or [] if o in known]
    result.notes += [f"output topic {o} does not exist" for o in outputs or [] if o not in known]
    if present:
        found, result.lineage_read = last_publications(clients, present, tail, max(timeout, 30))
        for row in rows:
            row.last_publication = found.get((row.topic, row.partition))
    if metrics_url:
        result.live = live_figures(metrics_url, app_id)
        for row in rows:
            row.live_lag = (result.live.get("lag_by_partition") or {}).get(f"{row.topic}[{row.partition}]")
    return result
