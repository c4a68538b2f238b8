"""`txstream state show`: a stateful app's state as a restore would rebuild it (docs/state.md, "Tools").

The operators come from the app's state topic `<app>.state` (state/operator.py). Each unit's state
is restored into a MemoryStore by the engine's own code (state/restore.py: the newest snapshot
plus the changelog's tail, tombstones applied, read_committed, every record's batch checked
against the unit's marker), so what is shown is what the next batch would start from. Beside it:
the watermark logged in the app's plan log, each changelog partition's offsets, and the last batch
by the markers and by the changelog's headers.
"""
from __future__ import annotations

import heapq
import json
import re
from base64 import b64decode, b64encode
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any
from uuid import UUID

from txstream.errors import UserError
from txstream.kafka import lookups as kofs
from txstream.kafka.config import KafkaClients
from txstream.operators.join import shown as join_shown
from txstream.records import Marker, PlanShare, read_markers
from txstream.state import partition
from txstream.state.changelog import HeaderReader, changelog_topic, snapshot_topic
from txstream.state.codec import StateCodec
from txstream.state.errors import MarkerMovedDuringRestore, StateAheadOfMarker, StateDecodeError
from txstream.state.keys import EXPIRY, EXPIRY_END, decode_key
from txstream.state.memory import MemoryStore
from txstream.state.operator import JOIN, OperatorDescription, state_topic
from txstream.state.restore import RestoreReport, restore

DEFAULT_LIMIT = 100
_EVERYTHING = Marker(1 << 62)     # a marker no batch reaches: every committed record is accepted
_MARKER_MOVES = 3                 # restores retried when the app commits a batch meanwhile


class NoStateError(UserError):
    """The app has no state to show or reset (or no such operator)."""


# ---------------------------------------------------------------------------------------------
# What is shown
# ---------------------------------------------------------------------------------------------

@dataclass
class UnitState:
    unit: int
    marker_batch: int | None          # the batch the unit's marker says it published (None: no marker)
    last_written_batch: int | None    # the newest batch in the changelog partition's headers
    changelog_start: int
    changelog_end: int
    source: str                       # what the restore read: "snapshot of batch N" or "changelog"
    snapshot_keys: int
    tail_records: int                 # changelog records read after the snapshot (or from the start)
    keys: int

    @property
    def records(self) -> int:
        return self.changelog_end - self.changelog_start


@dataclass
class Entry:
    unit: int
    key: list[Any]                    # the group's values
    window: dict[str, int] | None     # {"start": ms, "end": ms} for windowed operators
    value: Any                        # decoded with the state schema


@dataclass
class OperatorState:
    operator: str
    changelog_topic: str
    description: dict[str, Any]         # as `<app>.state` holds it, with its fingerprint
    units: list[UnitState]
    keys: int                          # live keys, all units
    matched: int                       # of which --key / --window kept
    entries: list[Entry]               # the first `limit` matched, in state key order
    windows: list[dict[str, int]] | None   # windowed: {"start", "end", "keys"} of the matched keys
    notes: list[str] = field(default_factory=list)

    @property
    def changelog_records(self) -> int:
        return sum(u.records for u in self.units)


@dataclass
class StateView:
    app_id: str
    watermark_ms: int | None           # from the newest plan share carrying one
    watermark_batch: int | None        # the batch whose plan carries it
    last_batch: int | None             # the highest batch a unit's marker says it published
    operators: list[OperatorState]
    filters: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        body = asdict(self)
        for op, out in zip(self.operators, body["operators"], strict=True):
            out["changelog_records"] = op.changelog_records
            for unit, unit_out in zip(op.units, out["units"], strict=True):
                unit_out["changelog_records"] = unit.records
        return body

    def json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=_jsonable)

    def text(self) -> str:
        count = len(self.operators)
        lines = [f"App {self.app_id}: {count} stateful operator{'s' if count != 1 else ''}; "
                 f"watermark {_watermark_words(self.watermark_ms, self.watermark_batch)}; last batch "
                 f"{self.last_batch if self.last_batch is not None else '- (no unit has a marker)'} (the units' markers)"]
        lines += [f"Note: {n}" for n in self.notes]
        for op in self.operators:
            lines += ["", *_operator_text(op, self.filters)]
        return "\n".join(lines)


def _watermark_words(ms: int | None, batch: int | None) -> str:
    if ms is None:
        return "- (no watermark in the plan log)"
    return f"{iso(ms)} ({ms} ms, in batch {batch}'s plan)"


def _operator_text(op: OperatorState, filters: dict[str, Any]) -> list[str]:
    d = op.description
    aggregates = ", ".join(f"{a['function']}({a['input']}) as {a['name']}" for a in d.get("aggregates") or [])
    lines = [f"Operator {op.operator}: {d['kind']}, output mode {d['output_mode']}, {d['units']} unit(s), "
             f"fingerprint {d.get('fingerprint', '-')}",
             f"  keys: {', '.join(d['keys']) or '-'}" + (f"; aggregates: {aggregates}" if aggregates else "")]
    if d.get("window"):
        w = d["window"]
        slide = w.get("slide_ms")
        if w.get("gap_ms") is not None:
            lines.append(f"  window: sessions on {w.get('column')}, gap {w['gap_ms']} ms")
        elif w.get("gap") is not None:   # a gap per row
            lines.append(f"  window: sessions on {w.get('column')}, gap {w['gap']} (per row)")
        else:
            how = "tumbling" if not slide or slide == w.get("size_ms") else f"sliding every {slide} ms"
            start = f", starting {w['start_ms']} ms past the epoch's windows" if w.get("start_ms") else ""
            lines.append(f"  window: {w.get('size_ms')} ms on {w.get('column')} ({how}{start})")
    if d.get("watermark"):
        lines.append(f"  watermark: {d['watermark'].get('column')} minus {d['watermark'].get('delay_ms')} ms")
    lines.append(f"  changelog {op.changelog_topic}: {op.changelog_records} offsets in {len(op.units)} partition(s) "
                 "(records, tombstones and transaction markers, less what compaction removed)")
    lines += ["  " + row for row in _table(
        ["UNIT", "MARKER", "LAST-WRITTEN", "CHANGELOG", "RESTORED-FROM", "TAIL-READ", "KEYS"],
        [[u.unit, _batch(u.marker_batch), _batch(u.last_written_batch), f"{u.changelog_start}..{u.changelog_end}",
          u.source + (f" ({u.snapshot_keys} keys)" if u.source.startswith("snapshot") else ""), u.tail_records, u.keys]
         for u in op.units])]
    lines += [f"  Note: {n}" for n in op.notes]
    if op.windows is not None:
        lines.append(f"  Open windows ({len(op.windows)}):" if op.windows else "  Open windows: none")
        if op.windows:
            lines += ["    " + row for row in _table(["START", "END", "KEYS"],
                                                     [[iso(w["start"]), iso(w["end"]), w["keys"]] for w in op.windows])]
    said = ", ".join(f"--{k} {v}" for k, v in filters.items() if v is not None and k in ("key", "window"))
    of = f"{op.matched} matching {said} of {op.keys}" if said else f"{op.keys}"
    shown = f"the first {len(op.entries)} of " if len(op.entries) < op.matched else ""
    lines.append(f"  Keys ({shown}{of}):" if op.matched else f"  Keys: none ({of})")
    if op.entries:
        header = (["WINDOW-START", "WINDOW-END"] if op.windows is not None else []) + ["KEY", "UNIT", "VALUE"]
        rows = [([iso(e.window["start"]), iso(e.window["end"])] if e.window else []) +
                [_compact(e.key), e.unit, _compact(e.value)] for e in op.entries]
        lines += ["    " + row for row in _table(header, rows)]
    return lines


def _batch(batch: int | None) -> str:
    return "-" if batch is None else f"batch {batch}"


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=_jsonable)


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    cells = [header] + [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]


def iso(ms: int) -> str:
    """Milliseconds since the epoch as ISO 8601 UTC (what --window accepts back)."""
    when = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _jsonable(value: Any) -> Any:
    """What Avro decodes to beyond JSON's types (logical types, bytes)."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, (Decimal, UUID)):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            return "base64:" + b64encode(bytes(value)).decode()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


# ---------------------------------------------------------------------------------------------
# Filters
# ---------------------------------------------------------------------------------------------

def parse_window_start(text: str) -> int:
    """--window START: milliseconds since the epoch, or an ISO 8601 time (no zone: UTC, as the
    windows are printed)."""
    text = text.strip()
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError:
        raise UserError(f"--window {text!r}: give the window's start as milliseconds since the epoch or an ISO "
                        "8601 time, e.g. 2026-05-01T12:00:00Z") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return round(when.timestamp() * 1000)


def key_matcher(text: str):
    """--key K: a JSON list is the group's values, all of them (`["EUR",3]`); anything else must
    equal one of the values, as JSON (`3`, `"EUR"`) or as text (`EUR`)."""
    try:
        parsed: Any = json.loads(text)
        as_json = True
    except ValueError:
        parsed, as_json = None, False

    def same(value: Any) -> bool:
        if as_json and type(value) is type(parsed) and value == parsed:
            return True
        if isinstance(value, dict) and set(value) == {"b64"}:   # a binary key value (state/keys.py): its bytes
            return b64decode(value["b64"]) == text.encode()
        return (value if isinstance(value, str) else json.dumps(value)) == text

    def match(values: list[Any]) -> bool:
        if as_json and isinstance(parsed, list):
            return values == parsed
        return any(same(v) for v in values)

    return match


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------

def read_descriptions(clients: KafkaClients, app_id: str, timeout: float) -> dict[str, OperatorDescription]:
    """The operators described in `<app>.state` (the latest record per operator; a tombstone
    removes one), read_committed."""
    topic = state_topic(app_id)
    latest: dict[str, tuple[int, bytes | None]] = {}

    def take(records: list) -> None:
        for record in records:
            name = (record.key() or b"").decode("utf-8", "backslashreplace")
            latest[name] = (record.offset(), record.value())

    with partition.reader(clients, app_id) as reader:
        low, _high = partition.bounds(reader, topic, 0, timeout)
        partition.read_to_end(reader, topic, 0, low, take, timeout)
    found = {}
    for name, (offset, value) in sorted(latest.items()):
        if value is None:
            continue
        try:
            found[name] = OperatorDescription.from_json(value)
        except (ValueError, TypeError, KeyError) as exc:
            raise StateDecodeError(f"{topic}[0]@{offset}: the description of operator {name!r} does not read as "
                                   f"an operator description ({exc})") from None
    return found


def no_state(admin: Any, app_id: str, timeout: float, why: str) -> NoStateError:
    """The one line for an app without state: an unknown app id is said as `status` says it."""
    from txstream.tools.status import unknown_app

    group = kofs.describe_group(admin, app_id, timeout)
    if not group.members and not kofs.committed_offsets(admin, app_id, None, stable=False, timeout=timeout):
        return NoStateError(unknown_app(admin, app_id, timeout))
    return NoStateError(f"app {app_id!r} has no state: {why}")


def descriptions_or_refuse(clients: KafkaClients, admin: Any, app_id: str, known: dict[str, int],
                           timeout: float) -> dict[str, OperatorDescription]:
    topic = state_topic(app_id)
    if topic not in known:
        raise no_state(admin, app_id, timeout, f"its state topic {topic} does not exist (its transform keeps no "
                                               "state across batches, or `txstream state reset` deleted it)")
    found = read_descriptions(clients, app_id, timeout)
    if not found:
        raise no_state(admin, app_id, timeout, f"its state topic {topic} describes no operator")
    return found


def plan_watermark(admin: Any, app_id: str, timeout: float) -> tuple[int | None, int | None]:
    """(watermark ms, batch) from the app group's plan log (records.py PlanShare): the watermark
    of the newest plan share that has one (shares written before the engine logged watermarks
    have none)."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    def call() -> list:
        future = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(app_id)],
                                                   request_timeout=timeout)[app_id]
        return future.result(timeout + 5).topic_partitions or []

    best: tuple[int, int] | None = None
    for tp in kofs.kafka_call(admin, f"reading the plan log of group {app_id}", call, timeout):
        share = PlanShare.decode(tp.metadata)
        if share is None or share.watermark_ms is None:
            continue
        batch, watermark = share.batch_id, share.watermark_ms
        if best is None or (batch, watermark) > best:
            best = (batch, watermark)
    return (None, None) if best is None else (best[1], best[0])


def newest_batch(clients: KafkaClients, app_id: str, operator: str, unit: int, low: int, high: int,
                 timeout: float) -> int | None:
    """The newest batch in the headers of the changelog partition's committed records: a unit
    writes its batches in order, so it is the last record's; read back from the end in growing
    windows (an aborted batch or a commit marker may be last)."""
    topic = changelog_topic(app_id, operator)
    window = 16
    while high > low:
        start = max(low, high - window)
        headers, newest = HeaderReader(operator, unit, topic), []

        def take(records: list, headers: HeaderReader = headers, newest: list = newest) -> None:
            newest.append(max(headers.batch_of(r) for r in records))

        with partition.reader(clients, app_id) as reader:   # a fresh one per window, as latest_manifest
            partition.read_to_end(reader, topic, unit, start, take, timeout)
        if newest:
            return max(newest)
        if start <= low:
            return None
        window *= 8
    return None


def _restore_unit(clients: KafkaClients, app_id: str, description: OperatorDescription, unit: int,
                  markers: dict[int, Marker], notes: list[str], timeout: float) -> tuple[MemoryStore, RestoreReport]:
    """The unit's state as the engine restores it; state ahead of the marker is shown all the same
    (everything committed), with a note: the tool must show what is there, not refuse."""
    def marker_now() -> Marker:
        return read_markers(clients, app_id, description.units, timeout)[unit]

    for _attempt in range(_MARKER_MOVES):
        store = MemoryStore(unit)
        try:
            return store, restore(clients, app_id, description.operator, unit, store, markers[unit],
                                  reread_marker=marker_now, timeout=timeout)
        except MarkerMovedDuringRestore:
            markers[unit] = marker_now()     # the app committed a batch meanwhile: again, at the new marker
        except StateAheadOfMarker as ahead:
            notes.append(f"unit {unit}: the state holds batch {ahead.batch}, after the batch its marker names "
                         f"({ahead.marker_batch}): the state and the markers disagree (one was reset or restored "
                         "without the other); shown: everything committed in the changelog")
            break
    else:
        notes.append(f"unit {unit}: its marker moved during each of {_MARKER_MOVES} reads (the app is running); "
                     "shown: everything committed in the changelog when it was read")
    store = MemoryStore(unit)
    return store, restore(clients, app_id, description.operator, unit, store, _EVERYTHING, timeout=timeout)


def _tagged(unit: int, store: MemoryStore, windowed: bool) -> Iterator[tuple[bytes, int, bytes]]:
    """The unit's keys, without the expiry index of deduplication and session windows (keys.EXPIRY:
    the engine's, not the user's; it sorts before their JSON keys). A windowed key starts with
    its window's end and has no index beside it."""
    for key, value in store.items() if windowed else store.scan(start=EXPIRY_END):
        yield key, unit, value


def _index_keys(store: MemoryStore, windowed: bool) -> int:
    return 0 if windowed else sum(1 for _ in store.scan(EXPIRY, end=EXPIRY_END))


def _operator_state(clients: KafkaClients, app_id: str, description: OperatorDescription, known: dict[str, int],
                    marks: dict, markers: dict[int, Marker], match_key: Any, window_start: int | None, limit: int,
                    timeout: float) -> OperatorState:
    name, units = description.operator, description.units
    changelog = changelog_topic(app_id, name)
    state = OperatorState(name, changelog, json.loads(description.to_json()), [], 0, 0, [],
                          [] if description.windowed else None)
    if changelog not in known:
        state.notes.append(f"its changelog topic {changelog} does not exist: no state yet (the engine creates it "
                           "at start)")
        return state
    if known[changelog] != units:
        state.notes.append(f"{changelog} has {known[changelog]} partitions, the description says {units} units")
    if snapshot_topic(app_id, name) not in known:
        state.notes.append(f"its snapshot topic {snapshot_topic(app_id, name)} does not exist: its state cannot be "
                           "restored as the engine would (the engine creates both topics at start)")
        return state
    codec = StateCodec(description.state_schema) if description.state_schema else None
    stores: list[tuple[int, MemoryStore]] = []
    for unit in range(min(units, known[changelog])):
        store, report = _restore_unit(clients, app_id, description, unit, markers, state.notes, timeout)
        stores.append((unit, store))
        mark = marks[kofs.Partition(changelog, unit)]
        marker = markers.get(unit)
        state.units.append(UnitState(
            unit, marker.done_through if marker is not None and marker.offset is not None else None,
            newest_batch(clients, app_id, name, unit, mark.earliest, mark.log_end, timeout),
            mark.earliest, mark.log_end, report.source, report.snapshot_keys, report.changelog_records,
            store.approximate_count() - _index_keys(store, description.windowed)))
    # The stores' key order (window end first, then the values), merged across units.
    rows = heapq.merge(*(_tagged(unit, store, description.windowed) for unit, store in stores),
                       key=lambda row: row[0])
    windows: Counter = Counter()
    undecodable = 0
    for key, unit, value in rows:
        state.keys += 1
        joined = description.kind == JOIN   # a side's row: (side, join keys), its values and matched flag
        values, window = (join_shown(key, value)[0], None) if joined else decode_key(key, description.windowed)
        if window_start is not None and (window is None or window[0] != window_start):
            continue
        if match_key is not None and not match_key(values):
            continue
        state.matched += 1
        if window is not None:
            windows[window] += 1
        if limit and len(state.entries) >= limit:
            continue
        try:
            decoded: Any = join_shown(key, value)[1] if joined else \
                codec.decode(value) if codec is not None else {"bytes": value.hex()}
        except StateDecodeError:
            decoded, undecodable = {"undecodable": value.hex()}, undecodable + 1
        state.entries.append(Entry(unit, values, None if window is None else {"start": window[0], "end": window[1]},
                                   decoded))
    if undecodable:
        state.notes.append(f"{undecodable} value(s) do not read with the state schema: shown as hex")
    if state.windows is not None:
        state.windows = [{"start": s, "end": e, "keys": n} for (s, e), n in sorted(windows.items(),
                                                                                  key=lambda w: (w[0][1], w[0][0]))]
    return state


def show_state(clients: KafkaClients, app_id: str, operator: str | None = None, key: str | None = None,
               window_start: int | None = None, limit: int = DEFAULT_LIMIT,
               timeout: float = kofs.DEFAULT_TIMEOUT) -> StateView:
    """The app's state; `operator`, `key` (key_matcher) and `window_start` (ms) narrow what is
    listed, `limit` caps the keys listed per operator (0: all)."""
    admin = kofs.admin_client(clients)
    known = kofs.cluster_topics(admin, timeout)    # also the reachability check
    described = descriptions_or_refuse(clients, admin, app_id, known, timeout)
    if operator is not None:
        if operator not in described:
            raise NoStateError(f"app {app_id!r} has no operator {operator!r}; its operators: {', '.join(described)}")
        described = {operator: described[operator]}
    if window_start is not None and not any(d.windowed for d in described.values()):
        raise NoStateError(f"--window: no operator of app {app_id!r} has windows "
                           f"({', '.join(f'{n}: {d.kind}' for n, d in described.items())})")
    units = max(d.units for d in described.values())
    markers = read_markers(clients, app_id, units, timeout)
    changelogs = [changelog_topic(app_id, n) for n in described if changelog_topic(app_id, n) in known]
    marks = kofs.watermarks(admin, [(t, p) for t in changelogs for p in range(known[t])], timeout)
    match_key = key_matcher(key) if key is not None else None
    operators = [_operator_state(clients, app_id, d, known, marks, markers, match_key, window_start, limit, timeout)
                 for d in described.values() if window_start is None or d.windowed]
    watermark, watermark_batch = plan_watermark(admin, app_id, timeout)
    done = [m.done_through for m in markers.values() if m.offset is not None]
    return StateView(app_id, watermark, watermark_batch, max(done) if done else None, operators,
                     {"operator": operator, "key": key,
                      "window": None if window_start is None else iso(window_start), "limit": limit})
