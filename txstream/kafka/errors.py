"""Kafka's errors as txstream's outcome types (txstream/errors.py), read from librdkafka's flags.

`classify_kafka` is the one place that looks at a KafkaError's code and flags (fatal, abortable,
retriable); everything else asks it, or `is_transient`, and matches the result by type.
"""
from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException

from txstream.errors import (
    AbortableError,
    FatalKafkaError,
    FencedError,
    KafkaFailure,
    KafkaUnreachable,
    TransientKafkaError,
)

# Transient whatever librdkafka's retriable() says: the coordinator or leader moved, is loading,
# or the request timed out while a broker restarted.
_TRANSIENT_CODES = frozenset({
    KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.UNSTABLE_OFFSET_COMMIT, KafkaError.REQUEST_TIMED_OUT, KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE, KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError.OFFSET_NOT_AVAILABLE, KafkaError.NETWORK_EXCEPTION, KafkaError.CONCURRENT_TRANSACTIONS,
    KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._WAIT_COORD, KafkaError._ALL_BROKERS_DOWN,
    KafkaError._RESOLVE,
})
_FENCED_CODES = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})
# No connection to any broker at all: refused, unresolvable, or every broker down.
_UNREACHABLE_CODES = frozenset({KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._RESOLVE})


def kafka_error_of(exc: BaseException | None) -> KafkaError | None:
    """The confluent_kafka.KafkaError inside `exc` (a KafkaException, or one of ours), else None.

    The one way to pull a KafkaError out of an exception."""
    if exc is None:
        return None
    if isinstance(exc, KafkaFailure):
        return exc.kafka_error
    if isinstance(exc, KafkaError):
        return exc
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


def classify_kafka(err: Any, operation: str = "") -> KafkaFailure:
    """A KafkaError (or KafkaException) as one of the Kafka outcome types, by librdkafka's flags."""
    err = kafka_error_of(err) if isinstance(err, BaseException) else err
    prefix = f"{operation}: " if operation else ""
    if err is None:
        return KafkaFailure(f"{prefix}unknown Kafka error")
    text = f"{prefix}{err.str() or err.name()}"
    code = err.code()
    if code in _FENCED_CODES:
        return FencedError(text, err)
    if err.fatal():
        return FatalKafkaError(text, err)
    if err.txn_requires_abort():
        return AbortableError(text, err)
    if code in _UNREACHABLE_CODES:
        return KafkaUnreachable(text, err)
    if err.retriable() or code in _TRANSIENT_CODES:
        return TransientKafkaError(text, err)
    return KafkaFailure(text, err)


def is_transient(exc: BaseException) -> bool:
    """True when a retry of the same call may succeed (a transient Kafka error)."""
    if isinstance(exc, TransientKafkaError):
        return True
    err = kafka_error_of(exc)
    return err is not None and isinstance(classify_kafka(err), TransientKafkaError)
