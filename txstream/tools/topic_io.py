"""Put JSON test data into a topic (Avro-encoded when a schema is given) and read a topic back.

What `txstream produce` and `txstream consume` run, so a user can try a processor without
writing Kafka code. Reading stops at the end offsets seen at start (last stable offsets under
read_committed), on position, never on a count.
"""
from __future__ import annotations

import base64
import json
import time
import uuid
from datetime import date, datetime
from decimal import Decimal
from typing import Any, Iterable, Iterator

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from txstream.serde.avro import AvroCodec


def _from_json(value: Any, schema: dict | None) -> Any:
    """JSON → what fastavro accepts: timestamps may be given as ISO strings or epoch millis."""
    if schema is None or not isinstance(value, dict):
        return value
    out = dict(value)
    for field in schema.get("fields", []):
        typ = field["type"]
        if isinstance(typ, list):
            typ = next((b for b in typ if b != "null"), typ)
        if isinstance(typ, dict) and typ.get("logicalType", "").startswith("timestamp") and isinstance(out.get(field["name"]), str):
            out[field["name"]] = datetime.fromisoformat(out[field["name"]].replace("Z", "+00:00"))
        elif isinstance(typ, dict) and typ.get("type") == "record" and field["name"] in out:
            out[field["name"]] = _from_json(out[field["name"]], typ)
    return out


def produce_waiting(producer: Producer, topic: str, value: bytes | None, key: bytes | None,
                    partition: int | None = None) -> None:
    """produce(), waiting for deliveries to drain while librdkafka's local queue is full."""
    while True:
        try:
            producer.produce(topic, value, key, partition=-1 if partition is None else partition)
            return
        except BufferError:
            producer.poll(0.1)


def produce_lines(bootstrap: str, topic: str, lines: Iterable[str], value_schema: dict | None = None,
                  key_field: str | None = None, transactional: bool = False,
                  partition: int | None = None) -> int:
    """Each line is one JSON value. Returns how many records were written (all acknowledged)."""
    codec = AvroCodec(value_schema) if value_schema else None
    encode = codec.encoder() if codec else None
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20,
                              "partitioner": "murmur2_random"}
    if transactional:
        config["transactional.id"] = f"txstream-produce-{uuid.uuid4().hex}"
    errors: list[str] = []
    producer = Producer({**config, "on_delivery": lambda err, _m: errors.append(str(err)) if err else None})
    if transactional:
        producer.init_transactions(30)
        producer.begin_transaction()
    count = 0
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"line {number} is not JSON: {exc}") from None
        key = None
        if key_field is not None:
            if not isinstance(value, dict) or key_field not in value:
                raise ValueError(f"line {number} has no field {key_field!r} to use as the key")
            key = str(value[key_field]).encode()
        try:
            payload = encode(_from_json(value, value_schema)) if encode else line.encode()
        except Exception as exc:  # noqa: BLE001 - fastavro's validation errors vary
            raise ValueError(f"line {number} does not fit the Avro schema: {exc}") from None
        produce_waiting(producer, topic, payload, key, partition)
        count += 1
    if transactional:
        producer.commit_transaction(60)
    remaining = producer.flush(60)
    if remaining or errors:
        raise KafkaException(f"{remaining} records unacknowledged; errors: {errors[:3]}")
    return count


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(value).decode()
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def end_offsets(bootstrap: str, topic: str, isolation: str, timeout: float = 30) -> dict[int, tuple[int, int]]:
    """{partition: (earliest, end)} where end is the LSO under read_committed, else the high watermark."""
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": f"txstream-probe-{uuid.uuid4().hex}",
                      "isolation.level": isolation, "enable.auto.commit": False})
    try:
        meta = probe.list_topics(topic, timeout=timeout).topics.get(topic)
        if meta is None or meta.error is not None:
            raise KafkaException(f"topic {topic!r} does not exist" + (f" ({meta.error})" if meta and meta.error else ""))
        # librdkafka asks ListOffsets with the consumer's isolation level: LSO under read_committed.
        return {p: probe.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout, cached=False)
                for p in sorted(meta.partitions)}
    finally:
        probe.close()


def read_records(bootstrap: str, topic: str, value_schema: dict | None = None,
                 isolation: str = "read_committed", limit: int | None = None,
                 timeout: float = 60.0) -> Iterator[dict[str, Any]]:
    """Every record from the beginning up to the end offsets seen at start, as JSON-able dicts."""
    codec = AvroCodec(value_schema) if value_schema else None
    ends = end_offsets(bootstrap, topic, isolation)
    pending = {p: end for p, (low, end) in ends.items() if end > low}
    if not pending:
        return
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"txstream-consume-{uuid.uuid4().hex}",
                         "isolation.level": isolation, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, p, ends[p][0]) for p in pending])
    produced = 0
    deadline = time.monotonic() + timeout
    try:
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} did not reach its end offsets within {timeout:.0f}s "
                                   f"(still open: {sorted(pending)})")
            for msg in consumer.consume(1000, 0.5):
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(msg.error())
                p = msg.partition()
                if p not in pending or msg.offset() >= pending[p]:
                    continue
                value = msg.value()
                record: dict[str, Any] = {"partition": p, "offset": msg.offset(), "key": _jsonable(msg.key())}
                try:
                    record["value"] = _jsonable(codec.decode(value) if codec else value)
                except Exception as exc:  # noqa: BLE001 - show undecodable records, don't stop
                    record["value"] = _jsonable(value)
                    record["decode_error"] = str(exc)
                if msg.headers():
                    record["headers"] = {k: _jsonable(v) for k, v in msg.headers()}
                yield record
                produced += 1
                if limit is not None and produced >= limit:
                    return
            # Control records and aborted data are never delivered: ask the position.
            for tp in consumer.position([TopicPartition(topic, p) for p in list(pending)]):
                if tp.offset >= pending.get(tp.partition, 0):
                    pending.pop(tp.partition, None)
    finally:
        consumer.close()


