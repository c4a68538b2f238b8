"""Input for the tests: numbered records spread over partitions, and the sample orders in Avro."""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Callable

from confluent_kafka import Producer

from processors.sample_orders import orders
from tests.support.kafka import avro_bytes, produce
from txstream.serde.avro import load_schema
from txstream.tools.topic_io import produce_waiting

ORDER = load_schema(str(Path(__file__).resolve().parents[2] / "schemas/order.avsc"))


def numbered(n: int) -> tuple[bytes, bytes]:
    """Record n: key `k<n>` (tests/support/wide_processors.py reads n back from it), a value of
    varying length."""
    return f"k{n}".encode(), f"v{n}-{'x' * (n % 37)}".encode()


def seed_numbered(bootstrap: str, topic: str, partitions: int, count: int, first: int = 0, only: int | None = None,
         record: Callable[[int], tuple[bytes | None, bytes]] = numbered) -> Counter:
    """Records `first` .. `first + count - 1`, record n into partition n mod `partitions` (or all
    into partition `only`); returns their (key, value) multiset."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20,
                         "batch.num.messages": 10_000, "queue.buffering.max.messages": 500_000})
    sent: Counter = Counter()
    for n in range(first, first + count):
        key, value = record(n)
        produce_waiting(producer, topic, value, key, n % partitions if only is None else only)
        sent[(key, value)] += 1
    assert producer.flush(120) == 0, "seeding did not finish"
    return sent


def seed_orders(bootstrap: str, topic: str, count: int, garbage_at: tuple[int, ...] = ()) -> list[dict]:
    """`count` sample orders (processors/sample_orders.py) in Avro, keyed by customer; an
    undecodable record inserted at each index of `garbage_at`. Returns the orders."""
    data = list(orders(count))
    records = [(o["customer_id"].encode(), avro_bytes(ORDER, o)) for o in data]
    for i in garbage_at:
        records.insert(i, (b"bad", b"\xff\xff not avro"))
    produce(bootstrap, topic, records)
    return data
