"""One publishing task (a `mapInArrow` body): the protocol of docs/architecture.md §3.4.

The task's output and its input offset are committed in one Kafka transaction through the
partition's `TransactionalPublisher` (publisher.py); `RecordCollector` (collector.py) turns the
rows into records. The weaker guarantees produce with an idempotent producer and leave offsets
to the driver (driver/commits.py).
"""
from __future__ import annotations

import time
import uuid
from typing import Any, Iterator

import pyarrow as pa

from txstream import faults
from txstream.errors import AbortableError, FencedError, PoisonRecordError, TaskError
from txstream.serde.avro import AvroCodec
from txstream.task.collector import RecordCollector
from txstream.task.publisher import TransactionalPublisher
from txstream.task.result import ACKED, ALREADY_DONE, COMMITTED, FENCED, STALE_PLAN, TaskResult
from txstream.task.sidefile import read_side_file
from txstream.task.spec import EXACTLY_ONCE, PartitionPlan, PublishSpec

_PUBLISHERS: dict[str, TransactionalPublisher] = {}   # per Python worker, across batches
_GROUP_READERS: dict[str, Any] = {}


def _group_reader(spec: PublishSpec) -> Any:
    """A non-member consumer of the app's group, for stable reads of committed offsets."""
    from confluent_kafka import Consumer

    # read_committed makes librdkafka ask for stable offsets (KIP-447): a commit still pending
    # in an open transaction is resolved before the answer.
    config = spec.clients.consumer(spec.app_id, **{"isolation.level": "read_committed", "enable.auto.commit": False})
    key = repr(sorted((k, str(v)) for k, v in config.items()))
    if key not in _GROUP_READERS:
        _GROUP_READERS[key] = Consumer(config)
    return _GROUP_READERS[key]


def committed_offset(spec: PublishSpec, topic: str, partition: int) -> int | None:
    from confluent_kafka import TopicPartition

    from txstream.kafka.retry import retriable

    timeout = spec.timeout_s
    tp = retriable(lambda: _group_reader(spec).committed([TopicPartition(topic, partition)], timeout=timeout),
                   timeout)[0]
    return tp.offset if tp.offset >= 0 else None


def _new_publisher(spec: PublishSpec, tid: str) -> TransactionalPublisher:
    return TransactionalPublisher(spec.producer_config(transactional=True), tid, spec.owner_dir, spec.timeout_s)


def partition_publisher(spec: PublishSpec, plan: PartitionPlan) -> tuple[TransactionalPublisher, bool]:
    """The cached publisher for this partition, or a new initialised one. (publisher, fresh)."""
    return cached_publisher(spec, plan.transactional_id)


def cached_publisher(spec: PublishSpec, tid: str) -> tuple[TransactionalPublisher, bool]:
    """This worker's publisher for `tid` (an input partition's, or a wide output unit's), or a new
    initialised one. (publisher, fresh)."""
    now = time.monotonic()
    # Producers that another worker fenced since, or that no task of this worker used for a
    # while (their partitions' tasks run elsewhere now), are dead weight (threads, sockets):
    # close them, so that across all hosts there is about one live producer per input partition.
    for stale in [t for t, p in _PUBLISHERS.items()
                  if not p.still_owner() or (t != tid and now - p.last_used > spec.producer_idle_s)]:
        drop_publisher(stale)
    publisher = _PUBLISHERS.get(tid)
    if publisher is not None:
        publisher.last_used = now
        return publisher, False
    publisher = _new_publisher(spec, tid)
    publisher.init()
    _PUBLISHERS[tid] = publisher
    return publisher, True


def drop_publisher(tid: str) -> None:
    publisher = _PUBLISHERS.pop(tid, None)
    if publisher is not None:
        publisher.close()


def cached_publishers() -> list[str]:
    """The transactional.ids this Python worker keeps a producer for (tests, diagnostics)."""
    return sorted(_PUBLISHERS)


def publish_partition(spec: PublishSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: docs/architecture.md §3.4 for this task's planned range."""
    from pyspark import TaskContext

    index = TaskContext.get().partitionId()
    plan = spec.plans[index]
    result = TaskResult(index)
    if spec.guarantee == EXACTLY_ONCE:
        publish_transactional(spec, plan, batches, result)
    else:
        _publish_plain(spec, plan, batches, result)
    _take_side_file(spec, result)  # if no path above took it (an early return)
    yield result.to_batch()


def _collector(spec: PublishSpec, plan: PartitionPlan, producer: Any) -> RecordCollector:
    return RecordCollector(
        producer=producer, default_topic=spec.output_topic,
        value_codec=AvroCodec(spec.output_value_schema) if spec.output_value_schema else None,
        key_codec=AvroCodec(spec.output_key_schema) if spec.output_key_schema else None,
        source=(plan.topic, plan.partition), publication=uuid.uuid4().hex, lineage=spec.lineage)


def _produce_all(collector: RecordCollector, batches: Iterator[pa.RecordBatch], result: TaskResult,
                 plan: PartitionPlan) -> None:
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


def _take_side_file(spec: PublishSpec, result: TaskResult) -> list[tuple[Any, ...]]:
    """Consume the reader's side file of this task attempt (once): its counts go to `result`,
    its undecodable records are returned."""
    read = read_side_file(spec.read.side_dir, spec.read.batch_id)
    if read is None:
        return []
    result.records_in, result.read_s = read.records, read.read_seconds
    return read.dead_letters


def _dead_letters_of_range(spec: PublishSpec, plan: PartitionPlan, result: TaskResult) -> list[tuple[Any, ...]]:
    """The reader's undecodable records of this range (its side file, taken once)."""
    dead = _take_side_file(spec, result)
    if dead and not spec.dead_letter_topic:
        _key, _value, _h, _ts, offset, stage, error = dead[0]
        raise PoisonRecordError(
            f"record {plan.topic}[{plan.partition}]@{offset} failed at {stage}: {error}. "
            f"{len(dead)} record(s) of this range failed; declare a dead_letter_topic on the processor "
            "(or --dead-letter-topic) to set such records aside. Nothing of this range was published.")
    return dead


def publish_transactional(spec: PublishSpec, plan: PartitionPlan, batches: Iterator[pa.RecordBatch],
                           result: TaskResult) -> None:
    """docs/architecture.md §3.4. The range's records are kept (collector.py), so that a new
    transaction after an abort or a fence replays them and then goes on with the rest of the input."""
    from confluent_kafka import TopicPartition

    tid = plan.transactional_id
    publisher, fresh = partition_publisher(spec, plan)
    result.init_s = publisher.init_seconds if fresh else 0.0
    collector: RecordCollector | None = None
    input_done = False
    dead: list[tuple[Any, ...]] | None = None   # the side file's records, once the input is done
    dead_added = 0
    for attempt in range(1, 4):
        result.attempts = attempt
        # After init_transactions, nothing older can still commit: the committed offset is final.
        current = committed_offset(spec, plan.topic, plan.partition)
        if current is not None and current == plan.end:
            result.status, result.committed = ALREADY_DONE, current
            return
        if current != plan.committed:
            result.status, result.committed = STALE_PLAN, current if current is not None else -1
            result.message = f"committed offset is {current}, the plan expected {plan.committed}"
            return
        try:
            publisher.begin()
            faults.maybe_fail("publish.before_produce", plan)
            with publisher.producing():
                if collector is None:
                    collector = _collector(spec, plan, publisher.producer)
                else:
                    started = time.perf_counter()
                    collector.producer = publisher.producer
                    collector.replay()
                    result.produce_s += time.perf_counter() - started
                if not input_done:
                    _produce_all(collector, batches, result, plan)
                    input_done = True
                if dead is None:
                    dead = _dead_letters_of_range(spec, plan, result)
                while dead_added < len(dead):
                    dead_added += 1   # kept by the collector before it is produced: replayed if need be
                    collector.add_dead_letter(spec.dead_letter_topic, dead[dead_added - 1], spec.app_id)
                result.dead_letters = len(dead)
            started = time.perf_counter()
            publisher.send_offsets([TopicPartition(plan.topic, plan.partition, plan.end)], spec.group_metadata)
            faults.maybe_fail("publish.before_commit", plan)
            publisher.commit()
            result.commit_s += time.perf_counter() - started
            faults.maybe_fail("publish.after_commit", plan)
            result.status, result.committed = COMMITTED, plan.end
            return
        except AbortableError as exc:
            publisher.abort()   # robust: a producer that cannot abort is replaced (publisher.py)
            result.message = str(exc)
            if exc.code in _group_moved_codes():
                # The group rebalanced since planning: this plan's metadata is stale.
                result.status = STALE_PLAN
                return
            continue  # publish the range again in a new transaction
        except FencedError as exc:
            drop_publisher(tid)
            if fresh:
                # Fenced during this task: another attempt of this range (a speculative copy, a
                # retry on another host) initialised the id after us and owns the range now.
                result.status, result.committed, result.message = _outcome_of_other_attempt(spec, plan, exc)
                return
            # Our cached producer was fenced by a producer elsewhere (another worker, another
            # host) since this worker's last batch: start afresh (which fences that one, if it
            # still lives) and publish the kept records, then the rest.
            publisher, fresh = partition_publisher(spec, plan)
            result.init_s += publisher.init_seconds
            continue
        except BaseException:
            try:
                publisher.abort()
            except Exception:   # the original error is the one to report
                drop_publisher(tid)
            raise
    raise AbortableError(f"{tid}: gave up after {result.attempts} aborted attempts: {result.message}")


def _outcome_of_other_attempt(spec: PublishSpec, plan: PartitionPlan, fence: FencedError) -> tuple[str, int, str]:
    """What became of the range after another attempt fenced this one: wait (up to the
    transaction timeout, the longest its transaction can stay open) until it committed the
    range (ALREADY_DONE) or something else moved the offset (STALE_PLAN); else FENCED.

    Reporting at once would let Spark take this attempt's result as the task's and kill the
    attempt that owns the range, perhaps before its commit (speculation): the range would then
    be re-planned and read again. Waiting, the first result Spark sees is a finished range."""
    deadline = time.monotonic() + spec.transaction_timeout_s
    current: int | None = plan.committed
    while time.monotonic() < deadline:
        current = committed_offset(spec, plan.topic, plan.partition)
        if current == plan.end:
            return ALREADY_DONE, current, f"fenced by another attempt, which committed the range: {fence}"
        if current != plan.committed:
            return STALE_PLAN, current if current is not None else -1, f"fenced; the offset moved to {current}"
        time.sleep(0.2)
    return FENCED, current if current is not None else -1, str(fence)


def _group_moved_codes() -> set[int]:
    """send_offsets_to_transaction refused because the group rebalanced since planning."""
    from confluent_kafka import KafkaError

    return {KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID, KafkaError.FENCED_INSTANCE_ID,
            KafkaError.REBALANCE_IN_PROGRESS}


_PLAIN_PRODUCERS: dict[str, Any] = {}
_PLAIN_ERRORS: list[str] = []


def _plain_delivery(err, _msg) -> None:
    if err is not None:
        _PLAIN_ERRORS.append(str(err))


def _publish_plain(spec: PublishSpec, plan: PartitionPlan, batches: Iterator[pa.RecordBatch],
                   result: TaskResult) -> None:
    """at-least-once / at-most-once: idempotent producer, offsets are the driver's business."""
    from confluent_kafka import Producer

    config = spec.producer_config(transactional=False)
    key = repr(sorted((k, str(v)) for k, v in config.items()))
    if key not in _PLAIN_PRODUCERS:
        _PLAIN_PRODUCERS[key] = Producer({**config, "on_delivery": _plain_delivery})
    producer = _PLAIN_PRODUCERS[key]
    _PLAIN_ERRORS.clear()
    collector = _collector(spec, plan, producer)
    _produce_all(collector, batches, result, plan)
    dead = _dead_letters_of_range(spec, plan, result)
    for record in dead:
        collector.add_dead_letter(spec.dead_letter_topic, record, spec.app_id)
    result.dead_letters = len(dead)
    started = time.perf_counter()
    remaining = producer.flush(spec.timeout_s)
    result.commit_s = time.perf_counter() - started  # waiting for the acknowledgements
    if remaining or _PLAIN_ERRORS:
        raise TaskError(f"output of {plan.topic}[{plan.partition}] was not acknowledged "
                        f"({remaining} still queued after {spec.timeout_s:.0f}s; delivery "
                        f"errors: {_PLAIN_ERRORS[:3]}); its offsets are not committed")
    result.status, result.attempts = ACKED, 1


def publish_dead_letter(spec: PublishSpec, plan: PartitionPlan, record: tuple, membership: Any) -> str:
    """Send one record to the dead-letter topic and move the partition's offset past it.

    Runs on the driver (poison isolation), with a task's protocol: under exactly-once the
    partition's transactional.id (fencing any zombie), the committed-offset re-check, the dead
    letter and the offset in one transaction. The weaker guarantees produce, then let the
    member commit.
    """
    from confluent_kafka import Producer, TopicPartition

    offset = record[4]
    next_offset = [TopicPartition(plan.topic, plan.partition, offset + 1)]
    if spec.guarantee != EXACTLY_ONCE:
        producer = Producer(spec.producer_config(transactional=False))
        collector = _collector(spec, plan, producer)
        collector.add_dead_letter(spec.dead_letter_topic, record, spec.app_id)
        if producer.flush(spec.timeout_s):
            raise TaskError("the dead letter was not acknowledged; its offset is not committed")
        membership.commit(next_offset)
        return COMMITTED
    publisher = _new_publisher(spec, plan.transactional_id)
    try:
        publisher.init()
        if committed_offset(spec, plan.topic, plan.partition) != offset:
            return STALE_PLAN
        publisher.begin()
        _collector(spec, plan, publisher.producer).add_dead_letter(spec.dead_letter_topic, record, spec.app_id)
        publisher.send_offsets(next_offset, spec.group_metadata)
        publisher.commit()
        return COMMITTED
    finally:
        publisher.close()
