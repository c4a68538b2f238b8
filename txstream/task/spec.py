"""What a Spark task is given: frozen, typed, built once on the driver (driver/specs.py).

Each default is declared here, once. The specs are pickled into every task of a batch, so they
hold only plain values, Avro schemas and a `KafkaClients`; the plans of the batch are the only
part that changes per batch (`with_batch`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from txstream.kafka.config import KafkaClients

# The column a reader adds when a publishing task must learn each row's range (its reading
# task, Spark partition or slot position): task/reading.py range_frame, task/publish.py.
RANGE_COLUMN = "_txstream_range"

# Delivery guarantees (docs/guarantees.md): only exactly-once uses transactions.
EXACTLY_ONCE, AT_LEAST_ONCE, AT_MOST_ONCE = "exactly-once", "at-least-once", "at-most-once"
GUARANTEES = (EXACTLY_ONCE, AT_LEAST_ONCE, AT_MOST_ONCE)

# The reader's consumer: never joins the group (assign only), read_committed, up to 1 MB of a partition per fetch.
READER_DEFAULTS: dict[str, Any] = {
    "isolation.level": "read_committed",
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "enable.partition.eof": False,
    "auto.offset.reset": "error",
    "fetch.max.bytes": 52_428_800,
    # Kafka's own default (the Java consumer's), not more: a fetch returns this much of each
    # partition from the read's position, also past the range's end, and librdkafka fetches on
    # while the records are handed over until the reader unassigns the partition; what lies past
    # the end is fetched, parsed and dropped. A 100 KB range with 9 MB after it received all 9 MB
    # with 10 MB, 2 MB with 1 MB (tests/test_reading_fetches.py). Side by side against 10 MB
    # (benchmarks/results/side-by-side/*-fetch-1mb.md): 1,000 records per partition per batch
    # +20% in-batch records/s, the broker's CPU per M records 29 -> 16 s; 256 partitions CPU per
    # M 65 -> 54 s; 10 KB values batch median 3.7 -> 2.7 s; 100,000 per partition per batch
    # unchanged; 1M orders peak RSS 1,835 -> 1,670 MiB (one run per point; later runs of this
    # setting spread as wide as those gains: the bytes not fetched and the memory are the sure part).
    "max.partition.fetch.bytes": 1_048_576,
    # A bounded prefetch queue. librdkafka fetches ahead of the reader until its queue holds
    # 64 MB (or queued.min.messages, 100,000 records, which with 1 MB comes first only below
    # ~10 B a record), and what it fetched past a range's end is dropped when the reader
    # unassigns: a large range's reader ran up to that far ahead, and a fresh consumer's first
    # small range fetched the whole rest of its partition (10.8 MB -> 2 MB with 1 MB,
    # tests/test_reading_fetches.py). A full queue makes librdkafka wait fetch.queue.backoff.ms
    # before it fetches again (10 ms for every consumer here, kafka/config.py QUICK_REFETCH);
    # with 1 MB the reader's is 1 ms, or 10 KB records (a full queue every 100) read in stalls
    # (the read's median per batch: 0.42 s against 0.13 unbounded with 10 ms; with 1 ms 0.18
    # against 0.11 and 0.12 against 0.15, two rounds). Three 100,000-record ranges of a
    # partition (41 MB) received 103 MB unbounded, 56 MB bounded.
    # Side by side (benchmarks/results/side-by-side/*-queue-1mb.md, one run per point): 1,000
    # per partition per batch +10% in-batch records/s, 100,000 +15%; 256 partitions batch median
    # 0.73 -> 0.61 s; 10 KB values 3.79 -> 2.69 s; 1M orders peak RSS 1,768 -> 1,512 MiB.
    "queued.max.messages.kbytes": 1024,
    "fetch.queue.backoff.ms": 1,
    # A range is below the last stable offset, so its records are there: a fetch need not wait
    # for more. With librdkafka's 500 ms default, the long-poll fetch a reused consumer left at the
    # end of its previous range held up the first fetch of the next range (one fetch in flight
    # per broker) for the full 500 ms: per range read after the first in a worker, measured 504 ms
    # -> 14 ms (250 records), and a slot reads its ranges one after another.
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

# A transaction's records are invisible until it commits, and commit_transaction sends whatever
# waits at once: lingering longer only makes fewer, fuller produce requests (librdkafka sends one
# partition per request), which is broker CPU on every batch and, at many output partitions, the
# queue of requests the commit's flush waits behind. Measured side by side (one sitting, EO with
# `-X producer.linger.ms=100` against 5, benchmarks/results/side-by-side/20261125-202509-... and
# -203255-...): 256 partitions, batch median 0.98 against 1.19 s, broker CPU -25%; 4 partitions
# 0.58 against 0.60 s, broker CPU -30%; 1,000 records per partition per batch, batch median
# 0.16-0.23 against 0.28-0.34 s in all three rounds, broker CPU -40%. Latency at 2,000/s was
# measured unchanged by an earlier session (p50 / p99 117 / 192 against 123 / 211 ms). Output
# that is visible as soon as it is acknowledged (at-least-once, at-most-once) keeps 5 ms.
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
class PublishSpec:
    """What a publishing task needs on top of its reader's spec."""

    read: ReadSpec
    guarantee: str
    transaction_timeout_s: float
    owner_dir: str | None
    output_topic: str | None = None
    output_key_schema: dict | None = None
    output_value_schema: dict | None = None
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
