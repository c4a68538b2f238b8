"""Group membership on the driver (docs/architecture.md).

The driver joins the app's consumer group for the input topics and so owns a set of partitions.
Its assigned partitions stay paused: it polls to heartbeat and to take part in rebalances. Only
while the driver idles (nothing to plan) does it fetch, from the last stable offsets, so that the
first record committed after a quiet spell wakes the driver (`watch`); the records themselves are
dropped, the tasks read them. On revocation it first lets the in-flight batch finish, so no
partition is given up while one of its transactions is open.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from txstream.kafka.config import KafkaClients, as_clients
from txstream.kafka.retry import retriable

log = logging.getLogger("txstream")

# Cooperative-sticky moves only the partitions that must move: the others keep processing
# through a rebalance instead of all stopping (eager), which matters when one batch is in flight.
DEFAULT_ASSIGNMENT = "cooperative-sticky"

# How long a watch retries the seek that librdkafka refuses until a resumed partition's fetcher
# has started (`watch`).
WATCH_SEEK_S = 0.5


class GroupMembership:
    def __init__(self, clients: KafkaClients | str, app_id: str, topics: list[str],
                 wait_for_batch: Callable[[], None], on_change: Callable[[str, list[TopicPartition]], None] | None = None,
                 remember: bool = False) -> None:
        config = as_clients(clients).stable_reader(app_id, **{
            "enable.auto.offset.store": False,
            "session.timeout.ms": 10_000,
            "heartbeat.interval.ms": 1_000,
            "max.poll.interval.ms": 300_000,
            # What a watch (below) fetches only tells the driver that a record is there: the
            # broker's smallest answer (one record batch per partition) is enough.
            "max.partition.fetch.bytes": 1,
        })
        config.pop("auto.offset.reset", None)  # the planner applies it, never this consumer
        if config.get("group.protocol") == "consumer":
            # KIP-848: the broker assigns; these classic-protocol settings are refused.
            for key in ("partition.assignment.strategy", "session.timeout.ms", "heartbeat.interval.ms"):
                config.pop(key, None)
        else:
            config.setdefault("partition.assignment.strategy", DEFAULT_ASSIGNMENT)
        # Incremental (cooperative-sticky, or the KIP-848 protocol) vs eager assignment.
        self._incremental = (config.get("group.protocol") == "consumer"
                             or "cooperative" in str(config.get("partition.assignment.strategy", "")))
        self.consumer = Consumer(config)
        self.topics = topics
        self._owned: set[tuple[str, int]] = set()
        self._lock = threading.Lock()
        self._wait_for_batch = wait_for_batch
        self._on_change = on_change
        self.generation_changes = 0
        # The committed offsets as last read or committed (remember/forget), and the
        # generation_changes they hold for; `stable_reads` counts the reads that went to Kafka.
        self.remembers = remember   # answers committed() from what it saw (the narrow driver's)
        self._known: dict[tuple[str, int], int | None] = {}
        self._known_at: int | None = None
        self.stable_reads = 0
        self._watching: list[TopicPartition] = []
        self.consumer.subscribe(topics, on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._lost)

    # -- rebalance callbacks (run inside poll, on the driver's main thread) ----------------------

    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self._incremental:
            consumer.incremental_assign(partitions)
        else:
            consumer.assign(partitions)
        if partitions:
            consumer.pause(partitions)
        with self._lock:
            self._owned |= {(p.topic, p.partition) for p in partitions}
            self.generation_changes += 1
        if self._on_change and partitions:
            self._on_change("assigned", partitions)

    def _revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Finish the in-flight batch before the partitions go to another member.
        self._wait_for_batch()
        with self._lock:
            self._owned -= {(p.topic, p.partition) for p in partitions}
            self.generation_changes += 1
        if self._incremental:
            consumer.incremental_unassign(partitions)
        else:
            consumer.unassign()
        if self._on_change and partitions:
            self._on_change("revoked", partitions)

    def _lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Lost (session expired): another member may already own them; our in-flight
        # transactions carry a stale generation and will be refused. Stop planning them.
        self._revoked(consumer, partitions)

    # -- driver API ------------------------------------------------------------------------------

    def poll(self, timeout: float) -> bool:
        """Heartbeat and serve rebalances for up to `timeout`; True when a watched partition
        delivered a record (it returns at once then)."""
        msg = self.consumer.poll(timeout)
        if msg is None:
            return False
        if msg.error() is not None:
            err = msg.error()
            if err.fatal():
                raise KafkaException(err)
            if err.code() not in (KafkaError._PARTITION_EOF,):
                log.warning("group membership: %s", err.str())
            return False
        return bool(self._watching)

    def watch(self, positions: list[TopicPartition]) -> None:
        """Fetch the owned ones of `positions` (where the planner found nothing: their last
        stable offsets) until `unwatch`, so that poll() returns as soon as a record is committed
        there. Without it an idle driver found new input only when its back-off ended: up to
        idle_backoff_max_s (2 s) after a quiet spell, where a consumer's fetch answers in
        milliseconds. (read_committed: a fetch returns only records of committed transactions,
        those a plan would read.)"""
        with self._lock:
            positions = [tp for tp in positions if (tp.topic, tp.partition) in self._owned]
        if not positions:
            return
        # Resumed first: librdkafka refuses to seek a partition whose fetcher has not started
        # (_STATE), and one paused since its assignment starts only once resumed, after the
        # group's committed offset is fetched, with no event to wait on: so the seek is retried
        # until WATCH_SEEK_S. What it fetches before the seek lands is dropped (the seek outdates it).
        self.consumer.resume(positions)
        self._watching = positions
        try:
            deadline = time.monotonic() + WATCH_SEEK_S
            for tp in positions:
                while not self._seek(tp, retry=time.monotonic() < deadline):
                    time.sleep(0.002)
        except KafkaException as exc:   # no watch this time: the idle back-off alone
            log.warning("group membership: no watch of %s, the idle back-off alone (%s)", positions, exc)
            self.unwatch()

    def _seek(self, position: TopicPartition, retry: bool) -> bool:
        """Seek `position`; False when librdkafka refused for now (_STATE) and `retry` allows."""
        try:
            self.consumer.seek(position)
            return True
        except KafkaException as exc:
            if retry and exc.args[0].code() == KafkaError._STATE:
                return False
            raise

    def unwatch(self) -> None:
        """Pause the watched partitions again (those still assigned)."""
        if not self._watching:
            return
        assigned = {(tp.topic, tp.partition) for tp in self.consumer.assignment()}
        still = [tp for tp in self._watching if (tp.topic, tp.partition) in assigned]
        self._watching = []
        if still:
            self.consumer.pause(still)

    def owned(self) -> list[TopicPartition]:
        with self._lock:
            return [TopicPartition(t, p) for t, p in sorted(self._owned)]

    def group_metadata(self) -> bytes:
        return self.consumer.consumer_group_metadata()

    def member_id(self) -> str | None:
        """This member's id in the group, once it has joined."""
        return self.consumer.memberid() or None

    def committed(self, partitions: list[TopicPartition], timeout: float = 30,
                  fresh: bool = False) -> dict[tuple[str, int], int | None]:
        """The group's committed offsets, read stably (read_committed asks for stable offsets).

        With `remember` (the narrow driver), offsets this driver read or saw committed since its
        assignment last changed are answered without asking Kafka (`fresh` asks anyway). Under
        exactly-once that read came right after the batch's transactions committed, and could wait
        for their markers.
        The tasks' re-check still reads stably, and a plan whose start is not what is committed
        publishes nothing (docs/architecture.md §3, invariant 2)."""
        if not partitions:
            return {}
        keys = [(p.topic, p.partition) for p in partitions]
        if (not fresh and self._known_at == self.generation_changes
                and all(key in self._known for key in keys)):
            return {key: self._known[key] for key in keys}
        wanted = [TopicPartition(t, p) for t, p in keys]
        result = retriable(lambda: self.consumer.committed(wanted, timeout), timeout)
        self.stable_reads += 1
        offsets = {(tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None) for tp in result}
        if self.remembers and not fresh:
            if self._known_at != self.generation_changes:
                self._known, self._known_at = {}, self.generation_changes
            self._known.update(offsets)
        return offsets

    def remember(self, offsets: dict[tuple[str, int], int], since: int) -> None:
        """`offsets` are committed now (a clean batch's ends) and the assignment has not changed
        since generation_changes was `since`: the next `committed` may answer with them."""
        if self.remembers and since == self.generation_changes == self._known_at:
            self._known.update(offsets)
        else:
            self.forget()

    def forget(self) -> None:
        """The next `committed` asks Kafka (after a failed or unclean batch, a dead letter)."""
        self._known, self._known_at = {}, None

    def commit(self, offsets: list[TopicPartition]) -> None:
        """Synchronous offset commit by the member (at-least-once and at-most-once)."""
        if offsets:
            self.consumer.commit(offsets=offsets, asynchronous=False)

    def close(self, timeout: float = 30.0) -> None:
        """Leave the group now, so the partitions move to other instances without a session timeout.

        Unsubscribe first and serve the revoke that follows through poll(), so that the client's
        close() has no assignment left to revoke: librdkafka can wait for ever inside close() when
        it runs a rebalance callback there (in incremental_unassign's request to the group
        thread, librdkafka#4527; e.g. a driver that joined early and failed its transform check
        before its first poll). close() then
        runs in a thread of its own, bounded by what is left of `timeout`: a client that still
        does not return is left behind with a warning (the broker drops the member after its
        session timeout) instead of keeping the driver from exiting."""
        consumer = self.consumer
        deadline = time.monotonic() + timeout
        try:
            consumer.unsubscribe()
            polls = 0   # at least two: an assignment queued before the unsubscribe is served, then revoked
            while time.monotonic() < deadline and (polls < 2 or consumer.assignment()):
                consumer.poll(0.05)
                polls += 1
        except (KafkaException, RuntimeError) as exc:
            log.warning("leaving the group: %s", exc)
        closed = threading.Event()

        def close_client() -> None:
            try:
                consumer.close()
            except (KafkaException, RuntimeError) as exc:
                log.warning("leaving the group: %s", exc)
            finally:
                closed.set()

        threading.Thread(target=close_client, name="txstream-leave-group", daemon=True).start()
        if not closed.wait(max(1.0, deadline - time.monotonic())):
            log.warning("leaving the group: the Kafka client's close did not return within %.0fs; it is left "
                        "behind (the broker drops this member after its session timeout)", timeout)
