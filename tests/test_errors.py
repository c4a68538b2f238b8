"""The error taxonomy (txstream/errors.py) and its readers: Kafka errors classified once by
librdkafka's flags (kafka/errors.py), Python tracebacks that crossed Py4J read once
(spark/remote_errors.py), and the decision taken by type alone."""
from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from txstream import errors as E
from txstream.classify import one_line, understand, unexpected_cause
from txstream.kafka.errors import classify_kafka, kafka_error_of
from txstream.spark.remote_errors import RemoteFailure, parse_python_traceback


@pytest.mark.parametrize(("error", "expected"), [
    (KafkaError(KafkaError._FENCED, "fenced", fatal=True), E.FencedError),
    (KafkaError(KafkaError.PRODUCER_FENCED, "fenced"), E.FencedError),
    (KafkaError(KafkaError.INVALID_PRODUCER_EPOCH, "epoch"), E.FencedError),
    (KafkaError(KafkaError._INCONSISTENT, "fatal", fatal=True), E.FatalKafkaError),
    (KafkaError(KafkaError.INVALID_TXN_STATE, "abort", txn_requires_abort=True), E.AbortableError),
    (KafkaError(KafkaError.NOT_COORDINATOR, "moved"), E.TransientKafkaError),
    (KafkaError(KafkaError._TRANSPORT, "down", retriable=True), E.KafkaUnreachable),  # transient too
    (KafkaError(KafkaError._ALL_BROKERS_DOWN, "all down"), E.KafkaUnreachable),
    (KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied"), E.KafkaFailure),
])
def test_kafka_errors_are_classified_by_their_flags(error, expected) -> None:
    classified = classify_kafka(KafkaException(error), "commit_transaction")
    assert type(classified) is expected
    assert classified.kafka_error is error and classified.code == error.code()
    assert str(classified).startswith("commit_transaction: ")
    assert kafka_error_of(classified) is error


def test_decisions_are_taken_by_type() -> None:
    assert E.decide(E.OutputError("x")) is E.Decision.STOP
    assert E.decide(E.SchemaError("x")) is E.Decision.STOP
    assert E.decide(E.FatalKafkaError("x")) is E.Decision.STOP
    assert E.decide(E.DataError("x")) is E.Decision.ISOLATE
    for retried in (E.InfrastructureError("x"), E.BatchTimeout("x"), E.FencedError("x"),
                    E.AbortableError("x"), E.TransientKafkaError("x"), E.KafkaFailure("x")):
        assert E.decide(retried) is E.Decision.RETRY, retried
    from txstream.fault_injection import InjectedFault

    assert E.decide(understand(InjectedFault("x"))) is E.Decision.RETRY
    assert isinstance(understand(KeyError("k")), E.InfrastructureError)


UDF_TRACEBACK = '''An exception was thrown from the Python worker. Please see the stack trace below.
Traceback (most recent call last):
  File "/srv/app/processors/orders.py", line 12, in checked
    raise ValueError(f"cannot handle {value!r}")
ValueError: cannot handle b'x'
second line of the message

\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:624)
'''

SETUP_TRACEBACK = '''Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/pyspark/worker.py", line 1931, in main
    func, profiler, deserializer, serializer = read_udfs(pickleSer, infile, eval_type)
  File "/venv/lib/python3.11/site-packages/pyspark/serializers.py", line 483, in loads
    return cloudpickle.loads(obj, encoding=encoding)
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
ModuleNotFoundError: No module named 'orders'
'''

OWN_TRACEBACK = '''Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/txstream/task/publish.py", line 80, in publish_partition
    raise OutputError(...)
txstream.errors.OutputError: output topic 'x' does not exist
'''


def test_python_tracebacks_are_read_once() -> None:
    exc_type, message, frames = parse_python_traceback(UDF_TRACEBACK)
    assert exc_type == "ValueError"
    assert message == "cannot handle b'x'\nsecond line of the message"
    assert frames == ["/srv/app/processors/orders.py"]
    assert parse_python_traceback(SETUP_TRACEBACK)[0] == "ModuleNotFoundError"
    assert parse_python_traceback(OWN_TRACEBACK)[:2] == ("txstream.errors.OutputError",
                                                           "output topic 'x' does not exist")
    assert parse_python_traceback("no traceback here") == (None, "", [])


def test_remote_failures_name_their_kind() -> None:
    udf = RemoteFailure("ValueError", "bad", ["/srv/app/processors/orders.py"])
    setup = RemoteFailure("ModuleNotFoundError", "no module", ["/venv/site-packages/pyspark/worker.py"])
    engine = RemoteFailure("KeyError", "k", ["/venv/site-packages/txstream/task/reading.py"])
    own = RemoteFailure("txstream.errors.OutputError", "topic")
    assert udf.raised_in_user_code and not setup.raised_in_user_code and not engine.raised_in_user_code
    assert own.txstream_type is E.OutputError and udf.txstream_type is None
    from txstream.fault_injection import InjectedFault

    assert RemoteFailure("txstream.fault_injection.InjectedFault").txstream_type is InjectedFault
    assert RemoteFailure("txstream.nowhere.OutputError").txstream_type is None
    assert RemoteFailure("os.path.join").txstream_type is None


def test_one_line_keeps_a_user_errors_words() -> None:
    assert one_line(E.GroupActiveError("group g is Stable:\n  member m")) == "group g is Stable:\n  member m"
    assert one_line(E.InfrastructureError("Traceback (most recent call last):\nboom")) == "boom"


def test_an_unexpected_python_error_is_found_in_the_cause_chain() -> None:
    """`txstream run` prints the traceback of a bug (an IndexError in the driver), not only its line."""
    from confluent_kafka import KafkaError, KafkaException


    try:
        [][0]
    except IndexError as bug:
        try:
            raise E.InfrastructureError("batch 3 failed") from bug
        except E.InfrastructureError as wrapped:
            assert unexpected_cause(wrapped) is bug
    assert unexpected_cause(E.InfrastructureError("a lost executor")) is None
    assert unexpected_cause(KafkaException(KafkaError(KafkaError._TRANSPORT))) is None


def test_the_taxonomy_is_a_leaf_and_its_readers_import_no_defining_module() -> None:
    """errors.py imports nothing of txstream, so every module can import it without a cycle; the
    Py4J parser finds a type such as faults.InjectedFault by name, never by importing faults."""
    import ast
    from pathlib import Path

    import txstream

    package = Path(txstream.__file__).parent

    def imported(relative: str) -> set[str]:
        tree = ast.parse((package / relative).read_text())
        names = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        names |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        return {name for name in names if name.startswith("txstream")}

    assert imported("errors.py") == set()
    assert imported("kafka/errors.py") == {"txstream.errors"}
    assert imported("spark/remote_errors.py") == {"txstream.errors"}
