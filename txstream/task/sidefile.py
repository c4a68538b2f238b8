"""The reader's side file: how a reading task tells the publisher of the same task what it read.

Records that cannot be decoded never enter the DataFrame; the reader writes them (with its counts)
to a small file keyed by the Spark task attempt, which the publisher downstream in the same task
picks up once its own input is exhausted and sends to the dead-letter topic inside the same
transaction. The publisher removes the file when it takes it.

The files live in the executor's own local directory (Spark's SPARK_LOCAL_DIRS, removed when the
application ends), never in a path the driver made: on a cluster the driver's directories do not
exist on the executors' hosts. `side_dir` is only a run's directory *name* under it. A file an
attempt left behind (it died between reading and publishing) is swept by a later task of the
same run on that executor once its batch is over.

A reader leaves one file for all of its ranges (a slot's reader, many), named by its first plan
index, which its publisher takes whole: a file per range would cost a slot's reader and its
publisher a file created, read and removed per range and batch. Several readers in one task (reading
partitions coalesced into one publishing task) each leave their own.
"""
from __future__ import annotations

import os
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txstream.records import DeadLetter
from txstream.task.probe import local_dirs

_NAME = re.compile(r"b(\d+)-a(\d+)(?:-r\d+)?\.\w+$")


def run_directory(side_dir: str) -> Path:
    """This run's directory in the executor's first local directory."""
    return Path(local_dirs()[0]) / side_dir


def side_file(side_dir: str, batch_id: int, task_attempt: int, first_index: int) -> Path:
    """Where a task attempt's reader whose first range is plan `first_index` leaves its ranges'
    dead letters and counts for its publisher."""
    return run_directory(side_dir) / f"b{batch_id}-a{task_attempt}-r{first_index}.read"


def sweep(side_dir: str, batch_id: int) -> int:
    """Remove files of batches before `batch_id - 1` (their tasks are over: the driver plans
    batch b only after b-1 ended, and a cancelled b-1's stragglers are given one batch's grace).
    Returns how many were removed."""
    removed = 0
    try:
        entries = list(os.scandir(run_directory(side_dir)))
    except OSError:
        return 0
    for entry in entries:
        match = _NAME.match(entry.name)
        if match and int(match.group(1)) < batch_id - 1:
            try:
                os.unlink(entry.path)
                removed += 1
            except OSError:
                pass
    return removed


def current_task_attempt() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.taskAttemptId() if context is not None else -1


@dataclass
class ReadResult:
    """What the reader tells the publisher of the same task (through the side file)."""

    records: int
    dead_letters: list[DeadLetter]
    read_seconds: float
    largest_record: int = 0   # bytes of key + value of the range's largest record


def write_side_file(side_dir: str, batch_id: int, results: dict[int, ReadResult]) -> None:
    """Every range's result of a reader, {plan index: result}, in one file."""
    _write(side_file(side_dir, batch_id, current_task_attempt(), min(results)), results)


def _write(path: Path, content: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as out:
        pickle.dump(content, out, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)


def read_side_file(side_dir: str, batch_id: int, plan_index: int = 0) -> ReadResult | None:
    """The reader's result for one range of this task attempt, consumed (read_side_files)."""
    return read_side_files(side_dir, batch_id, [plan_index]).get(plan_index)


def read_side_files(side_dir: str, batch_id: int, plan_indexes: list[int]) -> dict[int, ReadResult]:
    """The readers' results for these ranges of this task attempt, {plan index: result},
    consumed: each file is removed whole (a slot's reader left all its ranges in one). Then one
    sweep of the run's directory."""
    attempt = current_task_attempt()
    wanted = set(plan_indexes)
    found: dict[int, ReadResult] = {}
    for index in sorted(wanted):   # a reader's file is named by its first range
        if index not in found:
            results = _take(side_file(side_dir, batch_id, attempt, index))
            if results is not None:
                found.update((i, result) for i, result in results.items() if i in wanted)
    sweep(side_dir, batch_id)
    return found


def _take(path: Path) -> Any:
    """A file's content, the file removed; None when there is none."""
    try:
        with open(path, "rb") as src:
            content = pickle.load(src)
    except FileNotFoundError:
        return None
    path.unlink(missing_ok=True)
    return content


def state_file(side_dir: str, batch_id: int, task_attempt: int) -> Path:
    """Where a stateful unit's merge (task/state_unit.py) leaves the batch's state changes, late
    records and event times for the unit's publisher, later in the same task attempt."""
    return run_directory(side_dir) / f"b{batch_id}-a{task_attempt}.state"


@dataclass
class MergeResult:
    """What a stateful unit's merge (task/state_unit.py) leaves the unit's publisher
    (task/units.py) in the same task attempt: the state's changes for the changelog, the late
    rows for the dead-letter topic, the event time and rows merged for the marker, the state key
    (and a deduplicated key's expiry) of each row emitted, and how the state was restored."""

    skip: bool = False      # the unit's marker says the batch is published: nothing merged, nothing to add
    changes: dict[bytes, bytes | None] = field(default_factory=dict)   # state key -> row (None: removed)
    late: list[tuple[bytes, int]] = field(default_factory=list)        # the late rows (JSON) and their event times
    events: int | None = None           # the latest event time among the partials
    events_right: int | None = None     # a stream-stream join: its right side's latest event time
    emitted: list[bytes] = field(default_factory=list)               # the state key of each row emitted, in order
    expires: list[int | None] = field(default_factory=list)          # ... a deduplicated key's expiry (ms), aligned
    rows: int = 0                       # input rows the partials merged
    keys: int = 0                       # the state's keys after the merge
    restore_source: str = ""            # state/restore.py RestoreReport.source
    restore_records: int = 0            # changelog records replayed
    restore_s: float = 0.0
    snapshot_s: float = 0.0             # a snapshot written after the restore
    attempt: str = ""                   # which merge attempt this is (named in the unit's marker)

    @staticmethod
    def skipped() -> MergeResult:
        return MergeResult(skip=True)


def write_state(side_dir: str, batch_id: int, result: MergeResult) -> None:
    _write(state_file(side_dir, batch_id, current_task_attempt()), result)


def take_state(side_dir: str, batch_id: int) -> MergeResult | None:
    """The merge's result for this task attempt, consumed; None when the merge left none."""
    return _take(state_file(side_dir, batch_id, current_task_attempt()))


def probe_file(side_dir: str, batch_id: int) -> Path:
    """Where a join unit's probe leaves what its finish needs, later in the same task attempt
    (task/join_unit.py)."""
    return run_directory(side_dir) / f"b{batch_id}-a{current_task_attempt()}.probe"


def write_probe(side_dir: str, batch_id: int, content: Any) -> None:
    _write(probe_file(side_dir, batch_id), content)


def take_probe(side_dir: str, batch_id: int) -> Any:
    return _take(probe_file(side_dir, batch_id))
