"""Bring a unit's store to the state after the batch its marker names (docs/state.md, "Restore").

The source, in order of preference: the worker's own copy when it knows the changelog offset it
covers and no newer snapshot exists; else the newest complete snapshot; else the changelog from
its start. A copy or snapshot is passed over when records after the offset it covers are older
than the changelog's tombstone retention (delete.retention.ms): compaction may have removed a
tombstone among them, and the source would bring the deleted key back. Then the changelog's tail from that offset to its end, read_committed. Every record's
batch is checked against the marker: a record, snapshot or local copy of a later batch stops the
restore (`StateAheadOfMarker`) rather than guess which side is right. Records are absolute values,
so replaying records the source already holds changes nothing: a covered offset may be early,
never late. Nothing is wiped: a stale local copy is replaced only by a newer snapshot.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from txstream import fault_injection
from txstream.kafka.config import KafkaClients
from txstream.state import partition
from txstream.state.changelog import HeaderReader, changelog_topic, tombstone_retention_ms
from txstream.state.errors import MarkerMovedDuringRestore, StateAheadOfMarker, StateInconsistent
from txstream.state.snapshot import latest_manifest, load_snapshot
from txstream.state.store import StateStore, StoreVersion

# At most this much of a changelog's tombstone retention is kept back for the restore's reading
# time and clock skew between the hosts that wrote the records and the one restoring.
MARGIN_MS = 3_600_000

if TYPE_CHECKING:
    from txstream.records import Marker


@dataclass
class RestoreReport:
    source: str                 # "local copy", "snapshot of batch N" or "changelog"
    batch: int                  # the batch the store now holds the state after
    snapshot_keys: int = 0
    changelog_records: int = 0
    changelog_from: int = 0
    changelog_to: int = 0
    snapshot_offset: int = 0    # the changelog offset the newest snapshot covers (0: no snapshot)
    snapshot_seconds: float = 0.0   # of `seconds`: finding and loading the snapshot
    seconds: float = 0.0
    refused: list[str] = field(default_factory=list)   # sources too old to trust (_Freshness)


def restore(clients: KafkaClients, app_id: str, operator: str, unit: int, store: StateStore, marker: Marker,
            reread_marker: Callable[[], Marker] | None = None, timeout: float = 120.0) -> RestoreReport:
    """Restore `store` (unit `unit` of `operator`) to `marker`'s batch. `reread_marker`, when
    given, tells a marker that moved during the restore (another attempt of the unit committed:
    retried) from state ahead of a marker that did not (stops)."""
    started = time.perf_counter()
    target, local = marker.done_through, store.version
    if local.batch > target:
        raise StateAheadOfMarker("this worker's copy", local.batch, target, operator, unit)
    topic = changelog_topic(app_id, operator)
    snapshot = latest_manifest(clients, app_id, operator, unit, timeout)
    if snapshot is not None and snapshot.batch > target:
        _ahead(reread_marker, "the newest snapshot", snapshot.batch, target, operator, unit)
    report = RestoreReport("changelog", target, snapshot_offset=snapshot.changelog_offset if snapshot else 0)
    with partition.reader(clients, app_id) as reader:
        low, high = partition.bounds(reader, topic, unit, timeout)
        fresh = _Freshness(clients, app_id, operator, reader, topic, unit, high, timeout)
        if local.changelog_offset is not None and (snapshot is None or snapshot.changelog_offset <= local.changelog_offset) \
                and fresh.covers(local.changelog_offset, "this worker's copy", report):
            report.source, start = "local copy", local.changelog_offset
        elif snapshot is not None and fresh.covers(snapshot.changelog_offset, f"the snapshot of batch {snapshot.batch}",
                                                   report):
            loading = time.perf_counter()
            store.replace(StoreVersion(unit))
            report.snapshot_keys = load_snapshot(clients, app_id, snapshot, store, timeout)
            store.load((), StoreVersion(unit, snapshot.batch, snapshot.changelog_offset))
            report.source, start = f"snapshot of batch {snapshot.batch}", snapshot.changelog_offset
            report.snapshot_seconds = time.perf_counter() - loading
        else:
            # The whole changelog: compaction removes a tombstone only after the records it
            # deletes, so what is left of it is always the state (less nothing).
            store.replace(StoreVersion(unit))
            start = low
        end = _read_tail(reader, topic, operator, unit, store, target, low, start, report, reread_marker, timeout)
    store.load((), StoreVersion(unit, target, end))
    report.changelog_from, report.changelog_to = start, end
    report.seconds = time.perf_counter() - started
    return report


class _Freshness:
    """Whether a restore source covering the changelog up to an offset can still have every
    tombstone after it: compaction removes a tombstone delete.retention.ms after its first
    cleaning, so one written longer ago than that may be gone, and a source from before it would
    keep the key it deleted (a closed window or session emitted again). A source is usable when
    nothing follows it, or when every record after it is younger than the retention less a
    margin (for the restore's own reading time and the hosts' clock skew)."""

    def __init__(self, clients: KafkaClients, app_id: str, operator: str, reader: partition.Reader, topic: str,
                 unit: int, high: int, timeout: float) -> None:
        self.clients, self.app_id, self.operator, self.reader = clients, app_id, operator, reader
        self.topic, self.unit, self.high, self.timeout = topic, unit, high, timeout
        self._horizon: int | None = None

    def covers(self, offset: int, what: str, report: RestoreReport) -> bool:
        if offset >= self.high:
            return True
        horizon = self.horizon()
        if offset >= horizon:
            return True
        report.refused.append(f"{what} (covers the changelog to offset {offset}; records before offset {horizon} "
                              "are older than its tombstones' retention)")
        return False

    def horizon(self) -> int:
        """The first changelog offset whose records are all younger than the retention less the
        margin (the end when none is)."""
        if self._horizon is None:
            from confluent_kafka import KafkaException, TopicPartition

            from txstream.kafka.errors import classify_kafka

            retention = tombstone_retention_ms(self.clients, self.app_id, self.operator, self.timeout)
            since = int(time.time() * 1000) - retention + min(retention // 4, MARGIN_MS)
            try:
                found, = self.reader.offsets.offsets_for_times([TopicPartition(self.topic, self.unit, since)],
                                                               timeout=self.timeout)
            except KafkaException as exc:
                raise classify_kafka(exc, f"offsets of {self.topic}[{self.unit}] by time") from exc
            self._horizon = found.offset if 0 <= found.offset < self.high else self.high
        return self._horizon


def _read_tail(reader: partition.Reader, topic: str, operator: str, unit: int, store: StateStore, target: int,
               low: int, start: int, report: RestoreReport, reread_marker: Callable[[], Marker] | None,
               timeout: float) -> int:
    """Apply the changelog from `start` to its end (`low`: its first offset); returns the end offset."""
    if start < low:
        raise StateInconsistent(f"{topic}[{unit}] starts at offset {low}, but the state read from {report.source} "
                                f"needs it from offset {start}: records were deleted from the changelog")
    headers = HeaderReader(operator, unit, topic)

    def take(records: list) -> None:
        batch_of, changes, newest = headers.batch_of, [], 0
        append = changes.append
        for record in records:
            batch = batch_of(record)
            if batch > newest:
                newest = batch
            append((record.key(), record.value()))
        if newest > target:
            first = next(record for record in records if batch_of(record) > target)
            _ahead(reread_marker, f"the changelog record at offset {first.offset()}", batch_of(first), target,
                   operator, unit)
        store.load(changes)
        report.changelog_records += len(changes)
        fault_injection.maybe_fail("state.mid_restore", unit)

    return partition.read_to_end(reader, topic, unit, start, take, timeout)


def _ahead(reread_marker: Callable[[], Marker] | None, what: str, batch: int, target: int, operator: str,
           unit: int) -> None:
    if reread_marker is not None:
        now = reread_marker().done_through
        if now >= batch:
            raise MarkerMovedDuringRestore(f"state of operator {operator!r}, unit {unit}: the marker moved from "
                                           f"batch {target} to {now} during the restore")
    raise StateAheadOfMarker(what, batch, target, operator, unit)
