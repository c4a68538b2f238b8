"""A stateful unit's merge in a Spark task (a `mapInArrow` body after `repartition(K, ...)`):
docs/state.md.

Spark hands unit i the batch's partial aggregates of the groups that hash to it (or, for
deduplication, each key's first row), and the batch's late rows. This shell brings unit i's state
partition to the unit's marker (a local copy plus the changelog's tail: state/restore.py), has
the operator of its kind (txstream/operators/) merge the partials into it and decide what the
output mode emits, and yields those rows in the aggregation's own schema, for the rest of the
user's transform and then the unit's publisher (task/units.py), which runs later in the same task.

The merge writes nothing to Kafka. The batch's state changes, its late rows and its latest event
time go to the publisher through the task's side file (task/sidefile.py), and reach Kafka in the
unit's transaction with its output and its marker. The local copy takes them only from the
changelog, at the next batch's restore: it never holds a change Kafka did not commit.
"""
from __future__ import annotations

import os
import pickle
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa

from txstream.errors import TransformError
from txstream.operators.base import MergeSpec
from txstream.operators.kinds import operator_for
from txstream.state.errors import StateStoreError
from txstream.state.restore import restore
from txstream.state.store import StateStore, StoreVersion
from txstream.state.stores import open_store
from txstream.task import worker_heap
from txstream.task.sidefile import MergeResult, current_task_attempt, run_directory, state_file, write_state
from txstream.task.spec import FromJob, resolve


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
    if (saved["base"] != store.version.batch or marker.done_through != saved["batch"]
            or not marker.attempt or saved.get("attempt") != marker.attempt):
        # The batch did not commit, another attempt of it did (its changes may differ: the marker
        # names the attempt that committed), or the copy moved since: restore reads the changelog.
        return False
    from txstream.state.changelog import changelog_end

    # Every record of the committed batch lies below the changelog's end now, and no later batch
    # of this unit committed (the marker names this one): the copy covers up to the end.
    end = changelog_end(spec.clients, spec.app_id, spec.operator, unit, spec.timeout_s)
    store.load(saved["changes"].items(), StoreVersion(unit, saved["batch"], end))
    return True


def save_pending(spec: MergeSpec, path: Path | None, changes: dict[bytes, bytes | None], base_batch: int,
                 attempt: str) -> None:
    """Keep the batch's `changes`, merged into the state at `base_batch`, for the next batch's
    `_take_pending`."""
    if path is None or not changes:
        return
    pending = _pending_file(path)
    with open(pending.with_suffix(".tmp"), "wb") as out:
        pickle.dump({"batch": spec.batch_id, "base": base_batch, "attempt": attempt, "changes": dict(changes)}, out,
                    protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(pending.with_suffix(".tmp"), pending)


@dataclass
class OpenedUnit:
    """A unit's store brought to its marker (`open_unit`), and how it got there."""

    store: StateStore
    path: Path | None
    report: Any            # state/restore.py RestoreReport
    restored_s: float
    snapshot_s: float


def unit_to_merge(spec: MergeSpec, unit: int, what: str) -> Any:
    """The unit's marker, or None when an earlier attempt published the batch (its state is in the
    changelog already: nothing to merge). Refuses a second merge in one task: something after the
    stateful operator (a coalesce) put two units' rows in one task, whose partition id names one
    unit, and its store would take both."""
    from txstream.records import read_markers

    if state_file(spec.side_dir, spec.batch_id, current_task_attempt()).exists():
        raise TransformError(f"batch {spec.batch_id}: a second state merge in the task of unit {unit}: the transform "
                             f"merges partitions after its stateful operator (a coalesce?); keep what follows the "
                             f"{what} to selects and filters")
    marker = read_markers(spec.clients, spec.app_id, spec.description.units, spec.timeout_s)[unit]
    return None if marker.done_through >= spec.batch_id else marker


def open_unit(spec: MergeSpec, unit: int, marker: Any) -> OpenedUnit:
    """The unit's store (`_store`) with this executor's pending changes, restored to `marker`
    (a snapshot written when due); the caller closes it."""
    from txstream.records import read_markers

    store, path = _store(spec, unit)
    try:
        started = time.perf_counter()
        _take_pending(spec, unit, store, path, marker)
        report = restore(spec.clients, spec.app_id, spec.operator, unit, store, marker,
                         reread_marker=lambda: read_markers(spec.clients, spec.app_id, spec.description.units,
                                                            spec.timeout_s)[unit],
                         timeout=spec.timeout_s)
        restored_s = time.perf_counter() - started
        return OpenedUnit(store, path, report, restored_s, _snapshot_if_due(spec, unit, store, report))
    except BaseException:
        store.close()
        raise


def merge_unit(spec: MergeSpec | FromJob, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: unit `partitionId`'s merge (`FromJob`: the job carries the spec, task/spec.py)."""
    worker_heap.settle()
    from pyspark import TaskContext

    spec = resolve(spec)
    unit = TaskContext.get().partitionId()
    received = list(batches)
    marker = unit_to_merge(spec, unit, "aggregation")
    if marker is None:
        write_state(spec.side_dir, spec.batch_id, MergeResult.skipped())
        return
    opened = open_unit(spec, unit, marker)
    store, report = opened.store, opened.report
    try:
        operator = operator_for(spec.description.kind)
        # This attempt's name, in the side file (so in the marker its publisher commits) and in the
        # pending file: a later batch applies the pending changes only if this attempt committed.
        attempt = uuid.uuid4().hex[:12]
        merged = operator.merge(spec, store, pa.Table.from_batches(received) if received else None)
        write_state(spec.side_dir, spec.batch_id, MergeResult(
            changes=dict(store.changes()), attempt=attempt, late=merged.late, events=merged.events,
            emitted=merged.emitted, expires=merged.expires, rows=merged.rows, keys=operator.user_keys(store),
            restore_source=report.source, restore_records=report.changelog_records, restore_s=opened.restored_s,
            snapshot_s=opened.snapshot_s))
        save_pending(spec, opened.path, store.changes(), store.version.batch, attempt)
        store.abort()
    finally:
        store.close()
    if merged.out is not None and merged.out.num_rows:
        yield from merged.out.to_batches()


def _snapshot_if_due(spec: MergeSpec, unit: int, store: StateStore, report: Any) -> float:
    """Write a snapshot of the state just restored (the state after the marker's batch) when the
    changelog has grown `spec.snapshot_every` records past the newest snapshot: a restore then reads
    that snapshot and a tail shorter than that. One transaction of the engine, on a producer of
    its own, closed after it (state/snapshot.py). Returns the seconds it took (0: none was due)."""
    if report.changelog_to - report.snapshot_offset < spec.snapshot_every or store.version.changelog_offset is None:
        return 0.0
    from txstream.state.snapshot import write_snapshot

    started = time.perf_counter()
    write_snapshot(spec.clients, spec.app_id, spec.operator, store, store.version.changelog_offset, spec.timeout_s)
    return time.perf_counter() - started
