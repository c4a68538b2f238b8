"""Output rows -> Kafka records (Kafka Streams' RecordCollectorImpl): encoding, topics,
partitions, headers, lineage. Keeps what it sent, so an aborted transaction can be replayed."""
from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txstream.errors import OutputError, topic_missing
from txstream.kafka import headers
from txstream.kafka.errors import kafka_error_of
from txstream.records import DeadLetter
from txstream.serde.avro import AvroCodec

# The source offset the driver carries through the transform's plan (driver/range_tag.py), which
# the lineage takes before a user's `offset` column: it is the reader's, whatever the transform does.
OFFSET_COLUMN = "_txstream_offset"


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
    # A wide unit's lineage headers (task/units.py: its batch, unit and publication), which every
    # record carries with its position; None: the compact `txstream.lineage` of a source partition.
    fixed_headers: list[tuple[str, bytes]] | None = None
    # Topics a row's `topic` may not name (the run's inputs: PublishSpec.refused_topics).
    refused_topics: frozenset[str] = frozenset()
    # Headers of each output row in turn, after the lineage (a stateful unit's state keys:
    # task/units.py); None: none.
    row_headers: list[list[tuple[str, bytes]]] | None = None
    _row_at: int = 0

    def _next_row_headers(self, n: int) -> list[list[tuple[str, bytes]]] | None:
        if self.row_headers is None:
            return None
        taken = self.row_headers[self._row_at:self._row_at + n]
        self._row_at += n
        return taken if len(taken) == n else None

    def __post_init__(self) -> None:
        topic, partition = self.source
        self.lineage_prefix = headers.lineage_prefix(topic, partition)
        self.lineage_middle = f"/{self.publication}/"

    def add_batch(self, batch: pa.RecordBatch) -> int:
        if batch.num_rows == 0:
            return 0
        with _collections_paused():
            return self._add_batch(batch)

    def _add_batch(self, batch: pa.RecordBatch) -> int:
        n = batch.num_rows
        names = batch.schema.names
        values = _encoded(batch.column(names.index("value")), self.value_codec, "value")
        keys = (_encoded(batch.column(names.index("key")), self.key_codec, "key")
                if "key" in names else [None] * n)
        sent = self.sent
        offsets = _source_offsets(batch)
        extra = self._next_row_headers(n)
        if not {"topic", "partition", "headers"} & set(names) and self.default_topic is not None:
            # The common shape (one topic, Kafka's partitioner, no headers of its own): one pass.
            topic = self.default_topic
            if not self.lineage:
                sent.extend([(topic, v, k, -1, None) for v, k in zip(values, keys, strict=False)])
            elif self.fixed_headers is not None and extra is not None:
                fixed, seq = self.fixed_headers, headers.PUBLICATION_SEQ
                sent.extend([(topic, v, k, -1, [*fixed, (seq, s), *e])
                             for v, k, s, e in zip(values, keys, _positions(len(sent), n), extra, strict=False)])
            elif self.fixed_headers is not None:
                fixed, seq = self.fixed_headers, headers.PUBLICATION_SEQ
                sent.extend([(topic, v, k, -1, [*fixed, (seq, s)])
                             for v, k, s in zip(values, keys, _positions(len(sent), n), strict=False)])
            else:
                name = headers.LINEAGE
                sent.extend([(topic, v, k, -1, {name: h}) for v, k, h in
                             zip(values, keys, self._lineage_values(offsets, len(sent), n), strict=False)])
            self._produce_from(len(sent) - n)
            return n
        topics = batch.column(names.index("topic")).to_pylist() if "topic" in names else None
        if topics is not None and self.refused_topics:
            _refuse_input_topics(set(topics) & self.refused_topics)
        partitions = batch.column(names.index("partition")).to_pylist() if "partition" in names else None
        hdrs = batch.column(names.index("headers")).to_pylist() if "headers" in names else None
        offsets = offsets.to_pylist() if offsets is not None else None
        source_topic, source_partition = self.source
        for i in range(n):
            topic = topics[i] if topics is not None and topics[i] is not None else self.default_topic
            if topic is None:
                raise OutputError("an output row has no `topic` and the processor declares no output_topic")
            record_headers = [(h["key"], h["value"]) for h in hdrs[i]] if hdrs is not None and hdrs[i] else []
            if self.lineage and self.fixed_headers is not None:
                record_headers += [*self.fixed_headers, (headers.PUBLICATION_SEQ, str(len(sent)).encode())]
            elif self.lineage:
                record_headers.append((headers.LINEAGE, headers.lineage_value(
                    source_topic, source_partition, offsets[i] if offsets is not None else None,
                    self.publication, len(sent))))
            if extra is not None:
                record_headers += extra[i]
            partition = partitions[i] if partitions is not None and partitions[i] is not None else -1
            sent.append((topic, values[i], keys[i], partition, record_headers))
        self._produce_from(len(sent) - n)
        return n

    def _lineage_values(self, offsets: pa.Array | None, first: int, n: int) -> list[bytes]:
        """`txstream.lineage` of `n` records from position `first`, built column-wise (what
        `headers.lineage_value` gives one record): a null or absent offset leaves its field empty."""
        offset_text = (pc.cast(offsets, pa.string()) if offsets is not None
                       else pa.nulls(n, pa.string()))
        joined = pc.binary_join_element_wise(
            pa.scalar(self.lineage_prefix), offset_text, pa.scalar(self.lineage_middle),
            pc.cast(pa.array(np.arange(first, first + n)), pa.string()), "",
            null_handling="replace", null_replacement="")
        return joined.cast(pa.binary()).to_pylist()

    def one_pass(self, names: list[str]) -> bool:
        """Whether a batch of these columns takes the one-pass path of `add_batch` with the
        compact lineage (or none): what `add_runs` builds for several collectors at once."""
        return (not {"topic", "partition", "headers"} & set(names) and self.default_topic is not None
                and self.fixed_headers is None)

    def add_records(self, records: list[tuple]) -> int:
        """Records built for this collector (`add_runs`): kept, then produced."""
        self.sent.extend(records)
        self._produce_from(len(self.sent) - len(records))
        return len(records)

    def add_dead_letter(self, dead_topic: str, record: DeadLetter, app_id: str) -> None:
        topic, partition = self.source
        dlq_headers = list(record.headers or []) + [
            (headers.LINEAGE, headers.lineage_value(topic, partition, record.offset, self.publication, len(self.sent))),
            (headers.DLQ_STAGE, record.stage.encode()), (headers.DLQ_ERROR, record.error.encode()[:4000]),
            (headers.DLQ_APP_ID, app_id.encode())]
        self.sent.append((dead_topic, record.value, record.key, -1, dlq_headers))
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
                    if record_headers is None:   # passing `headers=None` has a per-record cost of its own
                        produce(topic, value, key, partition)
                    else:
                        produce(topic, value, key, partition, headers=record_headers)
                    break
                except BufferError:
                    poll(0.05)  # local queue full: let deliveries drain
                except KafkaException as exc:
                    err = kafka_error_of(exc)
                    code = err.code() if err is not None else None
                    if code in (KafkaError._UNKNOWN_TOPIC, KafkaError.UNKNOWN_TOPIC_OR_PART):
                        raise OutputError(topic_missing("output", topic)) from None
                    if code == KafkaError._UNKNOWN_PARTITION:
                        raise OutputError(f"output partition {partition} of topic {topic!r} does not exist") from None
                    raise
        poll(0)


def add_runs(collectors: Mapping[int, RecordCollector], batch: pa.RecordBatch, runs: list[tuple[int, int, int]],
             produced: Callable[[int], None] = lambda _pos: None) -> list[int] | None:
    """A slot's batch of several ranges' runs, `(collector position, first row, end row)` covering
    the batch in order, built at once and produced run by run: the records each run's
    `add_batch` would produce, header for header: each `add_batch` call has a fixed cost before
    its first record (its Arrow compute calls and list building), which many short runs would
    pay again and again. Returns each run's record count, or None when the batch is not of the
    one-pass shape (the caller then takes `add_batch` per run). `produced(pos)`: after each run."""
    names = batch.schema.names
    if not runs or not all(collectors[pos].one_pass(names) for pos, _, _ in runs):
        return None
    if len({(id(collectors[pos].value_codec), id(collectors[pos].key_codec)) for pos, _, _ in runs}) > 1:
        return None   # the keys and values are encoded once, so the collectors must share their codecs
    covered = 0
    for _, start, end in runs:
        if start != covered:
            return None
        covered = end
    if covered != batch.num_rows:
        return None
    with _collections_paused():
        first = collectors[runs[0][0]]
        n = batch.num_rows
        values = _encoded(batch.column(names.index("value")), first.value_codec, "value")
        keys = (_encoded(batch.column(names.index("key")), first.key_codec, "key")
                if "key" in names else [None] * n)
        lineages: list | None = None
        if any(collectors[pos].lineage for pos, _, _ in runs):
            lineages = _lineage_of_runs(collectors, batch, runs)
        counts = []
        for pos, start, end in runs:
            collector = collectors[pos]
            topic = collector.default_topic
            if lineages is None or not collector.lineage:
                records = [(topic, v, k, -1, None) for v, k in zip(values[start:end], keys[start:end], strict=False)]
            else:
                name = headers.LINEAGE
                records = [(topic, v, k, -1, {name: h}) for v, k, h in
                           zip(values[start:end], keys[start:end], lineages[start:end], strict=False)]
            counts.append(collector.add_records(records))
            produced(pos)
        return counts


def _lineage_of_runs(collectors: Mapping[int, RecordCollector], batch: pa.RecordBatch,
                     runs: list[tuple[int, int, int]]) -> list[bytes]:
    """`txstream.lineage` of every row of `batch`, each from its run's collector (its source, its
    publication, its next positions: a collector's runs recur in one batch), in one pass of Arrow
    compute calls (`RecordCollector._lineage_values` gives one run's)."""
    n = batch.num_rows
    lengths = np.array([end - start for _, start, end in runs], np.int64)
    which = pa.array(np.repeat(np.arange(len(runs), dtype=np.int32), lengths))
    prefixes = pc.take(pa.array([collectors[pos].lineage_prefix for pos, _, _ in runs], pa.string()), which)
    middles = pc.take(pa.array([collectors[pos].lineage_middle for pos, _, _ in runs], pa.string()), which)
    next_position = {pos: len(collectors[pos].sent) for pos, _, _ in runs}
    starts = []
    for pos, start, end in runs:
        starts.append(next_position[pos])
        next_position[pos] += end - start
    # Each row's position: its run's first position plus its place in the run.
    run_first_row = np.repeat(np.array([start for _, start, _ in runs], np.int64), lengths)
    positions = np.repeat(np.array(starts, np.int64), lengths) + (np.arange(n, dtype=np.int64) - run_first_row)
    offsets = _source_offsets(batch)
    offset_text = pc.cast(offsets, pa.string()) if offsets is not None else pa.nulls(n, pa.string())
    joined = pc.binary_join_element_wise(prefixes, offset_text, middles, pc.cast(pa.array(positions), pa.string()), "",
                                         null_handling="replace", null_replacement="")
    return joined.cast(pa.binary()).to_pylist()


def _source_offsets(batch: pa.RecordBatch) -> pa.Array | None:
    """Each row's source offset: the carried one, else the user's `offset` column, else none."""
    names = batch.schema.names
    for name in (OFFSET_COLUMN, "offset"):
        if name in names:
            return batch.column(names.index(name))
    return None


@contextmanager
def _collections_paused() -> Iterator[None]:
    """No garbage collection while a batch's records are built and produced.

    Each record is a tuple (and its headers) that the collector keeps until the commit: a batch
    allocates hundreds of thousands of objects without freeing any, which is what triggers
    CPython's collections, and each collection walks what the batch built so far. None of them is
    garbage (the records hold no cycles), so the collections are pure cost. Process-wide,
    restored after; a thread that found collections on turns them back on, so overlapping callers
    cannot leave them off."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _positions(first: int, n: int) -> list[bytes]:
    """Records' positions in a wide publication (`txstream.publication.seq`), as header values."""
    return pc.cast(pa.array(np.arange(first, first + n)), pa.string()).cast(pa.binary()).to_pylist()


def encoded_batch(batch: pa.RecordBatch, value_codec: AvroCodec | None, key_codec: AvroCodec | None) -> pa.RecordBatch:
    """`batch` with a struct `value` and `key` Avro-encoded into binary columns (what `add_batch`
    would encode), so that the runs of a batch shared by several collectors are encoded once.
    A struct without a codec is left for `add_batch` to refuse."""
    names = batch.schema.names
    columns = list(batch.columns)
    for what, codec in (("value", value_codec), ("key", key_codec)):
        if what in names and codec is not None and pa.types.is_struct(batch.schema.field(what).type):
            i = names.index(what)
            columns[i] = pa.array(codec.encode_column(columns[i]), pa.binary())
    return pa.RecordBatch.from_arrays(columns, names=names)


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


def _refuse_input_topics(named: set[str]) -> None:
    if named:
        topic = sorted(named)[0]
        raise OutputError(
            f"an output row's `topic` is {topic!r}, an input topic of this run: the run would read "
            "its own output. The usual cause is a transform that kept the input's `topic` column: "
            "select the output's columns (key, value, ...) or set `topic`. If the loop is intended, "
            "set allow_output_to_input_topics = True on the processor.")
