"""An app's committed offsets: read them, compare them with the log, and move them.

One app = one consumer group, and its committed offset for a partition is the *next* record it
will read (the planner's `start`, docs/architecture.md). Moving it is how an app replays or skips
input, so this module follows `kafka-consumer-groups.sh --reset-offsets`: targets are clamped to
the partition's [earliest, latest], and nothing is moved while the group has live members
(the broker would refuse too, and a running driver would overwrite the reset with its next commit).

"latest" is the last stable offset (read_committed) throughout: that is where a txstream plan
ends, so a reset never puts `start` beyond a batch's `end`, inside a transaction still open.

Everything here uses the AdminClient only (no consumer joins the group) and raises
`OffsetsError` with a sentence a user can act on; the CLI (cli/offsets.py) only formats.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient

from txstream.errors import GroupActiveError, OffsetsError
from txstream.kafka.lookups import (
    DEFAULT_TIMEOUT,
    GroupInfo,
    Partition,
    Watermarks,
    cluster_topics,
    committed_offsets,
    describe_group,
    kafka_call,
    offsets_for_time,
    select_partitions,
    watermarks,
)


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
    warnings: list[str] = field(default_factory=list)   # what the reset does to a wide app's internal state


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

    kafka_call(admin, f"changing offsets of group {group_id}", call, timeout)


def _plan_log(admin: AdminClient, group_id: str, timeout: float) -> dict:
    """The group's committed offsets with their metadata, as a wide app's plan log (records.py)."""
    from txstream.records import LoggedPartition, PlanShare

    def call():
        future = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group_id)],
                                                   request_timeout=timeout)[group_id]
        return future.result(timeout).topic_partitions

    return {(tp.topic, tp.partition): LoggedPartition(tp.offset if tp.offset >= 0 else None, PlanShare.decode(tp.metadata))
            for tp in kafka_call(admin, f"reading the plan log of group {group_id}", call, timeout)}


def wide_app_state(admin: AdminClient, group_id: str, timeout: float = DEFAULT_TIMEOUT) -> tuple[list[str], str | None]:
    """What a reset would do to a wide app's internal state: (warnings, the reason to refuse or
    None). A reset writes offsets without plan shares, so a pending batch (planned, not closed) is
    abandoned: units that published it keep their output in the output topic, a batch never closed
    (docs/offsets.md). Markers are not reset: the next batch is numbered after them."""
    from txstream.records import last_batch_id, markers_name, pending_batch

    log = _plan_log(admin, group_id, timeout)
    markers_group = markers_name(group_id)
    markers = committed_offsets(admin, markers_group, None, stable=True, timeout=timeout)
    if not markers and not any(entry.share for entry in log.values()):
        return [], None   # not a wide app (or a wide app that never ran with markers)
    done = max((offset - 1 for offset in markers.values() if offset), default=0)
    latest = max(last_batch_id(log), done)
    warnings = [f"group {group_id} is a wide app's (plan log in its offsets' metadata, markers in group "
                f"{markers_group}): the reset clears its plan log and leaves the markers; its next batch is "
                f"batch {latest + 1}, and the records between the old and the new offsets are published again "
                "(or skipped) as new batches"]
    pending = pending_batch(log)
    if pending is None:
        return warnings, None
    published = sorted(p.partition for p, offset in markers.items() if offset and offset - 1 >= pending.batch_id)
    ranges = ", ".join(f"{t}[{p}] {a}..{b}" for (t, p), (a, b) in sorted(pending.ranges.items()) if b > a)
    who = (f"unit(s) {', '.join(map(str, published))} published it already: their output stays in the output "
           "topic, in a batch that is never closed" if published else "no unit has published it yet")
    return warnings, (f"batch {pending.batch_id} of group {group_id} is pending (planned, not closed: {ranges}); "
                      f"{who}. Let the app close it first (`txstream run ... --max-batches 1`), or pass --force to "
                      "abandon it")


def stateful_refusal(admin: AdminClient, group_id: str, timeout: float = DEFAULT_TIMEOUT) -> str | None:
    """Why the offsets of a stateful app must not move alone, or None: its state (changelog and
    snapshots, described in `<app>.state`, which the engine creates for every stateful app) counts
    the input up to the committed offsets, and would count records again or miss them."""
    from txstream.state.operator import state_topic

    if state_topic(group_id) not in cluster_topics(admin, timeout):
        return None
    return (f"group {group_id} is a stateful app's (its state described in {state_topic(group_id)}): moving its "
            "offsets without its state makes the two disagree (the state would count again the records read "
            f"again, or keep those skipped). Reset both with `txstream state reset --app-id {group_id}` and the "
            "same target, or pass --force to move the offsets alone")


def reset_offsets(admin: AdminClient, group_id: str, target: ResetTarget,
                  selection: Mapping[str, Sequence[int] | None] | None = None, *, execute: bool = False,
                  timeout: float = DEFAULT_TIMEOUT, force: bool = False, with_state: bool = False) -> ResetResult:
    """`--reset-offsets` end to end: check the group is idle, plan, and with `execute` commit.

    `selection` maps topic -> partitions (None = all of the topic); without it the reset covers
    every partition the group has committed offsets for. A dry run (execute=False) changes nothing.
    A wide app's pending batch refuses an executed reset unless `force` (wide_app_state), and so
    does a stateful app's state unless `with_state` (`state reset` deletes it) or `force`.
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
    result.warnings, refusal = wide_app_state(admin, group_id, timeout)
    if refusal is not None:
        if execute and not force:
            raise OffsetsError(refusal)
        result.warnings.append(refusal.replace("or pass --force to abandon it", "or --force abandons it")
                               if not force else f"abandoning it: {refusal.split(';')[0]}")
    stateful = None if with_state else stateful_refusal(admin, group_id, timeout)
    if stateful is not None:
        if execute and not force:
            raise OffsetsError(stateful)
        result.warnings.append(stateful.replace("or pass --force to move", "or --force moves")
                               if not force else f"--force: moving the offsets alone: {stateful.split(':')[0]}")
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
