"""Small ranges in partitions with much more after them, against the real broker (task/reading.py;
the reader's `max.partition.fetch.bytes` and its prefetch queue bound in task/spec.py
READER_DEFAULTS).

A fetch returns up to `max.partition.fetch.bytes` of each partition from the read's position,
also past the range's end, and librdkafka fetches on while the records are handed over, until the
reader unassigns the partition: what lies past the end is fetched, parsed and dropped. With a
large fetch size a small range would fetch the whole rest of its partition, and a batch over many
partitions read mostly what it then drops. librdkafka also fetches ahead into its prefetch queue
(64 MB by default) while the reader starts; the reader bounds that queue to 1 MB. What stays is a
fetch's granularity: it returns whole producer batches, so a range's last fetch can carry records
past its end.
"""
from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer

from tests.support.kafka import produce
from txstream.kafka.config import KafkaClients
from txstream.task import reading
from txstream.task.spec import PartitionPlan, ReadSpec

RECORDS, VALUE_BYTES = 12_000, 1_000   # ~12 MB in each partition, in small producer batches
RANGE = 100                            # records per range: ~100 KB
MB = 1024 * 1024


def _fill(bootstrap: str, topic: str, partitions: int) -> None:
    """Small producer batches: a fetch returns whole record batches, and large ones would blunt
    what the test measures."""
    value = b"x" * VALUE_BYTES
    for p in range(partitions):
        produce(bootstrap, topic, ((b"k%d" % i, value) for i in range(RECORDS)), partition=p,
                config={"linger.ms": 0, "batch.size": 16_384})


class _Stats:
    def __init__(self) -> None:
        self.last: dict[str, Any] | None = None

    def __call__(self, blob: str) -> None:
        self.last = json.loads(blob)

    def received_bytes(self, consumer: Any) -> int:
        """Bytes the consumer received from its brokers so far, from a statistics report taken when
        no request awaits its response: a fetch still in flight when a read unassigns counts for
        that read, not for the next."""
        self.last = None
        for _ in range(100):
            consumer.poll(0.05)
            brokers = (self.last or {}).get("brokers", {}).values()
            if self.last is not None and not any(b["waitresp_cnt"] or b["outbuf_cnt"] for b in brokers):
                return sum(broker["rxbytes"] for broker in brokers)
            self.last = None
        raise AssertionError("no statistics report without requests in flight within 5 s")


@pytest.mark.parametrize("partitions", [1, 2], ids=["one-range", "a-slot-of-two"])
def test_a_small_range_fetches_little_past_its_end(partitions, bootstrap_servers, make_topic) -> None:
    topic = make_topic("fetches", partitions)
    _fill(bootstrap_servers, topic, partitions)
    spec = ReadSpec(clients=KafkaClients(bootstrap_servers), app_id=f"fetches-{uuid.uuid4().hex[:6]}",
                    side_dir=f"txstream-test-{uuid.uuid4().hex[:8]}")
    config = spec.consumer_config()
    key = repr(sorted(config.items()))
    stats = _Stats()
    consumer = Consumer({**config, "statistics.interval.ms": 50, "stats_cb": stats})
    received = []
    try:
        # Three reads through the same consumer (the reader keeps it), each with >= 9 MB after it.
        for start in (1_000, 2_000, 3_000):
            plans = tuple(PartitionPlan(topic, p, start, start + RANGE, None, "") for p in range(partitions))
            read = spec.with_batch(1, list(plans))
            before = stats.received_bytes(consumer)
            reading._CONSUMERS[key] = consumer   # noqa: SLF001 - the reader's own consumer
            batches = list(reading.read_ranges(read, [reading.RangeRead(p, p, plan) for p, plan in enumerate(plans)]))
            assert reading._CONSUMERS.get(key) is consumer   # noqa: SLF001 - kept for the next read
            received.append(stats.received_bytes(consumer) - before)
            rows = [row for batch in batches for row in batch.select(["partition", "offset"]).to_pylist()]
            assert sorted((r["partition"], r["offset"]) for r in rows) == [
                (p, o) for p in range(partitions) for o in range(start, start + RANGE)]
    finally:
        reading._CONSUMERS.pop(key, None)   # noqa: SLF001
        consumer.close()
    # With 1 MB fetches and a 1 MB prefetch queue a read receives two fetches per partition, now
    # and then three (one still in flight when the read unassigns); without the bounds it would
    # receive the whole rest of each partition. Every read counts: the bound stops the fetcher
    # however late a busy machine runs the reader again.
    assert max(received) < (3 * partitions + 1) * MB, [round(r / MB, 1) for r in received]


def test_records_larger_than_the_queue_bound_are_read_whole(bootstrap_servers, make_topic) -> None:
    """A record of 2 MB is bigger than the reader's 1 MB prefetch queue and fetch size: librdkafka
    checks the queue before a fetch and a fetch returns at least one record batch, so the range is
    read, not stalled with a full queue."""
    topic = make_topic("big", 1, **{"max.message.bytes": "8000000"})
    value = b"x" * 2_000_000
    produce(bootstrap_servers, topic, ((b"k%d" % i, value) for i in range(6)), partition=0,
            config={"message.max.bytes": 8_000_000, "linger.ms": 0})
    spec = ReadSpec(clients=KafkaClients(bootstrap_servers), app_id=f"fetches-{uuid.uuid4().hex[:6]}",
                    side_dir=f"txstream-test-{uuid.uuid4().hex[:8]}")
    plan = PartitionPlan(topic, 0, 1, 5, None, "")
    key = repr(sorted(spec.consumer_config().items()))
    try:
        batches = list(reading.read_ranges(spec.with_batch(1, [plan]), [reading.RangeRead(0, 0, plan)]))
    finally:
        cached = reading._CONSUMERS.pop(key, None)   # noqa: SLF001 - the reader's own consumer, kept
        if cached is not None:
            cached.close()
    rows = [row for batch in batches for row in batch.select(["offset", "value"]).to_pylist()]
    assert [r["offset"] for r in rows] == [1, 2, 3, 4]
    assert all(r["value"] == value for r in rows)
