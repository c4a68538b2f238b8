"""Any exception read as one of txstream's error types (txstream/errors.py), and told in a line.

Kafka's errors are classified by kafka/errors.py, a failed Spark job's by spark/remote_errors.py;
this module puts the two readers together for the driver and the commands, so that errors.py
(the taxonomy and `decide`) depends on neither.
"""
from __future__ import annotations

from txstream.errors import InfrastructureError, TxstreamError, UserError
from txstream.kafka.errors import classify_kafka, kafka_error_of
from txstream.spark.remote_errors import first_meaningful_line, from_spark


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
    """Any exception as one of txstream's error types: ours as they are, Kafka's classified, Spark's
    parsed (`from_spark`), anything else the machinery's."""
    if isinstance(exc, TxstreamError):
        return exc
    if kafka_error_of(exc) is not None:
        return classify_kafka(exc)
    spark = from_spark(exc)
    if spark is not None:
        return spark
    return InfrastructureError(f"{type(exc).__name__}: {exc}".strip())


def one_line(exc: BaseException) -> str:
    """The message a user needs from any error, on one line where it can be."""
    error = understand(exc)
    text = str(error).strip() or type(error).__name__
    return text if isinstance(error, UserError) or "\n" not in text else first_meaningful_line(text)
