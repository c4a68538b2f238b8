"""Failures of the machinery are never mistaken for bad data (issue 11, item 2).

Before, any batch failure without a Kafka word in its text was treated as a poison record: the
bisection then landed on the range's first record and a *good* record was dead-lettered and its
offset committed past. Here the set-up itself is broken in three ways -- a processor module the
Python workers cannot import, a side directory that cannot be written, a Python worker killed
during every dry run -- and each run must end with an error naming the real cause, with no
record dead-lettered, nothing published and no offset committed.
"""
from __future__ import annotations

import os
import signal
import sys
import uuid
from pathlib import Path

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from tests.support.kafka import committed, produce, read_all
from txstream import Processor
from txstream.driver.loop import Driver
from txstream.errors import InfrastructureError
from txstream.settings import resolve
from txstream.task.sidefile import run_directory

POISON = b"poison-for-the-udf"


def _driver(cls, bootstrap: str, spark, **overrides) -> tuple[Driver, list[str]]:
    settings = resolve(cls, bootstrap_servers=bootstrap, master="local[2]", until_caught_up=True,
                       app_id=f"test-setup-{uuid.uuid4().hex[:8]}", max_consecutive_failures=1, **overrides)
    lines: list[str] = []
    return Driver(settings, echo=lines.append, spark=spark), lines


def _topics(make_topic, bootstrap: str, records: int = 40) -> tuple[str, str, str]:
    source, output, dead = make_topic("in", 2), make_topic("out", 2), make_topic("dlq")
    produce(bootstrap, source, [(f"k{i}".encode(), f"v{i}".encode()) for i in range(records)])
    return source, output, dead


def _nothing_happened(bootstrap: str, source: str, output: str, dead: str, app_id: str) -> None:
    assert read_all(bootstrap, dead) == [], "a record was dead-lettered because the machinery failed"
    assert read_all(bootstrap, output) == [], "something was published"
    assert set(committed(bootstrap, app_id, source, 2).values()) == {None}, "an offset was committed"


def test_a_processor_module_the_workers_cannot_import(tmp_path: Path, bootstrap_servers, make_topic, spark):
    # The module is importable on the driver (its directory is put on sys.path after Spark's
    # Python workers started) but not in the workers: the UDF travels by value, the module-level
    # function it calls by reference, so unpickling the UDF imports the module in the worker.
    name = f"setup_fault_udfs_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        "from pyspark.sql import functions as F, types as T\n"
        "from txstream import Processor\n\n"
        "def shout(value):\n"
        "    return bytes(value).upper()\n\n"
        "@F.udf(returnType=T.BinaryType())\n"
        "def upper(value):\n"
        "    return shout(value)\n\n"
        "class Upper(Processor):\n"
        "    def transform(self, batch):\n"
        "        return batch.select('key', upper(batch['value']).alias('value'), 'offset')\n")
    sys.path.insert(0, str(tmp_path))
    try:
        module = __import__(name)
        source, output, dead = _topics(make_topic, bootstrap_servers)
        driver, lines = _driver(module.Upper, bootstrap_servers, spark, inputs=[source], output=output,
                                dead_letter=dead)
        with pytest.raises(InfrastructureError) as failure:
            driver.run()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)
    message = str(failure.value)
    assert f"ModuleNotFoundError: No module named '{name}'" in message, (message, lines)
    assert "not because of the data" in message, message
    _nothing_happened(bootstrap_servers, source, output, dead, driver.settings.app_id)


class PassThrough(Processor):
    def transform(self, batch: DataFrame) -> DataFrame:
        return batch.select("key", "value", "offset")


def test_a_side_directory_that_cannot_be_written(bootstrap_servers, make_topic, spark):
    source, output, dead = _topics(make_topic, bootstrap_servers)
    driver, lines = _driver(PassThrough, bootstrap_servers, spark, inputs=[source], output=output, dead_letter=dead)
    # Where the readers write their side files (in the executor's local directory) is a regular
    # file: every reader fails to write there (as root, permission bits would not stop it; a file
    # in the way does).
    name = driver.specs.side_dir
    [where] = spark.sparkContext.range(0, 1, 1, 1).map(lambda _: str(run_directory(name))).collect()
    Path(where).write_text("in the way")
    try:
        with pytest.raises(InfrastructureError) as failure:
            driver.run()
    finally:
        Path(where).unlink(missing_ok=True)
    message = str(failure.value)
    assert "FileExistsError" in message and name in message, (message, lines)
    assert "not because of the data" in message, message
    _nothing_happened(bootstrap_servers, source, output, dead, driver.settings.app_id)


@F.udf(returnType=T.BinaryType())
def _raises_on_poison_dies_in_dry_runs(value):
    from pyspark import TaskContext

    if "dry-run" in (TaskContext.get().getLocalProperty("spark.jobGroup.id") or ""):
        os.kill(os.getpid(), signal.SIGKILL)   # the Python worker dies in every dry run
    if bytes(value) == POISON:
        raise ValueError("cannot handle the poison record")
    return bytes(value)


class RaisesOnPoison(Processor):
    def transform(self, batch: DataFrame) -> DataFrame:
        return batch.select("key", _raises_on_poison_dies_in_dry_runs(F.col("value")).alias("value"), "offset")


def test_a_worker_killed_during_every_dry_run(bootstrap_servers, make_topic, spark):
    # The batch fails because of a real poison record, so the driver starts isolating it; but
    # every dry run loses its Python worker. Bisecting on those failures would blame the first
    # record of the range (a good one): the driver must see a crashed worker, not bad data.
    source, output, dead = make_topic("in", 1), make_topic("out", 1), make_topic("dlq")
    records = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(30)]
    records.insert(17, (b"bad", POISON))
    produce(bootstrap_servers, source, records)
    driver, lines = _driver(RaisesOnPoison, bootstrap_servers, spark, inputs=[source], output=output,
                            dead_letter=dead)
    with pytest.raises(InfrastructureError) as failure:
        driver.run()
    message = str(failure.value)
    assert driver.poison.dry_runs >= 2, f"no dry run was attempted: {lines}"
    assert "Python worker exited unexpectedly" in message, (message, lines)
    assert "not because of the data" in message, message
    assert read_all(bootstrap_servers, dead) == [], "a record was dead-lettered because a worker died"
    assert read_all(bootstrap_servers, output) == [], "something was published"
    assert committed(bootstrap_servers, driver.settings.app_id, source, 1) == {0: None}
