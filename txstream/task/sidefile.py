"""The reader's side file: how a reading task tells the publisher of the same task what it read.

Records that cannot be decoded never enter the DataFrame; the reader writes them (with its counts)
to a small file keyed by the Spark task attempt, which the publisher downstream in the same task
picks up once its own input is exhausted and sends to the dead-letter topic inside the same
transaction. The publisher removes the file when it takes it.
"""
from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def side_file(side_dir: str, batch_id: int, task_attempt: int, kind: str) -> Path:
    """Where a task attempt's reader leaves dead letters and counts for its publisher."""
    return Path(side_dir) / f"batch-{batch_id}" / f"attempt-{task_attempt}.{kind}"


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


def write_side_file(side_dir: str, batch_id: int, result: ReadResult) -> None:
    path = side_file(side_dir, batch_id, current_task_attempt(), "read")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as out:
        pickle.dump(result, out, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)


def read_side_file(side_dir: str, batch_id: int) -> ReadResult | None:
    """The reader's result for this task attempt, consumed: the file is removed."""
    path = side_file(side_dir, batch_id, current_task_attempt(), "read")
    try:
        with open(path, "rb") as src:
            result = pickle.load(src)
    except FileNotFoundError:
        return None
    path.unlink(missing_ok=True)
    return result
