"""`txstream state reset`: start a stateful app's state over (docs/state.md, "Tools").

Deletes the app's state topics: `<app>.state` (the operators' descriptions and fingerprints) and
each operator's changelog and snapshot topics; the engine creates them again, empty, at its next
start. With a target of `txstream offsets reset` (--to-earliest, ...) the app's input offsets are
moved too, by tools/offset_reset.py `reset_offsets` itself, so that state and input start over
together.

The units' markers (group `<app>.units`) are kept, as `offsets reset` keeps them: a marker m says
"this unit published batch m-1" and numbers the next batch; a restore after the reset finds an
empty changelog and no snapshot, which is the empty state at the marker's batch. Deleting the
markers instead would number batches from 1 again, beside the output topic's old batches 1, 2, ...

The watermark starts over with the state (a replay must not run into the old one, which would
find every replayed record late): the latest event time each marker carries (`x=`) and the
watermark each plan share carries (`w=`) are cleared, offsets and the rest of their metadata
kept, before the topics are deleted (a reset cut short is run again, and finds the topics).

Refused (with --execute) while the app's group has members, and while its plan log has a pending
batch, unless --force: some units may have published that batch with the old state, and the others
would publish it from the empty one.
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from txstream.errors import OffsetsError, TxstreamError
from txstream.kafka import lookups as kofs
from txstream.kafka.config import KafkaClients
from txstream.state.changelog import changelog_topic, snapshot_topic
from txstream.state.operator import state_topic
from txstream.tools import offset_reset as ofs
from txstream.tools.state_view import no_state, read_descriptions

# Besides the operators `<app>.state` describes: the engine's operator names, so that topics left
# by a description already deleted are found. Never a pattern over every topic: app "a"'s
# `a.x.changelog` could be app "a.x"'s.
ENGINE_OPERATORS = ("agg", "dedup")


@dataclass(frozen=True)
class StateTopic:
    name: str
    role: str                  # "descriptions", "changelog" or "snapshots"
    operator: str | None
    partitions: int
    records: int               # offsets in use: end minus start, summed over the partitions


@dataclass
class StateResetResult:
    app_id: str
    topics: list[StateTopic]
    markers_group: str
    executed: bool = False
    offsets: ofs.ResetResult | None = None
    warnings: list[str] = field(default_factory=list)


def state_topics(clients: KafkaClients, admin: Any, app_id: str, known: Mapping[str, int],
                 timeout: float) -> list[StateTopic]:
    """The app's state topics that exist, with their sizes."""
    names: list[tuple[str, str, str | None]] = []
    operators = list(ENGINE_OPERATORS)
    if state_topic(app_id) in known:
        names.append((state_topic(app_id), "descriptions", None))
        try:
            operators = sorted(set(operators) | set(read_descriptions(clients, app_id, timeout)))
        except TxstreamError:
            pass     # an unreadable description must not keep its topics from being reset
    for operator in operators:
        names += [(changelog_topic(app_id, operator), "changelog", operator),
                  (snapshot_topic(app_id, operator), "snapshots", operator)]
    present = [(n, role, op) for n, role, op in names if n in known]
    marks = kofs.watermarks(admin, [(n, p) for n, _r, _o in present for p in range(known[n])], timeout)
    return [StateTopic(n, role, op, known[n],
                       sum(marks[kofs.Partition(n, p)].log_end - marks[kofs.Partition(n, p)].earliest
                           for p in range(known[n])))
            for n, role, op in present]


def _pending_refusal(admin: Any, app_id: str, timeout: float) -> str | None:
    """Why the state must not be reset now: a pending batch of the plan log (tools/offset_reset.py
    `wide_app_state` finds it), in the words of a state reset."""
    _warnings, refusal = ofs.wide_app_state(admin, app_id, timeout)
    if refusal is None:
        return None
    pending = refusal.split(". Let the app close it first")[0]
    return (f"{pending}. Resetting the state now would split that batch: units that published it did so from "
            "the old state, the others would from the empty one. Let the app close it first (`txstream run ... "
            "--max-batches 1`), or pass --force to reset all the same")


def delete_topics(admin: Any, names: Sequence[str], timeout: float) -> None:
    """Delete `names` and wait until the cluster no longer lists them (the engine may create them
    again right after: a topic still being deleted cannot be created)."""
    from confluent_kafka import KafkaError, KafkaException

    from txstream.kafka.errors import kafka_error_of

    def call() -> None:
        futures = admin.delete_topics(list(names), operation_timeout=timeout, request_timeout=timeout)
        for future in futures.values():
            try:
                future.result(timeout + 5)
            except KafkaException as exc:
                error = kafka_error_of(exc)
                if error is None or error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise       # gone already is what was asked for

    kofs.kafka_call(admin, f"deleting topics {', '.join(names)}", call, timeout)
    deadline = time.monotonic() + timeout
    while True:
        left = sorted(set(names) & set(kofs.cluster_topics(admin, timeout)))
        if not left:
            return
        if time.monotonic() > deadline:
            raise OffsetsError(f"topics {', '.join(left)} are still listed {timeout:.0f} s after their deletion; "
                               "run the reset again once the cluster has finished deleting them")
        time.sleep(0.1)


def _committed_metadata(admin: Any, group_id: str, timeout: float) -> list[Any]:
    """The group's committed offsets (TopicPartitions) with their metadata."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    def call() -> list[Any]:
        future = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group_id)],
                                                   request_timeout=timeout)[group_id]
        return list(future.result(timeout).topic_partitions or [])

    return [tp for tp in kofs.kafka_call(admin, f"reading the offsets of group {group_id}", call, timeout)
            if tp.offset >= 0]


def _rewrite_metadata(admin: Any, group_id: str, parts: list[Any], timeout: float) -> None:
    """Commit `parts` (offsets unchanged, new metadata) for the inactive or memberless group."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    def call() -> None:
        result = admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(group_id, parts)],
                                                    request_timeout=timeout)[group_id].result(timeout + 5)
        failed = [f"{tp.topic}-{tp.partition}: {tp.error.str()}" for tp in result.topic_partitions or []
                  if tp.error is not None]
        if failed:
            raise OffsetsError(f"Kafka refused to clear the watermark in group {group_id}: {'; '.join(failed)}")

    if parts:
        kofs.kafka_call(admin, f"clearing the watermark in group {group_id}", call, timeout)


def clear_watermarks(admin: Any, app_id: str, timeout: float) -> None:
    """The watermark starts over with the state: each unit marker's latest event time and each
    plan share's watermark are cleared (driver/stateful.py computes the next watermark from both)."""
    from confluent_kafka import TopicPartition

    from txstream.records import Marker, PlanShare, markers_name

    markers = []
    for tp in _committed_metadata(admin, markers_name(app_id), timeout):
        marker = Marker.decode(tp.offset, tp.metadata)
        if marker.events is not None:
            markers.append(TopicPartition(tp.topic, tp.partition, tp.offset,
                                          metadata=replace(marker, events=None).encode()))
    _rewrite_metadata(admin, markers_name(app_id), markers, timeout)
    shares = []
    for tp in _committed_metadata(admin, app_id, timeout):
        share = PlanShare.decode(tp.metadata)
        if share is not None and (share.watermark_ms is not None or share.late_ms is not None):
            shares.append(TopicPartition(tp.topic, tp.partition, tp.offset,
                                         metadata=replace(share, watermark_ms=None, late_ms=None).encode()))
    _rewrite_metadata(admin, app_id, shares, timeout)


def reset_state(clients: KafkaClients, app_id: str, target: ofs.ResetTarget | None = None,
                selection: Mapping[str, Sequence[int] | None] | None = None, *, execute: bool = False,
                force: bool = False, timeout: float = kofs.DEFAULT_TIMEOUT) -> StateResetResult:
    """What `txstream state reset` does: list the state topics (a dry run stops there), and with
    `execute` move the input offsets to `target` (when given) and delete the topics."""
    from txstream.records import markers_name

    admin = kofs.admin_client(clients)
    known = kofs.cluster_topics(admin, timeout)     # also the reachability check
    topics = state_topics(clients, admin, app_id, known, timeout)
    if not topics:
        raise no_state(admin, app_id, timeout, f"none of its state topics exists ({state_topic(app_id)}, "
                                               f"{app_id}.<operator>.changelog, {app_id}.<operator>.snapshots)")
    result = StateResetResult(app_id, topics, markers_name(app_id))
    group = kofs.describe_group(admin, app_id, timeout)
    refusal = _pending_refusal(admin, app_id, timeout)
    if execute:
        ofs.ensure_inactive(group)
        if refusal is not None and not force:
            raise OffsetsError(refusal)
    else:
        if not group.inactive:
            result.warnings.append(f"group {app_id} is {group.state} with {len(group.members)} member(s): "
                                   "--execute is refused until the app is stopped")
        if refusal is not None and target is None:   # with a target, the offsets' dry run says it
            result.warnings.append(refusal)
    if refusal is not None and force:
        result.warnings.append(f"--force: {refusal.split('. Resetting')[0]}")
    if target is not None:
        result.offsets = ofs.reset_offsets(admin, app_id, target, selection or None, execute=execute,
                                           timeout=timeout, force=force, with_state=True)
    if execute:
        ofs.ensure_inactive(kofs.describe_group(admin, app_id, timeout))   # a member may have joined meanwhile
        clear_watermarks(admin, app_id, timeout)
        delete_topics(admin, [t.name for t in topics], timeout)
        result.executed = True
    return result
