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
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from txstream.kafka.config import KafkaClients
from txstream.state import aggregates as aggs
from txstream.state import values
from txstream.state.codec import StateCodec
from txstream.state.errors import StateStoreError
from txstream.state.keys import (
    EXPIRY,
    EXPIRY_END,
    EXPIRY_VALUE,
    decode_key,
    decode_keys,
    encode_key,
    encode_keys,
    expiring_key,
    expiry_end,
    expiry_key,
    window_prefix,
)
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
    # A snapshot once the changelog has grown this many records past the newest one (docs/state.md).
    snapshot_every: int = 200_000

    @property
    def operator(self) -> str:
        return self.description.operator








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


@dataclass
class Merged:
    """What a unit's merge of one batch decided (the publisher's side file holds it)."""

    out: pa.Table | None              # the rows emitted, in the aggregation's (or the rows') schema
    emitted: list[bytes]              # the state key of each row emitted, in order
    late: list[tuple[bytes, int]]     # the late rows (JSON) and their event times
    events: int | None                # the latest event time among the partials
    rows: int                         # input rows the partials merge
    # Deduplication with a watermark: each emitted row's expiry (ms), aligned with `emitted`.
    expires: list[int | None] = field(default_factory=list)


def merge_partials(spec: MergeSpec, store: StateStore, batches: list[pa.RecordBatch]) -> Merged:
    """The merge's core: the batch's partials (and late rows) merged into `store`, whose
    buffered changes are then the batch's state changes. Column-wise: Arrow encodes the keys
    and reads the columns, the store is read once for all keys, and the output is built a
    column at a time; Python's per-row work is the state's decoding, merging and encoding."""
    table = pa.Table.from_batches(batches) if batches else None
    if table is None or table.num_rows == 0:
        partials, late = None, []
    else:
        late_mask = pc.is_valid(table[LATE]) if LATE in table.column_names else None
        if late_mask is not None and pc.any(late_mask).as_py():
            gone = table.filter(late_mask)
            late = [(text.encode(), ms) for text, ms in zip(gone[LATE].to_pylist(), gone[LATE_MS].to_pylist(),
                                                             strict=True)]
            table = table.filter(pc.invert(late_mask))
        else:
            late = []
        partials = table if table.num_rows else None
    merger = _Merger(spec, store)
    out = merger.run(partials)
    events = rows = None
    if partials is not None:
        events = values.ms(pc.max(partials[EVENTS]).as_py())
        rows = pc.sum(partials[ROWS]).as_py()
    return Merged(out, merger.emitted, late, events, int(rows or 0), merger.expires)


def merge_unit(spec: MergeSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    worker_heap.settle()
    from pyspark import TaskContext

    from txstream.task.units import read_markers

    unit = TaskContext.get().partitionId()
    received = list(batches)
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
        merged = merge_partials(spec, store, received)
        write_state(spec.side_dir, spec.batch_id, {
            "changes": dict(store.changes()), "late": merged.late, "events": merged.events,
            "emitted": merged.emitted, "expires": merged.expires, "rows": merged.rows,
            "restore": {"source": report.source, "records": report.changelog_records, "seconds": restored_s,
                        "snapshot_seconds": snapshot_s},
            "keys": _user_keys(spec, store)})
        _save_pending(spec, path, store)
        store.abort()
    finally:
        store.close()
    if merged.out is not None and merged.out.num_rows:
        yield from merged.out.to_batches()


def _user_keys(spec: MergeSpec, store: StateStore) -> int:
    """The store's keys less the expiry index: deduplication and session windows keep one index
    entry beside each key (keys.expiry_key)."""
    keys = store.approximate_count()
    return keys // 2 if spec.description.kind in (DEDUP, SESSION) else keys


def _snapshot_if_due(spec: MergeSpec, unit: int, store: StateStore, report: Any) -> float:
    """Write a snapshot of the state just restored (the state after the marker's batch) when the
    changelog has grown `spec.snapshot_every` records past the newest snapshot: a restore then reads
    that snapshot and a tail shorter than that. Its own transactional.id: the unit's producer
    stays the publisher's. Returns the seconds it took (0: none was due)."""
    if report.changelog_to - report.snapshot_offset < spec.snapshot_every or store.version.changelog_offset is None:
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








def _distinct_rounds(keys: list[bytes]) -> list[list[int]]:
    """Row indexes in rounds that hold each key at most once, in row order: the store is read
    once per round, so a key twice in a batch (two groups whose values encode alike) merges both."""
    if len(set(keys)) == len(keys):
        return [list(range(len(keys)))]
    rounds: list[list[int]] = []
    seen: dict[bytes, int] = {}
    for j, key in enumerate(keys):
        r = seen.get(key, 0)
        seen[key] = r + 1
        if r == len(rounds):
            rounds.append([])
        rounds[r].append(j)
    return rounds


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
        self.expires: list[int | None] = []   # deduplication: when each emitted key expires (ms)
        # The Python type of each aggregate's emitted values when float or int (aggs.final_columns).
        self.kinds: list[type | None] = []
        for agg in self.aggregates:
            typ = self.fields.field(agg.name).type if agg.name in self.fields.names else None
            self.kinds.append(float if typ is not None and pa.types.is_floating(typ)
                              else int if typ is not None and pa.types.is_integer(typ) else None)

    def run(self, partials: pa.Table | None) -> pa.Table | None:
        kind = self.spec.description.kind
        if kind == DEDUP:
            return self._deduplicate(partials)
        if kind == SESSION:
            return self._sessions(partials)
        changed = self._aggregate(partials) if partials is not None else {}
        out: list[tuple[bytes, dict]] = []
        if self.mode == "complete":
            out = [(key, self.codec.decode(value)) for key, value in self.store.scan()]
        elif self.mode == "update":
            out = sorted(changed.items())
        if self.windowed and self.watermark is not None and self.mode != "complete":
            # Windows the watermark closed: emitted now in append mode, and their state deleted.
            for key, value in list(self.store.scan(end=window_prefix(self.watermark + 1))):
                if self.mode == "append":
                    out.append((key, self.codec.decode(value)))
                self.store.delete(key)
        return self._rows(out)

    def _aggregate(self, partials: pa.Table) -> dict[bytes, dict]:
        """Each partial row merged into its group's state; the groups changed, with their state."""
        names = self.spec.group_names
        windows = None
        if self.windowed:
            window = partials[names[0]]
            windows = (values.ms_column(pc.struct_field(window, "start")), values.ms_column(pc.struct_field(window, "end")))
            names = names[1:]
        keys = encode_keys([partials[n] for n in names], partials.num_rows, windows)
        columns = [values.plain_column(partials[n]) for n in self.spec.partial_names]
        changed: dict[bytes, dict] = {}
        decode, encode, put = self.codec.decode, self.codec.encode, self.store.put
        for rows in _distinct_rounds(keys):
            batch_keys = keys if len(rows) == len(keys) else [keys[j] for j in rows]
            batch_columns = columns if len(rows) == len(keys) else [[c[j] for j in rows] for c in columns]
            stored = self.store.get_many(batch_keys)
            states = aggs.merge_rows(self.aggregates, [None if v is None else decode(v) for v in stored],
                                     batch_columns)
            for key, state in zip(batch_keys, states, strict=True):
                put(key, encode(state))
                changed[key] = state
        return changed

    def _rows(self, pairs: list[tuple[bytes, dict]], windowed: bool | None = None) -> pa.Table | None:
        """The output rows of (state key, state) pairs, built a column at a time; their keys are
        the emitted ones, in order."""
        if not pairs:
            return None
        windowed = self.windowed if windowed is None else windowed
        keys = [key for key, _ in pairs]
        self.emitted.extend(keys)
        key_values, windows = decode_keys(keys, windowed)   # not `values`: the module is used below
        names = self.spec.group_names
        columns: dict[str, pa.Array] = {}
        if windowed:
            typ = self.fields.field(names[0]).type
            columns[names[0]] = pa.StructArray.from_arrays(
                [values.arrow_column(windows[0], typ.field("start").type, 1000),
                 values.arrow_column(windows[1], typ.field("end").type, 1000)], fields=list(typ))
            names = names[1:]
        for name, column in zip(names, key_values, strict=True):
            columns[name] = values.arrow_column(column, self.fields.field(name).type, 1000)
        finals = aggs.final_columns(self.aggregates, [state for _, state in pairs], self.kinds)
        for agg, column in zip(self.aggregates, finals, strict=True):
            columns[agg.name] = values.arrow_column(column, self.fields.field(agg.name).type)
        return pa.Table.from_arrays([columns[f.name] for f in self.fields], schema=self.fields)

    def _sessions(self, partials: pa.Table | None) -> pa.Table | None:
        """Session windows: each group's open sessions in one state key. A batch's sessions (Spark
        cut them within the batch) merge with every open session they overlap; a session is
        closed once the watermark passes its end (last event + gap). A group's key is indexed by
        its sessions' first end (keys.expiry_key), so closing reads only the groups that close."""
        names, window = self.spec.group_names[1:], self.spec.group_names[0]
        by_key: dict[bytes, list[dict]] = {}
        if partials is not None:
            keys = encode_keys([partials[n] for n in names], partials.num_rows)
            for key, row in zip(keys, partials.to_pylist(), strict=True):
                by_key.setdefault(key, []).append(row)
        changed: list[tuple[bytes, dict]] = []
        ordered = sorted(by_key)
        for key, stored in zip(ordered, self.store.get_many(ordered), strict=True):
            rows = by_key[key]
            before = self.codec.decode(stored)["sessions"] if stored is not None else []
            sessions = before
            for row in sorted(rows, key=lambda r: values.ms(r[window]["start"])):
                start, end = values.ms(row[window]["start"]), values.ms(row[window]["end"])
                state = aggs.merge(self.aggregates, aggs.empty(self.aggregates),
                                   [values.plain(row[n]) for n in self.spec.partial_names])
                joined = [s for s in sessions if s["start"] < end and start < s["end"]]
                for other in joined:
                    state = aggs.merge_states(self.aggregates, state, other)
                    start, end = min(start, other["start"]), max(end, other["end"])
                sessions = [s for s in sessions if s not in joined] + [{**state, "start": start, "end": end}]
            sessions.sort(key=lambda s: s["start"])
            self._put_sessions(key, before, sessions)
            changed += [(key, s) for s in sessions if any(
                values.ms(r[window]["start"]) >= s["start"] and values.ms(r[window]["end"]) <= s["end"] for r in rows)]
        out: list[tuple[bytes, dict]] = []
        if self.mode == "update":
            out += [self._session_pair(key, s) for key, s in changed]
        if self.mode == "complete":
            for key, value in self.store.scan(start=EXPIRY_END):
                out += [self._session_pair(key, s) for s in self.codec.decode(value)["sessions"]]
        elif self.watermark is not None:
            # The groups with a session the watermark closed, in key order (as a scan of every key gave them).
            closing = sorted(expiring_key(k) for k, _ in self.store.scan(EXPIRY, end=expiry_end(self.watermark)))
            for key, stored in zip(closing, self.store.get_many(closing), strict=True):
                sessions = self.codec.decode(stored)["sessions"]
                closed = [s for s in sessions if s["end"] <= self.watermark]
                if self.mode == "append":
                    out += [self._session_pair(key, s) for s in closed]
                self._put_sessions(key, sessions, [s for s in sessions if s["end"] > self.watermark])
        return self._rows(out, windowed=True)

    def _put_sessions(self, key: bytes, before: list[dict], after: list[dict]) -> None:
        """A group's sessions and its index entry (by its sessions' first end), both replaced."""
        if before:
            self.store.delete(expiry_key(min(s["end"] for s in before), key))
        if after:
            self.store.put(key, self.codec.encode({"sessions": after}))
            self.store.put(expiry_key(min(s["end"] for s in after), key), EXPIRY_VALUE)
        else:
            self.store.delete(key)

    def _session_pair(self, key: bytes, session: dict) -> tuple[bytes, dict]:
        values, _ = decode_key(key, False)
        return encode_key(values, (session["start"], session["end"])), session

    def _deduplicate(self, partials: pa.Table | None) -> pa.Table | None:
        """Each key's first row, unless the state has seen the key; keys whose event time the
        watermark passed are forgotten (dropDuplicatesWithinWatermark), found by the expiry
        index (keys.expiry_key) rather than by reading every key."""
        out = None
        if partials is not None:
            delay = (self.spec.description.watermark or {}).get("delay_ms", 0)
            event_column = self.spec.event_column
            keys = encode_keys([partials[n] for n in self.spec.group_names], partials.num_rows)
            first = pc.struct_field(partials[FIRST], "row")
            events = values.ms_column(pc.struct_field(first, event_column)) if event_column else [None] * len(keys)
            stored = self.store.get_many(keys)
            kept: list[int] = []
            seen: set[bytes] = set()
            encode, put = self.codec.encode, self.store.put
            for j in sorted(range(len(keys)), key=keys.__getitem__):
                key = keys[j]
                if stored[j] is not None or key in seen:
                    continue
                seen.add(key)
                kept.append(j)
                expires = None if events[j] is None else events[j] + delay
                put(key, encode({"t": expires}))
                if expires is not None:
                    put(expiry_key(expires, key), EXPIRY_VALUE)
            self.emitted.extend(keys[j] for j in kept)
            self.expires.extend(None if events[j] is None else events[j] + delay for j in kept)
            if kept:
                rows = first.take(pa.array(kept, pa.int64()))
                out = pa.Table.from_struct_array(rows).cast(self.spec.out_schema)
        if self.watermark is not None and self.spec.event_column:
            for index_key, _ in list(self.store.scan(EXPIRY, end=expiry_end(self.watermark))):
                self.store.delete(index_key)
                self.store.delete(expiring_key(index_key))
        return out
