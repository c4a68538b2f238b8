"""One output unit of a wide batch (a `mapInArrow` body after `repartition(K, ...)`):
docs/wide-transforms.md §2.

Unit i is published by a producer with the stable transactional.id `<app>-unit-i`. After
`init_transactions` (which fences every older attempt of unit i, anywhere) the unit reads its
*marker*: the committed offset of partition i of the internal topic `<app>.units` in the group
`<app>.units`. Offset m means "batch m-1 of this unit is published". A unit whose marker already
says batch b skips (and compares its own rows with the marker's: determinism is checked on every
replay); otherwise it produces its rows and moves the marker to b+1, in one transaction.

Nobody ever joins the markers group: the marker is sent with the memberless group metadata of
a consumer that never subscribes (generation -1), which the broker accepts for a classic group.
"""
from __future__ import annotations

import time
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterator

import pyarrow as pa

from txstream import faults
from txstream.errors import AbortableError, FencedError, TaskError
from txstream.kafka import headers
from txstream.protocol import ACKED, ALREADY_DONE, COMMITTED, EMPTY, EXACTLY_ONCE, FENCED
from txstream.serde.avro import AvroCodec
from txstream.task import worker_heap
from txstream.task.collector import RecordCollector
from txstream.task.publish import _group_moved_codes, cached_publisher, drop_publisher
from txstream.task.result import TaskResult
from txstream.task.spec import PublishSpec

NONDETERMINISTIC = "nondeterministic"   # a replay's rows differ from the committed attempt's
VALUES_DIFFER = "values-differ"         # same rows and routing, other values (skipped all the same)

_MARKER_READERS: dict[str, Any] = {}
_PLAIN: dict[str, Any] = {}
_PLAIN_ERRORS: list[str] = []


def _plain_delivery(err: Any, _msg: Any) -> None:
    if err is not None:
        _PLAIN_ERRORS.append(str(err))


def unit_transactional_id(app_id: str, unit: int) -> str:
    return f"{app_id}-unit-{unit}"


def markers_name(app_id: str) -> str:
    """The internal topic and the group whose committed offsets are the units' markers."""
    return f"{app_id}.units"


@dataclass(frozen=True)
class Marker:
    """A unit's marker: `offset` is the next batch it has to publish; the metadata describes the
    last one it published (plan id, rows, content hash)."""

    offset: int | None
    plan_id: str = ""
    rows: int = -1
    content: str = ""       # digest of what routed the records (topic and key)
    values: str = ""        # digest of the values

    @property
    def done_through(self) -> int:
        """The last batch id this unit published (0: none)."""
        return (self.offset or 1) - 1

    def metadata(self) -> str:
        return f"p={self.plan_id};r={self.rows};h={self.content};v={self.values}"

    @staticmethod
    def parse(offset: int | None, metadata: str | None) -> Marker:
        fields = dict(part.split("=", 1) for part in (metadata or "").split(";") if "=" in part)
        try:
            rows = int(fields.get("r", -1))
        except ValueError:
            rows = -1
        return Marker(offset, fields.get("p", ""), rows, fields.get("h", ""), fields.get("v", ""))


@dataclass(frozen=True)
class UnitSpec:
    """What a unit task needs: the publishing spec (codecs, clients, guarantee) and the batch."""

    publish: PublishSpec
    batch_id: int
    units: int
    plan_id: str
    routing: str = "key"                    # what decided the unit: "key" or "all columns"
    markers_metadata: Any = field(default=None, repr=False)   # memberless, of the markers group

    @property
    def app_id(self) -> str:
        return self.publish.app_id


def read_markers(clients: Any, app_id: str, units: int, timeout: float = 30.0) -> dict[int, Marker]:
    """Every unit's marker, read stably (a marker pending in an open transaction is resolved
    first, as read_committed asks the broker for stable offsets)."""
    from confluent_kafka import TopicPartition

    from txstream.kafka.retry import retriable

    name = markers_name(app_id)
    config = clients.consumer(name, **{"isolation.level": "read_committed", "enable.auto.commit": False})
    key = repr(sorted((k, str(v)) for k, v in config.items()))
    if key not in _MARKER_READERS:
        from confluent_kafka import Consumer

        _MARKER_READERS[key] = Consumer(config)
    reader = _MARKER_READERS[key]
    wanted = [TopicPartition(name, i) for i in range(units)]
    answer = retriable(lambda: reader.committed(wanted, timeout=timeout), timeout)
    return {tp.partition: Marker.parse(tp.offset if tp.offset >= 0 else None, tp.metadata) for tp in answer}


def content_hash(sent: list[tuple]) -> tuple[str, str]:
    """Order-free digests of a unit's records (rows of a shuffle reach a task in no fixed order):
    of what routed them to this unit (topic and key, or the value when there is no key), and of
    their values. A routing difference on a replay breaks exactly-once (a record could be in two
    units, or none); a value difference alone does not, and a sum of doubles may differ in its
    last bit between attempts (the order of addition), so it is only reported."""
    routed_total = values_total = 0
    for topic, value, key, _partition, _headers in sent:
        routed = key if key is not None else value
        routed_total += (zlib.crc32(topic.encode()) << 32) | zlib.crc32(routed or b"")
        values_total += (zlib.crc32(value or b"") << 32) | zlib.crc32(value or b"", 7)
    return f"{routed_total % (1 << 64):016x}", f"{values_total % (1 << 64):016x}"


def publish_unit(spec: UnitSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: unit `partitionId` of batch `spec.batch_id`."""
    worker_heap.settle()
    from pyspark import TaskContext

    unit = TaskContext.get().partitionId()
    result = TaskResult(unit)
    pending = [b for b in batches if b.num_rows]
    if not pending:
        result.status = EMPTY   # nothing to publish: no producer, no marker (a skipped unit)
    elif spec.publish.guarantee != EXACTLY_ONCE:
        _publish_plain(spec, unit, pending, result)
    else:
        _publish_transactional(spec, unit, pending, result)
    yield result.to_batch()


def wide_collector(p: PublishSpec, producer: Any, batch_id: int, unit: int) -> RecordCollector:
    """A collector whose records name their batch and unit (a wide output record has no single
    source record); used by the unit tasks and by the driver's transactions (driver/wide.py)."""
    publication = uuid.uuid4().hex
    return RecordCollector(
        producer=producer, default_topic=p.output_topic,
        value_codec=AvroCodec(p.output_value_schema) if p.output_value_schema else None,
        key_codec=AvroCodec(p.output_key_schema) if p.output_key_schema else None,
        source=("", -1), publication=publication, lineage=p.lineage,
        fixed_headers=headers.wide_lineage(batch_id, unit, publication, p.app_id), refused_topics=p.refused_topics)


def _collector(spec: UnitSpec, unit: int, producer: Any) -> RecordCollector:
    return wide_collector(spec.publish, producer, spec.batch_id, unit)


def _check_replay(spec: UnitSpec, marker: Marker, collector: RecordCollector, result: TaskResult) -> None:
    """This attempt's rows against those the committed attempt published: a difference means
    the transform is not deterministic (docs/wide-transforms.md §4)."""
    if marker.done_through != spec.batch_id or marker.rows < 0:
        return
    rows, (digest, values) = len(collector.sent), content_hash(collector.sent)
    if marker.plan_id != spec.plan_id or marker.rows != rows or marker.content != digest:
        result.status = NONDETERMINISTIC
        result.message = (f"unit {result.index} of batch {spec.batch_id} replayed with {rows} records "
                          f"(digest {digest}, plan {spec.plan_id}); the committed attempt published "
                          f"{marker.rows} (digest {marker.content}, plan {marker.plan_id})")
    elif marker.values and marker.values != values:
        result.status = VALUES_DIFFER
        result.message = (f"unit {result.index} of batch {spec.batch_id} replayed with different values for the "
                          "same keys than the committed attempt published (routing unchanged: published once; "
                          "floating-point sums can differ in their last bit between attempts)")


def _publish_transactional(spec: UnitSpec, unit: int, batches: list[pa.RecordBatch], result: TaskResult) -> None:
    from confluent_kafka import TopicPartition

    tid = unit_transactional_id(spec.app_id, unit)
    publisher, fresh = cached_publisher(spec.publish, tid)
    result.init_s = publisher.init_seconds if fresh else 0.0
    collector: RecordCollector | None = None
    for attempt in range(1, 4):
        result.attempts = attempt
        # After init_transactions no older attempt of this unit can commit: the marker is final.
        marker = read_markers(spec.publish.clients, spec.app_id, spec.units, spec.publish.timeout_s)[unit]
        if marker.done_through >= spec.batch_id:
            result.status, result.committed = ALREADY_DONE, marker.offset or -1
            if marker.done_through == spec.batch_id:
                check = _collector(spec, unit, None)
                check.sent = _encode_only(check, batches)
                _check_replay(spec, marker, check, result)
            return
        try:
            publisher.begin()
            faults.maybe_fail("publish.before_produce", unit)
            started = time.perf_counter()
            with publisher.producing():
                if collector is None:
                    collector = _collector(spec, unit, publisher.producer)
                    for batch in batches:
                        result.records_out += collector.add_batch(batch)
                        faults.maybe_fail("publish.mid_produce", unit)
                else:
                    collector.producer = publisher.producer
                    collector.replay()
            result.produce_s += time.perf_counter() - started
            started = time.perf_counter()
            marker = Marker(spec.batch_id + 1, spec.plan_id, len(collector.sent), *content_hash(collector.sent))
            publisher.send_offsets([TopicPartition(markers_name(spec.app_id), unit, marker.offset,
                                                   metadata=marker.metadata())], spec.markers_metadata)
            faults.maybe_fail("publish.before_commit", unit)
            publisher.commit()
            result.commit_s += time.perf_counter() - started
            faults.maybe_fail("publish.after_commit", unit)
            result.status, result.committed = COMMITTED, marker.offset
            return
        except AbortableError as exc:
            publisher.abort()
            result.message = str(exc)
            if exc.code in _group_moved_codes():
                raise TaskError(f"{tid}: the markers group {markers_name(spec.app_id)!r} refused a memberless "
                                f"commit ({exc}); something joined it") from exc
            continue
        except FencedError as exc:
            drop_publisher(tid)
            if fresh:
                # Another attempt of this unit initialised the id after us: it owns the unit.
                result.status, result.message = _outcome_of_other_attempt(spec, unit, exc)
                return
            publisher, fresh = cached_publisher(spec.publish, tid)
            result.init_s += publisher.init_seconds
            continue
        except BaseException:
            try:
                publisher.abort()
            except Exception:
                drop_publisher(tid)
            raise
    raise AbortableError(f"{tid}: gave up after {result.attempts} aborted attempts: {result.message}")


def _encode_only(collector: RecordCollector, batches: list[pa.RecordBatch]) -> list[tuple]:
    """The records this attempt would publish, encoded, without producing them."""
    class _NoProducer:
        def produce(self, *args: Any, **kwargs: Any) -> None:
            pass

        def poll(self, _timeout: float) -> int:
            return 0

    collector.producer = _NoProducer()
    for batch in batches:
        collector.add_batch(batch)
    return collector.sent


def _outcome_of_other_attempt(spec: UnitSpec, unit: int, fence: FencedError) -> tuple[str, str]:
    """Wait (up to the transaction timeout) for the attempt that fenced this one to publish the
    unit, so Spark does not take this attempt's result and kill the one that owns it."""
    deadline = time.monotonic() + spec.publish.transaction_timeout_s
    while time.monotonic() < deadline:
        marker = read_markers(spec.publish.clients, spec.app_id, spec.units, spec.publish.timeout_s)[unit]
        if marker.done_through >= spec.batch_id:
            return ALREADY_DONE, f"fenced by another attempt, which published the unit: {fence}"
        time.sleep(0.2)
    return FENCED, str(fence)


def _publish_plain(spec: UnitSpec, unit: int, batches: list[pa.RecordBatch], result: TaskResult) -> None:
    """at-least-once / at-most-once: an idempotent producer; the driver commits the input."""
    from confluent_kafka import Producer

    errors = _PLAIN_ERRORS
    errors.clear()
    config = spec.publish.producer_config(transactional=False)
    key = repr(sorted((k, str(v)) for k, v in config.items()))
    if key not in _PLAIN:
        _PLAIN[key] = Producer({**config, "on_delivery": _plain_delivery})
    producer = _PLAIN[key]
    collector = _collector(spec, unit, producer)
    for batch in batches:
        result.records_out += collector.add_batch(batch)
    started = time.perf_counter()
    remaining = producer.flush(spec.publish.timeout_s)
    result.commit_s = time.perf_counter() - started
    if remaining or errors:
        raise TaskError(f"unit {unit} of batch {spec.batch_id} was not acknowledged ({remaining} queued, "
                        f"errors {errors[:3]}); the input offsets are not committed")
    result.status, result.attempts = ACKED, 1
