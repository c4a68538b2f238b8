"""Every error txstream raises, and the one place that decides what a failure means.

Kafka Streams gets by with a handful of outcome exceptions matched by type (TaskMigrated,
TaskCorrupted, Timeout, Streams); txstream does the same. Each type below is one answer to the
only question the driver asks of a failure, `decide(error)`:

- `UserError` (settings, schemas, the transform's shape, the output, a poison record without a
  dead-letter topic, a missing committed offset, ...): **stop** the run with the message, which
  says what to change. No retry can cure it.
- `DataError`: a row made the transform fail. **Isolate** the record (bisection, dead letter).
  Recognised positively: an exception raised while computing a row (a UDF, the transform, or
  one of Spark's row-level error conditions), never by the absence of something else.
- `FatalKafkaError`: librdkafka says the client can never recover. **Stop.**
- everything else -- `KafkaFailure` (transient, abortable, fenced), `InfrastructureError` (a
  Python worker that cannot start, an import that fails on an executor, a side directory that
  cannot be written, a lost executor, a batch that timed out): **retry** with back-off; after
  too many in a row the run stops naming the cause. Never a dead letter.

Reading a failure as one of these types is done beside what it reads: Kafka's errors by
librdkafka's flags (kafka/errors.py), a failed Spark job's Py4J exception by the Python traceback
it carries (spark/remote_errors.py); `failures.understand` puts the two together. The protocol
behind these outcomes is described in docs/architecture.md.
"""
from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any


class TxstreamError(Exception):
    """Base of every error txstream raises on purpose."""


# ---------------------------------------------------------------------------------------------
# Stop: the user must change something
# ---------------------------------------------------------------------------------------------

class UserError(TxstreamError):
    """Stops the run; the message says what to change. No retry can cure it."""


class SettingsError(UserError, ValueError):
    """A setting or processor reference is wrong."""


class ExecutorEnvironmentError(UserError):
    """An executor lacks what the run needs (txstream or a library at the driver's version, the
    processor's code, the driver's Kafka cluster, a writable local directory). Found by the
    preflight (driver/preflight.py) before anything is read; the message names each host and
    what differs there."""


class SchemaError(UserError, ValueError):
    """A schema or a DataFrame does not fit the Avro schema it must be encoded with."""


class SchemaRegistryRefused(UserError):
    """The schema registry refused what the run needs: an output schema its compatibility rule
    refuses, one not registered with auto-registration off, credentials it does not accept."""


class TransformError(UserError, ValueError):
    """The processor's transform does not produce what txstream can publish."""


class OutputError(UserError, ValueError):
    """The output cannot be published as the transform shaped it (a missing topic, a bad column)."""


class PoisonRecordError(UserError):
    """A record cannot be processed and there is no dead-letter topic to set it aside."""


class TableRecordError(UserError):
    """A record of a table's topic (Processor.tables) does not decode: the table would miss its
    key, and a join against it would be wrong silently."""


class TableChangedError(UserError):
    """A table's topic changed its partitions while the run reads it (docs/joins.md)."""


class NoCommittedOffsetError(UserError):
    """auto.offset.reset=none and some partitions have no committed offset (or an invalid one)."""


class OffsetsError(UserError):
    """A problem with an app's offsets the user can fix (bad input, a live group)."""


class GroupActiveError(OffsetsError):
    """The group has live members, so its offsets must not be moved."""


class AuditError(UserError):
    """`verify` cannot audit: bad arguments, an unknown topic, a cluster it cannot read."""


class TopicSetupError(UserError):
    """`txstream topics ensure` will not change an existing topic, or cannot create one."""


class BrokerError(UserError):
    """A problem starting or reaching the local broker (`txstream kafka up`)."""


def topic_missing(role: str, topic: str, where: str = "", others: Sequence[tuple[str, str]] = ()) -> str:
    """The one wording of "this topic does not exist" (and of the others missing with it): `txstream
    run` never creates topics; `txstream topics ensure` creates, on purpose, those a processor declares."""
    at = f" on {where}" if where else ""
    missing = [(role, topic), *others]
    names = ", ".join(f"{r} topic {t!r}" for r, t in missing)
    one = len(missing) == 1
    return (f"{names} {'does' if one else 'do'} not exist{at}; create {'it' if one else 'them'} first: "
            "`txstream topics ensure PROCESSOR` creates the topics a processor declares (txstream run "
            "never auto-creates topics)")


# ---------------------------------------------------------------------------------------------
# Kafka's outcomes (read from librdkafka's flags by kafka/errors.py)
# ---------------------------------------------------------------------------------------------

class KafkaFailure(TxstreamError):
    """A Kafka call failed. Retried with back-off unless a subclass says otherwise."""

    def __init__(self, message: str, kafka_error: Any = None) -> None:
        super().__init__(message)
        self.kafka_error = kafka_error   # confluent_kafka.KafkaError, when there is one

    @property
    def code(self) -> int | None:
        return self.kafka_error.code() if self.kafka_error is not None else None


class TransientKafkaError(KafkaFailure):
    """Try again: a coordinator or leader moving or loading, a broker restarting, a timeout."""


class KafkaUnreachable(TransientKafkaError):
    """No broker answered. Retried inside a run; a command says so in one line."""


class AbortableError(KafkaFailure):
    """The transaction must be aborted; its range may be published again (TaskCorrupted-like)."""


class FencedError(KafkaFailure):
    """A newer producer owns this transactional.id: this attempt is a zombie (TaskMigrated)."""


class FatalKafkaError(KafkaFailure):
    """librdkafka reports a fatal error that is not a fence: the client cannot go on."""


# ---------------------------------------------------------------------------------------------
# Retry: the machinery failed, not the data
# ---------------------------------------------------------------------------------------------

class InfrastructureError(TxstreamError):
    """The machinery failed (worker start-up, imports, permissions, lost executors). Retried;
    never a reason to dead-letter a record."""


class SchemaRegistryUnreachable(InfrastructureError):
    """The schema registry did not answer (refused, timed out, a 5xx): retried like any machinery,
    never a reason to dead-letter the record whose schema was being fetched."""


class BatchTimeout(InfrastructureError):
    """The watchdog cancelled a batch that ran past batch_timeout_s."""


class TaskError(InfrastructureError):
    """txstream's own task code (reading, publishing) failed for a reason that is not Kafka's."""


# ---------------------------------------------------------------------------------------------
# Isolate: a row made the transform fail
# ---------------------------------------------------------------------------------------------

class DataError(TxstreamError):
    """An exception raised while computing a row: the record is a candidate poison record."""


# ---------------------------------------------------------------------------------------------
# The decision
# ---------------------------------------------------------------------------------------------

class Decision(enum.Enum):
    STOP = "stop"          # the run ends with the message
    RETRY = "retry"        # re-plan and run the batch again, with back-off
    ISOLATE = "isolate"    # find the record (bisection) and dead-letter it


def decide(error: TxstreamError) -> Decision:
    """What the driver does about a failed batch, by the error's type alone."""
    if isinstance(error, (UserError, FatalKafkaError)):
        return Decision.STOP
    if isinstance(error, DataError):
        return Decision.ISOLATE
    return Decision.RETRY
