"""`txstream topics ensure`: create the topics a processor declares, never change one.

`txstream run` never creates topics (a typo in a topic name must not quietly start a new, empty
pipeline); this is the deliberate way to set them up. It works out what it would do first (the
plan is printed, `--dry-run` stops there) and refuses to touch a topic that exists with other
partitions, replication or configs than asked: it says how it differs instead. (txstream's own
topics, the markers and the state's, are created by the run: kafka/internal_topics.py.)
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from txstream.errors import InfrastructureError, TopicSetupError
from txstream.kafka.errors import kafka_error_of

BROKER_DEFAULT = -1   # NewTopic: the broker's num.partitions / default.replication.factor


@dataclass
class TopicState:
    """One declared topic: what is asked, what exists, what ensure would do."""

    role: str                          # input | table | output | dead-letter
    name: str
    partitions: int                    # to create with (BROKER_DEFAULT: the broker's)
    replication: int
    config: dict[str, str]
    exists: bool = False
    actual_partitions: int | None = None
    actual_replication: int | None = None
    differences: list[str] = field(default_factory=list)
    why_partitions: str = ""           # where the partition count comes from, for the plan

    @property
    def action(self) -> str:
        return "differs" if self.differences else ("exists" if self.exists else "create")

    def describe(self) -> str:
        if self.exists:
            what = f"{self.actual_partitions} partitions, replication {self.actual_replication}"
            return what + ("; " + "; ".join(self.differences) if self.differences else "")
        parts = "the broker's default partitions" if self.partitions == BROKER_DEFAULT else f"{self.partitions} partitions"
        rf = "the broker's default replication" if self.replication == BROKER_DEFAULT else f"replication {self.replication}"
        conf = ", ".join(f"{k}={v}" for k, v in sorted(self.config.items()))
        return f"{parts}{self.why_partitions}, {rf}" + (f", {conf}" if conf else "")


# A table's topic (Processor.tables) keeps the latest value per key: compacted.
TABLE_CONFIG = {"cleanup.policy": "compact"}


def declared(input_topics: Sequence[str], output_topic: str | None, dead_letter_topic: str | None,
             table_topics: Sequence[str] = ()) -> list[tuple[str, str]]:
    """(role, name) of every topic a processor's run reads or writes, in that order, once each."""
    seen: set[str] = set()
    out = []
    for role, name in [*(("input", t) for t in input_topics), *(("table", t) for t in table_topics),
                       ("output", output_topic), ("dead-letter", dead_letter_topic)]:
        if name and name not in seen:
            seen.add(name)
            out.append((role, name))
    return out


def _configs(admin: AdminClient, names: list[str], keys: Sequence[str], timeout: float) -> dict[str, dict[str, str]]:
    if not names or not keys:
        return {name: {} for name in names}
    futures = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, n) for n in names],
                                     request_timeout=timeout)
    out = {}
    for resource, future in futures.items():
        entries = future.result(timeout)
        out[resource.name] = {k: entries[k].value for k in keys if k in entries}
    return out


def plan(admin: AdminClient, topics: Sequence[tuple[str, str]], partitions: int | None = None,
         replication: int | None = None, config: Mapping[str, str] | None = None,
         timeout: float = 30) -> list[TopicState]:
    """What `ensure` would do for `topics`: each one exists as asked, is to be created, or differs.

    Partitions for a topic to create: `partitions`, else the (first existing) input topic's count
    (the output then has one partition per input partition), else the broker's default. Existing
    topics are compared on what was asked: `partitions` and `replication` when given, and each
    config given."""
    config = dict(config or {})
    metadata = admin.list_topics(timeout=timeout).topics
    existing = {name: meta for name, meta in metadata.items() if meta.error is None}
    inputs = [name for role, name in topics if role == "input" and name in existing]
    default_partitions, why = BROKER_DEFAULT, ""
    if partitions is not None:
        default_partitions = partitions
    elif inputs:
        default_partitions, why = len(existing[inputs[0]].partitions), f" (as input {inputs[0]!r})"
    keys = sorted({*config, *(TABLE_CONFIG if any(role == "table" for role, _ in topics) else ())})
    actual_configs = _configs(admin, [n for _r, n in topics if n in existing], keys, timeout)
    states = []
    for role, name in topics:
        wanted_config = {**config, **TABLE_CONFIG} if role == "table" else config
        state = TopicState(role, name, default_partitions, replication if replication is not None else BROKER_DEFAULT,
                           wanted_config, why_partitions=why)
        meta = existing.get(name)
        if meta is not None:
            state.exists = True
            state.actual_partitions = len(meta.partitions)
            state.actual_replication = min((len(p.replicas) for p in meta.partitions.values()), default=0)
            if partitions is not None and state.actual_partitions != partitions:
                state.differences.append(f"has {state.actual_partitions} partitions, {partitions} asked")
            if replication is not None and state.actual_replication != replication:
                state.differences.append(f"has replication {state.actual_replication}, {replication} asked")
            for key, wanted in sorted(wanted_config.items()):
                actual = actual_configs.get(name, {}).get(key)
                if actual != wanted:
                    state.differences.append(f"has {key}={actual if actual is not None else '(unknown)'}, "
                                             f"{wanted} asked")
        states.append(state)
    return states


def create(admin: AdminClient, states: Sequence[TopicState], timeout: float = 30) -> list[str]:
    """Create the topics `plan` marked 'create'; refuse (create nothing) if any existing one differs."""
    differing = [s for s in states if s.differences]
    if differing:
        raise TopicSetupError(
            "not changing existing topics (txstream topics ensure never alters a topic): "
            + "; ".join(f"{s.role} topic {s.name!r} {', '.join(s.differences)}" for s in differing)
            + ". Change them with Kafka's own tools if you mean to, or ask for what they have.")
    wanted = [NewTopic(s.name, s.partitions, s.replication, config=dict(s.config))
              for s in states if s.action == "create"]
    if not wanted:
        return []
    futures = admin.create_topics(wanted, request_timeout=timeout, operation_timeout=timeout)
    created, failures = [], []
    for name, future in futures.items():
        try:
            future.result(timeout)
            created.append(name)
        except Exception as exc:
            err = kafka_error_of(exc)
            failures.append(f"{name!r}: {err.str() if err is not None else exc}")
    if failures:
        raise TopicSetupError(f"could not create {', '.join(failures)}"
                              + (f" (created {', '.join(created)})" if created else ""))
    _wait_visible(admin, created, timeout)
    return sorted(created)


def _wait_visible(admin: AdminClient, names: list[str], timeout: float) -> None:
    """Until the brokers' metadata lists the new topics with their leaders: the controller
    acknowledges a creation before every broker has applied it, and a `txstream run` started
    right after must find them (the same wait as txstream's own topics')."""
    from txstream.kafka.internal_topics import wait_for_partitions

    deadline = time.monotonic() + timeout
    try:
        for name in names:
            wait_for_partitions(admin, name, 1, "topic", max(0.0, deadline - time.monotonic()))
    except InfrastructureError as exc:
        raise TopicSetupError(f"created {', '.join(names)}, but the brokers' metadata does not list them: {exc}") \
            from None
