"""One output unit of a wide batch (a `mapInArrow` body after `repartition(K, ...)`):
docs/wide-transforms.md §2.

Unit i is published by a producer with the stable transactional.id `<app>-unit-i`. After
`init_transactions` (which fences every older attempt of unit i, anywhere) the unit reads its
*marker* (records.py `Marker`): the committed offset of partition i of the internal topic
`<app>.units` in the group `<app>.units`. Offset m means "batch m-1 of this unit is published".
A unit whose marker already says batch b skips (and compares its own rows with the marker's:
determinism is checked on every replay); otherwise it produces its rows and moves the marker to
b+1, in one transaction (the transaction engine's attempt loop, kafka/transactions.py).

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

from txstream import fault_injection
from txstream.constants import ACKED, ALREADY_DONE, COMMITTED, EMPTY, EXACTLY_ONCE, FENCED
from txstream.errors import AbortableError, TaskError
from txstream.kafka import headers, transactions
from txstream.kafka.transactions import Transaction, group_moved, pooled_publisher, publish_plain
from txstream.records import Marker, markers_name, read_markers
from txstream.serde.avro import AvroCodec
from txstream.task import publish, worker_heap
from txstream.task.collector import RecordCollector
from txstream.task.result import TaskResult
from txstream.task.sidefile import MergeResult, take_state
from txstream.task.spec import FromJob, PublishSpec, resolve

NONDETERMINISTIC = "nondeterministic"   # a replay's rows differ from the committed attempt's
VALUES_DIFFER = "values-differ"         # same rows and routing, other values (skipped all the same)

def unit_transactional_id(app_id: str, unit: int) -> str:
    return f"{app_id}-unit-{unit}"


@dataclass(frozen=True)
class StateUnit:
    """What a stateful unit's publisher adds to its transaction (docs/state.md): the changelog
    records, late records and event time its merge left in the task's side file."""

    operator: str
    watermark_ms: int | None = None   # the watermark the batch's late rows missed (their dead letters say it)


@dataclass(frozen=True)
class UnitSpec:
    """What a unit task needs: the publishing spec (codecs, clients, guarantee) and the batch."""

    publish: PublishSpec
    batch_id: int
    units: int
    plan_id: str
    routing: str = "key"                    # what decided the unit: "key" or "all columns"
    markers_metadata: Any = field(default=None, repr=False)   # memberless, of the markers group
    state: StateUnit | None = None          # a stateful batch's unit

    @property
    def app_id(self) -> str:
        return self.publish.app_id


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


def publish_unit(spec: UnitSpec | FromJob, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: unit `partitionId` of batch `spec.batch_id` (`FromJob`: the job carries
    the spec, task/spec.py)."""
    worker_heap.settle()
    from pyspark import TaskContext

    spec = resolve(spec)
    unit = TaskContext.get().partitionId()
    result = TaskResult(unit)
    pending = [b for b in batches if b.num_rows]
    merged = None
    if spec.state is not None:
        merged = take_state(spec.publish.read.side_dir, spec.batch_id)
        if merged is None:
            raise TaskError(f"unit {unit} of batch {spec.batch_id}: the state merge of this task left no result")
        if not merged.skip:
            result.rows_merged, result.late, result.state_keys = merged.rows, len(merged.late), merged.keys
            result.restore_s, result.restore_records = merged.restore_s, merged.restore_records
    if merged is not None and merged.skip:
        result.status = ALREADY_DONE   # the merge found the unit's marker at the batch: published before
    elif not pending and not (merged and (merged.changes or merged.late or merged.events is not None
                                          or merged.events_right is not None)):
        # Nothing to publish: no producer, no marker (a skipped unit). A stateful unit that saw rows
        # (duplicates only, say) still moves its marker: their event time advances the watermark.
        result.status = EMPTY
    elif spec.publish.guarantee != EXACTLY_ONCE:
        _publish_plain(spec, unit, pending, result)
    else:
        _publish_transactional(spec, unit, pending, result, merged)
    yield result.to_batch()


def wide_collector(p: PublishSpec, producer: Any, batch_id: int, unit: int) -> RecordCollector:
    """A collector whose records name their batch and unit (a wide output record has no single
    source record); used by the unit tasks and by the driver's transactions (driver/wide.py)."""
    publication = uuid.uuid4().hex
    return RecordCollector(
        producer=producer, default_topic=p.output_topic,
        value_codec=(AvroCodec(p.output_value_schema, registry_schema_id=p.output_value_schema_id)
                     if p.output_value_schema else None),
        key_codec=(AvroCodec(p.output_key_schema, registry_schema_id=p.output_key_schema_id)
                   if p.output_key_schema else None),
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


class _UnitTransaction(Transaction):
    """A unit's records (kept, replayed after an abort) and its marker moved to the next batch,
    sent with the memberless metadata of the markers group."""

    def __init__(self, spec: UnitSpec, unit: int, batches: list[pa.RecordBatch], result: TaskResult,
                 merged: MergeResult | None = None) -> None:
        self.spec, self.unit, self.batches, self.result = spec, unit, batches, result
        self.merged = merged            # a stateful unit's merge result (task/state_unit.py)
        self.events: int | None = None  # the marker's event time before this batch
        self.events_right: int | None = None   # ... a join's right side's
        self.collector: RecordCollector | None = None

    def _marker(self) -> Marker:
        spec = self.spec
        return read_markers(spec.publish.clients, spec.app_id, spec.units, spec.publish.timeout_s)[self.unit]

    def settled(self) -> str | None:
        # After init_transactions no older attempt of this unit can commit: the marker is final.
        spec, result = self.spec, self.result
        marker = self._marker()
        self.events, self.events_right = marker.events, marker.events_right
        if marker.done_through < spec.batch_id:
            return None
        result.status, result.committed = ALREADY_DONE, marker.offset or -1
        if marker.done_through == spec.batch_id and spec.state is None:
            check = _collector(spec, self.unit, None)
            check.sent = _encode_only(check, self.batches)
            _check_replay(spec, marker, check, result)   # may say the replay differs
        return result.status

    def produce(self, producer: Any) -> None:
        started = time.perf_counter()
        if self.collector is None:
            self.collector = _collector(self.spec, self.unit, producer)
            if self.merged is not None:
                self._state_keys()
            for batch in self.batches:
                self.result.records_out += self.collector.add_batch(batch)
                fault_injection.maybe_fail("publish.mid_produce", self.unit)
            if self.merged is not None:
                self._late_records()
        else:
            self.collector.producer = producer
            self.collector.replay()
        if self.merged is not None and self.merged.changes:
            from txstream.state.changelog import ChangelogWriter

            ChangelogWriter(self.spec.app_id, self.spec.state.operator, self.unit).produce(
                producer, self.merged.changes, self.spec.batch_id)
        self.result.produce_s += time.perf_counter() - started

    def _state_keys(self) -> None:
        """Each output row names the state key it was emitted for (`txstream.state.key`), which
        `verify` audits (each closed window once, ...): the merge emitted the rows in that order
        and the transform's rest kept them one for one, else (it filtered) no row names one."""
        keys = self.merged.emitted
        if len(keys) != sum(b.num_rows for b in self.batches):
            return
        # A deduplicated key's expiry: `verify` tells a key emitted again after it expired from a duplicate.
        expires = self.merged.expires
        if len(expires) != len(keys):
            expires = [None] * len(keys)
        self.collector.row_headers = [[(headers.STATE_KEY, key)] if ms is None else
                                      [(headers.STATE_KEY, key), (headers.STATE_EXPIRES, str(ms).encode())]
                                      for key, ms in zip(keys, expires, strict=True)]

    def _late_records(self) -> None:
        """Records behind the watermark: to the dead-letter topic in this transaction, or only
        counted when there is none (docs/state.md, "Late records"). Each is its input record as
        read (key, value, headers), read back from its topic, where the transform's plan carried
        where it came from to the stateful operator; else the row the operator saw, as JSON."""
        late, dead_topic = self.merged.late, self.spec.publish.dead_letter_topic
        if not dead_topic:
            return
        watermark = self.spec.state.watermark_ms
        said = headers.iso_ms(watermark) if watermark is not None else "none"
        collector, app = self.collector, self.spec.app_id.encode()
        first = len(collector.sent)
        inputs = read_back(self.spec.publish.read, [row.record for row in late if row.record is not None],
                           self.spec.publish.timeout_s)
        records = []
        for i, row in enumerate(late):
            found = inputs.get(row.record) if row.record is not None else None
            key, value = (found.key(), found.value()) if found is not None else (None, row.row)
            own = [(k, v) for k, v in (found.headers() or []) if k not in _LINEAGE_HEADERS] if found is not None else []
            # The unit's wide lineage, as its output records carry it: `verify` counts them in the unit.
            records.append((dead_topic, value, key, -1, [
                *own, *collector.fixed_headers, (headers.PUBLICATION_SEQ, str(first + i).encode()),
                (headers.DLQ_STAGE, b"late"), (headers.DLQ_APP_ID, app), (headers.DLQ_WATERMARK, said.encode()),
                *([(headers.DLQ_SOURCE, row.record)] if found is not None else []),
                (headers.DLQ_ERROR, f"event time {headers.iso_ms(row.event_ms)} is behind the watermark {said}".encode())]))
        collector.add_records(records)

    def offsets(self) -> tuple[list, Any]:
        from confluent_kafka import TopicPartition

        spec, sent = self.spec, self.collector.sent
        events, events_right = self.events, self.events_right
        if self.merged is not None and self.merged.events is not None:
            events = max(events or self.merged.events, self.merged.events)
        if self.merged is not None and self.merged.events_right is not None:
            events_right = max(events_right or self.merged.events_right, self.merged.events_right)
        merged = late = -1
        attempt = ""
        if self.merged is not None:
            merged, late = self.merged.rows, len(self.merged.late)
            attempt = self.merged.attempt
        marker = Marker(spec.batch_id + 1, spec.plan_id, len(sent), *content_hash(sent), events=events,
                        merged=merged, late=late, attempt=attempt, events_right=events_right)
        return ([TopicPartition(markers_name(spec.app_id), self.unit, marker.offset, metadata=marker.encode())],
                spec.markers_metadata)

    def abortable(self, error: AbortableError) -> str | None:
        if group_moved(error):
            raise TaskError(f"{unit_transactional_id(self.spec.app_id, self.unit)}: the markers group "
                            f"{markers_name(self.spec.app_id)!r} refused a memberless commit ({error}); "
                            "something joined it") from error
        return None

    def other_attempt(self) -> str | None:
        return ALREADY_DONE if self._marker().done_through >= self.spec.batch_id else None


def _publish_transactional(spec: UnitSpec, unit: int, batches: list[pa.RecordBatch], result: TaskResult,
                           merged: MergeResult | None = None) -> None:
    tid = unit_transactional_id(spec.app_id, unit)
    producers = publish.producers(spec.publish)
    publisher, fresh = pooled_publisher(producers, tid)
    outcome = transactions.run(_UnitTransaction(spec, unit, batches, result, merged), publisher, fresh=fresh,
                               renew=lambda: pooled_publisher(producers, tid)[0],
                               other_attempt_s=spec.publish.transaction_timeout_s, fault_detail=unit)
    result.init_s, result.attempts = outcome.init_s, outcome.attempts
    result.commit_s += outcome.commit_s
    if outcome.message:
        result.message = outcome.message
    if outcome.committed:
        result.status, result.committed = COMMITTED, spec.batch_id + 1
    elif outcome.fence is not None:
        result.status = outcome.status or FENCED
        result.message = (f"fenced by another attempt, which published the unit: {outcome.fence}"
                          if outcome.status == ALREADY_DONE else str(outcome.fence))
    else:
        result.status = outcome.status


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


def _publish_plain(spec: UnitSpec, unit: int, batches: list[pa.RecordBatch], result: TaskResult) -> None:
    """at-least-once / at-most-once: the engine's idempotent producer; the driver commits the input."""
    def produce(producer: Any) -> None:
        collector = _collector(spec, unit, producer)
        for batch in batches:
            result.records_out += collector.add_batch(batch)

    _, result.commit_s = publish_plain(spec.publish.producer_config(transactional=False), produce,
                                       spec.publish.timeout_s, f"unit {unit} of batch {spec.batch_id}")
    result.status, result.attempts = ACKED, 1



# An input record's own headers a late dead letter leaves out: txstream's lineage, which the
# unit's own replaces (an upstream app's would otherwise be read as this record's).
_LINEAGE_HEADERS = frozenset((headers.LINEAGE, headers.SOURCE_TOPIC, headers.SOURCE_PARTITION, headers.SOURCE_OFFSET,
                              headers.PUBLICATION, headers.PUBLICATION_SEQ, headers.BATCH, headers.UNIT, headers.APP))
# Past this many offsets to the next one wanted, a read-back seeks instead of reading on.
_SEEK_PAST = 500


def read_back(spec: Any, wanted: list[bytes], timeout_s: float) -> dict[bytes, Any]:
    """The input records named `<topic>/<partition>/<offset>` in `wanted`, read back from their
    topics (the batch's own ranges: committed, read_committed). One consumer; each partition's
    offsets read in order, reading on through near ones and seeking to far ones. A record that
    is gone (retention deleted it since) is missing from the answer."""
    from collections import deque

    from confluent_kafka import Consumer, KafkaError, TopicPartition

    by_partition: dict[tuple[str, int], set[int]] = {}
    for name in wanted:
        topic, partition, offset = name.decode().rsplit("/", 2)
        by_partition.setdefault((topic, int(partition)), set()).add(int(offset))
    found: dict[bytes, Any] = {}
    if not by_partition:
        return found
    consumer = Consumer(spec.consumer_config())
    try:
        for (topic, partition), offsets in sorted(by_partition.items()):
            todo = deque(sorted(offsets))
            position = None
            deadline = time.monotonic() + timeout_s
            while todo:
                if position is None or todo[0] - position > _SEEK_PAST:
                    consumer.assign([TopicPartition(topic, partition, todo[0])])
                    position = todo[0]
                message = consumer.poll(1.0)
                if message is None:
                    if time.monotonic() > deadline:
                        raise TaskError(f"could not read back {topic}[{partition}]@{todo[0]} (a late record's input) "
                                        f"within {timeout_s:.0f}s")
                    continue
                if message.error() is not None:
                    if message.error().code() == KafkaError.OFFSET_OUT_OF_RANGE:
                        todo.popleft()   # gone: its dead letter is the row the operator saw
                        position = None
                        continue
                    if message.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise TaskError(f"reading back {topic}[{partition}]: {message.error()}")
                position = message.offset() + 1
                while todo and todo[0] < position - 1:
                    todo.popleft()   # a transaction marker or a compacted offset: nothing there
                if todo and todo[0] == message.offset():
                    found[f"{topic}/{partition}/{todo.popleft()}".encode()] = message
    finally:
        consumer.close()
    return found
