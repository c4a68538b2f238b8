"""Reading one partition of a state topic from an offset to its end: a read_committed consumer
assigned to the partition (never subscribed: no group membership, no rebalance), in large
fetches, until the consumer reports the end (under read_committed, the last stable offset)."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from txstream.errors import classify_kafka
from txstream.kafka.config import KafkaClients
from txstream.state.errors import RestoreIncomplete

_FETCH = {"isolation.level": "read_committed", "enable.auto.commit": False, "enable.partition.eof": True,
          "auto.offset.reset": "error", "fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 16 << 20,
          "queued.max.messages.kbytes": 256 << 10}
_CONSUMERS: dict[str, Any] = {}


def reader(clients: KafkaClients, app_id: str) -> Any:
    """The worker's state reader for this cluster, made once: it never joins its group."""
    config = clients.consumer(f"{app_id}.state-reader", **_FETCH)
    key = repr(sorted((k, str(v)) for k, v in config.items()))
    if key not in _CONSUMERS:
        from confluent_kafka import Consumer

        _CONSUMERS[key] = Consumer(config)
    return _CONSUMERS[key]


def bounds(consumer: Any, topic: str, partition: int, timeout: float) -> tuple[int, int]:
    """The partition's first offset and its end (high watermark)."""
    from confluent_kafka import KafkaException, TopicPartition

    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout)
    except KafkaException as exc:
        raise classify_kafka(exc, f"offsets of {topic}[{partition}]") from exc


def read_to_end(consumer: Any, topic: str, partition: int, start: int, on_records: Callable[[list], None],
                timeout: float) -> int:
    """Hand every committed record from `start` on to `on_records`, a list per fetch; returns the
    end offset reached (the next offset to read)."""
    from confluent_kafka import KafkaError, TopicPartition

    consumer.assign([TopicPartition(topic, partition, start)])
    deadline = time.monotonic() + timeout
    try:
        while True:
            messages = consumer.consume(num_messages=50_000, timeout=0.5)
            records = []
            for message in messages:
                error = message.error()
                if error is None:
                    records.append(message)
                elif error.code() == KafkaError._PARTITION_EOF:
                    if records:
                        on_records(records)
                    return message.offset()
                else:
                    raise classify_kafka(error, f"reading {topic}[{partition}]")
            if records:
                on_records(records)
                deadline = time.monotonic() + timeout
            elif time.monotonic() > deadline:
                raise RestoreIncomplete(f"{topic}[{partition}]: no record and no end within {timeout:.0f} s "
                                        f"(reading from offset {start})")
    finally:
        consumer.unassign()
