"""`txstream offsets show|reset`, txstream.kafka.lookups and txstream.tools.offset_reset, against the real broker (never a mock).

Each test builds its own topic and group: records from a plain Producer, committed offsets from a
Consumer that commits and closes (so the group is Empty), open transactions from a transactional
Producer left uncommitted until the test ends.
"""
from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone

import pytest
from click.testing import CliRunner, Result
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.support.kafka import live_member
from txstream.cli import main
from txstream.errors import OffsetsError
from txstream.kafka import lookups as ofs
from txstream.kafka.lookups import Partition

BASE_TS = int(time.time() * 1000) - 3_600_000  # record i of a topic has timestamp BASE_TS + i seconds


def produce(bootstrap: str, topic: str, count: int, partition: int = 0, first: int = 0) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(first, first + count):
        producer.produce(topic, f"v{i}".encode(), partition=partition, timestamp=BASE_TS + i * 1000)
    assert producer.flush(30) == 0


def commit(bootstrap: str, group: str, offsets: dict[tuple[str, int], int]) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()], asynchronous=False)
    finally:
        consumer.close()


def new_group() -> str:
    return f"test-offsets-{uuid.uuid4().hex[:10]}"


def committed(admin: AdminClient, group: str) -> dict[tuple[str, int], int | None]:
    return {tuple(p): o for p, o in ofs.committed_offsets(admin, group).items()}


def cli(bootstrap: str, *args: str) -> Result:
    result = CliRunner().invoke(main, ["offsets", *args, "--bootstrap-servers", bootstrap])
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def table(output: str, header_start: str = "TOPIC") -> dict[tuple[str, int], list[str]]:
    """Rows of the first table whose header starts with `header_start`, keyed by (topic, partition)."""
    rows: dict[tuple[str, int], list[str]] = {}
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    for line in lines[start + 1:]:
        if not line.strip():
            break
        cells = line.split()
        rows[(cells[0], int(cells[1]))] = cells[2:]
    return rows


@contextmanager
def open_transaction(bootstrap: str, topic: str, count: int, partition: int = 0) -> Iterator[None]:
    """Records written inside a transaction that stays open for the `with` body, then aborted."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"test-open-{uuid.uuid4().hex}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for _ in range(count):
        producer.produce(topic, b"open", partition=partition)
    assert producer.flush(30) == 0
    try:
        yield
    finally:
        producer.abort_transaction(30)


@pytest.fixture
def ten_records(bootstrap_servers: str, admin: AdminClient, make_topic: Callable[..., str]) -> tuple[str, str]:
    """One partition holding offsets 2..9 (0 and 1 deleted, so earliest = 2), group committed at 5."""
    topic, group = make_topic("ten"), new_group()
    produce(bootstrap_servers, topic, 10)
    admin.delete_records([TopicPartition(topic, 0, 2)])[TopicPartition(topic, 0, 2)].result(30)
    commit(bootstrap_servers, group, {(topic, 0): 5})
    return topic, group


# ---------------------------------------------------------------------------------------------
# show, and the functions under it
# ---------------------------------------------------------------------------------------------

def test_show_committed_log_end_last_stable_and_lag(bootstrap_servers: str, admin: AdminClient,
                                                    make_topic: Callable[..., str]) -> None:
    topic, other, group = make_topic("show", partitions=2), make_topic("other"), new_group()
    produce(bootstrap_servers, topic, 5, partition=0)
    produce(bootstrap_servers, topic, 3, partition=1)
    produce(bootstrap_servers, other, 4)
    commit(bootstrap_servers, group, {(topic, 0): 2})
    with open_transaction(bootstrap_servers, topic, 2, partition=0):
        marks = ofs.watermarks(admin, [Partition(topic, 0), Partition(topic, 1)])
        assert marks[Partition(topic, 0)] == ofs.Watermarks(earliest=0, log_end=7, last_stable=5)
        assert marks[Partition(topic, 1)] == ofs.Watermarks(earliest=0, log_end=3, last_stable=3)
        assert committed(admin, group) == {(topic, 0): 2}
        assert ofs.committed_offsets(admin, group, [Partition(topic, 1)]) == {Partition(topic, 1): None}

        # Without --topic: only what the group has committed offsets for.
        result = cli(bootstrap_servers, "show", "--app-id", group)
        assert result.exit_code == 0, result.output
        assert f"Group {group}: Empty, 0 member(s)" in result.output
        assert table(result.output) == {(topic, 0): ["2", "7", "5", "3", "-"]}

        # --topic adds topics and partitions; LAG = LSO - committed, '-' when nothing is committed.
        result = cli(bootstrap_servers, "show", "--app-id", group, "--topic", topic, "--topic", other)
        assert result.exit_code == 0, result.output
        assert table(result.output) == {(topic, 0): ["2", "7", "5", "3", "-"],
                                        (topic, 1): ["-", "3", "3", "-", "-"],
                                        (other, 0): ["-", "4", "4", "-", "-"]}

        # --to-latest means the last stable offset: never into the open transaction.
        result = cli(bootstrap_servers, "reset", "--app-id", group, "--to-latest")
        assert result.exit_code == 0, result.output
        assert table(result.output) == {(topic, 0): ["2", "5"]}


@contextmanager
def pending_commit(bootstrap: str, group: str, topic: str, offset: int) -> Iterator[Producer]:
    """An offset commit of `group` for topic[0] inside a transaction left open for the `with` body
    (the body may commit it; else it is aborted)."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"test-pending-{uuid.uuid4().hex}"})
    outsider = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.send_offsets_to_transaction([TopicPartition(topic, 0, offset)], outsider.consumer_group_metadata(), 30)
        yield producer
    finally:
        outsider.close()
        try:
            producer.abort_transaction(30)
        except Exception:   # committed in the body: nothing left to abort
            pass


def test_a_stable_read_waits_for_a_pending_offset_commit(bootstrap_servers: str, admin: AdminClient,
                                                         ten_records: tuple[str, str]) -> None:
    """A running app commits its offsets inside its batches' transactions: `verify` and `offsets
    reset` read them stably and must wait for the transaction (not fail, not read the old value);
    a transaction still open at the timeout is a clear error."""
    topic, group = ten_records   # committed at 5
    with pending_commit(bootstrap_servers, group, topic, 7) as producer:
        assert ofs.committed_offsets(admin, group, stable=False) == {Partition(topic, 0): 5}
        with pytest.raises(OffsetsError, match=r"inside a transaction still open after 1s"):
            ofs.committed_offsets(admin, group, timeout=1)
        read: dict = {}

        def stable_read() -> None:
            try:
                read["offsets"] = ofs.committed_offsets(admin, group, timeout=60)
            except Exception as exc:   # handed to the assertions below
                read["error"] = exc

        reader = threading.Thread(target=stable_read)
        reader.start()
        reader.join(2.0)
        assert reader.is_alive(), f"the stable read returned while the commit was pending: {read}"
        producer.commit_transaction(30)
        reader.join(60)
        assert not reader.is_alive()
    assert read.get("offsets") == {Partition(topic, 0): 7}, read


def test_show_a_group_without_offsets(bootstrap_servers: str, make_topic: Callable[..., str]) -> None:
    """No members and no offsets: most likely a typo, an error as `status` makes it (the app ids
    that exist listed); with --topic, the topic's offsets for a group yet to commit."""
    group = new_group()
    result = cli(bootstrap_servers, "show", "--app-id", group)
    assert result.exit_code == 1, result.output
    assert f"no app {group!r}" in result.output, result.output
    named = cli(bootstrap_servers, "show", "--app-id", group, "--topic", make_topic("unread"))
    assert named.exit_code == 0 and "Dead, 0 member(s)" in named.output, named.output
    assert table(named.output), named.output


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_live_members_are_shown_and_block_a_reset(bootstrap_servers: str, admin: AdminClient,
                                                  make_topic: Callable[..., str], protocol: str) -> None:
    topic, group = make_topic("live", partitions=2), new_group()
    produce(bootstrap_servers, topic, 4, partition=0)
    commit(bootstrap_servers, group, {(topic, 0): 3})
    with live_member(bootstrap_servers, group, topic, protocol):
        info = ofs.describe_group(admin, group)
        assert info.state == "Stable" and len(info.members) == 1
        member = info.members[0]
        assert member.client_id == "live-client"
        assert set(member.partitions) == {Partition(topic, 0), Partition(topic, 1)}

        result = cli(bootstrap_servers, "show", "--app-id", group)
        assert result.exit_code == 0, result.output
        assert "Stable, 1 member(s)" in result.output
        assert member.member_id in result.output and "live-client" in result.output
        assert table(result.output)[(topic, 0)] == ["3", "4", "4", "1", member.member_id]

        for mode in ("--dry-run", "--execute"):
            result = cli(bootstrap_servers, "reset", "--app-id", group, "--to-earliest", mode)
            assert result.exit_code == 1, result.output
            assert "live member" in result.output
            assert member.member_id in result.output
            assert "live-client" in result.output and member.host in result.output
        assert committed(admin, group) == {(topic, 0): 3}


# ---------------------------------------------------------------------------------------------
# reset: every target, dry run then execute
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "expected"), [
    (["--to-earliest"], 2),
    (["--to-latest"], 10),
    (["--to-offset", "7"], 7),
    (["--shift-by", "-2"], 3),
    (["--shift-by", "3"], 8),
    # Record 6 has timestamp BASE_TS + 6 s; a time between records 5 and 6 lands on 6.
    (["--to-datetime", "BASE_TS+5.5s"], 6),
], ids=["earliest", "latest", "offset", "shift-back", "shift-forward", "datetime"])
def test_reset_modes_dry_run_then_execute(bootstrap_servers: str, admin: AdminClient,
                                          ten_records: tuple[str, str], args: list[str], expected: int) -> None:
    topic, group = ten_records
    if args[-1] == "BASE_TS+5.5s":  # computed here so that test ids stay the same across runs
        args = [args[0], datetime.fromtimestamp((BASE_TS + 5500) / 1000, timezone.utc).isoformat()]
    result = cli(bootstrap_servers, "reset", "--app-id", group, *args)
    assert result.exit_code == 0, result.output
    assert "Dry run" in result.output
    assert table(result.output) == {(topic, 0): ["5", str(expected)]}
    assert committed(admin, group) == {(topic, 0): 5}, "a dry run must change nothing"

    result = cli(bootstrap_servers, "reset", "--app-id", group, *args, "--execute")
    assert result.exit_code == 0, result.output
    assert "Executed" in result.output
    assert table(result.output) == {(topic, 0): ["5", str(expected)]}
    assert table(result.output.split("Committed now:")[1]) == {(topic, 0): [str(expected)]}
    assert committed(admin, group) == {(topic, 0): expected}


def test_reset_to_datetime_after_the_last_record_goes_to_latest(bootstrap_servers: str, admin: AdminClient,
                                                                 ten_records: tuple[str, str]) -> None:
    topic, group = ten_records
    result = cli(bootstrap_servers, "reset", "--app-id", group, "--to-datetime", "2999-01-01T00:00:00Z", "--execute")
    assert result.exit_code == 0, result.output
    assert "no record at or after 2999-01-01T00:00:00+00:00, so latest" in result.output
    assert committed(admin, group) == {(topic, 0): 10}


@pytest.mark.parametrize(("args", "expected", "why"), [
    (["--to-offset", "100"], 10, "100 is above the latest (last stable) offset 10; clamped to 10"),
    (["--to-offset", "0"], 2, "0 is below the earliest offset 2; clamped to 2"),
    (["--shift-by", "-100"], 2, "-95 is below the earliest offset 2; clamped to 2"),
])
def test_reset_targets_are_clamped_and_say_so(bootstrap_servers: str, admin: AdminClient,
                                              ten_records: tuple[str, str], args: list[str], expected: int,
                                              why: str) -> None:
    topic, group = ten_records
    result = cli(bootstrap_servers, "reset", "--app-id", group, *args, "--execute")
    assert result.exit_code == 0, result.output
    assert f"{topic}-0: {why}" in result.output
    assert table(result.output) == {(topic, 0): ["5", str(expected)]}
    assert committed(admin, group) == {(topic, 0): expected}


def test_reset_only_the_selected_partitions(bootstrap_servers: str, admin: AdminClient,
                                            make_topic: Callable[..., str]) -> None:
    topic, other, group = make_topic("sel", partitions=3), make_topic("untouched"), new_group()
    for p in range(3):
        produce(bootstrap_servers, topic, 4, partition=p)
    produce(bootstrap_servers, other, 4)
    commit(bootstrap_servers, group, {(topic, 0): 1, (topic, 1): 1, (topic, 2): 1, (other, 0): 1})

    result = cli(bootstrap_servers, "reset", "--app-id", group, "--to-latest", "--topic", f"{topic}:0,2", "--execute")
    assert result.exit_code == 0, result.output
    assert table(result.output) == {(topic, 0): ["1", "4"], (topic, 2): ["1", "4"]}
    assert committed(admin, group) == {(topic, 0): 4, (topic, 1): 1, (topic, 2): 4, (other, 0): 1}

    # A whole topic, including a partition nothing was committed for yet.
    result = cli(bootstrap_servers, "reset", "--app-id", group, "--to-offset", "2", "--topic", other, "--execute")
    assert result.exit_code == 0, result.output
    assert table(result.output) == {(other, 0): ["1", "2"]}

    # Without --topic: every partition with a committed offset.
    result = cli(bootstrap_servers, "reset", "--app-id", group, "--to-earliest")
    assert set(table(result.output)) == {(topic, 0), (topic, 1), (topic, 2), (other, 0)}


# ---------------------------------------------------------------------------------------------
# bad input: a clear click error, never a traceback
# ---------------------------------------------------------------------------------------------

def test_reset_needs_exactly_one_target(bootstrap_servers: str, ten_records: tuple[str, str]) -> None:
    _, group = ten_records
    result = cli(bootstrap_servers, "reset", "--app-id", group)
    assert result.exit_code == 2
    assert "give exactly one target option: --to-earliest, --to-latest" in result.output
    result = cli(bootstrap_servers, "reset", "--app-id", group, "--to-earliest", "--shift-by", "1")
    assert result.exit_code == 2
    assert "only one target option at a time, got --to-earliest, --shift-by" in result.output


def test_reset_a_group_without_offsets_needs_topic(bootstrap_servers: str, make_topic: Callable[..., str]) -> None:
    group = new_group()
    result = cli(bootstrap_servers, "reset", "--app-id", group, "--to-earliest")
    assert result.exit_code == 1
    assert f"group {group} has no committed offsets; name the topics to reset with --topic" in result.output

    topic = make_topic("fresh")
    produce(bootstrap_servers, topic, 3)
    result = cli(bootstrap_servers, "reset", "--app-id", group, "--to-earliest", "--topic", topic)
    assert result.exit_code == 0, result.output
    assert table(result.output) == {(topic, 0): ["-", "0"]}


def test_bad_input_gives_clear_errors(bootstrap_servers: str, admin: AdminClient,
                                      ten_records: tuple[str, str]) -> None:
    topic, group = ten_records
    cases = [
        (["reset", "--app-id", group, "--to-latest", "--topic", f"no-such-topic-{uuid.uuid4().hex}"],
         "unknown topic: no-such-topic-"),
        (["reset", "--app-id", group, "--to-latest", "--topic", f"{topic}:0,3"],
         f"topic {topic} has partitions 0..0; no partition 3"),
        (["reset", "--app-id", group, "--to-latest", "--topic", f"{topic}:x"], "partitions must be numbers"),
        (["reset", "--app-id", group, "--to-datetime", "last tuesday"], "not an ISO 8601 date-time"),
        (["show", "--app-id", group, "--topic", f"no-such-topic-{uuid.uuid4().hex}"], "unknown topic"),
    ]
    for args, message in cases:
        result = cli(bootstrap_servers, *args)
        assert result.exit_code in (1, 2), result.output
        assert "Error:" in result.output and message in result.output, result.output

    result = cli(bootstrap_servers, "reset", "--app-id", new_group(), "--shift-by", "1", "--topic", topic)
    assert result.exit_code == 1
    assert f"cannot shift: nothing committed for {topic}-0" in result.output
    assert committed(admin, group) == {(topic, 0): 5}


def test_unreachable_broker_times_out_with_a_clear_error() -> None:
    started = time.monotonic()
    for command in (["show", "--app-id", "x"], ["reset", "--app-id", "x", "--to-earliest"]):
        result = CliRunner().invoke(main, ["offsets", *command, "--bootstrap-servers", "127.0.0.1:1",
                                           "--timeout", "2"])
        assert result.exit_code == 1, result.output
        assert "Traceback" not in result.output
        assert "Cannot reach Kafka at 127.0.0.1:1 within 2s" in result.output
        assert "txstream kafka up" in result.output
    assert time.monotonic() - started < 20


def test_bootstrap_servers_default_from_the_environment(bootstrap_servers: str, ten_records: tuple[str, str]) -> None:
    topic, group = ten_records
    result = CliRunner().invoke(main, ["offsets", "show", "--app-id", group],
                                env={"TXSTREAM_BOOTSTRAP_SERVERS": bootstrap_servers})
    assert result.exit_code == 0, result.output
    assert table(result.output) == {(topic, 0): ["5", "10", "10", "5", "-"]}


def test_watermarks_without_an_offset_are_asked_again_never_taken(monkeypatch) -> None:
    """A ListOffsets answer without error and without offset (-1001, seen while a leader moved in
    the broker-bounce chaos test) is transient: taken as a watermark it made the planner reset a
    committed offset by auto.offset.reset. The real answers are exercised against a broker
    everywhere else; this pins the reaction to the one a broker gives only mid-election."""
    from txstream.errors import TransientKafkaError
    from txstream.kafka.errors import is_transient

    answers = {"reading earliest offsets": 0, "reading log end offsets": 2500, "reading last stable offsets": -1001}
    monkeypatch.setattr(ofs, "list_offsets", lambda _admin, specs, _iso, what, *_a: {p: answers[what] for p in specs})
    with pytest.raises(TransientKafkaError, match=r"no offsets for t\[0\]") as raised:
        ofs.watermarks(None, [("t", 0)])
    assert is_transient(raised.value)   # the planner's retriable() asks again

