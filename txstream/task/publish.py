"""Publishing: one task's output and its input offset, committed in one Kafka transaction.

The split mirrors Kafka Streams:
- `TransactionalPublisher` (their StreamsProducer) owns the transactional producer and is the
  only place that begins, commits and aborts transactions and classifies their errors:
  retriable (retry the same call; aborting after an unknown commit outcome would duplicate),
  abortable (abort, publish the range again), fatal / fenced (a newer attempt owns the
  transactional.id: stop, publish nothing more).
- `RecordCollector` (their RecordCollectorImpl) turns output rows into Kafka records: encoding,
  topics, partitions, headers, lineage.
- `publish_partition` is the body of one Spark task (`mapInArrow`): the DESIGN.md 2.4 protocol.

Producers are kept per Python worker across batches. A shared "owner" marker per
transactional.id tells a worker that another worker has initialised that id since (and so
fenced it), so it starts afresh instead of discovering the fence at commit time.
"""
from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from txstream import faults
from txstream.kafka import headers
from txstream.serde.avro import AvroCodec
from txstream.errors import (AbortableError, FatalKafkaError, FencedError, OutputError, PoisonRecordError,
                             classify_kafka, kafka_error_of)

# Guarantees (DESIGN.md 2): only exactly-once uses transactions.
EXACTLY_ONCE, AT_LEAST_ONCE, AT_MOST_ONCE = "exactly-once", "at-least-once", "at-most-once"

RESULT_SCHEMA = pa.schema([
    ("index", pa.int32()), ("status", pa.string()), ("records_in", pa.int64()),
    ("records_out", pa.int64()), ("dead_letters", pa.int64()), ("committed", pa.int64()),
    ("read_s", pa.float64()), ("upstream_s", pa.float64()), ("produce_s", pa.float64()), ("commit_s", pa.float64()),
    ("init_s", pa.float64()), ("attempts", pa.int32()), ("message", pa.string()),
])


def result_schema():  # noqa: ANN201 - StructType
    """RESULT_SCHEMA for Spark. A StructType rather than DDL text, so Spark's SQL parser stays idle."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(RESULT_SCHEMA)


# Task outcomes the driver acts on.
COMMITTED, ALREADY_DONE, STALE_PLAN, FENCED, ACKED, EMPTY = (
    "committed", "already-done", "stale-plan", "fenced", "acked", "empty")


# ---------------------------------------------------------------------------------------------
# The transactional producer and its errors
# ---------------------------------------------------------------------------------------------

class TransactionalPublisher:
    """Owns one producer for one transactional.id (one input partition of one app)."""

    def __init__(self, config: dict[str, Any], transactional_id: str, owner_dir: str | None,
                 timeout_s: float = 60.0) -> None:
        from confluent_kafka import Producer

        self.transactional_id = transactional_id
        self.timeout_s = timeout_s
        self.delivery_errors: list[str] = []
        self.producer = Producer({**config, "transactional.id": transactional_id,
                                  "on_delivery": self._on_delivery})
        self.init_seconds = 0.0
        self._owner_path = Path(owner_dir) / transactional_id if owner_dir else None
        self._token = f"{os.getpid()}-{uuid.uuid4().hex}"
        self.in_transaction = False

    def _on_delivery(self, err, _msg) -> None:  # noqa: ANN001 - librdkafka callback
        if err is not None:
            self.delivery_errors.append(str(err))

    def init(self) -> None:
        """init_transactions: fences older producers of this id, aborts their open transaction."""
        started = time.perf_counter()
        # A fresh producer has no broker connection yet: librdkafka's coordinator lookup then
        # finds "no brokers available" and retries on a 500 ms timer. A metadata request first
        # brings a connection up, so init_transactions finds its coordinator at once (measured:
        # ~0.5 s -> ~0.05 s per new producer).
        try:
            self.producer.list_topics(timeout=min(5.0, self.timeout_s))
        except Exception:  # noqa: BLE001 - only a warm-up; init_transactions reports real trouble
            pass
        self._retry(lambda: self.producer.init_transactions(self.timeout_s), "init_transactions")
        self.init_seconds = time.perf_counter() - started
        if self._owner_path is not None:
            self._owner_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self._owner_path.with_suffix(f".{self._token}")
            tmp.write_text(self._token)
            os.replace(tmp, self._owner_path)

    def still_owner(self) -> bool:
        """False when another worker on this machine initialised this id after us."""
        if self._owner_path is None:
            return True
        try:
            return self._owner_path.read_text() == self._token
        except OSError:
            return False

    def begin(self) -> None:
        self.delivery_errors.clear()
        self._call(self.producer.begin_transaction, "begin_transaction")
        self.in_transaction = True

    def send_offsets(self, offsets: list, group_metadata: bytes) -> None:  # noqa: ANN001
        self._call(lambda: self.producer.send_offsets_to_transaction(offsets, group_metadata, self.timeout_s),
                   "send_offsets_to_transaction")

    def commit(self) -> None:
        """Commit; a retriable error retries the commit itself (its outcome is unknown)."""
        self._retry(lambda: self.producer.commit_transaction(self.timeout_s), "commit_transaction",
                    abort_on_abortable=True)
        self.in_transaction = False

    def abort(self) -> None:
        if not self.in_transaction:
            return
        try:
            self._retry(lambda: self.producer.abort_transaction(self.timeout_s), "abort_transaction")
        finally:
            self.in_transaction = False

    def close(self) -> None:
        try:
            self.abort()
        except Exception:  # noqa: BLE001 - closing after a fatal error: nothing left to save
            pass
        self.producer.flush(5)

    # -- error classification -------------------------------------------------------------

    def _call(self, fn: Callable[[], Any], what: str) -> Any:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - classified below
            raise self._classify(exc, what) from exc

    def _retry(self, fn: Callable[[], Any], what: str, attempts: int = 10,
               abort_on_abortable: bool = False) -> Any:
        # Each call may block up to timeout_s; the retries together get twice that, after which
        # the task fails and a new attempt starts from init_transactions and the offset re-check.
        deadline = time.monotonic() + 2 * self.timeout_s
        for attempt in range(attempts):
            try:
                return fn()
            except Exception as exc:  # noqa: BLE001 - classified below
                err = kafka_error_of(exc)
                if (err is not None and err.retriable() and not err.fatal() and attempt < attempts - 1
                        and time.monotonic() < deadline):
                    time.sleep(min(0.1 * 2 ** attempt, 2.0))
                    continue
                classified = self._classify(exc, what)
                if abort_on_abortable and isinstance(classified, AbortableError):
                    self.abort()
                raise classified from exc
        raise AssertionError("unreachable")

    def _classify(self, exc: BaseException, what: str) -> BaseException:
        """Kafka's errors as txstream's outcome types. A fatal error is treated as a fence:
        this producer is done, and a fresh one's init_transactions settles what was open."""
        err = kafka_error_of(exc)
        if err is None:
            return exc
        classified = classify_kafka(err, f"{self.transactional_id}: {what}")
        if isinstance(classified, FatalKafkaError):
            return FencedError(str(classified), err)
        return classified


# ---------------------------------------------------------------------------------------------
# Output rows -> Kafka records
# ---------------------------------------------------------------------------------------------

@dataclass
class RecordCollector:
    """Encodes output Arrow batches and produces them; keeps what it sent for a re-publish."""

    producer: Any  # confluent_kafka.Producer
    default_topic: str | None
    value_codec: AvroCodec | None
    key_codec: AvroCodec | None
    source: tuple[str, int]
    publication: str
    lineage: bool = True
    sent: list[tuple] = field(default_factory=list)

    def __post_init__(self) -> None:
        topic, partition = self.source
        self._lineage_fixed = [(headers.SOURCE_TOPIC, topic.encode()),
                               (headers.SOURCE_PARTITION, str(partition).encode()),
                               (headers.PUBLICATION, self.publication.encode())]

    def add_batch(self, batch: pa.RecordBatch) -> int:
        n = batch.num_rows
        if n == 0:
            return 0
        names = batch.schema.names
        values = _encoded(batch.column(names.index("value")), self.value_codec, "value")
        keys = (_encoded(batch.column(names.index("key")), self.key_codec, "key")
                if "key" in names else [None] * n)
        sent = self.sent
        offset_nulls = batch.column(names.index("offset")).null_count if "offset" in names else 0
        if not {"topic", "partition", "headers"} & set(names) and self.default_topic is not None \
                and not offset_nulls:
            # The common shape (one topic, Kafka's partitioner, no headers of its own): one pass.
            topic = self.default_topic
            if not self.lineage:
                sent.extend([(topic, v, k, -1, None) for v, k in zip(values, keys)])
            elif "offset" in names:
                fixed, name = self._lineage_fixed, headers.SOURCE_OFFSET
                offsets = pc.cast(batch.column(names.index("offset")), pa.string()).cast(pa.binary()).to_pylist()
                sent.extend([(topic, v, k, -1, [*fixed, (name, o)]) for v, k, o in zip(values, keys, offsets)])
            else:
                fixed = self._lineage_fixed
                sent.extend([(topic, v, k, -1, list(fixed)) for v, k in zip(values, keys)])
            self._produce_from(len(sent) - n)
            return n
        topics = batch.column(names.index("topic")).to_pylist() if "topic" in names else None
        partitions = batch.column(names.index("partition")).to_pylist() if "partition" in names else None
        hdrs = batch.column(names.index("headers")).to_pylist() if "headers" in names else None
        offsets = batch.column(names.index("offset")).to_pylist() if "offset" in names else None
        for i in range(n):
            topic = topics[i] if topics is not None and topics[i] is not None else self.default_topic
            if topic is None:
                raise OutputError("an output row has no `topic` and the processor declares no output_topic")
            record_headers = [(h["key"], h["value"]) for h in hdrs[i]] if hdrs is not None and hdrs[i] else []
            if self.lineage:
                record_headers += self._lineage_fixed
                if offsets is not None:
                    record_headers.append((headers.SOURCE_OFFSET, str(offsets[i]).encode()))
            partition = partitions[i] if partitions is not None and partitions[i] is not None else -1
            sent.append((topic, values[i], keys[i], partition, record_headers))
        self._produce_from(len(sent) - n)
        return n

    def add_dead_letter(self, dead_topic: str, record: tuple, app_id: str) -> None:
        key, value, original_headers, timestamp_ms, offset, stage, error = record
        topic, partition = self.source
        dlq_headers = list(original_headers or []) + headers.lineage(topic, partition, offset) + [
            (headers.DLQ_STAGE, stage.encode()), (headers.DLQ_ERROR, error.encode()[:4000]),
            (headers.DLQ_APP_ID, app_id.encode()), (headers.PUBLICATION, self.publication.encode())]
        self.sent.append((dead_topic, value, key, -1, dlq_headers))
        self._produce_from(len(self.sent) - 1)

    def replay(self) -> None:
        """Produce everything again (after an abort): the encoded records were kept."""
        self._produce_from(0)

    def _produce_from(self, start: int) -> None:
        from confluent_kafka import KafkaError, KafkaException

        produce, poll = self.producer.produce, self.producer.poll
        for topic, value, key, partition, record_headers in self.sent[start:]:
            while True:
                try:
                    produce(topic, value, key, partition=partition, headers=record_headers)
                    break
                except BufferError:
                    poll(0.05)  # local queue full: let deliveries drain
                except KafkaException as exc:
                    err = kafka_error_of(exc)
                    code = err.code() if err is not None else None
                    if code in (KafkaError._UNKNOWN_TOPIC, KafkaError.UNKNOWN_TOPIC_OR_PART):
                        raise OutputError(f"output topic {topic!r} does not exist; create it first "
                                          "(txstream never auto-creates topics)") from None
                    if code == KafkaError._UNKNOWN_PARTITION:
                        raise OutputError(f"output partition {partition} of topic {topic!r} does not exist") from None
                    raise
        poll(0)


def _encoded(column: pa.Array, codec: AvroCodec | None, what: str) -> list:
    typ = column.type
    if pa.types.is_struct(typ):
        if codec is None:
            raise OutputError(f"the output `{what}` is a struct but the processor declares no "
                              f"output_{what}_schema to encode it with")
        return codec.encode_column(column)
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return [v.encode() if v is not None else None for v in column.to_pylist()]
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ) or pa.types.is_null(typ):
        return column.to_pylist()
    raise OutputError(f"the output `{what}` column is {typ}; it must be binary, string or a struct")


# ---------------------------------------------------------------------------------------------
# One Spark task
# ---------------------------------------------------------------------------------------------

_PUBLISHERS: dict[str, TransactionalPublisher] = {}   # per Python worker, across batches
_GROUP_READERS: dict[tuple[str, str], Any] = {}


def _group_reader(spec: dict) -> Any:
    """A non-member consumer of the app's group, for stable reads of committed offsets."""
    from confluent_kafka import Consumer

    key = (spec["bootstrap_servers"], spec["app_id"])
    if key not in _GROUP_READERS:
        _GROUP_READERS[key] = Consumer({
            "bootstrap.servers": spec["bootstrap_servers"], "group.id": spec["app_id"],
            # read_committed makes librdkafka ask for stable offsets (KIP-447): a commit still
            # pending in an open transaction is resolved before the answer.
            "isolation.level": "read_committed", "enable.auto.commit": False,
            **{k: v for k, v in spec.get("consumer_config", {}).items() if k.startswith(("security.", "sasl.", "ssl."))},
        })
    return _GROUP_READERS[key]


def committed_offset(spec: dict, topic: str, partition: int) -> int | None:
    from confluent_kafka import TopicPartition

    from txstream.kafka.retry import retriable

    timeout = spec.get("timeout_s", 60)
    tp = retriable(lambda: _group_reader(spec).committed([TopicPartition(topic, partition)], timeout=timeout),
                   timeout)[0]
    return tp.offset if tp.offset >= 0 else None


def _publisher(spec: dict, plan: dict) -> tuple[TransactionalPublisher, bool]:
    """The cached publisher for this partition, or a new initialised one. (publisher, fresh)."""
    tid = plan["transactional_id"]
    # Producers that another worker fenced since are dead weight (threads, sockets): close them,
    # so across all workers there is about one live producer per input partition.
    for stale in [t for t, p in _PUBLISHERS.items() if not p.still_owner()]:
        _drop_publisher(stale)
    publisher = _PUBLISHERS.get(tid)
    if publisher is not None:
        return publisher, False
    publisher = TransactionalPublisher(spec["producer_config"], tid, spec.get("owner_dir"),
                                       spec.get("timeout_s", 60))
    publisher.init()
    _PUBLISHERS[tid] = publisher
    return publisher, True


def _drop_publisher(tid: str) -> None:
    publisher = _PUBLISHERS.pop(tid, None)
    if publisher is not None:
        publisher.close()


def publish_partition(spec: dict, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: the protocol of DESIGN.md 2.4 for this task's planned range."""
    from pyspark import TaskContext

    index = TaskContext.get().partitionId()
    plan = spec["plans"][index]
    result = _Result(index)
    if spec["guarantee"] == EXACTLY_ONCE:
        _publish_transactional(spec, plan, batches, result)
    else:
        _publish_plain(spec, plan, batches, result)
    _take_side_file(spec, result)  # if no path above took it (an early return)
    yield result.to_batch()


@dataclass
class _Result:
    index: int
    status: str = EMPTY
    records_in: int = 0
    records_out: int = 0
    dead_letters: int = 0
    committed: int = -1
    read_s: float = 0.0
    upstream_s: float = 0.0   # waiting for the transform's output (reading, JVM, transform)
    produce_s: float = 0.0    # encoding and producing it
    commit_s: float = 0.0
    init_s: float = 0.0
    attempts: int = 0
    message: str = ""

    def to_batch(self) -> pa.RecordBatch:
        return pa.RecordBatch.from_pylist([self.__dict__], schema=RESULT_SCHEMA)


def _collector(spec: dict, plan: dict, producer: Any) -> RecordCollector:
    return RecordCollector(
        producer=producer, default_topic=spec.get("output_topic"),
        value_codec=AvroCodec(spec["output_value_schema"], spec.get("output_value_schema_id"))
        if spec.get("output_value_schema") else None,
        key_codec=AvroCodec(spec["output_key_schema"]) if spec.get("output_key_schema") else None,
        source=(plan["topic"], plan["partition"]), publication=uuid.uuid4().hex,
        lineage=spec.get("lineage", True))


def _produce_all(collector: RecordCollector, batches: Iterator[pa.RecordBatch], result: _Result, plan: dict) -> None:
    """Produce every output batch, timing the wait for upstream apart from encode+produce."""
    clock = time.perf_counter
    iterator = iter(batches)
    while True:
        started = clock()
        batch = next(iterator, None)
        got = clock()
        result.upstream_s += got - started
        if batch is None:
            return
        result.records_out += collector.add_batch(batch)
        result.produce_s += clock() - got
        faults.maybe_fail("publish.mid_produce", plan)


def _take_side_file(spec: dict, result: _Result) -> list[tuple[Any, ...]]:
    """Consume the reader's side file of this task attempt (once): its counts go to `result`,
    its undecodable records are returned."""
    from txstream.task.reading import read_side_file

    read = read_side_file(spec["side_dir"], spec["batch_id"])
    if read is None:
        return []
    result.records_in, result.read_s = read.records, read.read_seconds
    return read.dead_letters


def _collect_dead_letters(spec: dict, plan: dict, collector: RecordCollector, result: _Result) -> int:
    """Add the reader's undecodable records (its side file) to this range's output."""
    dead = _take_side_file(spec, result)
    if dead and not spec.get("dead_letter_topic"):
        key, _value, _h, _ts, offset, stage, error = dead[0]
        raise PoisonRecordError(
            f"record {plan['topic']}[{plan['partition']}]@{offset} failed at {stage}: {error}. "
            f"{len(dead)} record(s) of this range failed; declare a dead_letter_topic on the processor "
            "(or --dead-letter-topic) to set such records aside. Nothing of this range was published.")
    for record in dead:
        collector.add_dead_letter(spec["dead_letter_topic"], record, spec["app_id"])
    return len(dead)


def _publish_transactional(spec: dict, plan: dict, batches: Iterator[pa.RecordBatch], result: _Result) -> None:
    from confluent_kafka import TopicPartition

    tid = plan["transactional_id"]
    publisher, fresh = _publisher(spec, plan)
    result.init_s = publisher.init_seconds if fresh else 0.0
    collector: RecordCollector | None = None
    for attempt in range(1, 4):
        result.attempts = attempt
        # After init_transactions, nothing older can still commit: the committed offset is final.
        current = committed_offset(spec, plan["topic"], plan["partition"])
        if current is not None and current == plan["end"]:
            result.status, result.committed = ALREADY_DONE, current
            return
        if current != plan["committed"]:
            result.status, result.committed = STALE_PLAN, current if current is not None else -1
            result.message = f"committed offset is {current}, the plan expected {plan['committed']}"
            return
        try:
            publisher.begin()
            faults.maybe_fail("publish.before_produce", plan)
            if collector is None:
                collector = _collector(spec, plan, publisher.producer)
                _produce_all(collector, batches, result, plan)
                result.dead_letters = _collect_dead_letters(spec, plan, collector, result)
            else:
                started = time.perf_counter()
                collector.producer = publisher.producer
                collector.replay()
                result.produce_s += time.perf_counter() - started
            started = time.perf_counter()
            publisher.send_offsets([TopicPartition(plan["topic"], plan["partition"], plan["end"])],
                                   spec["group_metadata"])
            faults.maybe_fail("publish.before_commit", plan)
            publisher.commit()
            result.commit_s += time.perf_counter() - started
            faults.maybe_fail("publish.after_commit", plan)
            result.status, result.committed = COMMITTED, plan["end"]
            return
        except AbortableError as exc:
            publisher.abort()
            result.message = str(exc)
            if exc.code in _group_moved_codes():
                # The group rebalanced since planning: this plan's metadata is stale.
                result.status = STALE_PLAN
                return
            continue  # publish the range again in a new transaction
        except FencedError as exc:
            _drop_publisher(tid)
            if fresh:
                result.status, result.message = FENCED, str(exc)
                return
            # Our cached producer was fenced by another worker since the last batch: start
            # afresh (which fences that one) and publish the kept records.
            publisher, fresh = _publisher(spec, plan)
            result.init_s += publisher.init_seconds
            continue
        except BaseException:
            try:
                publisher.abort()
            except Exception:  # noqa: BLE001 - the original error is the one to report
                _drop_publisher(tid)
            raise
    raise AbortableError(f"{tid}: gave up after {result.attempts} aborted attempts: {result.message}")


def _group_moved_codes() -> set[int]:
    """send_offsets_to_transaction refused because the group rebalanced since planning."""
    from confluent_kafka import KafkaError

    return {KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID, KafkaError.FENCED_INSTANCE_ID,
            KafkaError.REBALANCE_IN_PROGRESS}


_PLAIN_PRODUCERS: dict[str, Any] = {}
_PLAIN_ERRORS: list[str] = []


def _plain_delivery(err, _msg) -> None:  # noqa: ANN001 - librdkafka callback
    if err is not None:
        _PLAIN_ERRORS.append(str(err))


def _publish_plain(spec: dict, plan: dict, batches: Iterator[pa.RecordBatch], result: _Result) -> None:
    """at-least-once / at-most-once: idempotent producer, offsets are the driver's business."""
    from confluent_kafka import Producer

    key = spec["bootstrap_servers"]
    if key not in _PLAIN_PRODUCERS:
        config = {k: v for k, v in spec["producer_config"].items() if not k.startswith("transaction")}
        _PLAIN_PRODUCERS[key] = Producer({**config, "enable.idempotence": True, "acks": "all",
                                          "on_delivery": _plain_delivery})
    producer = _PLAIN_PRODUCERS[key]
    _PLAIN_ERRORS.clear()
    collector = _collector(spec, plan, producer)
    _produce_all(collector, batches, result, plan)
    result.dead_letters = _collect_dead_letters(spec, plan, collector, result)
    started = time.perf_counter()
    remaining = producer.flush(spec.get("timeout_s", 60))
    result.commit_s = time.perf_counter() - started  # waiting for the acknowledgements
    if remaining or _PLAIN_ERRORS:
        raise RuntimeError(f"output of {plan['topic']}[{plan['partition']}] was not acknowledged "
                           f"({remaining} still queued after {spec.get('timeout_s', 60)}s; delivery "
                           f"errors: {_PLAIN_ERRORS[:3]}); its offsets are not committed")
    result.status, result.attempts = ACKED, 1


# ---------------------------------------------------------------------------------------------
# Offsets the driver commits (the weaker guarantees)
# ---------------------------------------------------------------------------------------------

class DriverCommits:
    """Where at-most-once and at-least-once commit offsets; exactly-once commits in the tasks.

    at-most-once: the ranges' end offsets are committed before the batch runs, so a crash
    loses the range and never repeats it. at-least-once: committed synchronously after every
    output record of the range is acknowledged, so a crash repeats the range and never loses it.
    """

    def __init__(self, guarantee: str, membership: Any) -> None:
        self.guarantee = guarantee
        self.membership = membership

    @staticmethod
    def _offsets(plans: list) -> list:
        from confluent_kafka import TopicPartition

        return [TopicPartition(p.topic, p.partition, p.end) for p in plans]

    def before_batch(self, plans: list) -> None:
        if self.guarantee == AT_MOST_ONCE:
            self.membership.commit(self._offsets(plans))

    def after_batch(self, plans: list, rows: list[dict]) -> None:
        if self.guarantee == AT_LEAST_ONCE:
            acked = {row["index"] for row in rows if row["status"] == ACKED}
            self.membership.commit(self._offsets([p for i, p in enumerate(plans) if i in acked]))


# ---------------------------------------------------------------------------------------------
# One record set aside by the driver (a record that makes the transform fail)
# ---------------------------------------------------------------------------------------------

def publish_dead_letter(spec: dict, plan: dict, record: tuple, membership: Any) -> str:
    """Send one record to the dead-letter topic and move the partition's offset past it.

    Under exactly-once this is the same protocol as a task's: the partition's transactional.id
    (fencing any zombie), the committed-offset re-check, the dead letter and the offset in one
    transaction. The weaker guarantees produce, then let the member commit.
    """
    from confluent_kafka import Producer, TopicPartition

    offset = record[4]
    next_offset = [TopicPartition(plan["topic"], plan["partition"], offset + 1)]
    if spec["guarantee"] != EXACTLY_ONCE:
        config = {k: v for k, v in spec["producer_config"].items() if not k.startswith("transaction")}
        producer = Producer({**config, "enable.idempotence": True})
        collector = _collector(spec, plan, producer)
        collector.add_dead_letter(spec["dead_letter_topic"], record, spec["app_id"])
        if producer.flush(spec.get("timeout_s", 60)):
            raise RuntimeError("the dead letter was not acknowledged; its offset is not committed")
        membership.commit(next_offset)
        return COMMITTED
    publisher = TransactionalPublisher(spec["producer_config"], plan["transactional_id"], spec.get("owner_dir"),
                                       spec.get("timeout_s", 60))
    try:
        publisher.init()
        if committed_offset(spec, plan["topic"], plan["partition"]) != offset:
            return STALE_PLAN
        publisher.begin()
        _collector(spec, plan, publisher.producer).add_dead_letter(spec["dead_letter_topic"], record, spec["app_id"])
        publisher.send_offsets(next_offset, spec["group_metadata"])
        publisher.commit()
        return COMMITTED
    finally:
        publisher.close()
