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

A slot's reader (several ranges in one task) leaves one file for all of its ranges, which its
publisher takes whole: one file per range cost, at 256 partitions on 2 slots, half the reading
worker's samples (creating 128 files a batch) and a fifth of the publishing worker's (reading
them, each read followed by a sweep of the run's directory, by then hundreds of files).
"""
from __future__ import annotations

import os
import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from txstream.task.probe import local_dirs

_NAME = re.compile(r"b(\d+)-a(\d+)(?:-r\d+)?\.\w+$")


def run_directory(side_dir: str) -> Path:
    """This run's directory in the executor's first local directory."""
    return Path(local_dirs()[0]) / side_dir


def side_file(side_dir: str, batch_id: int, task_attempt: int, kind: str, plan_index: int | None = 0) -> Path:
    """Where a task attempt's reader leaves one range's dead letters and counts for its
    publisher; `plan_index` None: the file of all the ranges a slot's reader read."""
    suffix = "" if plan_index is None else f"-r{plan_index}"
    return run_directory(side_dir) / f"b{batch_id}-a{task_attempt}{suffix}.{kind}"


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
    dead_letters: list[tuple[Any, ...]]  # (key, value, headers, timestamp_ms, offset, stage, error)
    read_seconds: float
    largest_record: int = 0   # bytes of key + value of the range's largest record


def write_side_file(side_dir: str, batch_id: int, result: ReadResult, plan_index: int = 0) -> None:
    """One range's result (a task that reads one range)."""
    _write(side_file(side_dir, batch_id, current_task_attempt(), "read", plan_index), result)


def write_side_files(side_dir: str, batch_id: int, results: dict[int, ReadResult]) -> None:
    """Every range's result of a slot's reader, {plan index: result}, in one file."""
    _write(side_file(side_dir, batch_id, current_task_attempt(), "read", None), results)


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
    """The reader's results for these ranges of this task attempt, {plan index: result},
    consumed: the files are removed, the slot's file whole (its publisher takes all its ranges
    at once). Then one sweep of the run's directory."""
    attempt = current_task_attempt()
    found: dict[int, ReadResult] = {}
    slot = _take(side_file(side_dir, batch_id, attempt, "read", None))
    if slot is not None:
        found.update((i, slot[i]) for i in plan_indexes if i in slot)
    for index in plan_indexes:
        if index not in found:
            single = _take(side_file(side_dir, batch_id, attempt, "read", index))
            if single is not None:
                found[index] = single
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
