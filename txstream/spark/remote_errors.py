"""A failed Spark job's exception, read back into txstream's error types (txstream/errors.py).

Errors that crossed Py4J arrive as pyspark's captured exceptions with the Python worker's
traceback as text, and Spark's error conditions on the JVM exceptions behind them. `from_spark`
is the one parser that turns them back into typed errors, so nothing else in txstream looks at
error text.
"""
from __future__ import annotations

import builtins
import importlib
import re
from dataclasses import dataclass, field
from typing import Any

from txstream.errors import DataError, InfrastructureError, TxstreamError

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


def txstream_error_type(qualified: str) -> type[TxstreamError] | None:
    """The txstream error class a worker's traceback names ('txstream.errors.OutputError',
    'txstream.fault_injection.InjectedFault', ...), looked up by name so that this parser depends on no
    module that defines one; None for any other name."""
    module, _, name = qualified.rpartition(".")
    if module != "txstream" and not module.startswith("txstream."):
        return None
    try:
        found = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None
    return found if isinstance(found, type) and issubclass(found, TxstreamError) else None


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
        return txstream_error_type(self.python_type)

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
        failure.summary = first_meaningful_line(said[-1] if said else str(exc))
    return failure


def from_spark(exc: BaseException) -> TxstreamError | None:
    """A failed Spark job's exception as a typed txstream error; None if it is not Spark's."""
    failure = describe_remote(exc)
    if failure is None:
        return None
    own = failure.txstream_type
    if own is not None:
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


def first_meaningful_line(text: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("Traceback", "File ", "at ", "\tat ")):
            return line[:500]
    return text.strip()[:500]
