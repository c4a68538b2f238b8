"""A unit's late rows come grouped with the partials (operators/base.py late_marked): each group
holds ROWS copies of one row, and a row of a hopping window comes in one group per window
holding it. `split_late` gives each input row back exactly once."""
from __future__ import annotations

import pyarrow as pa

from txstream.operators.base import LATE, LATE_MS, LATE_RECORD, ROWS, LateRow, split_late


def _table(rows: list[tuple]) -> pa.Table:
    names = ["k", ROWS, LATE, LATE_MS, LATE_RECORD]
    return pa.table({name: [r[i] for r in rows] for i, name in enumerate(names)},
                    schema=pa.schema([("k", pa.string()), (ROWS, pa.int64()), (LATE, pa.string()),
                                      (LATE_MS, pa.int64()), (LATE_RECORD, pa.string())]))


def test_partials_and_late_rows_are_told_apart_and_each_late_row_comes_once() -> None:
    table = _table([
        ("a", 3, None, None, None),                      # a partial row
        ("w1", 1, '{"n":1}', 10, 'in/0/7'),       # one row in three hopping windows ...
        ("w2", 1, '{"n":1}', 10, 'in/0/7'),
        ("w3", 1, '{"n":1}', 10, 'in/0/7'),
        ("w1", 2, '{"n":2}', 20, None),                 # two identical rows, no input record carried,
        ("w2", 2, '{"n":2}', 20, None),                 # ... in two windows
    ])
    partials, late = split_late(table)
    assert partials.column("k").to_pylist() == ["a"]
    assert late == [LateRow(b'{"n":1}', 10, b'in/0/7'), LateRow(b'{"n":2}', 20, None),
                    LateRow(b'{"n":2}', 20, None)]


def test_a_unit_with_only_late_rows_has_no_partials() -> None:
    partials, late = split_late(_table([("w", 1, '{"n":1}', 10, None)]))
    assert partials is None and late == [LateRow(b'{"n":1}', 10, None)]
