"""The reader's side files (task/sidefile.py): one file per reader, named by its first range,
that its publisher takes whole; several readers of one task each with their own; one sweep per
take. No Spark, no broker: the files are plain files in SPARK_LOCAL_DIRS, and the task attempt
is set as Spark's would be."""
from __future__ import annotations

import os
import uuid

import pytest

from txstream.records import DeadLetter
from txstream.task import sidefile
from txstream.task.sidefile import (
    MergeResult,
    ReadResult,
    read_side_file,
    read_side_files,
    take_state,
    write_side_file,
    write_state,
)


@pytest.fixture()
def side_dir(tmp_path, monkeypatch) -> str:
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path))
    monkeypatch.setattr(sidefile, "current_task_attempt", lambda: 42)
    return f"run-{uuid.uuid4().hex[:6]}"


def _listing(side_dir: str) -> list[str]:
    return sorted(os.listdir(sidefile.run_directory(side_dir)))


def test_a_slots_ranges_are_one_file_taken_whole(side_dir):
    results = {i: ReadResult(records=10 * i, dead_letters=[DeadLetter(b"k", b"v", None, 1, i, "decode", "bad")] if i == 3 else [],
                             read_seconds=0.1, largest_record=50 + i) for i in range(128, 256)}
    write_side_file(side_dir, 4, results)
    assert _listing(side_dir) == ["b4-a42-r128.read"]

    found = read_side_files(side_dir, 4, list(reversed(range(128, 256))))
    assert sorted(found) == list(range(128, 256))
    assert [found[i].records for i in range(128, 256)] == [10 * i for i in range(128, 256)]
    assert found[131].dead_letters == [] and found[128].largest_record == 178
    assert _listing(side_dir) == []                                    # consumed
    assert read_side_files(side_dir, 4, list(range(128, 256))) == {}   # once


def test_readers_of_one_task_each_leave_a_file_and_a_missing_range_is_none(side_dir):
    """Reading partitions coalesced into one publishing task: a reader of one range each."""
    write_side_file(side_dir, 2, {7: ReadResult(5, [], 0.0)})
    write_side_file(side_dir, 2, {9: ReadResult(6, [DeadLetter(b"k", b"v", None, 1, 3, "decode", "bad")], 0.0)})
    assert read_side_file(side_dir, 2, 8) is None                # another range: nothing, nothing removed
    assert _listing(side_dir) == ["b2-a42-r7.read", "b2-a42-r9.read"]
    found = read_side_files(side_dir, 2, [9, 7])
    assert found[7].records == 5 and found[9].dead_letters[0].offset == 3
    assert _listing(side_dir) == []


def test_a_take_sweeps_what_batches_before_the_last_left(side_dir):
    write_side_file(side_dir, 1, {0: ReadResult(1, [], 0.0)})   # an attempt that died before publishing
    write_side_file(side_dir, 5, {0: ReadResult(1, [], 0.0)})
    write_side_file(side_dir, 6, {0: ReadResult(1, [], 0.0), 1: ReadResult(2, [], 0.0)})
    write_side_file(side_dir, 7, {0: ReadResult(3, [], 0.0)})
    assert read_side_files(side_dir, 7, [0])[0].records == 3
    # Files of batches before the last are swept (their tasks are over); batch 6's has one batch's grace.
    assert _listing(side_dir) == ["b6-a42-r0.read"]


def test_the_merge_result_reaches_the_units_publisher_typed_and_once(side_dir):
    """A stateful unit's merge leaves a MergeResult for its publisher in the same task attempt
    (task/state_unit.py -> task/units.py): taken whole, as written, then gone."""
    merged = MergeResult(changes={b"k1": b"row", b"k2": None}, late=[(b'{"v":1}', 1_000)], events=5_000,
                         emitted=[b"k1"], expires=[None], rows=3, keys=1, restore_source="changelog",
                         restore_records=7, restore_s=0.25, snapshot_s=0.0)
    write_state(side_dir, 9, merged)
    assert _listing(side_dir) == ["b9-a42.state"]
    taken = take_state(side_dir, 9)
    assert isinstance(taken, MergeResult) and taken == merged and not taken.skip
    assert take_state(side_dir, 9) is None and _listing(side_dir) == []
    write_state(side_dir, 10, MergeResult.skipped())
    assert take_state(side_dir, 10) == MergeResult(skip=True)
