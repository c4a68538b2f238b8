"""An app's committed offsets: read them, compare them with the log, and move them.

One app = one consumer group, and its committed offset for a partition is the *next* record it
will read (the planner's `start`, DESIGN.md section 2). Moving it is how an app replays or skips
input, so this module follows `kafka-consumer-groups.sh --reset-offsets`: targets are clamped to
the partition's [earliest, latest], and nothing is moved while the group has live members
(the broker would refuse too, and a running driver would overwrite the reset with its next commit).

"latest" is the last stable offset (read_committed) throughout: that is where a txstream plan
ends, so a reset never puts `start` beyond a batch's `end`, inside a transaction still open.

Everything here uses the AdminClient only (no consumer joins the group) and raises
`OffsetsError` with a sentence a user can act on; the CLI (cli_offsets.py) only formats.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
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

from txstream.errors import GroupActiveError, KafkaUnreachable, OffsetsError

DEFAULT_TIMEOUT = 10.0

T = TypeVar("T")


class Partition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


@dataclass(frozen=True)
class Watermarks:
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


@dataclass(frozen=True)
class ResetTarget:
    """One of kafka-consumer-groups' targets: earliest, latest, offset N, datetime, shift-by N."""
    kind: str                        # "earliest" | "latest" | "offset" | "datetime" | "shift-by"
    value: int | datetime | None = None

    def __str__(self) -> str:
        if self.kind in ("earliest", "latest"):
            return f"--to-{self.kind}"
        if self.kind == "shift-by":
            return f"--shift-by {self.value}"
        value = self.value.isoformat() if isinstance(self.value, datetime) else self.value
        return f"--to-{self.kind} {value}"


@dataclass(frozen=True)
class ResetRow:
    partition: Partition
    current: int | None              # committed before the reset; None = nothing committed
    requested: int                   # what the target asked for, before clamping
    new: int                         # what is (or would be) committed
    note: str = ""                   # why `new` differs from `requested`, if it does


@dataclass
class ResetResult:
    group_id: str
    target: ResetTarget
    rows: list[ResetRow]
    executed: bool = False
    committed_after: dict[Partition, int | None] = field(default_factory=dict)


_STATE_NAMES = {
    ConsumerGroupState.EMPTY: "Empty",
    ConsumerGroupState.STABLE: "Stable",
    ConsumerGroupState.PREPARING_REBALANCING: "PreparingRebalance",
    ConsumerGroupState.COMPLETING_REBALANCING: "CompletingRebalance",
    ConsumerGroupState.DEAD: "Dead",
    ConsumerGroupState.UNKNOWN: "Unknown",
}

# Errors the group coordinator returns while it moves or loads; the admin client does not retry them.
_COORDINATOR_RETRIABLE = {
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
}
_UNREACHABLE = {KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN,
                KafkaError._RESOLVE}


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------

def admin_client(bootstrap_servers: str) -> AdminClient:
    """An AdminClient whose connection errors become our exceptions, not librdkafka log noise."""
    return AdminClient({"bootstrap.servers": bootstrap_servers,
                        # Connection failures surface as timeouts we report ourselves.
                        "log_level": 0})


def _error_of(exc: BaseException) -> KafkaError | None:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


def _kafka_call(what: str, call: Callable[[], T], timeout: float) -> T:
    """Run one admin request; retry coordinator moves until `timeout`, turn failures into OffsetsError."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except KafkaException as exc:
            err = _error_of(exc)
            if err is not None and err.code() in _COORDINATOR_RETRIABLE and time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            if err is not None and err.code() in _UNREACHABLE:
                raise KafkaUnreachable(f"{what}: cannot reach Kafka within {timeout:g}s ({err.str() or err.name()})") from None
            raise OffsetsError(f"{what}: {err.str() if err is not None else exc}") from None
        except TimeoutError:
            raise KafkaUnreachable(f"{what}: no answer from Kafka within {timeout:g}s") from None


def cluster_topics(admin: AdminClient, timeout: float = DEFAULT_TIMEOUT) -> dict[str, int]:
    """Every topic in the cluster with its number of partitions.

    Also the reachability check: metadata is the first request, so an unreachable broker fails
    here with a clear message after `timeout` instead of deep inside a later call.
    """
    metadata = _kafka_call("reading cluster metadata", lambda: admin.list_topics(timeout=timeout), timeout)
    return {name: len(t.partitions) for name, t in metadata.topics.items() if t.error is None}


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


def describe_group(admin: AdminClient, group_id: str, timeout: float = DEFAULT_TIMEOUT) -> GroupInfo:
    """The group's state and live members with their assignments: who would fight a reset.

    A group that never existed (or expired) is reported as Dead with no members, as Kafka does.
    """
    def call() -> GroupInfo:
        try:
            desc = admin.describe_consumer_groups([group_id], request_timeout=timeout)[group_id].result(timeout + 5)
        except KafkaException as exc:
            err = _error_of(exc)
            if err is not None and err.code() == KafkaError.GROUP_ID_NOT_FOUND:
                return GroupInfo(group_id, "Dead", ())
            raise
        members = tuple(
            Member(m.member_id, m.client_id, m.host,
                   tuple(sorted(Partition(tp.topic, tp.partition)
                                for tp in (m.assignment.topic_partitions if m.assignment else []) or [])))
            for m in desc.members)
        return GroupInfo(group_id, _STATE_NAMES.get(desc.state, str(desc.state)), members)

    return _kafka_call(f"describing group {group_id}", call, timeout)


def committed_offsets(admin: AdminClient, group_id: str,
                      partitions: Iterable[Partition] | None = None, *, stable: bool = True,
                      timeout: float = DEFAULT_TIMEOUT) -> dict[Partition, int | None]:
    """The group's committed offsets (next record to read); None where nothing is committed.

    `partitions=None` returns every partition the group has committed offsets for. `stable=True`
    is the planner's read: a commit still pending in an open transaction is an error rather than
    silently the previous value (DESIGN.md 2.2). `stable=False` shows what is committed now.
    """
    wanted = None if partitions is None else [TopicPartition(p.topic, p.partition) for p in partitions]
    if wanted is not None and not wanted:
        return {}

    def call() -> dict[Partition, int | None]:
        request = ConsumerGroupTopicPartitions(group_id, wanted) if wanted else ConsumerGroupTopicPartitions(group_id)
        result = admin.list_consumer_group_offsets([request], require_stable=stable,
                                                   request_timeout=timeout)[group_id].result(timeout + 5)
        offsets: dict[Partition, int | None] = {}
        for tp in result.topic_partitions or []:
            if tp.error is not None:
                if tp.error.code() == KafkaError.UNSTABLE_OFFSET_COMMIT:
                    raise OffsetsError(
                        f"group {group_id} has an offset commit for {tp.topic}-{tp.partition} inside a "
                        "transaction that is still open; wait for it to commit or abort "
                        "(transaction.timeout.ms) and try again")
                raise KafkaException(tp.error)
            offsets[Partition(tp.topic, tp.partition)] = tp.offset if tp.offset >= 0 else None
        return dict(sorted(offsets.items()))

    return _kafka_call(f"reading committed offsets of group {group_id}", call, timeout)


def _list_offsets(admin: AdminClient, specs: Mapping[Partition, OffsetSpec], isolation: IsolationLevel,
                  what: str, timeout: float) -> dict[Partition, int]:
    """One batched ListOffsets request for many partitions; -1 where the broker found no offset."""
    if not specs:
        return {}

    def call() -> dict[Partition, int]:
        futures = admin.list_offsets({TopicPartition(p.topic, p.partition): spec for p, spec in specs.items()},
                                     isolation_level=isolation, request_timeout=timeout)
        return {Partition(tp.topic, tp.partition): fut.result(timeout + 5).offset for tp, fut in futures.items()}

    return _kafka_call(what, call, timeout)


def watermarks(admin: AdminClient, partitions: Iterable[Partition],
               timeout: float = DEFAULT_TIMEOUT) -> dict[Partition, Watermarks]:
    """Earliest, log-end (high watermark) and last stable offset of each partition.

    Three batched ListOffsets requests (one per spec), however many partitions. LEO - LSO > 0
    means a transaction is open: read_committed readers, and txstream plans, stop at the LSO.
    """
    parts = sorted(set(partitions))
    earliest = _list_offsets(admin, {p: OffsetSpec.earliest() for p in parts}, IsolationLevel.READ_UNCOMMITTED,
                             "reading earliest offsets", timeout)
    log_end = _list_offsets(admin, {p: OffsetSpec.latest() for p in parts}, IsolationLevel.READ_UNCOMMITTED,
                            "reading log end offsets", timeout)
    stable = _list_offsets(admin, {p: OffsetSpec.latest() for p in parts}, IsolationLevel.READ_COMMITTED,
                           "reading last stable offsets", timeout)
    return {p: Watermarks(earliest[p], log_end[p], stable[p]) for p in parts}


def offsets_for_time(admin: AdminClient, partitions: Iterable[Partition], when: datetime,
                     timeout: float = DEFAULT_TIMEOUT) -> dict[Partition, int | None]:
    """Per partition the first committed (read_committed) record with timestamp >= `when`; None if none.

    `when` must be timezone-aware: a naive datetime is ambiguous across hosts.
    """
    if when.tzinfo is None:
        raise ValueError("offsets_for_time needs a timezone-aware datetime")
    millis = int(when.timestamp() * 1000)
    found = _list_offsets(admin, {p: OffsetSpec.for_timestamp(millis) for p in sorted(set(partitions))},
                          IsolationLevel.READ_COMMITTED, f"looking up offsets for {when.isoformat()}", timeout)
    return {p: (o if o >= 0 else None) for p, o in found.items()}


# ---------------------------------------------------------------------------------------------
# Resetting
# ---------------------------------------------------------------------------------------------

def ensure_inactive(group: GroupInfo) -> None:
    """Refuse to touch a group with live members, naming them so the user knows what to stop."""
    if group.inactive:
        return
    if group.members:
        names = "\n".join(f"  {m.describe()}" for m in group.members)
        raise GroupActiveError(
            f"group {group.group_id} is {group.state} with {len(group.members)} live member(s); "
            f"stop them first (offsets of an active group cannot be changed):\n{names}")
    raise GroupActiveError(f"group {group.group_id} is {group.state}, not Empty; "
                           "wait until its members have left and try again")


def clamp(requested: int, marks: Watermarks) -> tuple[int, str]:
    """Clamp a target into [earliest, last stable] like kafka-consumer-groups, saying why."""
    if requested < marks.earliest:
        return marks.earliest, f"{requested} is below the earliest offset {marks.earliest}"
    if requested > marks.last_stable:
        return marks.last_stable, f"{requested} is above the latest (last stable) offset {marks.last_stable}"
    return requested, ""


def plan_reset(admin: AdminClient, target: ResetTarget, current: Mapping[Partition, int | None],
               timeout: float = DEFAULT_TIMEOUT) -> list[ResetRow]:
    """New offset per partition of `current` for `target`, clamped; reads the log, changes nothing."""
    parts = sorted(current)
    marks = watermarks(admin, parts, timeout)
    requested: dict[Partition, int] = {}
    notes: dict[Partition, str] = {}
    if target.kind == "earliest":
        requested = {p: marks[p].earliest for p in parts}
    elif target.kind == "latest":
        requested = {p: marks[p].last_stable for p in parts}
    elif target.kind == "offset":
        requested = {p: int(target.value) for p in parts}  # type: ignore[arg-type]
    elif target.kind == "shift-by":
        uncommitted = [str(p) for p in parts if current[p] is None]
        if uncommitted:
            raise OffsetsError(f"cannot shift: nothing committed for {', '.join(uncommitted)}; "
                               "use --to-earliest, --to-latest or --to-offset for those")
        requested = {p: current[p] + int(target.value) for p in parts}  # type: ignore[operator,arg-type]
    elif target.kind == "datetime":
        assert isinstance(target.value, datetime)
        found = offsets_for_time(admin, parts, target.value, timeout)
        for p in parts:
            if found[p] is None:
                notes[p] = f"no record at or after {target.value.isoformat()}, so latest"
            requested[p] = marks[p].last_stable if found[p] is None else found[p]  # type: ignore[assignment]
    else:
        raise ValueError(f"unknown reset target {target.kind!r}")
    rows = []
    for p in parts:
        new, why = clamp(requested[p], marks[p])
        rows.append(ResetRow(p, current[p], requested[p], new, why or notes.get(p, "")))
    return rows


def alter_offsets(admin: AdminClient, group_id: str, offsets: Mapping[Partition, int],
                  timeout: float = DEFAULT_TIMEOUT) -> None:
    """Commit `offsets` for the (inactive) group; any per-partition refusal is an OffsetsError."""
    if not offsets:
        return

    def call() -> None:
        request = ConsumerGroupTopicPartitions(
            group_id, [TopicPartition(p.topic, p.partition, o) for p, o in sorted(offsets.items())])
        result = admin.alter_consumer_group_offsets([request], request_timeout=timeout)[group_id].result(timeout + 5)
        failed = [f"{tp.topic}-{tp.partition}: {tp.error.str()}" for tp in result.topic_partitions or []
                  if tp.error is not None]
        if failed:
            raise OffsetsError(f"Kafka refused to change offsets of group {group_id} "
                               f"(did a member join meanwhile?): {'; '.join(failed)}")

    _kafka_call(f"changing offsets of group {group_id}", call, timeout)


def reset_offsets(admin: AdminClient, group_id: str, target: ResetTarget,
                  selection: Mapping[str, Sequence[int] | None] | None = None, *, execute: bool = False,
                  timeout: float = DEFAULT_TIMEOUT) -> ResetResult:
    """`--reset-offsets` end to end: check the group is idle, plan, and with `execute` commit.

    `selection` maps topic -> partitions (None = all of the topic); without it the reset covers
    every partition the group has committed offsets for. A dry run (execute=False) changes nothing.
    """
    if selection:
        parts = select_partitions(admin, selection, timeout)
    else:
        cluster_topics(admin, timeout)  # fail fast and clearly when Kafka is unreachable
        parts = list(committed_offsets(admin, group_id, None, timeout=timeout))
        if not parts:
            raise OffsetsError(f"group {group_id} has no committed offsets; "
                               "name the topics to reset with --topic")
    ensure_inactive(describe_group(admin, group_id, timeout))
    current = committed_offsets(admin, group_id, parts, timeout=timeout)
    rows = plan_reset(admin, target, {p: current.get(p) for p in parts}, timeout)
    result = ResetResult(group_id, target, rows)
    if execute:
        # Re-check just before writing: a member may have joined while we planned.
        ensure_inactive(describe_group(admin, group_id, timeout))
        alter_offsets(admin, group_id, {r.partition: r.new for r in rows}, timeout)
        result.executed = True
        result.committed_after = committed_offsets(admin, group_id, parts, timeout=timeout)
    return result


def parse_datetime(text: str) -> datetime:
    """ISO 8601 (`2024-05-01T12:00:00Z`, `...+02:00`, `2024-05-01`); no zone means local time, like Kafka."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise OffsetsError(f"not an ISO 8601 date-time: {text!r} (e.g. 2024-05-01T12:00:00Z)") from None
    return value if value.tzinfo is not None else value.astimezone()
