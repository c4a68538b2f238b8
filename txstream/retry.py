"""Retry Kafka calls whose errors say 'try again' (coordinator loading or moving, broker restart).

librdkafka retries most requests itself, but a committed-offsets fetch can still surface
NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS right after a broker or the offsets topic starts.
"""
from __future__ import annotations

import time
from typing import Callable, TypeVar

from confluent_kafka import KafkaException

T = TypeVar("T")


def retriable(fn: Callable[[], T], timeout: float = 60.0) -> T:
    deadline = time.monotonic() + timeout
    delay = 0.1
    while True:
        try:
            return fn()
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if not (hasattr(err, "retriable") and err.retriable()) or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
