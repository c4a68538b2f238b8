"""The preflight's comparison of an executor's answers with the driver's (driver/preflight.py);
the probe itself runs on real executors in tests/cluster."""
from __future__ import annotations

from txstream.driver.preflight import differences
from txstream.task.probe import probe

DRIVER = {"python": "3.11.7", "executable": "/venv/bin/python", "cluster_id": "abc",
          "versions": {"pyspark": "4.3.0", "pyarrow": "26.0.1", "confluent_kafka": "2.16.1", "fastavro": "1.13.1",
                       "txstream": "0.1.0"},
          "processor": None, "kafka_error": None, "local_dir": None}


def _executor(**changes) -> dict:
    answer = {**DRIVER, "versions": dict(DRIVER["versions"]), "bootstrap": "10.0.0.5:9092", **changes}
    return answer


def test_an_executor_like_the_driver_has_no_differences() -> None:
    assert differences(DRIVER, _executor(python="3.11.9")) == []   # the patch level may differ


def test_each_difference_is_named() -> None:
    executor = _executor(python="3.10.12", cluster_id="xyz", local_dir="cannot write to /data/spark: read-only")
    executor["versions"]["pyarrow"] = "14.0.2"
    executor["versions"]["txstream"] = "not importable (ModuleNotFoundError: No module named 'txstream')"
    problems = differences(DRIVER, executor)
    assert any(p.startswith("Python 3.10.12") for p in problems), problems
    assert "pyarrow 14.0.2, the driver has 26.0.1" in problems
    assert any(p.startswith("txstream is not importable") and p.endswith("the driver has 0.1.0") for p in problems)
    assert any("reaches Kafka cluster xyz at 10.0.0.5:9092" in p and "cluster abc" in p for p in problems), problems
    assert "cannot write to /data/spark: read-only" in problems


def test_an_unreachable_kafka_is_named_instead_of_a_cluster_id() -> None:
    problems = differences(DRIVER, _executor(cluster_id=None, kafka_error="KafkaException: timed out"))
    assert problems == ["cannot reach Kafka at 10.0.0.5:9092: KafkaException: timed out"]


def test_the_probe_reports_a_missing_module_instead_of_failing() -> None:
    answer = probe("no_such_processor_module_anywhere", {"bootstrap.servers": "127.0.0.1:1",
                                                         "socket.timeout.ms": 100}, timeout_s=0.5)
    assert answer["processor"].startswith("cannot import no_such_processor_module_anywhere (ModuleNotFoundError")
    assert answer["cluster_id"] is None and answer["kafka_error"]
    assert answer["local_dir"] is None and answer["versions"]["txstream"] not in (None, "")
