"""Put JSON test data into a topic (Avro-encoded when a schema is given) and read a topic back.

What `txstream produce` and `txstream consume` run, so a user can try a processor without
writing Kafka code. Reading stops at the end offsets seen at start (last stable offsets under
read_committed), on position, never on a count (txstream.kafka.scan). Clients come from a
KafkaClients (bootstrap servers plus -X / --command-config properties).
"""
from __future__ import annotations

import base64
import json
import uuid
from collections import Counter
from datetime import date, datetime
from decimal import Decimal
from typing import Any, Iterable, Iterator

from confluent_kafka import KafkaException, Producer

from txstream.errors import KafkaFailure, OffsetsError, SchemaRegistryRefused, SchemaRegistryUnreachable
from txstream.kafka.config import KafkaClients, as_clients
from txstream.kafka.errors import classify_kafka
from txstream.kafka.lookups import admin_client, cluster_topics, watermarks
from txstream.kafka.scan import scan
from txstream.serde.avro import AvroCodec

_UNITS_PER_SECOND = {"timestamp-millis": 1000, "timestamp-micros": 1_000_000}


def _from_json(value: Any, schema: dict | None, top: bool = True) -> Any:
    """JSON → what the encoder accepts: a timestamp may be given as an ISO string or as an epoch
    integer in the field's unit. The encoder (serde/avro.py) writes top-level timestamps from
    integers, nested ones from datetimes."""
    if schema is None or not isinstance(value, dict):
        return value
    out = dict(value)
    for field in schema.get("fields", []):
        typ, name = field["type"], field["name"]
        if isinstance(typ, list):
            typ = next((b for b in typ if b != "null"), typ)
        logical = typ.get("logicalType", "") if isinstance(typ, dict) else ""
        if logical in _UNITS_PER_SECOND and isinstance(out.get(name), str):
            at = datetime.fromisoformat(out[name].replace("Z", "+00:00"))
            out[name] = round(at.timestamp() * _UNITS_PER_SECOND[logical]) if top else at
        elif isinstance(typ, dict) and typ.get("type") == "record" and name in out:
            out[name] = _from_json(out[name], typ, top=False)
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


def _topic_partitions(clients: KafkaClients, topic: str, timeout: float) -> int:
    """How many partitions `topic` has; KafkaUnreachable or an OffsetsError naming it, quickly."""
    known = cluster_topics(admin_client(clients), timeout)
    if topic not in known:
        raise OffsetsError(f"topic {topic!r} does not exist at {clients.bootstrap_servers}")
    return known[topic]


def produce_lines(clients: KafkaClients | str, topic: str, lines: Iterable[str], value_schema: dict | None = None,
                  key_field: str | None = None, transactional: bool = False,
                  partition: int | None = None, timeout: float = 60.0, registry: Any = None) -> int:
    """Each line is one JSON value. Returns how many records were written (all acknowledged); when
    some were not, a KafkaFailure says how many were and how many not. `registry` (a
    serde.registry.RegistryConfig): values framed with the id of `value_schema` registered under
    the topic's subject (or of the subject's latest, with use_latest_version)."""
    clients = as_clients(clients)
    _topic_partitions(clients, topic, timeout)  # an unreachable cluster or a missing topic: one line, now
    schema_id = None
    if registry is not None:
        from txstream.serde.registry import register_output, subject_name

        subject = subject_name(registry, topic, False, value_schema.get("name") if value_schema else None)
        schema_id, value_schema = register_output(registry, subject, value_schema)
    codec = AvroCodec(value_schema, registry_schema_id=schema_id) if value_schema else None
    encode = codec.encoder() if codec else None
    config: dict[str, Any] = {"enable.idempotence": True, "linger.ms": 20, "partitioner": "murmur2_random",
                              "message.timeout.ms": int(min(timeout, 60) * 1000)}
    if transactional:
        config["transactional.id"] = f"txstream-produce-{uuid.uuid4().hex}"
    delivered: list[int] = [0]
    errors: Counter[str] = Counter()

    def on_delivery(err, _msg) -> None:
        if err:
            errors[err.str()] += 1
        else:
            delivered[0] += 1

    producer = Producer(clients.producer(**config, on_delivery=on_delivery))
    count = 0
    try:
        if transactional:
            producer.init_transactions(timeout)
            producer.begin_transaction()
        # Once Kafka stops acknowledging, the rest of the input is not read: it would only time out too.
        count, read_all = _produce_all(producer, topic, lines, encode, value_schema, key_field, partition,
                                       failing=lambda: bool(errors))
        if transactional:
            producer.commit_transaction(timeout)
    except KafkaException as exc:
        raise classify_kafka(exc, f"producing to {topic}") from None
    remaining = producer.flush(timeout)
    if remaining or errors:
        said = "; ".join(f"{what} ({n})" for what, n in errors.most_common(3))
        # A record whose acknowledgement was lost (the broker died before answering) may be in
        # the topic all the same: say "acknowledged", never "not written".
        raise KafkaFailure(
            f"producing to {topic}: {delivered[0]} of {count} records acknowledged, {count - delivered[0]} not"
            + (f" ({remaining} still unacknowledged after {timeout:g}s)" if remaining else "")
            + (f"; Kafka said: {said}" if said else "")
            + "; the unacknowledged ones may or may not be in the topic"
            + ("" if read_all else f"; the input was read up to its record {count} only"))
    return count


def _produce_all(producer: Producer, topic: str, lines: Iterable[str], encode: Any, value_schema: dict | None,
                 key_field: str | None, partition: int | None, failing: Any = lambda: False) -> tuple[int, bool]:
    """(records produced, whether the input was read to its end: not once `failing()`)."""
    count = 0
    for number, line in enumerate(lines, 1):
        if number % 1000 == 0 and failing():
            return count, False
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
        except Exception as exc:
            raise ValueError(f"line {number} does not fit the Avro schema: {exc}") from None
        produce_waiting(producer, topic, payload, key, partition)
        count += 1
    return count, True


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


def end_offsets(clients: KafkaClients | str, topic: str, isolation: str,
                timeout: float = 30) -> dict[int, tuple[int, int]]:
    """{partition: (earliest, end)} where end is the LSO under read_committed, else the high watermark."""
    clients = as_clients(clients)
    count = _topic_partitions(clients, topic, timeout)
    marks = watermarks(admin_client(clients), [(topic, p) for p in range(count)], timeout)
    return {p.partition: (m.earliest, m.last_stable if isolation == "read_committed" else m.log_end)
            for p, m in marks.items()}


def read_records(clients: KafkaClients | str, topic: str, value_schema: dict | None = None,
                 isolation: str = "read_committed", limit: int | None = None,
                 timeout: float = 60.0, registry: Any = None) -> Iterator[dict[str, Any]]:
    """Every record from the beginning up to the end offsets seen at start, as JSON-able dicts.

    `timeout` bounds the first Kafka requests and any stall while reading. `registry` (a
    serde.registry.RegistryConfig): values read by their schema id (shown as `schema_id`),
    resolved to `value_schema` when given."""
    codec = AvroCodec(value_schema) if value_schema else None
    if registry is not None:
        from txstream.serde.registry import RecordReader

        codec = _FramedCodec(RecordReader(registry, value_schema))
    ends = end_offsets(clients, topic, isolation, timeout)
    produced = 0
    for batch in scan(clients, {(topic, p): rng for p, rng in ends.items()}, timeout,
                      isolation=isolation, purpose="consume"):
        for msg in batch:
            value = msg.value()
            record: dict[str, Any] = {"partition": msg.partition(), "offset": msg.offset(),
                                      "key": _jsonable(msg.key())}
            try:
                if isinstance(codec, _FramedCodec):
                    record["schema_id"], value = codec.reader.read(value)
                    record["value"] = _jsonable(value)
                else:
                    record["value"] = _jsonable(codec.decode(value) if codec else value)
            except (SchemaRegistryUnreachable, SchemaRegistryRefused):
                raise   # the registry's failure, not the record's
            except Exception as exc:
                record["value"] = _jsonable(value)
                record["decode_error"] = str(exc)
            if msg.headers():
                record["headers"] = {k: _jsonable(v) for k, v in msg.headers()}
            yield record
            produced += 1
            if limit is not None and produced >= limit:
                return


class _FramedCodec:
    """A registry's RecordReader where `read_records` takes a codec."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader
