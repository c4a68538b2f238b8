"""Retry Kafka calls whose errors say 'try again' (coordinator loading or moving, broker restart).

librdkafka retries most requests itself, but a committed-offsets fetch can still surface
NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS right after a broker or the offsets topic starts.
What counts as transient is decided in kafka/errors.py (`is_transient`), nowhere else.
"""
from __future__ import annotations

import time
from typing import Callable, TypeVar

from txstream.kafka.errors import is_transient

T = TypeVar("T")


def retriable(fn: Callable[[], T], timeout: float = 60.0) -> T:
    """Call `fn` until it returns or fails with a non-transient error, for up to `timeout` s."""
    deadline = time.monotonic() + timeout
    delay = 0.1
    while True:
        try:
            return fn()
        except Exception as exc:
            if not is_transient(exc) or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


__all__ = ["retriable", "is_transient"]
