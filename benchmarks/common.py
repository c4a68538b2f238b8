"""Shared pieces of the benchmark: schemas, test data, the reference transform, Kafka helpers.

This module imports only fastavro and confluent-kafka (plus the standard library), so the
harness and the in-process pieces can use it; contender worker scripts that run under another
interpreter (Quix Streams' venv) carry their own copy of the transform.
"""
from __future__ import annotations

import hashlib
import io
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import fastavro

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = Path(__file__).resolve().parent
ORDER_SCHEMA_PATH = REPO / "schemas" / "order.avsc"
ENRICHED_SCHEMA_PATH = REPO / "schemas" / "order_enriched.avsc"


def load_schema(path: Path):
    return fastavro.parse_schema(json.loads(Path(path).read_text()))


ORDER_SCHEMA = load_schema(ORDER_SCHEMA_PATH)
ENRICHED_SCHEMA = load_schema(ENRICHED_SCHEMA_PATH)


def encode(schema, record: dict) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, record)
    return buf.getvalue()


def decode(schema, data: bytes) -> dict:
    return fastavro.schemaless_reader(io.BytesIO(data), schema, None)


def transform(order: dict) -> dict | None:
    """The reference transform every contender implements: None when the order is dropped."""
    amount = order["amount"]
    if not amount > 0:
        return None
    return {
        "id": order["id"],
        "customer_id": order["customer_id"],
        "amount_cents": int(amount * 100),
        "currency": order["currency"],
        "created_at": order["created_at"],
        "items": order["items"],
        "is_large": amount > 100,
    }


# ---------------------------------------------------------------------------------------------
# Test data
# ---------------------------------------------------------------------------------------------

CURRENCIES = ["EUR", "USD", "JPY", "GBP", "KRW", "RUB", "CHF", "SEK"]
NOTES = [None, None, "gift wrap, please - it is a birthday present", "leave the parcel at the door, thank you",
         "call before delivery, the doorbell is broken", "second delivery attempt, customer was away",
         "fragile: glassware inside, handle with care", "deliver to the reception desk on floor 3"]


def decode_all(records, schema, key_field: str) -> tuple[list[dict], int, int]:
    """The output records' values that decode, how many did not, and how many records' keys differ
    from their value's `key_field` (the harness's checks)."""
    values, undecodable, bad_keys = [], 0, 0
    for record in records:
        try:
            value = decode(schema, record.value)
        except Exception:
            undecodable += 1
            continue
        bad_keys += record.key != value[key_field].encode()
        values.append(value)
    return values, undecodable, bad_keys


def produce_waiting(producer, topic: str, key: bytes, value: bytes) -> None:
    """produce, waiting for deliveries while librdkafka's local queue is full."""
    while True:
        try:
            producer.produce(topic, value=value, key=key)
            break
        except BufferError:
            producer.poll(0.05)
    producer.poll(0)


def make_order(rng: random.Random, seq: int, created_at_ms: int) -> dict:
    """One Order; about 10% void (amount <= 0), about 20% of the rest above 100."""
    roll = rng.random()
    if roll < 0.10:
        amount = -round(rng.uniform(0, 50), 2) if roll < 0.07 else 0.0
    elif roll < 0.28:
        amount = round(rng.uniform(100.01, 2000), 2)
    else:
        amount = round(rng.uniform(0.5, 100), 2)
    return {
        "id": f"order-{seq:010d}-{rng.getrandbits(64):016x}",
        "customer_id": f"customer-{rng.randrange(10_000_000):08d}",
        "amount": amount,
        "currency": rng.choice(CURRENCIES),
        "created_at": created_at_ms,
        "items": rng.randint(1, 12),
        "note": rng.choice(NOTES),
    }


FILLER = "abcdefghijklmnopqrstuvwxyz0123456789 "


def pad_note(order: dict, value_size: int) -> dict:
    """Set the optional `note` so that the encoded order is about `value_size` bytes.

    The note is the only field no contender's output carries, so padding it grows the input
    (what is read and decoded) and leaves the enriched output as it was.
    """
    bare = len(encode(ORDER_SCHEMA, {**order, "note": None}))
    room = value_size - bare  # `bare` already has the union's one-byte branch index
    room -= 1 if room < 64 else (2 if room < 8192 else 3)  # zig-zag varint of the length
    if room > 0:
        start = order["items"] % len(FILLER)
        text = (FILLER * (room // len(FILLER) + 2))[start:start + room]
        order = {**order, "note": text}
    return order


def digest(value: bytes) -> bytes:
    """A short fingerprint of a value: what the pass-through's output is compared with."""
    return hashlib.blake2b(value, digest_size=12).digest()


@dataclass
class Seeded:
    topic: str
    records: int
    expected: dict[bytes, bytes] = field(default_factory=dict)  # key -> expected output value
    input_digests: dict[bytes, bytes] = field(default_factory=dict)  # key -> digest(input value)
    input_bytes: int = 0  # keys + values
    value_bytes: int = 0
    value_size_target: int | None = None  # --value-size: orders padded to about this many bytes

    @property
    def expected_count(self) -> int:
        return len(self.expected)

    @property
    def avg_value_size(self) -> int:
        return max(1, round(self.value_bytes / max(1, self.records)))

    @property
    def avg_record_size(self) -> int:
        return max(1, round(self.input_bytes / max(1, self.records)))


def producer_config(bootstrap: str, **extra) -> dict:
    return {"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 262144,
            "compression.type": "none", "enable.idempotence": True, **extra}


def seed_input(bootstrap: str, topic: str, records: int, seed: int = 7,
               progress=lambda _m: None, value_size: int | None = None) -> Seeded:
    """Write `records` Orders (key = order id) and remember what the output must be.

    With `value_size`, every order's note is padded so the value is about that many bytes.
    """
    from confluent_kafka import Producer

    rng = random.Random(seed)
    producer = Producer(producer_config(bootstrap))
    out = Seeded(topic=topic, records=records, value_size_target=value_size)
    base_ms = int(time.time() * 1000) - records
    step = max(1, records // 10)
    for i in range(records):
        order = make_order(rng, i, base_ms + i)
        if value_size:
            order = pad_note(order, value_size)
        key = order["id"].encode()
        value = encode(ORDER_SCHEMA, order)
        out.input_bytes += len(key) + len(value)
        out.value_bytes += len(value)
        out.input_digests[key] = digest(value)
        enriched = transform(order)
        if enriched is not None:
            out.expected[key] = encode(ENRICHED_SCHEMA, enriched)
        produce_waiting(producer, topic, key, value)
        if (i + 1) % step == 0:
            progress(f"  seeded {i + 1:,}/{records:,}")
    remaining = producer.flush(120)
    if remaining:
        raise RuntimeError(f"{remaining} seed records were not delivered")
    return out


# ---------------------------------------------------------------------------------------------
# Kafka helpers
# ---------------------------------------------------------------------------------------------

def create_topics(bootstrap: str, names: list[str], partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(n, num_partitions=partitions, replication_factor=-1)
                                   for n in names], operation_timeout=30)
    for fut in futures.values():
        fut.result(60)
    # Wait until metadata shows every partition with a leader.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        meta = admin.list_topics(timeout=10)
        if all(n in meta.topics and len(meta.topics[n].partitions) == partitions
               and all(p.leader >= 0 for p in meta.topics[n].partitions.values()) for n in names):
            return
        time.sleep(0.2)


def delete_topics(bootstrap: str, names: list[str]) -> None:
    from confluent_kafka.admin import AdminClient

    if not names:
        return
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        for fut in admin.delete_topics(names, operation_timeout=30).values():
            try:
                fut.result(60)
            except Exception:  # best effort clean-up
                pass
    except Exception:
        pass


def broker_version(bootstrap: str) -> str:
    """The broker's software version, from the cluster's own jars when local, else unknown."""
    try:
        from txstream.local import cluster as local_broker

        return local_broker.KAFKA_VERSION
    except Exception:
        return "unknown"


def warm_up_broker(bootstrap: str, timeout: float = 180.0, load_s: float = 0.0) -> float:
    """Make a fresh broker create and load its internal topics before anything is measured.

    On a new cluster the first transactional producer waits for `__transaction_state` (50
    partitions) to be created and loaded ("Not coordinator", "Coordinator load in progress"),
    and the first group for `__consumer_offsets`: up to minutes on a small machine, which would
    be charged to whichever contender runs first. One committed transaction with offsets
    (send_offsets_to_transaction) does both. Then `load_s` seconds of the work every contender
    asks of it (`load_broker`). Returns the seconds it took.
    """
    from confluent_kafka import Consumer, Producer, TopicPartition

    started = time.monotonic()
    topic = f"bench-warm-up-{int(time.time() * 1000)}"
    create_topics(bootstrap, [topic], 1)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-group",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-txn"})
    try:
        producer.init_transactions(timeout)
        producer.begin_transaction()
        producer.produce(topic, key=b"warm-up", value=b"warm-up")
        consumer.assign([TopicPartition(topic, 0, 0)])
        producer.send_offsets_to_transaction([TopicPartition(topic, 0, 1)], consumer.consumer_group_metadata(),
                                             timeout)
        producer.commit_transaction(timeout)
    finally:
        consumer.close()
    delete_topics(bootstrap, [topic])
    if load_s > 0:
        load_broker(bootstrap, load_s)
    return time.monotonic() - started


def load_broker(bootstrap: str, seconds: float, partitions: int = 4) -> int:
    """Transactions of 2,000 records with offsets, read back read_committed, for `seconds`.

    A broker's JVM compiles its hot paths (produce, fetch, transaction markers) during its first
    minute of load, which would otherwise slow whichever contender runs first. Returns the
    records produced."""
    import threading

    from confluent_kafka import Consumer, Producer, TopicPartition

    topic = f"bench-load-{int(time.time() * 1000)}"
    create_topics(bootstrap, [topic], partitions)
    stop = threading.Event()

    def read() -> None:
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-reader",
                             "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
        consumer.subscribe([topic])
        try:
            while not stop.is_set():
                consumer.consume(1000, 0.1)
        finally:
            consumer.close()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    group = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-group"})
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-txn", "linger.ms": 5})
    value, produced = b"w" * 100, 0
    try:
        producer.init_transactions(60)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            producer.begin_transaction()
            for i in range(2_000):
                producer.produce(topic, value, str(i).encode())
            produced += 2_000
            producer.send_offsets_to_transaction([TopicPartition(topic, p, produced) for p in range(partitions)],
                                                 group.consumer_group_metadata(), 60)
            producer.commit_transaction(60)
    finally:
        stop.set()
        reader.join(10)
        group.close()
        delete_topics(bootstrap, [topic])
    return produced


@dataclass
class RunBroker:
    """The broker a benchmark run uses: the cluster given with --bootstrap-servers, or a local
    single-node Kafka started for the run in a temporary directory and destroyed by `stop()`."""

    bootstrap: str
    description: str
    cluster: object | None = None
    data_dir: str | None = None
    # With `secured`: the TLS + SCRAM-SHA-512 listener and its client settings file.
    secured: dict | None = None

    @classmethod
    def start(cls, bootstrap_servers: str | None, log, data_prefix: str, timeout: float = 180,
              secured: bool = False) -> RunBroker:
        if bootstrap_servers:
            return cls(bootstrap_servers, "external cluster (version not known to the harness)")
        import secrets
        import tempfile

        from txstream.local.cluster import KAFKA_VERSION, LocalKafkaCluster, free_port_block

        data_dir = tempfile.mkdtemp(prefix=data_prefix)
        cluster = LocalKafkaCluster(port=free_port_block(1, blocks=3), data_dir=data_dir, die_with_parent=True,
                                    tls=secured, scram_users={"bench": secrets.token_urlsafe(12)} if secured else None)
        broker = cls("", f"Apache Kafka {KAFKA_VERSION} (local, 1 KRaft node)", cluster, data_dir)
        log("starting a local Kafka broker" + (" (with a TLS + SCRAM listener)" if secured else "") + " ...")
        try:
            broker.bootstrap = cluster.start(progress=lambda m: log("  " + m), timeout=timeout)
            if secured:
                broker.secured = {"bootstrap": cluster.secured_bootstrap_servers,
                                  "config": str(cluster.write_client_properties())}
        except BaseException:
            broker.stop(log)
            raise
        return broker

    def stop(self, log) -> None:
        import shutil

        if self.cluster is not None:
            log("stopping the local Kafka broker")
            self.cluster.destroy()
            self.cluster = None
        if self.data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None


def start_registry(log):
    """A local schema registry for the run (txstream/local/registry.py), stopped by the caller."""
    from txstream.local.cluster import free_port_block
    from txstream.local.registry import LocalRegistry

    registry = LocalRegistry(port=free_port_block(2, blocks=1), die_with_parent=True)
    log("starting a local schema registry ...")
    registry.start(progress=lambda m: log("  " + m), timeout=180)
    return registry


_FRAMED: dict[tuple[str, str], str] = {}   # (bootstrap, topic) -> its registry-framed copy


def framed_copy(bootstrap: str, topic: str, registry_url: str) -> str:
    """A copy of `topic` whose values carry Confluent's framing: order.avsc registered under the
    copy's `<copy>-value`, its id before each value; same partitions, keys and order. Made once
    per input (outside any contender's measured time)."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from txstream.serde.registry import RegistryConfig, register_output

    if (bootstrap, topic) in _FRAMED:
        return _FRAMED[(bootstrap, topic)]
    copy = f"{topic}-framed"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = len(admin.list_topics(topic, timeout=30).topics[topic].partitions)
    admin.create_topics([NewTopic(copy, partitions, 1)])[copy].result(30)
    schema_id, _ = register_output(RegistryConfig(registry_url), f"{copy}-value", ORDER_SCHEMA)
    prefix = b"\x00" + schema_id.to_bytes(4, "big")
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"framed-copy-{copy}", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "queue.buffering.max.messages": 1_000_000,
                         "enable.idempotence": True})
    for p in range(partitions):
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
        consumer.assign([TopicPartition(topic, p, low)])
        # The position, not the last record's offset: it passes the transaction markers too.
        while consumer.position([TopicPartition(topic, p)])[0].offset < high:
            for msg in consumer.consume(10_000, 1.0):
                if msg.error():
                    continue
                while True:
                    try:
                        producer.produce(copy, prefix + msg.value(), msg.key(), partition=p)
                        break
                    except BufferError:
                        producer.poll(0.05)
    consumer.close()
    assert producer.flush(300) == 0
    _FRAMED[(bootstrap, topic)] = copy
    return copy
