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

Errors that crossed Py4J (a Spark job failed) arrive as pyspark's captured exceptions with the
Python worker's traceback as text; `from_spark` is the one parser that turns them back into the
types here, so nothing else in txstream looks at error text. The protocol behind these outcomes
is described in docs/architecture.md.
"""
from __future__ import annotations

import builtins
import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
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


class TransformError(UserError, ValueError):
    """The processor's transform does not produce what txstream can publish."""


class OutputError(UserError, ValueError):
    """The output cannot be published as the transform shaped it (a missing topic, a bad column)."""


class PoisonRecordError(UserError):
    """A record cannot be processed and there is no dead-letter topic to set it aside."""


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
# Kafka, classified once from librdkafka's own flags
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


# Transient whatever librdkafka's retriable() says: the coordinator or leader moved, is loading,
# or the request timed out while a broker restarted. Filled lazily (confluent_kafka's constants).
_TRANSIENT_CODES: set[int] = set()
_FENCED_CODES: set[int] = set()


def _codes() -> None:
    if _TRANSIENT_CODES:
        return
    from confluent_kafka import KafkaError as E

    _TRANSIENT_CODES.update({
        E.NOT_COORDINATOR, E.COORDINATOR_NOT_AVAILABLE, E.COORDINATOR_LOAD_IN_PROGRESS,
        E.UNSTABLE_OFFSET_COMMIT, E.REQUEST_TIMED_OUT, E.NOT_LEADER_FOR_PARTITION,
        E.LEADER_NOT_AVAILABLE, E.FENCED_LEADER_EPOCH, E.UNKNOWN_LEADER_EPOCH,
        E.OFFSET_NOT_AVAILABLE, E.NETWORK_EXCEPTION, E.CONCURRENT_TRANSACTIONS,
        E._TRANSPORT, E._TIMED_OUT, E._WAIT_COORD, E._ALL_BROKERS_DOWN, E._RESOLVE,
    })
    _FENCED_CODES.update({E._FENCED, E.PRODUCER_FENCED, E.INVALID_PRODUCER_EPOCH})


def kafka_error_of(exc: BaseException | None) -> Any:
    """The confluent_kafka.KafkaError inside `exc` (a KafkaException, or one of ours), else None.

    The one way to pull a KafkaError out of an exception."""
    if exc is None:
        return None
    if isinstance(exc, KafkaFailure):
        return exc.kafka_error
    from confluent_kafka import KafkaError, KafkaException

    if isinstance(exc, KafkaError):
        return exc
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


def classify_kafka(err: Any, operation: str = "") -> KafkaFailure:
    """A KafkaError (or KafkaException) as one of the Kafka outcome types, by librdkafka's flags."""
    _codes()
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
    if code in _unreachable_codes():
        return KafkaUnreachable(text, err)
    if err.retriable() or code in _TRANSIENT_CODES:
        return TransientKafkaError(text, err)
    return KafkaFailure(text, err)


def _unreachable_codes() -> tuple[int, ...]:
    """No connection to any broker at all: refused, unresolvable, or every broker down."""
    from confluent_kafka import KafkaError

    return (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._RESOLVE)


def is_transient(exc: BaseException) -> bool:
    """True when a retry of the same call may succeed (a transient Kafka error)."""
    if isinstance(exc, TransientKafkaError):
        return True
    err = kafka_error_of(exc)
    return err is not None and isinstance(classify_kafka(err), TransientKafkaError)


# ---------------------------------------------------------------------------------------------
# Retry: the machinery failed, not the data
# ---------------------------------------------------------------------------------------------

class InfrastructureError(TxstreamError):
    """The machinery failed (worker start-up, imports, permissions, lost executors). Retried;
    never a reason to dead-letter a record."""


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


def unexpected_cause(exc: BaseException | None) -> BaseException | None:
    """The first exception in `exc`'s cause chain that is none of the outcomes txstream knows
    (its own types, Kafka's, Spark's through Py4J): a bug, whose traceback is worth printing."""
    while exc is not None:
        if not isinstance(exc, TxstreamError) and kafka_error_of(exc) is None \
                and "py4j" not in type(exc).__module__ and "pyspark" not in type(exc).__module__:
            return exc
        exc = exc.__cause__
    return None


def understand(exc: BaseException) -> TxstreamError:
    """Any exception as one of the types above: ours as they are, Kafka's classified, Spark's
    parsed (`from_spark`), anything else the machinery's."""
    if isinstance(exc, TxstreamError):
        return exc
    if kafka_error_of(exc) is not None:
        return classify_kafka(exc)
    spark = from_spark(exc)
    if spark is not None:
        return spark
    return InfrastructureError(f"{type(exc).__name__}: {exc}".strip())


# ---------------------------------------------------------------------------------------------
# The one parser for errors that crossed Py4J
# ---------------------------------------------------------------------------------------------

# Spark's error conditions raised while computing one row (ANSI mode and SQL functions). A
# failure with one of these in its cause chain is in the data.
ROW_LEVEL_CONDITIONS = frozenset({
    "DIVIDE_BY_ZERO", "INTERVAL_DIVIDED_BY_ZERO", "ARITHMETIC_OVERFLOW", "BINARY_ARITHMETIC_OVERFLOW",
    "CAST_INVALID_INPUT", "CAST_OVERFLOW", "NUMERIC_VALUE_OUT_OF_RANGE", "INVALID_ARRAY_INDEX",
    "INVALID_ARRAY_INDEX_IN_ELEMENT_AT", "INVALID_INDEX_OF_ZERO", "INVALID_FRACTION_OF_SECOND",
    "CANNOT_PARSE_TIMESTAMP", "DATETIME_OVERFLOW", "DUPLICATED_MAP_KEY", "NULL_MAP_KEY",
    "CONVERSION_INVALID_INPUT", "INVALID_URL", "USER_RAISED_EXCEPTION", "INVALID_PARAMETER_VALUE",
    "DATETIME_FIELD_OUT_OF_BOUNDS", "INVALID_UTF8_STRING", "MALFORMED_RECORD_IN_PARSING",
})

# Python exception types that never depend on a row: the worker's environment failed (every
# OSError kind: files, sockets, processes).
_ENVIRONMENT_TYPES = frozenset({
    "ImportError", "ModuleNotFoundError", "MemoryError", "SystemExit", "KeyboardInterrupt",
    "EOFError", "pickle.UnpicklingError", "_pickle.UnpicklingError", "cloudpickle.PicklingError",
    *(name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, OSError)),
})

# Frames of these packages are the engine's, not the user's.
_ENGINE_PATH = re.compile(r"(/pyspark/|/txstream/|/py4j/|/cloudpickle/|<frozen importlib|/importlib/|"
                          r"/pyarrow/|/confluent_kafka/|/site-packages/pandas/)")
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line \d+, in (?P<func>.+)$')
_TRACEBACK = "Traceback (most recent call last):"


@dataclass
class RemoteFailure:
    """What a failed Spark job tells about its cause, read once."""

    python_type: str | None = None          # 'ValueError', 'txstream.errors.OutputError', ...
    python_message: str = ""
    frames: list[str] = field(default_factory=list)    # file paths of the Python traceback
    conditions: list[str] = field(default_factory=list)  # Spark error conditions in the chain
    summary: str = ""                       # one line for the user

    @property
    def txstream_type(self) -> type[TxstreamError] | None:
        if not self.python_type:
            return None
        module, _, name = self.python_type.rpartition(".")
        if module not in ("txstream.errors", "txstream.faults"):
            return None
        if module == "txstream.faults":
            from txstream import faults

            found = getattr(faults, name, None)
        else:
            found = globals().get(name)
        return found if isinstance(found, type) and issubclass(found, TxstreamError) else None

    @property
    def raised_in_user_code(self) -> bool:
        """The Python traceback has a frame outside the engine's packages: a UDF or the
        processor's own code computed something and raised."""
        return any(not _ENGINE_PATH.search(path) for path in self.frames)


def parse_python_traceback(text: str) -> tuple[str | None, str, list[str]]:
    """(exception type, its message, frame paths) of the last traceback in `text`."""
    start = text.rfind(_TRACEBACK)
    if start < 0:
        return None, "", []
    lines = text[start + len(_TRACEBACK):].splitlines()
    frames: list[str] = []
    i = 0
    while i < len(lines):
        match = _FRAME.match(lines[i])
        if match:
            frames.append(match.group("path"))
            i += 1
            # The frame's source line (and carets) are indented; the exception line is not.
            while i < len(lines) and lines[i].startswith((" ", "\t")) and not _FRAME.match(lines[i]):
                i += 1
            continue
        if lines[i].strip() and not lines[i].startswith((" ", "\t")):
            break
        i += 1
    rest = [line for line in lines[i:]]
    head = rest[0] if rest else ""
    exc_type, sep, message = head.partition(": ")
    exc_type = exc_type.strip()
    if not re.fullmatch(r"[A-Za-z_][\w.]*", exc_type or "-"):
        return None, head.strip(), frames
    # A multi-line message runs until the JVM's own stack lines start.
    tail = []
    for line in rest[1:]:
        if line.startswith("\tat ") or line.startswith("\tat") or not line.strip():
            break
        tail.append(line)
    full = "\n".join([message, *tail]).strip() if sep else "\n".join(tail).strip()
    return exc_type, full, frames


def _cause_chain(exc: BaseException) -> list[Any]:
    """`exc`, its causes, and the JVM exceptions behind any Py4J error among them."""
    chain: list[Any] = []
    seen: set[int] = set()
    current: Any = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append(current)
        java = getattr(current, "java_exception", None) or getattr(current, "_origin", None)
        if java is not None:
            chain.extend(_java_chain(java))
        current = getattr(current, "_cause", None) or getattr(current, "__cause__", None)
    return chain


def _java_chain(java: Any) -> list[Any]:
    out = []
    try:
        while java is not None and len(out) < 20:
            out.append(java)
            java = java.getCause()
    except Exception:
        pass
    return out


def _condition(link: Any) -> str | None:
    for getter in ("getCondition", "getErrorClass"):
        fn = getattr(link, getter, None)
        if fn is None:
            continue
        try:
            value = fn()
        except Exception:
            continue
        if value:
            return str(value)
    return None


def _is_spark_error(link: Any) -> bool:
    module = type(link).__module__ or ""
    return module.startswith(("pyspark.", "py4j."))


def _text(link: Any) -> str:
    if isinstance(link, BaseException):
        return str(link)
    try:  # a Py4J JavaObject: the exception's own message
        return str(link.getMessage() or "")
    except Exception:
        return ""


def describe_remote(exc: BaseException) -> RemoteFailure | None:
    """Read a failed Spark job's exception: the worker's Python exception, Spark's conditions.
    None when `exc` did not come from Spark or Py4J."""
    chain = _cause_chain(exc)
    if not any(_is_spark_error(e) for e in chain):
        return None
    failure = RemoteFailure()
    texts = []
    for link in chain:
        condition = _condition(link)
        if condition and condition not in failure.conditions:
            failure.conditions.append(condition)
        texts.append(_text(link))
    for text in texts:
        exc_type, message, frames = parse_python_traceback(text)
        if exc_type is not None:
            failure.python_type, failure.python_message, failure.frames = exc_type, message, frames
            break
    if failure.python_type:
        short = failure.python_type.rpartition(".")[2] if failure.txstream_type else failure.python_type
        failure.summary = f"{short}: {failure.python_message}".strip()
    else:
        # The deepest cause that says something (a lost executor, a crashed Python worker).
        said = [t for t in texts if t.strip()]
        failure.summary = _first_meaningful_line(said[-1] if said else str(exc))
    return failure


def from_spark(exc: BaseException) -> TxstreamError | None:
    """A failed Spark job's exception as a typed txstream error; None if it is not Spark's."""
    failure = describe_remote(exc)
    if failure is None:
        return None
    own = failure.txstream_type
    if own is not None:
        if issubclass(own, KafkaFailure):
            return own(failure.python_message)
        try:
            return own(failure.python_message)
        except TypeError:  # an error type with another signature: keep its meaning
            return InfrastructureError(failure.summary)
    if any(c in ROW_LEVEL_CONDITIONS for c in failure.conditions):
        return DataError(failure.summary)
    if (failure.python_type and failure.python_type not in _ENVIRONMENT_TYPES
            and failure.raised_in_user_code):
        return DataError(failure.summary)
    return InfrastructureError(failure.summary or type(exc).__name__)


def _first_meaningful_line(text: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("Traceback", "File ", "at ", "\tat ")):
            return line[:500]
    return text.strip()[:500]


def one_line(exc: BaseException) -> str:
    """The message a user needs from any error, on one line where it can be."""
    error = understand(exc)
    text = str(error).strip() or type(error).__name__
    return text if isinstance(error, UserError) or "\n" not in text else _first_meaningful_line(text)
