"""What a Spark task is given, and how it reaches the task.

The specs are frozen and typed, built on the driver (driver/specs.py). Each default is declared
here, once. They hold only plain values, Avro schemas and a `KafkaClients`; the plans of the
batch are the only part that changes per batch (`with_batch`).

One way, narrow and wide alike: a batch's `JobSpec` travels as a Spark local property of the job
that runs it (`encode`, `resolve`), and the tasks' closures hold `FromJob`, which names the part
a task reads. Spark hands a job's local properties to each of its tasks, retries and speculative
copies included, so a task always reads the spec of the job it belongs to, and a job built once
(a narrow batch's, run batch after batch) needs nothing rebuilt per batch. Local properties are
written to Spark's event log and shown by its UI, so the property carries the spec without its
`KafkaClients` and registry settings (credentials): those stay in the closure's `FromJob`, which
Spark ships to tasks over its own connections and never logs (docs/security.md).
"""
from __future__ import annotations

import base64
import pickle
import zlib
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from typing import Any

from txstream.errors import InfrastructureError
from txstream.kafka.config import KafkaClients
from txstream.serde.registry import RegistryConfig

# The reader's consumer: never joins the group (assign only), read_committed. The fetch and
# queue bounds keep what librdkafka fetches past a range's end small (docs/tuning.md, "Reading").
READER_DEFAULTS: dict[str, Any] = {
    "isolation.level": "read_committed",
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "enable.partition.eof": False,
    "auto.offset.reset": "error",
    "fetch.max.bytes": 52_428_800,
    # Kafka's own default: a fetch returns this much of a partition, also past the range's end.
    "max.partition.fetch.bytes": 1_048_576,
    # A bounded prefetch queue: what is fetched past a range's end is dropped at unassign.
    "queued.max.messages.kbytes": 1024,
    "fetch.queue.backoff.ms": 1,
    # A range lies below the last stable offset, so a fetch need not wait for more records; a
    # long-poll left from the previous range would hold up the next range's first fetch.
    "fetch.wait.max.ms": 10,
}

# Every producer: idempotent, acks=all (settings.py refuses -X that contradicts these).
PRODUCER_DEFAULTS: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 5,
    "batch.num.messages": 10_000,
    "queue.buffering.max.messages": 1_000_000,
    # Java clients' default partitioner for keyed records: output lands where Kafka Streams or
    # Spark would put it.
    "partitioner": "murmur2_random",
    "delivery.report.only.error": True,
}

# A transaction's records are invisible until it commits, and the commit sends whatever waits at
# once: a longer linger only makes fewer, fuller produce requests (docs/tuning.md). Output visible
# as soon as it is acknowledged (the weaker guarantees) keeps 5 ms.
TRANSACTIONAL_LINGER = {"linger.ms": 100}


@dataclass(frozen=True)
class PartitionPlan:
    """One input partition's range in a batch: [start, end), planned on the driver."""

    topic: str
    partition: int
    start: int
    end: int
    committed: int | None         # what the group had committed when planned (None: nothing)
    transactional_id: str         # the id a task without a usable producer initialises this batch
    # The slot's transactional.ids (driver/slots.py); empty: `transactional_id` alone.
    pool: tuple[str, ...] = ()

    @property
    def transactional_ids(self) -> tuple[str, ...]:
        return self.pool or (self.transactional_id,)

    @property
    def size(self) -> int:
        return self.end - self.start

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ReadSpec:
    """What a reading task needs: where, which group, how to decode, the batch's ranges."""

    clients: KafkaClients
    app_id: str
    side_dir: str
    key_schema: dict | None = None
    value_schema: dict | None = None
    lenient_trailing_bytes: bool = False
    # Keys and values framed by a schema registry (serde/registry.py): read with key_schema /
    # value_schema (resolved on the driver: the processor's, else the subject's latest).
    registry: RegistryConfig | None = None
    registry_keys: bool = False
    plans: tuple[PartitionPlan, ...] = ()
    batch_id: int = 0
    chunk_records: int = 10_000          # records per Arrow batch handed to Spark
    chunk_bytes: int = 64 * 1024 * 1024  # ... and at most this many bytes of keys and values
    idle_timeout_s: float = 60.0         # a range that makes no progress this long fails
    # Reading task k reads plan layout[k] (-1: nothing, a slot's padding); empty: plan k.
    # Publishing tasks cover `slot_width` consecutive reading tasks (driver/slots.py).
    layout: tuple[int, ...] = ()
    slot_width: int = 1

    def consumer_config(self) -> dict[str, Any]:
        return self.clients.consumer(self.app_id, **READER_DEFAULTS)

    def with_batch(self, batch_id: int, plans: list[PartitionPlan], layout: tuple[int, ...] = (),
                   slot_width: int = 1) -> ReadSpec:
        return replace(self, batch_id=batch_id, plans=tuple(plans), layout=tuple(layout), slot_width=slot_width)

    def plan_at(self, reading_task: int) -> int:
        """The index of the plan reading task `reading_task` reads (-1: none)."""
        if self.layout:
            return self.layout[reading_task] if reading_task < len(self.layout) else -1
        return reading_task if reading_task < len(self.plans) else -1

    def slot_plans(self, slot_task: int) -> list[int]:
        """The plan indexes publishing task `slot_task` covers, in reading order."""
        first = slot_task * self.slot_width
        return [i for i in (self.plan_at(k) for k in range(first, first + self.slot_width)) if i >= 0]


@dataclass(frozen=True)
class InputSource:
    """One of a processor's several input streams (Processor.inputs): its name in `transform`'s
    arguments, its topics, how its keys and values decode."""

    name: str
    topics: tuple[str, ...]
    key_schema: dict | None = None
    value_schema: dict | None = None


@dataclass(frozen=True)
class PublishSpec:
    """What a publishing task needs on top of its reader's spec."""

    read: ReadSpec
    guarantee: str
    transaction_timeout_s: float
    owner_dir: str | None
    output_topic: str | None = None
    output_key_schema: dict | None = None
    output_value_schema: dict | None = None
    # The schema registry's ids output is framed with (resolved once on the driver at start).
    output_key_schema_id: int | None = None
    output_value_schema_id: int | None = None
    dead_letter_topic: str | None = None
    lineage: bool = True
    # Topics an output row may not name: the inputs, unless the processor allows the loop
    # (processor.py allow_output_to_input_topics).
    refused_topics: frozenset[str] = frozenset()
    # A worker closes a cached producer that none of its tasks used for this long: its
    # partition's tasks run elsewhere now (task/publish.py).
    producer_idle_s: float = 120.0
    group_metadata: bytes | None = field(default=None, repr=False)
    # Every task of the batch initialises all of its slot's transactional.ids before its
    # offsets re-check (the first batch of a run, after a failed batch or a rebalance:
    # docs/architecture.md §3.4).
    fence_all: bool = False

    @property
    def plans(self) -> tuple[PartitionPlan, ...]:
        return self.read.plans

    @property
    def app_id(self) -> str:
        return self.read.app_id

    @property
    def clients(self) -> KafkaClients:
        return self.read.clients

    @property
    def timeout_s(self) -> float:
        """How long one Kafka call of the protocol may block (init, commit, offsets)."""
        return max(10.0, self.transaction_timeout_s)

    def producer_config(self, transactional: bool) -> dict[str, Any]:
        defaults = dict(PRODUCER_DEFAULTS)
        if transactional:
            defaults["transaction.timeout.ms"] = int(self.transaction_timeout_s * 1000)
            defaults.update(TRANSACTIONAL_LINGER)
        config = self.clients.producer(**defaults)
        if not transactional:
            config = {k: v for k, v in config.items() if not k.startswith("transaction")}
        return config

    def with_batch(self, batch_id: int, plans: list[PartitionPlan], group_metadata: bytes | None,
                   layout: tuple[int, ...] = (), slot_width: int = 1, fence_all: bool = False) -> PublishSpec:
        return replace(self, read=self.read.with_batch(batch_id, plans, layout, slot_width),
                       group_metadata=group_metadata, fence_all=fence_all)


# The local property a batch's job carries its spec in.
JOB_SPEC_PROPERTY = "txstream.batch.spec"

_last: tuple[str, Any] | None = None   # per Python worker: the last property decoded, and its spec


@dataclass(frozen=True)
class JobSpec:
    """Everything one batch's Spark job gives its tasks: its readers' spec, and what its
    publishing tasks need (a narrow batch's slots, or a wide batch's units and their merge)."""

    read: ReadSpec
    publish: PublishSpec | None = None
    unit: Any = None    # a wide batch's unit tasks (task/units.py UnitSpec)
    merge: Any = None   # a stateful batch's merge tasks (operators/base.py MergeSpec)
    tables: Any = None  # the processor's tables and the batch's version of each (task/tables.py TableReads)
    # Several input streams (Processor.inputs): each one's readers' spec, its own plans and schemas.
    inputs: dict[str, ReadSpec] | None = None


@dataclass(frozen=True)
class FromJob:
    """Stands in a task's closure for the part of its job's `JobSpec` the task reads ("read",
    "publish", "unit", "merge" or "tables"), with what the job's property leaves out: the run's
    `KafkaClients` and schema registry settings (credentials, both)."""

    part: str
    clients: KafkaClients
    registry: RegistryConfig | None = None
    name: str | None = None   # "inputs": which input stream's spec


# What the local property holds in place of the clients and registry settings.
_CLIENTS_IN_CLOSURE = KafkaClients("(in the task's closure)")
_REGISTRY_IN_CLOSURE = RegistryConfig("(in the task's closure)")


def _with_credentials(value: Any, clients: KafkaClients | None, registry: RegistryConfig | None) -> Any:
    """`value` with every `KafkaClients` and `RegistryConfig` in its dataclass fields replaced
    (the parts of a JobSpec nest: a UnitSpec holds a PublishSpec, which holds a ReadSpec)."""
    if isinstance(value, KafkaClients):
        return clients
    if isinstance(value, RegistryConfig):
        return registry
    if not is_dataclass(value) or isinstance(value, type):
        return value
    changed = {}
    for f in fields(value):
        if f.init:
            old = getattr(value, f.name)
            new = _with_credentials(old, clients, registry)
            if new is not old:
                changed[f.name] = new
    return replace(value, **changed) if changed else value


def encode(job: JobSpec) -> str:
    """The local property's value for a batch's JobSpec, without its clients and registry
    settings (text: local properties are strings)."""
    bare = _with_credentials(job, _CLIENTS_IN_CLOSURE, _REGISTRY_IN_CLOSURE)
    return base64.b64encode(zlib.compress(pickle.dumps(bare, protocol=pickle.HIGHEST_PROTOCOL), 1)).decode("ascii")


def resolve(spec: Any) -> Any:
    """`spec` itself, or for a `FromJob` the part of the JobSpec its job carries."""
    global _last
    if not isinstance(spec, FromJob):
        return spec
    from pyspark import TaskContext

    context = TaskContext.get()
    text = context.getLocalProperty(JOB_SPEC_PROPERTY) if context is not None else None
    if text is None:
        raise InfrastructureError(f"the task's Spark job carries no {JOB_SPEC_PROPERTY} property: a txstream "
                                  "batch job was run without its batch's spec")
    if _last is None or _last[0] != text:
        _last = (text, _with_credentials(pickle.loads(zlib.decompress(base64.b64decode(text))), spec.clients,
                                         spec.registry))
    part = getattr(_last[1], spec.part)
    if part is not None and spec.name is not None:
        part = part.get(spec.name)
    if part is None:
        raise InfrastructureError(f"the task's Spark job carries no {spec.part!r} spec: a txstream batch job was "
                                  "run with another kind of batch's spec")
    return part
