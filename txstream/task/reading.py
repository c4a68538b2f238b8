"""Reading: the planned Kafka ranges, read in the Spark tasks into Arrow.

Task i reads exactly `[start, end)` of its Kafka partition with `read_committed` (a slot read in
one task reads its ranges together, in one fetch loop) and yields Arrow record batches in the
columns of Spark's own Kafka source. Offsets may jump (control
records, aborted transactions), so the reader stops on the consumer's position, never on a count.

Records that cannot be decoded never enter the DataFrame: they are written to a small side file
keyed by the Spark task attempt, which the publisher of the same task picks up and sends to the
dead-letter topic inside the same transaction (sidefile.py, publish.py).
"""
from __future__ import annotations

import bisect
import itertools
import operator
import time
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from txstream import fault_injection
from txstream.constants import RANGE_COLUMN
from txstream.records import DeadLetter
from txstream.serde.avro import AvroCodec, arrow_type
from txstream.serde.registry import RegistryDecoder, subjects_of
from txstream.task import worker_heap
from txstream.task.sidefile import ReadResult, write_side_file
from txstream.task.spec import FromJob, PartitionPlan, ReadSpec
from txstream.task.spec import resolve as resolve_job_spec

# confluent_kafka.Message's accessors, mapped over a fetch's messages (`_Columns.add_all`): the
# unbound C methods, which map() calls without a Python frame (operator.methodcaller adds one).
_ERROR, _KEY, _VALUE, _OFFSET = Message.error, Message.key, Message.value, Message.offset
_HEADERS, _PARTITION, _TOPIC, _TIMESTAMP = Message.headers, Message.partition, Message.topic, Message.timestamp
_SECOND = operator.itemgetter(1)
# How long a read waits for the next fetch when nothing is queued, before it looks at its
# position again (and, past idle_timeout_s without progress, gives up).
FETCH_WAIT_S = 0.1


def _topic_partition(msg: Any) -> tuple[str, int]:
    return msg.topic(), msg.partition()


HEADERS_ARROW = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))


def input_struct(key_schema: dict | None, value_schema: dict | None, tagged: bool = False):
    """The input DataFrame's schema: Spark's Kafka source columns, Avro-decoded where declared
    (`tagged`: and RANGE_COLUMN).

    A StructType, not DDL text: Spark would parse DDL with its SQL parser, whose cold start is
    slow on the driver; a StructType crosses as JSON."""
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = input_arrow_schema(key_schema, value_schema)
    return from_arrow_schema(schema.append(pa.field(RANGE_COLUMN, pa.int32())) if tagged else schema)


def input_arrow_schema(key_schema: dict | None, value_schema: dict | None) -> pa.Schema:
    return pa.schema([
        ("key", arrow_type(key_schema) if key_schema else pa.binary()),
        ("value", arrow_type(value_schema) if value_schema else pa.binary()),
        ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")), ("headers", HEADERS_ARROW),
    ])


def read_planned_range(spec: ReadSpec | FromJob, accounts: Any, tagged: bool,
                       ids: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A reading task: the records of its plans as Arrow batches (`read_ranges`), then their
    accounts. Task i reads plan i; a slot read in one partition (driver/jobs.py range_frame `per_slot`) reads
    its ranges together. `tagged`: each batch ends with RANGE_COLUMN, the reading task of its rows.

    `accounts` None: the accounts go to the side file, for the publisher downstream in the same
    task; otherwise to the wide batch's accumulator (`ReadAccounts`)."""
    worker_heap.settle()
    spec = resolve_job_spec(spec)
    tasks = [task for id_batch in ids for task in id_batch.column(0).to_pylist()]
    reads = [RangeRead(task, index, spec.plans[index])
             for task, index in zip(tasks, map(spec.plan_at, tasks), strict=True)
             if index >= 0]   # -1: padding, a dry plan
    if not reads:
        return
    yield from read_ranges(spec, reads, tagged)
    # Written before the JVM sees this iterator end, so the publisher finds the side file whole
    # once its own input is exhausted.
    if accounts is not None:
        accounts.add({(r.plan.topic, r.plan.partition, r.plan.start, r.plan.end): r.result() for r in reads})
    else:
        write_side_file(spec.side_dir, spec.batch_id, {r.index: r.result() for r in reads})


def _with_tag(batch: pa.RecordBatch, tasks: np.ndarray) -> pa.RecordBatch:
    """`batch` with RANGE_COLUMN: its rows' reading tasks."""
    return batch.append_column(RANGE_COLUMN, pa.array(tasks, pa.int32()))


def _decoding(spec: ReadSpec) -> tuple[AvroCodec | None, AvroCodec | None, pa.Schema]:
    """The key and value codecs (None: raw bytes) and the Arrow schema a reader decodes into."""
    lenient = spec.lenient_trailing_bytes
    key_codec = AvroCodec(spec.key_schema, lenient_trailing_bytes=lenient) if spec.key_schema else None
    value_codec = AvroCodec(spec.value_schema, lenient_trailing_bytes=lenient) if spec.value_schema else None
    if spec.registry is not None:
        topics = sorted({p.topic for p in spec.plans})
        if spec.value_schema:
            value_codec = RegistryDecoder(spec.registry, spec.value_schema, subjects_of(spec.registry, topics, False,
                                                                                        spec.value_schema), lenient)
        if spec.key_schema and spec.registry_keys:
            key_codec = RegistryDecoder(spec.registry, spec.key_schema, subjects_of(spec.registry, topics, True,
                                                                                    spec.key_schema), lenient)
    return key_codec, value_codec, input_arrow_schema(spec.key_schema, spec.value_schema)


class RangeRead:
    """One planned range being read: where it is, the rows not yet handed over, and its account
    (what `result()` gives the publisher or the wide batch's accumulator)."""

    def __init__(self, task: int, index: int, plan: PartitionPlan) -> None:
        self.task, self.index, self.plan = task, index, plan   # reading task, plan index, the range
        self.position = plan.start
        self.rows = _Columns(plan.topic, plan.partition)
        self.count = 0                                 # rows handed over (decoded)
        self.largest = 0                               # bytes of its largest record
        self.dead: list[DeadLetter] = []          # undecodable records
        self.seconds = 0.0

    def take_rows(self) -> _Columns:
        """The rows collected since the last hand-over, raw (decoded with other ranges' rows)."""
        rows, self.rows = self.rows, _Columns(self.plan.topic, self.plan.partition)
        self.largest = max(self.largest, rows.largest)
        return rows

    def result(self) -> ReadResult:
        return ReadResult(self.count, self.dead, self.seconds, self.largest)


def read_ranges(spec: ReadSpec, reads: list[RangeRead], tagged: bool = False) -> Iterator[pa.RecordBatch]:
    """The records of `reads`' ranges as decoded Arrow batches; each RangeRead ends with its
    account. The one fetch loop: a task of one range is a slot of one.

    All the ranges' partitions are assigned at once, so librdkafka fetches them in the same
    requests (read one after another, each range would pay its own assignment and first fetch).
    Each range ends exactly at its planned end (`_Columns.add_all`), its partition unassigned
    there. A batch closes at `chunk_records` records or `chunk_bytes` of keys and values, or when
    nothing more arrived; it may hold rows of several ranges, each range's in offset order
    (`tagged`: each row names its reading task in RANGE_COLUMN; otherwise the slot's output is
    one publication, publish._pieces_by_range)."""
    for r in reads:
        if r.plan.end <= r.plan.start:
            _range_done(r)
    reading = {(r.plan.topic, r.plan.partition): r for r in reads if r.plan.end > r.plan.start}
    if not reading:
        return
    key_codec, value_codec, schema = _decoding(spec)
    one_topic = len({t for t, _ in reading}) == 1
    config = spec.consumer_config()  # never subscribes or commits: assign only
    consumer = _consumer(config)
    healthy = False
    taken: list[tuple[RangeRead, _Columns]] = []   # rows to hand over, in each range's offset order
    finished: list[RangeRead] = []                 # complete ranges, their last rows not yet handed over
    held_rows = held_bytes = 0                     # rows collected and not yet handed over
    last_done = time.perf_counter()
    try:
        consumer.assign([TopicPartition(t, p, r.position) for (t, p), r in reading.items()])
        last_progress = time.monotonic()
        while reading:
            # No more than the ranges can still hold (what follows a range's end is not this
            # read's), than the batch has room for, and than fits in its bytes at the largest
            # record so far (a range's first call is bounded by librdkafka's queue,
            # queued.max.messages.kbytes).
            wanted = min(spec.chunk_records - held_rows, sum(r.plan.end - r.position for r in reading.values()))
            biggest = max(max(r.largest, r.rows.largest) for r in reads)
            if biggest:
                wanted = min(wanted, (spec.chunk_bytes - held_bytes) // biggest)
            messages, passed = _next_messages(consumer, max(1, wanted), reading)
            moved = False
            for key, msgs in _by_range(messages, reading, one_topic).items():
                r = reading[key]
                position = r.rows.add_all(msgs, r.plan.end, r.position)
                moved, r.position = moved or position != r.position, position
            for key, offset in passed.items():
                r = reading[key]
                moved, r.position = True, min(offset, r.plan.end)
            if moved:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > spec.idle_timeout_s:
                stuck = ", ".join(f"{t}[{p}] at {r.position} (planned end {r.plan.end})" for (t, p), r in reading.items())
                raise TimeoutError(f"No progress reading {stuck} for {spec.idle_timeout_s:.0f}s")
            for key in [key for key, r in reading.items() if r.position >= r.plan.end]:
                r = reading.pop(key)
                consumer.incremental_unassign([TopicPartition(*key)])   # no fetching past its end
                if r.rows.count:
                    taken.append((r, r.take_rows()))
                now = time.perf_counter()
                r.seconds, last_done = now - last_done, now
                finished.append(r)
            held_rows = sum(rows.count for _, rows in taken) + sum(r.rows.count for r in reading.values())
            held_bytes = sum(rows.bytes for _, rows in taken) + sum(r.rows.bytes for r in reading.values())
            if not reading or not messages or held_rows >= spec.chunk_records or held_bytes >= spec.chunk_bytes:
                # Hand over what is collected: the batch is full, the read is over, or the broker
                # is slow (nothing arrived).
                taken.extend((r, r.take_rows()) for r in reading.values() if r.rows.count)
                if taken:
                    batch = _hand_over(taken, schema, key_codec, value_codec, tagged)
                    if batch is not None:
                        yield batch
                taken, held_rows, held_bytes = [], 0, 0
                for r in finished:   # all their rows handed over: their accounts are final
                    _range_done(r)
                finished = []
        healthy = True
    finally:
        _release(consumer, config, healthy)


def _range_done(r: RangeRead) -> None:
    """A range is read and its rows handed over: its account is final."""
    fault_injection.maybe_fail("read.end", r.plan)


def _by_range(messages: list, reading: dict[tuple[str, int], Any], one_topic: bool) -> dict[tuple[str, int], list]:
    """`messages` sorted by range, in their order: {(topic, partition): messages}. Messages of
    partitions no longer read (a finished range's last fetch) are dropped; an error message
    raises (an end of partition excepted).

    librdkafka hands over a fetch's records partition by partition, so the split is by runs
    (`groupby` keyed by the messages' own C method: no Python code per message)."""
    by_range: dict[tuple[str, int], list] = {}
    if any(map(_ERROR, messages)):
        for msg in messages:
            key = (msg.topic(), msg.partition())
            if key in reading:
                by_range.setdefault(key, []).append(msg)
            elif msg.error() is not None and msg.error().code() != KafkaError._PARTITION_EOF:
                raise KafkaException(msg.error())
        return by_range
    if one_topic:
        # Keyed by partition alone: a stray record of another topic lands in a range's list,
        # where add_all's topic check sends it through add_each, which drops it.
        topic = next(iter(reading))[0]
        runs = (((topic, partition), run) for partition, run in itertools.groupby(messages, _PARTITION))
    else:
        runs = itertools.groupby(messages, _topic_partition)
    for key, run in runs:
        if key in reading:
            by_range.setdefault(key, []).extend(run)
    return by_range


def _hand_over(taken: list[tuple[RangeRead, _Columns]], schema: pa.Schema, key_codec: AvroCodec | None,
               value_codec: AvroCodec | None, tagged: bool) -> pa.RecordBatch | None:
    """The rows of several ranges as one decoded Arrow batch: the decoder's and Arrow's fixed
    costs, and Spark's per Arrow message, paid once per batch rather than once per range."""
    batch, kept = _decoded([rows for _, rows in taken], schema, key_codec, value_codec, [r.dead for r, _ in taken])
    for (r, _), count in zip(taken, kept, strict=True):
        r.count += count
    if batch is None or not tagged:
        return batch
    return _with_tag(batch, np.repeat(np.array([r.task for r, _ in taken], np.int32), kept))


def _next_messages(consumer: Any, wanted: int,
                   reading: dict[tuple[str, int], RangeRead]) -> tuple[list, dict[tuple[str, int], int]]:
    """Up to `wanted` messages: those queued, else those of the next fetch to land (waiting up
    to FETCH_WAIT_S), else none. With none, also the ranges whose partition's consumer position
    passed the range's own without delivering anything, and where it stands now: control records
    (an upstream transaction's commit marker) and aborted data have offsets but are never
    delivered, so the caller moves its read to that position.

    Not consume(wanted, timeout) alone: it waits for the full count or the timeout, so a range
    ending in a commit marker with nothing written after it would wait out the timeout for a
    record that never comes."""
    messages = consumer.consume(num_messages=wanted, timeout=0)
    if messages:
        return messages, {}
    passed = _passed_undelivered(consumer, reading)
    if passed:
        return [], passed
    messages = consumer.consume(num_messages=1, timeout=FETCH_WAIT_S)
    if messages:
        if wanted > 1:
            messages += consumer.consume(num_messages=wanted - 1, timeout=0)   # the rest of its fetch
        return messages, {}
    return [], _passed_undelivered(consumer, reading)


def _passed_undelivered(consumer: Any, reading: dict[tuple[str, int], RangeRead]) -> dict[tuple[str, int], int]:
    """The partitions whose consumer position is past their range's position (it passed records
    never delivered), with that position. position() asks librdkafka, not the broker."""
    return {(tp.topic, tp.partition): tp.offset
            for tp in consumer.position([TopicPartition(t, p) for t, p in reading])
            if tp.offset > reading[(tp.topic, tp.partition)].position}


_CONSUMERS: dict[str, Any] = {}  # per Python worker: one idle consumer per configuration


def _consumer(config: dict[str, Any]) -> Any:
    """An idle consumer of this configuration left by an earlier task of this worker, or a new one.

    Reading never subscribes or commits (assign only), so any partition can be read by any
    consumer; reusing one saves a new client's connections and metadata, much of a small
    batch's read. Kept unassigned between tasks, it fetches nothing and holds no records."""
    cached = _CONSUMERS.pop(repr(sorted(config.items())), None)
    return cached if cached is not None else Consumer(config)


def _release(consumer: Any, config: dict[str, Any], healthy: bool) -> None:
    """Keep a consumer that read its range cleanly for the next task, unassigned (so it fetches
    nothing meanwhile and holds no records); close any other."""
    key = repr(sorted(config.items()))
    if healthy and key not in _CONSUMERS:
        try:
            consumer.unassign()
            _CONSUMERS[key] = consumer
            return
        except Exception:
            pass
    consumer.close()


class _Columns:
    """One Arrow batch in the making: raw records in, decoded columns out.

    The per-record loop only collects what librdkafka hands over; decoding happens per batch
    and column (`AvroCodec.decode_column`), and undecodable records leave the batch there."""

    __slots__ = ("topic", "partition", "keys", "values", "offsets", "timestamps", "headers", "bytes", "largest")

    def __init__(self, topic: str, partition: int) -> None:
        self.topic, self.partition = topic, partition
        self.keys: list = []
        self.values: list = []
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.headers: list = []
        self.bytes = 0     # keys and values collected so far
        self.largest = 0   # the largest record's key + value (an upper bound: the largest of each)

    @property
    def count(self) -> int:
        return len(self.offsets)

    def add_all(self, messages: list, end: int, position: int) -> int:
        """Collect `messages` below `end`; returns the new read position.

        Column by column, with the messages' own C methods mapped over them, when the messages
        are what a healthy read hands over: no error, all of this range's partition, offsets
        rising from `position` (no Python code runs per message); anything else takes
        `add_each`."""
        if not messages:
            return position
        offsets = list(map(_OFFSET, messages))
        if (offsets[0] < position or any(map(_ERROR, messages))
                or set(map(_PARTITION, messages)) != {self.partition} or set(map(_TOPIC, messages)) != {self.topic}
                or (len(offsets) > 1 and not bool(np.all(np.diff(np.array(offsets, np.int64)) > 0)))):
            return self.add_each(messages, end, position)
        keep = bisect.bisect_left(offsets, end)
        if keep < len(offsets):
            messages, offsets, position = messages[:keep], offsets[:keep], end
        else:
            position = offsets[-1] + 1
        first = len(self.values)
        self.keys.extend(map(_KEY, messages))
        self.values.extend(map(_VALUE, messages))
        self.offsets.extend(offsets)
        self.timestamps.extend(map(_SECOND, map(_TIMESTAMP, messages)))
        self.headers.extend(map(_HEADERS, messages))
        self._count_bytes(first)
        return position

    def add_each(self, messages: list, end: int, position: int) -> int:
        """`add_all` message by message, for what its columnar path does not take."""
        keys, values, offsets = self.keys.append, self.values.append, self.offsets.append
        timestamps, headers = self.timestamps.append, self.headers.append
        first = len(self.values)
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                # Out of range (retention deleted `start`), authorization, fatal: the planned
                # range cannot be read as planned. The driver re-plans.
                raise KafkaException(err)
            offset = msg.offset()
            if offset >= end:
                position = end
                break
            if offset < position or msg.partition() != self.partition or msg.topic() != self.topic:
                # Never expected (librdkafka drops what a reused consumer fetched for its previous
                # assignment); a record outside the range must not be published with it.
                continue
            position = offset + 1
            keys(msg.key())
            values(msg.value())
            offsets(offset)
            timestamps(msg.timestamp()[1])
            headers(msg.headers())
        self._count_bytes(first)
        return position

    def _count_bytes(self, first: int) -> None:
        """Sizes of the rows from `first` on, per call, not per message (len at C speed)."""
        added_values = list(map(len, filter(None, self.values[first:])))
        added_keys = list(map(len, filter(None, self.keys[first:])))
        self.bytes += sum(added_values) + sum(added_keys)
        self.largest = max(self.largest, max(added_values, default=0) + max(added_keys, default=0))

    def to_batch(self, schema: pa.Schema, key_codec: AvroCodec | None, value_codec: AvroCodec | None,
                 dead: list[DeadLetter]) -> pa.RecordBatch | None:
        """The decoded batch without its undecodable records, which go to `dead`."""
        return _decoded([self], schema, key_codec, value_codec, [dead])[0]


def _decoded(parts: list[_Columns], schema: pa.Schema, key_codec: AvroCodec | None, value_codec: AvroCodec | None,
             deads: list[list[DeadLetter]]) -> tuple[pa.RecordBatch | None, list[int]]:
    """The parts' rows, in order, as one decoded batch without the undecodable records (each goes
    to its part's list in `deads`); and how many rows of each part the batch holds."""
    if len(parts) == 1:
        only = parts[0]
        keys, values, offsets, timestamps, headers = only.keys, only.values, only.offsets, only.timestamps, only.headers
    else:
        chain = itertools.chain.from_iterable
        keys, values = list(chain(p.keys for p in parts)), list(chain(p.values for p in parts))
        offsets, timestamps = list(chain(p.offsets for p in parts)), list(chain(p.timestamps for p in parts))
        headers = list(chain(p.headers for p in parts))
    lengths = [p.count for p in parts]
    n = len(offsets)
    errors: dict[int, str] = {}
    if key_codec is not None:
        decoded_keys, errors = key_codec.decode_column(keys, nullable=True)
    else:
        decoded_keys = pa.array(keys, pa.binary())
    if value_codec is not None:
        decoded_values, value_errors = value_codec.decode_column(values)
        errors = {**value_errors, **errors}
    else:
        decoded_values = pa.array(values, schema.field("value").type)
    if len({p.topic for p in parts}) == 1:
        topic_column = pa.repeat(pa.scalar(parts[0].topic, pa.string()), n)
    else:
        topic_column = pa.concat_arrays([pa.repeat(pa.scalar(p.topic, pa.string()), p.count) for p in parts])
    columns = [
        decoded_keys, decoded_values, topic_column,
        pa.array(np.repeat(np.array([p.partition for p in parts], np.int32), lengths), pa.int32()),
        pa.array(offsets, pa.int64()),
        pc.multiply(pa.array(timestamps, pa.int64()), 1000).cast(schema.field("timestamp").type),
        (pa.array([[{"key": k, "value": v} for k, v in h] if h else None for h in headers], HEADERS_ARROW)
         if any(headers) else pa.nulls(n, HEADERS_ARROW)),
    ]
    batch = pa.RecordBatch.from_arrays(columns, schema=schema)
    if not errors:
        return batch, lengths
    kept = list(lengths)
    part_of = np.searchsorted(np.cumsum(lengths), sorted(errors), side="right")
    for row, part in zip(sorted(errors), part_of.tolist(), strict=True):
        deads[part].append(DeadLetter(keys[row], values[row], headers[row], timestamps[row], offsets[row], "decode",
                                      errors[row]))
        kept[part] -= 1
    keep = np.ones(n, bool)
    keep[list(errors)] = False
    return (batch.filter(pa.array(keep)) if keep.any() else None), kept


class ReadAccounts:
    """Spark AccumulatorParam (duck-typed, so this module imports no pyspark) of a wide batch's
    reads: {(topic, partition, start, end): ReadResult}. Keyed by range, so a read stage that
    Spark runs again (a lost shuffle file) replaces its entry instead of counting twice."""

    def zero(self, _value: dict) -> dict:
        return {}

    def addInPlace(self, first: dict, second: dict) -> dict:  # noqa: N802 (Spark's name)
        first.update(second)
        return first
