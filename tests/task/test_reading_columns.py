"""The reader's columnar collection (task/reading.py `_Columns.add_all`, `_by_range`): the same
rows and read position as the message-by-message path, whatever librdkafka hands over.

Pure logic over confluent_kafka.Message objects built here: which messages a range keeps is
decided before anything reaches Kafka again (the read against a real broker, control records
and aborted transactions included, is tested in test_engine_protocol.py and test_arrow_batches.py).
"""
from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException, Message

from txstream.task.reading import _by_range, _Columns


def msg(offset: int, partition: int = 0, topic: str = "in", headers=None, error=None) -> Message:
    return Message(topic=topic, partition=partition, offset=offset, key=f"k{offset}".encode(),
                   value=f"value-{offset}".encode(), headers=headers, error=error, timestamp=(1, 1000 + offset))


def collected(columns: _Columns) -> list[tuple]:
    return list(zip(columns.keys, columns.values, columns.offsets, columns.timestamps, columns.headers, strict=True))


def both_ways(messages: list[Message], end: int, position: int) -> tuple[_Columns, int]:
    """add_all's result, checked equal to `add_each`'s on the same messages."""
    fast, slow = _Columns("in", 0), _Columns("in", 0)
    got = fast.add_all(messages, end, position)
    expected = slow.add_each(messages, end, position)
    assert (got, collected(fast), fast.bytes, fast.largest) == (expected, collected(slow), slow.bytes, slow.largest)
    return fast, got


def test_a_healthy_fetch_is_collected_column_by_column_up_to_the_planned_end():
    messages = [msg(o, headers=[("h", b"1")] if o == 12 else None) for o in (10, 11, 12, 14, 15, 17)]
    columns, position = both_ways(messages, end=15, position=10)
    assert position == 15
    assert columns.offsets == [10, 11, 12, 14]
    assert columns.timestamps == [1010, 1011, 1012, 1014]
    assert columns.headers[2] == [("h", b"1")] and columns.headers[0] is None


def test_a_fetch_that_ends_below_the_planned_end_moves_past_its_last_record():
    columns, position = both_ways([msg(3), msg(5)], end=100, position=3)
    assert position == 6 and columns.count == 2


@pytest.mark.parametrize("messages", [
    [msg(7), msg(8), msg(10)],                               # records below the position (a stale fetch)
    [msg(10), msg(11, partition=1), msg(12)],                # another partition's record
    [msg(10), msg(11, topic="other"), msg(12)],              # another topic's record
    [msg(10), msg(12), msg(11)],                             # offsets that do not rise
], ids=["below-position", "other-partition", "other-topic", "not-rising"])
def test_what_a_healthy_read_never_hands_over_takes_the_per_message_path(messages):
    columns, position = both_ways(messages, end=100, position=9)
    assert all(o >= 9 for o in columns.offsets)


def test_an_error_message_raises_on_either_path():
    broken = [msg(10), msg(11, error=KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))]
    with pytest.raises(KafkaException):
        _Columns("in", 0).add_all(broken, 100, 10)
    eof = [msg(10), msg(11, error=KafkaError(KafkaError._PARTITION_EOF)), msg(12)]
    columns, position = both_ways(eof, end=100, position=10)
    assert columns.offsets == [10, 12] and position == 13   # an end of partition is no record


def test_messages_are_split_by_range_in_order_and_finished_ranges_dropped():
    reading = {("in", 0): None, ("in", 2): None}
    messages = [msg(1, 0), msg(2, 0), msg(5, 2), msg(3, 0), msg(9, 1), msg(6, 2)]
    split = _by_range(messages, reading, one_topic=True)
    assert {k: [m.offset() for m in v] for k, v in split.items()} == {("in", 0): [1, 2, 3], ("in", 2): [5, 6]}


def test_two_topics_with_the_same_partition_number_stay_apart():
    reading = {("a", 0): None, ("b", 0): None}
    messages = [msg(1, 0, "a"), msg(7, 0, "b"), msg(2, 0, "a"), msg(8, 0, "b")]
    split = _by_range(messages, reading, one_topic=False)
    assert {k: [m.offset() for m in v] for k, v in split.items()} == {("a", 0): [1, 2], ("b", 0): [7, 8]}


def test_an_error_in_a_fetch_raises_unless_it_is_an_end_of_partition():
    reading = {("in", 0): None}
    with pytest.raises(KafkaException):
        _by_range([msg(1), msg(-1, 5, error=KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))], reading, True)
    split = _by_range([msg(1), msg(-1, 5, error=KafkaError(KafkaError._PARTITION_EOF))], reading, True)
    assert [m.offset() for m in split[("in", 0)]] == [1]
