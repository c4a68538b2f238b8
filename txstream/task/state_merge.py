"""A stateful unit's merge (a `mapInArrow` body after `repartition(K, ...)`): docs/state.md.

Spark hands unit i the batch's partial aggregates of the groups that hash to it (or, for
deduplication, each key's first row), and the batch's late rows. The merge brings unit i's state
partition to the unit's marker (a local copy plus the changelog's tail: state/restore.py), merges
the partials into it, decides what the output mode emits, and yields those rows in the
aggregation's own schema, for the rest of the user's transform and then the unit's publisher
(task/units.py), which runs later in the same task.

The merge writes nothing to Kafka. The batch's state changes, its late rows and its latest event
time go to the publisher through the task's side file (task/sidefile.py), and reach Kafka in the
unit's transaction with its output and its marker. The local copy takes them only from the
changelog, at the next batch's restore: it never holds a change Kafka did not commit.
"""
from __future__ import annotations

import os
import pickle
import time
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa

from txstream.kafka.config import KafkaClients
from txstream.state import aggregates as aggs
from txstream.state.codec import StateCodec
from txstream.state.errors import StateStoreError
from txstream.state.keys import decode_key, encode_key, window_prefix
from txstream.state.operator import DEDUP, SESSION, WINDOW, OperatorDescription
from txstream.state.restore import restore
from txstream.state.store import StateStore, StoreVersion
from txstream.state.stores import open_store
from txstream.task import worker_heap
from txstream.task.sidefile import run_directory, write_state

# Columns the driver adds to the merge's input (driver/stateful_query.py).
ROUTE = "_txs_route"      # what routed the row to its unit
LATE = "_txs_late"        # a late row, as JSON (null on partial rows)
LATE_MS = "_txs_late_ms"  # its event time
EVENTS = "_txs_events"    # the latest event time of a group's rows in the batch
FIRST = "_txs_first"      # deduplication: the key's first row, (order..., row)
ROWS = "_txs_rows"        # how many input rows a partial row merges
# A snapshot when the changelog has grown this many records past the newest one (docs/state.md).
SNAPSHOT_EVERY = int(os.environ.get("TXSTREAM_STATE_SNAPSHOT_EVERY", 200_000))


@dataclass(frozen=True)
class MergeSpec:
    app_id: str
    clients: KafkaClients
    side_dir: str
    batch_id: int
    description: OperatorDescription
    group_names: tuple[str, ...]          # grouping columns in the partial rows (window first, if any)
    partial_names: tuple[str, ...]        # the partial aggregate columns, in aggregates' order
    out_schema: pa.Schema = field(repr=False)   # the aggregation's (or the deduplicated rows') schema
    watermark_ms: int | None = None
    store_kind: str = "rocksdb"
    timeout_s: float = 60.0
    event_column: str | None = None       # deduplication: the watermark's column in the rows

    @property
    def operator(self) -> str:
        return self.description.operator


def _ms(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return round(value.timestamp() * 1000)
    return int(value)


def _plain(value: Any) -> Any:
    """A partial's value as the state keeps it (JSON-able; timestamps as epoch microseconds)."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return round(value.timestamp() * 1_000_000)
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _typed(value: Any, typ: pa.DataType) -> Any:
    """A value the state or a key kept, back in its column's type."""
    if value is None:
        return None
    if pa.types.is_date(typ) and isinstance(value, str):
        return date.fromisoformat(value)
    if pa.types.is_binary(typ) and isinstance(value, str):
        return value.encode()
    if pa.types.is_decimal(typ):
        return Decimal(str(value))
    return value


def _store(spec: MergeSpec, unit: int) -> tuple[StateStore, Path | None]:
    """The unit's local copy (RocksDB in the executor's local directory, which every Python worker
    of the executor opens in turn) and its directory; a memory store (and None) when another
    process holds it."""
    if spec.store_kind == "rocksdb":
        # Named by the state's epoch: a copy from before a `txstream state reset` is never opened.
        path = run_directory(f"txstream-state-{spec.app_id}") / f"{spec.operator}-{spec.description.epoch}-{unit}"
        os.makedirs(path.parent, exist_ok=True)
        try:
            return open_store("rocksdb", str(path), unit), path
        except StateStoreError:
            pass   # a speculative copy of the unit holds it: restore into memory instead
    return open_store("memory", None, unit), None


def _pending_file(path: Path) -> Path:
    return path.with_name(path.name + ".pending")


def _take_pending(spec: MergeSpec, unit: int, store: StateStore, path: Path | None, marker: Any) -> bool:
    """The changes this executor merged for the unit's last batch, applied to the local copy if
    that batch committed (its marker says so) on top of the very state they were merged into: the
    copy then need not read its own batch back from the changelog. Returns whether it did."""
    if path is None:
        return False
    pending = _pending_file(path)
    try:
        with open(pending, "rb") as src:
            saved = pickle.load(src)
    except (FileNotFoundError, EOFError, pickle.UnpicklingError):
        return False
    finally:
        pending.unlink(missing_ok=True)
    if saved["base"] != store.version.batch or marker.done_through != saved["batch"]:
        return False   # the batch did not commit, or the copy moved since: restore reads the changelog
    from txstream.state.changelog import changelog_end

    # Every record of the committed batch lies below the changelog's end now, and no later batch
    # of this unit committed (the marker names this one): the copy covers up to the end.
    end = changelog_end(spec.clients, spec.app_id, spec.operator, unit, spec.timeout_s)
    store.load(saved["changes"].items(), StoreVersion(unit, saved["batch"], end))
    return True


def _save_pending(spec: MergeSpec, path: Path | None, store: StateStore) -> None:
    if path is None or not store.changes():
        return
    pending = _pending_file(path)
    with open(pending.with_suffix(".tmp"), "wb") as out:
        pickle.dump({"batch": spec.batch_id, "base": store.version.batch, "changes": dict(store.changes())}, out,
                    protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(pending.with_suffix(".tmp"), pending)


def merge_unit(spec: MergeSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    worker_heap.settle()
    from pyspark import TaskContext

    from txstream.task.units import read_markers

    unit = TaskContext.get().partitionId()
    rows = [row for batch in batches for row in batch.to_pylist()]
    markers = read_markers(spec.clients, spec.app_id, spec.description.units, spec.timeout_s)
    marker = markers[unit]
    if marker.done_through >= spec.batch_id:
        # Published by an earlier attempt: its state is in the changelog already, nothing to merge.
        write_state(spec.side_dir, spec.batch_id, {"skip": True})
        return
    store, path = _store(spec, unit)
    try:
        started = time.perf_counter()
        _take_pending(spec, unit, store, path, marker)
        report = restore(spec.clients, spec.app_id, spec.operator, unit, store, marker,
                         reread_marker=lambda: read_markers(spec.clients, spec.app_id, spec.description.units,
                                                            spec.timeout_s)[unit],
                         timeout=spec.timeout_s)
        restored_s = time.perf_counter() - started
        snapshot_s = _snapshot_if_due(spec, unit, store, report)
        merger = _Merger(spec, store)
        late = [(row[LATE].encode(), row[LATE_MS]) for row in rows if row.get(LATE) is not None]
        partials = [row for row in rows if row.get(LATE) is None]
        out = merger.run(partials)
        emitted = merger.emitted
        events = max((e for e in (_ms(row.get(EVENTS)) for row in partials) if e is not None), default=None)
        write_state(spec.side_dir, spec.batch_id, {
            "changes": dict(store.changes()), "late": late, "events": events, "emitted": emitted,
            "rows": sum(int(row.get(ROWS) or 0) for row in partials),
            "restore": {"source": report.source, "records": report.changelog_records, "seconds": restored_s,
                        "snapshot_seconds": snapshot_s},
            "keys": store.approximate_count()})
        _save_pending(spec, path, store)
        store.abort()
    finally:
        store.close()
    if out:
        yield pa.RecordBatch.from_pylist(out, schema=spec.out_schema)


def _snapshot_if_due(spec: MergeSpec, unit: int, store: StateStore, report: Any) -> float:
    """Write a snapshot of the state just restored (the state after the marker's batch) when the
    changelog has grown SNAPSHOT_EVERY records past the newest snapshot: a restore then reads
    that snapshot and a tail shorter than that. Its own transactional.id: the unit's producer
    stays the publisher's. Returns the seconds it took (0: none was due)."""
    if report.changelog_to - report.snapshot_offset < SNAPSHOT_EVERY or store.version.changelog_offset is None:
        return 0.0
    from confluent_kafka import Producer

    from txstream.state.snapshot import write_snapshot

    started = time.perf_counter()
    producer = Producer(spec.clients.producer(**{
        "transactional.id": f"{spec.app_id}-{spec.operator}-snapshot-{unit}", "enable.idempotence": True}))
    try:
        producer.init_transactions(spec.timeout_s)
        write_snapshot(spec.clients, producer, spec.app_id, spec.operator, store, store.version.changelog_offset,
                       spec.timeout_s)
    finally:
        producer.flush(1)
    return time.perf_counter() - started


class _Merger:
    """One batch of one unit: partials merged into the store, the emitted rows decided."""

    def __init__(self, spec: MergeSpec, store: StateStore) -> None:
        self.spec, self.store = spec, store
        d = spec.description
        self.aggregates = d.aggregates
        self.codec = StateCodec(d.state_schema)
        self.windowed = d.kind == WINDOW
        self.mode = d.output_mode
        self.fields = spec.out_schema
        self.watermark = spec.watermark_ms
        self.emitted: list[bytes] = []   # the state key of each row emitted, in order

    def run(self, partials: list[dict]) -> list[dict]:
        if self.spec.description.kind == DEDUP:
            return self._deduplicate(partials)
        if self.spec.description.kind == SESSION:
            return self._sessions(partials)
        changed: dict[bytes, dict] = {}
        group_names = self.spec.group_names
        value_names = group_names[1:] if self.windowed else group_names
        for row in partials:
            window = None
            if self.windowed:
                w = row[group_names[0]]
                window = (_ms(w["start"]), _ms(w["end"]))
            key = encode_key([row[n] for n in value_names], window)
            stored = self.store.get(key)
            state = self.codec.decode(stored) if stored is not None else aggs.empty(self.aggregates)
            state = aggs.merge(self.aggregates, state, [_plain(row[n]) for n in self.spec.partial_names])
            self.store.put(key, self.codec.encode(state))
            changed[key] = state
        out: list[dict] = []
        if self.mode == "complete":
            for key, value in self.store.scan():
                out.append(self._emit(key, self.codec.decode(value)))
        elif self.mode == "update":
            out.extend(self._emit(key, state) for key, state in sorted(changed.items()))
        if self.windowed and self.watermark is not None and self.mode != "complete":
            # Windows the watermark closed: emitted now in append mode, and their state deleted.
            for key, value in list(self.store.scan(end=window_prefix(self.watermark + 1))):
                if self.mode == "append":
                    out.append(self._emit(key, self.codec.decode(value)))
                self.store.delete(key)
        return out

    def _emit(self, key: bytes, state: dict) -> dict:
        self.emitted.append(key)
        return self._row(key, state)

    def _row(self, key: bytes, state: dict, windowed: bool | None = None) -> dict:
        windowed = self.windowed if windowed is None else windowed
        values, window = decode_key(key, windowed)
        names = self.spec.group_names
        row: dict[str, Any] = {}
        if windowed:
            row[names[0]] = {"start": window[0] * 1000, "end": window[1] * 1000}
            names = names[1:]
        for name, value in zip(names, values, strict=True):
            typ = self.fields.field(name).type
            row[name] = value * 1000 if pa.types.is_timestamp(typ) and isinstance(value, int) else _typed(value, typ)
        for agg, value in zip(self.aggregates, aggs.final(self.aggregates, state), strict=True):
            row[agg.name] = _typed(value, self.fields.field(agg.name).type)
        return row

    def _sessions(self, partials: list[dict]) -> list[dict]:
        """Session windows: each group's open sessions in one state key. A batch's sessions (Spark
        cut them within the batch) merge with every open session they overlap; a session is
        closed once the watermark passes its end (last event + gap)."""
        names, window = self.spec.group_names[1:], self.spec.group_names[0]
        by_key: dict[bytes, list[dict]] = {}
        for row in partials:
            by_key.setdefault(encode_key([row[n] for n in names]), []).append(row)
        changed: list[tuple[bytes, dict]] = []
        for key, rows in sorted(by_key.items()):
            stored = self.store.get(key)
            sessions = self.codec.decode(stored)["sessions"] if stored is not None else []
            for row in sorted(rows, key=lambda r: _ms(r[window]["start"])):
                start, end = _ms(row[window]["start"]), _ms(row[window]["end"])
                state = aggs.merge(self.aggregates, aggs.empty(self.aggregates),
                                   [_plain(row[n]) for n in self.spec.partial_names])
                joined = [s for s in sessions if s["start"] < end and start < s["end"]]
                for other in joined:
                    state = aggs.merge_states(self.aggregates, state, other)
                    start, end = min(start, other["start"]), max(end, other["end"])
                sessions = [s for s in sessions if s not in joined] + [{**state, "start": start, "end": end}]
            sessions.sort(key=lambda s: s["start"])
            self.store.put(key, self.codec.encode({"sessions": sessions}))
            changed += [(key, s) for s in sessions if any(
                _ms(r[window]["start"]) >= s["start"] and _ms(r[window]["end"]) <= s["end"] for r in rows)]
        out: list[dict] = []
        if self.mode == "update":
            out += [self._session_row(key, s) for key, s in changed]
        for key, value in list(self.store.scan()):
            sessions = self.codec.decode(value)["sessions"]
            if self.mode == "complete":
                out += [self._session_row(key, s) for s in sessions]
                continue
            if self.watermark is None:
                continue
            closed = [s for s in sessions if s["end"] <= self.watermark]
            if not closed:
                continue
            if self.mode == "append":
                out += [self._session_row(key, s) for s in closed]
            kept = [s for s in sessions if s["end"] > self.watermark]
            if kept:
                self.store.put(key, self.codec.encode({"sessions": kept}))
            else:
                self.store.delete(key)
        return out

    def _session_row(self, key: bytes, session: dict) -> dict:
        values, _ = decode_key(key, False)
        self.emitted.append(encode_key(values, (session["start"], session["end"])))
        row = self._row(encode_key(values, (session["start"], session["end"])), session, windowed=True)
        return row

    def _deduplicate(self, partials: list[dict]) -> list[dict]:
        """Each key's first row, unless the state has seen the key; keys whose event time the
        watermark passed are forgotten (dropDuplicatesWithinWatermark)."""
        out: list[dict] = []
        delay = (self.spec.description.watermark or {}).get("delay_ms", 0)
        event_column = self.spec.event_column
        for row in sorted(partials, key=lambda r: encode_key([r[n] for n in self.spec.group_names])):
            key = encode_key([row[n] for n in self.spec.group_names])
            if self.store.get(key) is not None:
                continue
            first = row[FIRST]["row"]
            event = _ms(first.get(event_column)) if event_column else None
            self.store.put(key, self.codec.encode({"t": None if event is None else event + delay}))
            self.emitted.append(key)
            out.append(first)
        if self.watermark is not None and event_column:
            for key, value in list(self.store.scan()):
                expires = self.codec.decode(value)["t"]
                if expires is not None and expires <= self.watermark:
                    self.store.delete(key)
        return out
