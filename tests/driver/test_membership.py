"""The driver's group membership (txstream/driver/membership.py) leaving the group, against the real broker."""
from __future__ import annotations

import logging
import threading
import time
import uuid

from confluent_kafka.admin import AdminClient

from tests.support.waiting import wait_until
from txstream.driver.membership import GroupMembership
from txstream.kafka.lookups import describe_group


class _Recorded:
    """The membership's client, with its close() noted in `events` (and held back until `release`
    is set, when given); everything else is the real client's."""

    def __init__(self, consumer, events: list[str], release: threading.Event | None = None) -> None:
        self._consumer, self._events, self._release = consumer, events, release

    def close(self) -> None:
        self._events.append("close")
        if self._release is not None:
            self._release.wait(60)
        self._consumer.close()

    def __getattr__(self, name: str):
        return getattr(self._consumer, name)


def _assigned_on_the_broker(admin: AdminClient, group: str, partitions: int) -> None:
    """Until the broker lists the group's member with every partition (the client has not polled:
    its assignment waits in its queue)."""
    wait_until(lambda: sum(len(m.partitions) for m in describe_group(admin, group, timeout=10).members) == partitions,
               60, f"the group {group}'s assignment", every=0.05)


def test_leaving_revokes_through_poll_before_the_client_closes(bootstrap_servers, admin, make_topic) -> None:
    """A driver that joined early and stopped before its first poll (a transform that fails its
    check) has its assignment queued when it leaves: the revoke runs in poll(), not inside the
    client's close(), where librdkafka could wait for ever (seen in CI)."""
    topic, group, events = make_topic("members", partitions=4), f"membership-{uuid.uuid4().hex[:8]}", []
    membership = GroupMembership(bootstrap_servers, group, [topic], lambda: None,
                                 lambda what, partitions: events.append(f"{what} {len(partitions)}"))
    membership.consumer = _Recorded(membership.consumer, events)
    _assigned_on_the_broker(admin, group, 4)
    started = time.monotonic()
    membership.close()
    assert time.monotonic() - started < 10
    assert events == ["assigned 4", "revoked 4", "close"], events
    group_now = describe_group(admin, group, timeout=10)
    assert not group_now.members, group_now


def test_a_client_close_that_does_not_return_does_not_keep_the_driver(bootstrap_servers, admin, make_topic,
                                                                      caplog) -> None:
    topic, group, events = make_topic("members", partitions=2), f"membership-{uuid.uuid4().hex[:8]}", []
    release = threading.Event()
    membership = GroupMembership(bootstrap_servers, group, [topic], lambda: None)
    membership.consumer = _Recorded(membership.consumer, events, release)
    _assigned_on_the_broker(admin, group, 2)
    started = time.monotonic()
    try:
        with caplog.at_level(logging.WARNING, logger="txstream"):
            membership.close(timeout=2)
        took = time.monotonic() - started
        assert events == ["close"] and 1.5 < took < 10, (events, took)
        assert "close did not return within 2s" in caplog.text, caplog.text
    finally:
        release.set()   # the held-back close goes on, and the client is closed for real


def test_the_wait_for_an_assignment_polls_in_short_steps(bootstrap_servers, admin, make_topic) -> None:
    """The driver's wait for its assignment (loop.py `_wait_for_assignment`, on every start)
    serves an assignment already queued and returns after a poll of at most ASSIGNMENT_POLL_S:
    poll() waits out its whole timeout even after it served the rebalance callback (no record
    comes: every partition is paused), so the step is what the start pays."""
    from processors.passthrough import PassThrough
    from txstream.driver.loop import ASSIGNMENT_POLL_S, Driver
    from txstream.settings import resolve

    topic, group = make_topic("members", partitions=4), f"membership-{uuid.uuid4().hex[:8]}"
    settings = resolve(PassThrough, bootstrap_servers=bootstrap_servers, app_id=group, inputs=[topic],
                       output=f"{topic}-out", master="local[2]")
    driver = Driver(settings, echo=lambda _m: None)
    driver.membership = GroupMembership(bootstrap_servers, group, [topic], lambda: None)
    polls = _recording_polls(driver.membership)
    try:
        _assigned_on_the_broker(admin, group, 4)   # queued in the client, not yet served
        driver._wait_for_assignment(timeout=30)  # noqa: SLF001 - the start's wait alone
        assert len(driver.membership.owned()) == 4
        steps = [timeout for timeout, _said in polls]
        assert steps and max(steps) <= ASSIGNMENT_POLL_S <= 0.02, steps
    finally:
        driver.membership.close()


def _recording_polls(membership: GroupMembership) -> list[tuple[float, bool]]:
    """Every poll() of `membership` from now on, noted as (timeout, what it said)."""
    polls: list[tuple[float, bool]] = []
    real_poll = membership.poll

    def poll(timeout: float) -> bool:
        polls.append((timeout, real_poll(timeout)))
        return polls[-1][1]

    membership.poll = poll
    return polls


def _polls_for(membership: GroupMembership, seconds: float) -> list[bool]:
    """What poll() said over `seconds` (in 0.1 s polls)."""
    said, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        said.append(membership.poll(0.1))
    return said


def test_a_watch_wakes_on_a_committed_record_and_on_nothing_else(bootstrap_servers, admin, make_topic) -> None:
    """membership.watch (the idle driver's wait): poll() says True once a record is committed at
    or past a watched position; not for the records before it, not for an open transaction's,
    not once unwatched (the partitions are paused again)."""
    from confluent_kafka import Producer, TopicPartition

    from tests.support.kafka import produce

    topic, group = make_topic("watched", partitions=2), f"membership-{uuid.uuid4().hex[:8]}"
    produce(bootstrap_servers, topic, [(b"k", b"before")] * 3, partition=0)
    membership = GroupMembership(bootstrap_servers, group, [topic], lambda: None)
    upstream = Producer({"bootstrap.servers": bootstrap_servers, "transactional.id": f"up-{uuid.uuid4().hex}"})
    try:
        wait_until(lambda: (membership.poll(0.01), len(membership.owned()) == 2)[1], 60, "the assignment")
        membership.watch([TopicPartition(topic, 0, 3), TopicPartition(topic, 1, 0)])
        assert membership._watching, "the seek was refused: no watch"   # noqa: SLF001
        assert not any(_polls_for(membership, 1.0))                 # the three records are behind the watch
        upstream.init_transactions(30)
        upstream.begin_transaction()
        upstream.produce(topic, b"in a transaction", b"k", partition=1)
        upstream.flush(30)
        assert not any(_polls_for(membership, 1.0))                 # open: read_committed sees nothing
        upstream.commit_transaction(30)
        wait_until(lambda: membership.poll(0.1), 30, "the committed record to wake the watch")
        membership.unwatch()
        produce(bootstrap_servers, topic, [(b"k", b"after")] * 3, partition=0)
        assert not any(_polls_for(membership, 1.0))                 # paused again
    finally:
        upstream.close()
        membership.close()


def test_the_idle_driver_plans_as_soon_as_a_record_is_committed(bootstrap_servers, make_topic) -> None:
    """An idle driver's wait (loop.py `_idle`) with the last stable offsets to watch ends on
    the first record committed there, not at the end of its back-off."""
    from confluent_kafka import TopicPartition

    from processors.passthrough import PassThrough
    from tests.support.kafka import produce
    from txstream.driver.loop import Driver
    from txstream.settings import resolve

    topic = make_topic("idle", partitions=1)
    settings = resolve(PassThrough, bootstrap_servers=bootstrap_servers, app_id=f"idle-{uuid.uuid4().hex[:8]}",
                       inputs=[topic], output=f"{topic}-out", master="local[2]")
    driver = Driver(settings, echo=lambda _m: None)
    driver.membership = GroupMembership(bootstrap_servers, settings.app_id, [topic], lambda: None)
    polls = _recording_polls(driver.membership)
    writer = threading.Timer(0.5, lambda: produce(bootstrap_servers, topic, [(b"k", b"v")]))
    try:
        driver._wait_for_assignment(timeout=30)  # noqa: SLF001
        writer.start()
        driver._idle(60.0, watch=[TopicPartition(topic, 0, 0)])  # noqa: SLF001 - the idle wait alone
        assert polls and polls[-1][1] is True, polls   # ended by the record, not by the 60 s
        assert not driver.membership._watching   # noqa: SLF001 - paused again
    finally:
        writer.cancel()
        driver.membership.close()
