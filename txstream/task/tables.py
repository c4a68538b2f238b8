"""Tables kept from compacted topics (`Processor.tables`), read in the Spark tasks: the latest
value of each key up to a batch's version, a tombstone deleting its key (Kafka Streams' source
KTable, restored from its own topic: no second copy).

A version is each table partition's last stable offset when the batch was planned (the driver
logs it with a wide batch's plan, so a re-run joins against the same version). Task p of a
table's frame reads partition p from its start to the version's end with `read_committed`; a
Python worker keeps what it read (`_KEPT`), so the next batch reads only the records after it.
The keys of a compacted topic are partitioned by key, so a partition's latest values are the
table's for its keys.

Hand-written rather than Spark's own Kafka source: that source reads ranges, not the latest value
per key at a version, and it is the JVM's client, not the confluent-kafka reader every other
read here uses (the same credentials and isolation).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from txstream.errors import TableRecordError
from txstream.records import DeadLetter
from txstream.task.reading import _Columns, _consumer, _decoded, _passed_undelivered, _release, input_arrow_schema
from txstream.task.spec import FromJob, ReadSpec
from txstream.task.spec import resolve as resolve_job_spec

FETCH_WAIT_S = 0.1


@dataclass(frozen=True)
class TableSource:
    """A table the processor declares: its name in `transform`'s arguments, its compacted
    topic, how its keys and values decode, and whether Spark broadcasts it to the join."""

    name: str
    topic: str
    key_schema: dict | None = None
    value_schema: dict | None = None
    broadcast: bool = True


@dataclass(frozen=True)
class TableVersion:
    """What a batch reads of a table: each partition's end offset (exclusive)."""

    name: str
    ends: tuple[int, ...]

    def encode(self) -> str:
        return f"{self.name}:" + ".".join(map(str, self.ends))

    @staticmethod
    def decode(text: str) -> TableVersion:
        name, _, ends = text.rpartition(":")
        return TableVersion(name, tuple(int(e) for e in ends.split(".")) if ends else ())


def encode_versions(versions: tuple[TableVersion, ...]) -> str:
    return ",".join(v.encode() for v in versions)


def decode_versions(text: str) -> tuple[TableVersion, ...]:
    return tuple(TableVersion.decode(part) for part in text.split(",") if part)


@dataclass(frozen=True)
class TableReads:
    """The part of a batch's JobSpec its table frames read: each table and its version."""

    read: ReadSpec                      # the run's clients and reader settings
    sources: tuple[TableSource, ...]
    versions: tuple[TableVersion, ...]

    def source(self, name: str) -> TableSource:
        return next(s for s in self.sources if s.name == name)

    def version(self, name: str) -> TableVersion:
        return next(v for v in self.versions if v.name == name)


def table_arrow_schema(source: TableSource) -> pa.Schema:
    """A table frame's columns: those of the input stream's (key, value, topic, partition,
    offset, timestamp, headers), the value decoded where the table declares a schema."""
    return input_arrow_schema(source.key_schema, source.value_schema)


class _Kept:
    """A worker's copy of one table partition: the raw latest record per key, read up to
    `position`; its decoded rows and their raw keys, as of the last decode; the keys changed
    since (only those are decoded again)."""

    def __init__(self) -> None:
        self.position = 0
        self.latest: dict[bytes, tuple[bytes, int, int, Any]] = {}   # key -> (value, offset, timestamp ms, headers)
        self.decoded: pa.Table | None = None
        self.decoded_keys: pa.Array = pa.array([], pa.binary())
        self.changed: set[bytes] = set()

    def apply(self, key: bytes, value: bytes | None, offset: int, timestamp_ms: int, headers: Any) -> None:
        """A record of the partition: a value replaces its key's, a tombstone deletes it."""
        if value is None:
            self.latest.pop(key, None)
        else:
            self.latest[key] = (value, offset, timestamp_ms, headers)
        self.changed.add(key)


_KEPT: dict[tuple, _Kept] = {}   # per Python worker: (bootstrap, topic, partition, schemas) -> copy


def read_table(spec: TableReads | FromJob, name: str, ids: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A table frame's task: for each partition number in `ids`, the partition's latest value
    per key at the batch's version, decoded."""
    reads = resolve_job_spec(spec)
    source, version = reads.source(name), reads.version(name)
    for partition in (p for batch in ids for p in batch.column(0).to_pylist()):
        if partition >= len(version.ends):
            continue
        batch = _partition_at(reads.read, source, partition, version.ends[partition])
        if batch is not None and batch.num_rows:
            yield batch


def _partition_at(read: ReadSpec, source: TableSource, partition: int, end: int) -> pa.RecordBatch | None:
    key = (read.clients.bootstrap_servers, source.topic, partition, repr(source.key_schema), repr(source.value_schema))
    kept = _KEPT.get(key)
    if kept is None or kept.position > end:   # first read, or a re-run at an older version
        kept = _Kept()
    if kept.position < end:
        config = read.consumer_config()
        consumer, healthy = _consumer(config), False
        try:
            low, _high = consumer.get_watermark_offsets(TopicPartition(source.topic, partition), timeout=30,
                                                        cached=False)
            if kept.position < low:
                kept = _Kept()   # retention removed what followed the copy: read from the log's start
                kept.position = low
            if kept.position < end:
                _read_into(consumer, read, source, partition, end, kept)
            healthy = True
        finally:
            _release(consumer, config, healthy)
        _KEPT[key] = kept
    decoded = decode_kept(source, partition, kept)
    return decoded.to_batches()[0] if decoded is not None and decoded.num_rows else None


def _read_into(consumer: Any, read: ReadSpec, source: TableSource, partition: int, end: int, kept: _Kept) -> None:
    """The records of [kept.position, end) applied to `kept`: a value replaces its key's, a
    tombstone (a null value) deletes it; a record without a key is not a table's."""
    consumer.assign([TopicPartition(source.topic, partition, kept.position)])
    idle = 0.0
    while kept.position < end:
        messages = consumer.consume(num_messages=10_000, timeout=FETCH_WAIT_S)
        moved = False
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(err)
            offset = msg.offset()
            if offset < kept.position:
                continue
            if offset >= end:
                kept.position = end
                break
            if msg.key() is not None:
                kept.apply(msg.key(), msg.value(), offset, msg.timestamp()[1], msg.headers())
            kept.position, moved = offset + 1, True
        if not messages:
            # Control records (a transaction's marker) and aborted records have offsets but are
            # never delivered: the consumer's position passes them.
            passed = _passed_undelivered(consumer, {(source.topic, partition): kept})
            if passed:
                kept.position, moved = min(passed[(source.topic, partition)], end), True
        if moved:
            idle = 0.0
        else:
            idle += FETCH_WAIT_S
            if idle > read.idle_timeout_s:
                raise TimeoutError(f"No progress reading the table {source.name!r} ({source.topic}[{partition}]) at "
                                   f"{kept.position}, its version ending at {end}, for {read.idle_timeout_s:.0f}s")


def decode_kept(source: TableSource, partition: int, kept: _Kept) -> pa.Table | None:
    """The kept records decoded: the rows decoded before, less the keys changed since, and the
    changed keys' latest records decoded now. A record that does not decode stops the batch (as
    Kafka Streams' default for a source table, LogAndFail): a table missing a key would join
    wrongly, silently."""
    if kept.decoded is not None and not kept.changed:
        return kept.decoded
    if kept.decoded is None:
        fresh = sorted(kept.latest)
    else:
        fresh = sorted(k for k in kept.changed if k in kept.latest)
    batch = _decode(source, partition, [(k, *kept.latest[k]) for k in fresh])
    if kept.decoded is not None and kept.decoded.num_rows:
        stays = pc.invert(pc.is_in(kept.decoded_keys, value_set=pa.array(sorted(kept.changed), pa.binary())))
        old, old_keys = kept.decoded.filter(stays), kept.decoded_keys.filter(stays)
    else:
        old, old_keys = None, pa.array([], pa.binary())
    parts = [t for t in (old, pa.Table.from_batches([batch]) if batch is not None else None) if t is not None]
    # One chunk, combined here once: an unchanged copy is handed over as it is, batch after batch.
    kept.decoded = (pa.concat_tables(parts).combine_chunks() if parts
                    else pa.Table.from_batches([], table_arrow_schema(source)))
    kept.decoded_keys = pa.concat_arrays([old_keys, pa.array(fresh, pa.binary())])
    kept.changed = set()
    return kept.decoded


def _decode(source: TableSource, partition: int,
            records: list[tuple[bytes, bytes, int, int, Any]]) -> pa.RecordBatch | None:
    """`records` (key, value, offset, timestamp ms, headers) as one decoded batch, in their order."""
    from txstream.serde.avro import AvroCodec

    if not records:
        return None
    rows = _Columns(source.topic, partition)
    for k, v, offset, ts, headers in records:
        rows.keys.append(k)
        rows.values.append(v)
        rows.offsets.append(offset)
        rows.timestamps.append(ts)
        rows.headers.append(headers)
    key_codec = AvroCodec(source.key_schema) if source.key_schema else None
    value_codec = AvroCodec(source.value_schema) if source.value_schema else None
    dead: list[DeadLetter] = []
    batch, _kept = _decoded([rows], table_arrow_schema(source), key_codec, value_codec, [dead])
    if dead:
        first = dead[0]
        raise TableRecordError(f"the table {source.name!r} cannot decode its record {source.topic}[{partition}] at "
                               f"offset {first.offset} ({first.error}); {len(dead)} record(s) of that partition do "
                               "not decode. Fix or delete them in the topic (a tombstone for their key)")
    return batch
