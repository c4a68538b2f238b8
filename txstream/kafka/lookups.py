"""Offsets, read once for everyone: the log's watermarks, a group's committed offsets, topics.

Planning, the offsets commands, `verify` and `produce`/`consume` all ask these questions; each is
answered here, with the AdminClient only (no consumer joins a group), in batched requests. Failures
are txstream's types (errors.py): `KafkaUnreachable` when no broker answers, saying where and what
the client said; other Kafka errors classified once (classify_kafka); `OffsetsError` for what a
user must fix (an unknown topic, a commit pending in an open transaction).

"Latest" for a read_committed reader is the last stable offset (LSO): a txstream plan ends there
(docs/architecture.md, planning).
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple, TypeVar

from confluent_kafka import (
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from txstream.errors import KafkaUnreachable, OffsetsError, TransientKafkaError
from txstream.kafka.config import KafkaClients, as_clients
from txstream.kafka.errors import classify_kafka, kafka_error_of

DEFAULT_TIMEOUT = 10.0

T = TypeVar("T")


class Partition(NamedTuple):
    """A topic partition; a tuple, so it is also the (topic, partition) key planning uses."""
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


class Watermarks(NamedTuple):
    """Where a partition's log starts and ends. Offsets in [earliest, last_stable] are valid starts."""
    earliest: int      # log start offset: the first offset still on disk
    log_end: int       # high watermark: next offset to be written (includes open transactions)
    last_stable: int   # LSO: first offset of the oldest open transaction, else log_end


@dataclass(frozen=True)
class Member:
    member_id: str
    client_id: str
    host: str
    partitions: tuple[Partition, ...]

    def describe(self) -> str:
        return f"member {self.member_id} (client id {self.client_id}, host {self.host})"


@dataclass(frozen=True)
class GroupInfo:
    group_id: str
    state: str                      # Kafka's name: Empty, Stable, PreparingRebalance, Dead, ...
    members: tuple[Member, ...]

    @property
    def inactive(self) -> bool:
        """True when offsets may be changed: Kafka allows it only for Empty or Dead groups."""
        return not self.members and self.state in ("Empty", "Dead")


_STATE_NAMES = {
    ConsumerGroupState.EMPTY: "Empty",
    ConsumerGroupState.STABLE: "Stable",
    ConsumerGroupState.PREPARING_REBALANCING: "PreparingRebalance",
    ConsumerGroupState.COMPLETING_REBALANCING: "CompletingRebalance",
    ConsumerGroupState.DEAD: "Dead",
    ConsumerGroupState.UNKNOWN: "Unknown",
}


# ---------------------------------------------------------------------------------------------
# Clients and failures
# ---------------------------------------------------------------------------------------------

def admin_client(clients: KafkaClients | str) -> AdminClient:
    """An AdminClient configured by `clients`, remembering where it points and the last errors
    librdkafka reported (a refused connection, a failed SASL handshake): what the client said."""
    clients = as_clients(clients)
    said: deque[KafkaError] = deque(maxlen=8)
    admin = AdminClient(clients.admin(error_cb=said.append))
    admin.txstream_bootstrap = clients.bootstrap_servers  # type: ignore[attr-defined]
    admin.txstream_errors = said  # type: ignore[attr-defined]
    return admin


def _client_said(admin: AdminClient, fallback: str) -> str:
    """The most telling error librdkafka reported on its own (not the summary 'all brokers down')."""
    said = getattr(admin, "txstream_errors", None)
    if said is None:
        return fallback
    admin.poll(0)  # serves the queued error callbacks
    detail = [e for e in said if e.code() != KafkaError._ALL_BROKERS_DOWN]
    return detail[-1].str() if detail else fallback


def unreachable(where: str, said: str, timeout: float | None = None) -> KafkaUnreachable:
    """The one line a user reads when no broker answers: where, what the client said, what to do."""
    within = f" within {timeout:g}s" if timeout is not None else ""
    if "SSL handshake failed" in said:
        hint = ("The brokers' certificate was not accepted: ssl.ca.location must name the CA that signed it "
                "(-X key=value or --command-config FILE).")
    elif "SASL" in said or "uthentication" in said:
        hint = "The brokers refused the client's credentials: check its sasl.* settings."
    else:
        hint = ("Is a broker running there? `txstream kafka up` starts a local one; a secured cluster needs its "
                "client settings (-X key=value or --command-config FILE).")
    return KafkaUnreachable(f"Cannot reach Kafka at {where}{within}: {said}. {hint}")


def _where(admin: AdminClient) -> str:
    return getattr(admin, "txstream_bootstrap", None) or "the bootstrap servers"


def kafka_call(admin: AdminClient, what: str, call: Callable[[], T], timeout: float,
               retry_s: float | None = None) -> T:
    """Run one admin request, retrying transient errors (a coordinator moving) for `retry_s`
    (default `timeout`). No connection at all is KafkaUnreachable saying where; any other Kafka
    error its classified type (kafka/errors.py classify_kafka), its message naming `what`."""
    deadline = time.monotonic() + (timeout if retry_s is None else retry_s)
    while True:
        try:
            return call()
        except KafkaException as exc:
            err = kafka_error_of(exc)
            failure = classify_kafka(err, what)
            said = (err.str() or err.name()) if err is not None else str(exc)
            if isinstance(failure, KafkaUnreachable) or (err is not None and err.code() == KafkaError._TIMED_OUT):
                raise unreachable(_where(admin), _client_said(admin, said), timeout) from None
            if isinstance(failure, TransientKafkaError) and time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            raise failure from None
        except TimeoutError:
            raise unreachable(_where(admin), _client_said(admin, "no answer"), timeout) from None


# ---------------------------------------------------------------------------------------------
# Topics
# ---------------------------------------------------------------------------------------------

SETTLE_S = 5.0   # how long a new topic's metadata may take to name its leaders


def cluster_topics(admin: AdminClient, timeout: float = DEFAULT_TIMEOUT) -> dict[str, int]:
    """Every topic in the cluster with its number of partitions.

    Also the reachability check: metadata is the first request, so an unreachable broker fails
    here with a clear message after `timeout` instead of deep inside a later call.
    """
    settle_until = time.monotonic() + min(timeout, SETTLE_S)
    while True:
        metadata = kafka_call(admin, "reading cluster metadata", lambda: admin.list_topics(timeout=timeout), timeout)
        # A topic created a moment ago can answer LEADER_NOT_AVAILABLE: it exists, so ask again
        # rather than call it missing.
        settling = [t for t in metadata.topics.values() if t.error is not None and t.error.retriable()]
        if not settling or time.monotonic() > settle_until:
            return {name: len(t.partitions) for name, t in metadata.topics.items() if t.error is None}
        time.sleep(0.1)


def topic_partition_counts(admin: AdminClient, topics: Iterable[str],
                           timeout: float = DEFAULT_TIMEOUT) -> dict[str, int]:
    """Number of partitions of each topic; an unknown topic is an OffsetsError naming it."""
    wanted = sorted(set(topics))
    known = cluster_topics(admin, timeout)
    missing = [t for t in wanted if t not in known]
    if missing:
        raise OffsetsError(f"unknown topic{'s' if len(missing) > 1 else ''}: {', '.join(missing)}")
    return {t: known[t] for t in wanted}


def select_partitions(admin: AdminClient, selection: Mapping[str, Sequence[int] | None],
                      timeout: float = DEFAULT_TIMEOUT) -> list[Partition]:
    """Expand {topic: partitions or None (= all)} into partitions, checking that each one exists."""
    counts = topic_partition_counts(admin, selection, timeout)
    chosen: list[Partition] = []
    for topic, wanted in selection.items():
        numbers = range(counts[topic]) if wanted is None else wanted
        unknown = [p for p in numbers if not 0 <= p < counts[topic]]
        if unknown:
            raise OffsetsError(f"topic {topic} has partitions 0..{counts[topic] - 1}; "
                               f"no partition {', '.join(map(str, unknown))}")
        chosen.extend(Partition(topic, p) for p in numbers)
    return sorted(set(chosen))


# ---------------------------------------------------------------------------------------------
# Groups
# ---------------------------------------------------------------------------------------------

def describe_group(admin: AdminClient, group_id: str, timeout: float = DEFAULT_TIMEOUT) -> GroupInfo:
    """The group's state and live members with their assignments: who would fight a reset.

    A group that never existed (or expired) is reported as Dead with no members, as Kafka does.
    """
    def call() -> GroupInfo:
        try:
            desc = admin.describe_consumer_groups([group_id], request_timeout=timeout)[group_id].result(timeout + 5)
        except KafkaException as exc:
            err = kafka_error_of(exc)
            if err is not None and err.code() == KafkaError.GROUP_ID_NOT_FOUND:
                return GroupInfo(group_id, "Dead", ())
            raise
        members = tuple(
            Member(m.member_id, m.client_id, m.host,
                   tuple(sorted(Partition(tp.topic, tp.partition)
                                for tp in (m.assignment.topic_partitions if m.assignment else []) or [])))
            for m in desc.members)
        return GroupInfo(group_id, _STATE_NAMES.get(desc.state, str(desc.state)), members)

    return kafka_call(admin, f"describing group {group_id}", call, timeout)


def committed_offsets(admin: AdminClient, group_id: str,
                      partitions: Iterable[tuple[str, int]] | None = None, *, stable: bool = True,
                      timeout: float = DEFAULT_TIMEOUT) -> dict[Partition, int | None]:
    """The group's committed offsets (next record to read); None where nothing is committed.

    `partitions=None` returns every partition the group has committed offsets for. `stable=True`
    is the planner's read: a commit still pending in an open transaction is waited for (a running
    app's batch ends in milliseconds) rather than read as the previous value, and one still
    pending after `timeout` (a crashed producer's, until transaction.timeout.ms aborts it) is an
    OffsetsError (docs/architecture.md). `stable=False` shows what is committed now.
    """
    wanted = None if partitions is None else [TopicPartition(t, p) for t, p in partitions]
    if wanted is not None and not wanted:
        return {}
    deadline = time.monotonic() + timeout
    while True:
        try:
            # What is left of the timeout, so that the transient errors' retries (kafka_call) and
            # the waits for a pending commit share one deadline.
            return _committed_offsets(admin, group_id, wanted, stable, max(1.0, deadline - time.monotonic()))
        except _PendingCommit as pending:
            if time.monotonic() >= deadline:
                raise OffsetsError(
                    f"group {group_id} has an offset commit for {pending.partition} inside a transaction "
                    f"still open after {timeout:.0f}s; wait for it to commit or abort (transaction.timeout.ms) "
                    "and try again") from None
            time.sleep(0.05)


class _PendingCommit(Exception):
    """A stable read met an offset commit of a transaction that is still open."""

    def __init__(self, partition: str) -> None:
        super().__init__(partition)
        self.partition = partition


def _committed_offsets(admin: AdminClient, group_id: str, wanted: list | None, stable: bool,
                       timeout: float) -> dict[Partition, int | None]:
    def call() -> dict[Partition, int | None]:
        request = ConsumerGroupTopicPartitions(group_id, wanted) if wanted else ConsumerGroupTopicPartitions(group_id)
        result = admin.list_consumer_group_offsets([request], require_stable=stable,
                                                   request_timeout=timeout)[group_id].result(timeout + 5)
        offsets: dict[Partition, int | None] = {}
        for tp in result.topic_partitions or []:
            if tp.error is not None:
                if tp.error.code() == KafkaError.UNSTABLE_OFFSET_COMMIT:
                    raise _PendingCommit(f"{tp.topic}-{tp.partition}")
                raise KafkaException(tp.error)
            offsets[Partition(tp.topic, tp.partition)] = tp.offset if tp.offset >= 0 else None
        return dict(sorted(offsets.items()))

    return kafka_call(admin, f"reading committed offsets of group {group_id}", call, timeout)


# ---------------------------------------------------------------------------------------------
# The log
# ---------------------------------------------------------------------------------------------

def list_offsets(admin: AdminClient, specs: Mapping[tuple[str, int], OffsetSpec], isolation: IsolationLevel,
                 what: str, timeout: float = DEFAULT_TIMEOUT, retry_s: float | None = None) -> dict[Partition, int]:
    """One batched ListOffsets request for many partitions; -1 where the broker found no offset."""
    if not specs:
        return {}

    def call() -> dict[Partition, int]:
        futures = admin.list_offsets({TopicPartition(t, p): spec for (t, p), spec in specs.items()},
                                     isolation_level=isolation, request_timeout=timeout)
        return {Partition(tp.topic, tp.partition): fut.result(timeout + 5).offset for tp, fut in futures.items()}

    return kafka_call(admin, what, call, timeout, retry_s)


def watermarks(admin: AdminClient, partitions: Iterable[tuple[str, int]],
               timeout: float = DEFAULT_TIMEOUT, retry_s: float | None = None) -> dict[Partition, Watermarks]:
    """Earliest, log-end (high watermark) and last stable offset of each partition.

    Three batched ListOffsets requests (one per spec), however many partitions. LEO - LSO > 0
    means a transaction is open: read_committed readers, and txstream plans, stop at the LSO.
    """
    parts = sorted({Partition(t, p) for t, p in partitions})
    if not parts:
        return {}
    earliest = list_offsets(admin, {p: OffsetSpec.earliest() for p in parts}, IsolationLevel.READ_UNCOMMITTED,
                            "reading earliest offsets", timeout, retry_s)
    log_end = list_offsets(admin, {p: OffsetSpec.latest() for p in parts}, IsolationLevel.READ_UNCOMMITTED,
                           "reading log end offsets", timeout, retry_s)
    stable = list_offsets(admin, {p: OffsetSpec.latest() for p in parts}, IsolationLevel.READ_COMMITTED,
                          "reading last stable offsets", timeout, retry_s)
    marks = {p: Watermarks(earliest[p], log_end[p], stable[p]) for p in parts}
    # While a partition's leader moves, a ListOffsets answer can carry no error and no offset
    # (-1001, librdkafka's "invalid"). Taken as a watermark, it would make a committed offset look
    # out of range and the planner reset it by auto.offset.reset: ask again instead.
    unknown = [f"{p.topic}[{p.partition}] {m}" for p, m in marks.items() if min(m) < 0]
    if unknown:
        raise TransientKafkaError(f"the broker answered no offsets for {', '.join(unknown[:5])} "
                                  "(a leader moving?)")
    return marks


def offsets_for_time(admin: AdminClient, partitions: Iterable[tuple[str, int]], when: datetime,
                     timeout: float = DEFAULT_TIMEOUT) -> dict[Partition, int | None]:
    """Per partition the first committed (read_committed) record with timestamp >= `when`; None if none.

    `when` must be timezone-aware: a naive datetime is ambiguous across hosts.
    """
    if when.tzinfo is None:
        raise ValueError("offsets_for_time needs a timezone-aware datetime")
    millis = int(when.timestamp() * 1000)
    found = list_offsets(admin, {Partition(t, p): OffsetSpec.for_timestamp(millis) for t, p in set(partitions)},
                         IsolationLevel.READ_COMMITTED, f"looking up offsets for {when.isoformat()}", timeout)
    return {p: (o if o >= 0 else None) for p, o in sorted(found.items())}
