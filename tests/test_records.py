"""What the protocols write to Kafka and read back (txstream/records.py): each record decodes what
it encodes, and reads the bytes earlier versions wrote (topics and groups outlive a release). No
broker: the wire forms are written out here as the driver and the units wrote them."""
from __future__ import annotations

import json
import pickle

import pytest

from txstream.records import (
    BatchRecord,
    DeadLetter,
    LoggedPartition,
    Marker,
    PlanShare,
    StateFacts,
    last_batch_id,
    last_watermark,
    markers_name,
    pending_batch,
)

# -- the plan log ------------------------------------------------------------------------------


def test_a_plan_share_reads_the_metadata_written_before_and_since_watermarks() -> None:
    old = "txs1;b=12;e=3456;k=4;t=1700000000000"          # a wide batch's share (no watermark)
    stateful = "txs1;b=13;e=3500;k=4;t=1700000001000;w=1699999990000"
    tables = "txs1;b=14;e=3600;k=4;t=1700000002000;w=1699999991000;l=1699999990000;v=customers:12.0.7,rates:3"
    assert PlanShare.decode(old) == PlanShare(12, 3456, 4, 1_700_000_000_000)
    assert PlanShare.decode(stateful) == PlanShare(13, 3500, 4, 1_700_000_001_000, 1_699_999_990_000)
    assert PlanShare.decode(tables).tables == "customers:12.0.7,rates:3"   # the tables' version (task/tables.py)
    for text in (old, stateful, tables):
        assert PlanShare.decode(text).encode() == text    # the wire form unchanged
    for foreign in (None, "", "txs2;b=1", "txs1;b=x;e=1;k=1;t=1", "txs1;b=1;e=2", "some tool's note"):
        assert PlanShare.decode(foreign) is None


def test_the_log_says_the_last_batch_and_watermark() -> None:
    log = {("t", 0): LoggedPartition(100, PlanShare(5, 150, 3, 9, 700)),
           ("t", 1): LoggedPartition(40, PlanShare(4, 40, 3, 8, 600)),
           ("t", 2): LoggedPartition(None, None)}
    assert last_batch_id(log) == 5 and last_watermark(log) == 700
    pending = pending_batch(log)
    assert pending is not None and pending.batch_id == 5 and pending.watermark_ms == 700
    assert pending.ranges == {("t", 0): (100, 150), ("t", 1): (40, 40)}


def test_a_share_carries_the_watermark_late_rows_are_judged_by() -> None:
    """A stateful batch logs two watermarks, as Spark 3.4+ keeps two: what its state closes by
    (w=, its own) and what its late rows are judged by (l=, the previous batch's); a re-run of
    the pending batch judges the same rows late."""
    share = PlanShare(7, 90, 2, 5, 2_000, 1_000)
    assert share.encode().endswith(";w=2000;l=1000") and PlanShare.decode(share.encode()) == share
    assert PlanShare.decode("txs1;b=7;e=90;k=2;t=5;l=1000").watermark_ms is None
    pending = pending_batch({("t", 0): LoggedPartition(60, share)})
    assert pending is not None and (pending.watermark_ms, pending.late_ms) == (2_000, 1_000)


# -- the units' markers ------------------------------------------------------------------------


def test_a_marker_reads_each_form_a_unit_wrote() -> None:
    wide = "p=0123456789ab;r=3;h=00000000000000ff;v=1111111111111111"
    stateful = wide + ";x=1700000000000;m=10;l=2"
    with_events = wide + ";x=1700000000000"    # a stateful unit before rows merged were recorded
    joined = wide + ";x=1700000000000;y=1699999999000;a=attempt1;m=4;l=0"   # a join's unit: each side's time
    assert Marker.decode(8, wide) == Marker(8, "0123456789ab", 3, "00000000000000ff", "1111111111111111")
    assert Marker.decode(8, stateful) == Marker(8, "0123456789ab", 3, "00000000000000ff", "1111111111111111",
                                                1_700_000_000_000, 10, 2)
    assert Marker.decode(8, with_events).events == 1_700_000_000_000
    assert (Marker.decode(8, joined).events, Marker.decode(8, joined).events_right) == (1_700_000_000_000,
                                                                                       1_699_999_999_000)
    for text in (wide, stateful, with_events, joined):
        assert Marker.decode(8, text).encode() == text    # the wire form unchanged
    assert Marker.decode(8, stateful).done_through == 7


def test_a_marker_without_metadata_or_with_foreign_metadata_is_its_offset() -> None:
    assert Marker.decode(None, None) == Marker(None) and Marker(None).done_through == 0
    odd = Marker.decode(4, "r=many;x=soon;junk")
    assert odd == Marker(4) and odd.done_through == 3
    assert markers_name("app") == "app.units"


# -- the batch record --------------------------------------------------------------------------

# As driver/wide.py wrote them with json.dumps (compact separators), key for key.
WIDE_RECORD = (b'{"batch":3,"plan":"0123456789ab","time_ms":1700000000000,"mode":"units","units":2,'
               b'"ranges":[["in",0,10,20],["in",1,5,5]],"unit_records":{"0":4,"1":6},"dead_letters":1}')
STATE_RECORD = (b'{"batch":4,"plan":"ba9876543210","time_ms":1700000001000,"mode":"units","units":2,'
                b'"ranges":[["in",0,20,30]],"unit_records":{"0":2},"dead_letters":0,'
                b'"state":{"operator":"agg-1","kind":"window","output_mode":"append","epoch":"e1",'
                b'"watermark_ms":1699999990000,"rows_once":true,"unit_merged":{"0":9,"1":0},"unit_late":{"0":1,"1":0}}}')


def test_a_batch_record_reads_what_the_driver_wrote_and_writes_it_back_byte_for_byte() -> None:
    wide = BatchRecord.decode(WIDE_RECORD, offset=17)
    assert wide == BatchRecord(3, "0123456789ab", 1_700_000_000_000, "units", 2, [("in", 0, 10, 20), ("in", 1, 5, 5)],
                               {0: 4, 1: 6}, 1)
    assert wide.offset == 17 and wide.state is None
    stateful = BatchRecord.decode(STATE_RECORD)
    assert stateful.state == StateFacts("agg-1", "window", "append", "e1", 1_699_999_990_000, True,
                                        {0: 9, 1: 0}, {0: 1, 1: 0})
    for value in (WIDE_RECORD, STATE_RECORD):
        assert BatchRecord.decode(value).encode() == value
    assert BatchRecord.decode(stateful.encode()) == stateful


def test_a_batch_record_from_before_epochs_and_a_sparse_one_read() -> None:
    """Records written before the state's epoch was recorded have none; a record naming only the
    batch, its ranges and counts (as tests and older closings wrote) reads with defaults."""
    found = json.loads(STATE_RECORD)
    del found["state"]["epoch"], found["state"]["rows_once"]
    old = BatchRecord.decode(json.dumps(found).encode())
    assert old.state is not None and old.state.epoch is None and old.state.rows_once
    sparse = BatchRecord.decode(b'{"batch":1,"ranges":[],"unit_records":{"0":1}}')
    assert sparse == BatchRecord(1, unit_records={0: 1})
    with pytest.raises((KeyError, ValueError)):
        BatchRecord.decode(b'{"plan":"x"}')
    with pytest.raises(ValueError):
        BatchRecord.decode(b"not json")


# -- dead letters ------------------------------------------------------------------------------


def test_a_dead_letter_is_a_tuple_that_names_its_fields_and_pickles() -> None:
    record = DeadLetter(b"k", b"v", [("h", b"1")], 1_700_000_000_000, 42, "decode", "bad Avro")
    key, value, headers, timestamp_ms, offset, stage, error = record   # as 7-tuples unpacked
    assert (offset, stage, error) == (42, "decode", "bad Avro") == (record.offset, record.stage, record.error)
    again = pickle.loads(pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL))
    assert type(again) is DeadLetter and again == record
