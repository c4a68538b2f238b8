"""Retry Kafka calls whose errors say 'try again' (coordinator loading or moving, broker restart).

librdkafka retries most requests itself, but a committed-offsets fetch can still surface
NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS right after a broker or the offsets topic starts.
"""
from __future__ import annotations

import time
from typing import Callable, TypeVar

from confluent_kafka import KafkaError, KafkaException

T = TypeVar("T")

# Transient whatever librdkafka's retriable() says: the coordinator or leader moved, is
# loading, or the request timed out while a broker restarted.
TRANSIENT = {
    KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.UNSTABLE_OFFSET_COMMIT, KafkaError.REQUEST_TIMED_OUT, KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE, KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError.OFFSET_NOT_AVAILABLE, KafkaError.NETWORK_EXCEPTION,
    KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._WAIT_COORD, KafkaError._ALL_BROKERS_DOWN,
}


def is_transient(exc: BaseException) -> bool:
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    if not hasattr(err, "code"):
        return False
    return not err.fatal() and (err.retriable() or err.code() in TRANSIENT)


def retriable(fn: Callable[[], T], timeout: float = 60.0) -> T:
    deadline = time.monotonic() + timeout
    delay = 0.1
    while True:
        try:
            return fn()
        except KafkaException as exc:
            if not is_transient(exc) or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
