"""The Spark session's fixed costs: workers import byte-compiled pyspark, the JVM maps the class archive."""
from __future__ import annotations

import pyarrow as pa

from txstream.spark.session import class_archive


def _where_pyspark_comes_from(batches):  # a mapInArrow function
    import pyspark

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pylist([{"path": pyspark.__file__}])


def test_python_workers_import_the_installed_pyspark_not_the_zip(spark) -> None:
    """From pyspark.zip every worker compiles pyspark from source and every task re-reads the zip."""
    paths = {row.path for row in spark.range(0, 2, 1, 2).mapInArrow(_where_pyspark_comes_from, "path string").collect()}
    assert paths and all(".zip" not in p for p in paths), paths


def test_the_driver_jvm_maps_the_class_archive(spark) -> None:
    """`make install` writes the archive; every session started afterwards uses it."""
    archive = class_archive()
    assert archive.is_file(), f"no class archive at {archive}: run `python -m txstream.spark.session`"
    jvm = spark.sparkContext._jvm
    arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert f"-XX:SharedArchiveFile={archive}" in arguments, arguments


def _worker_state(batches):  # a mapInArrow function
    import sys

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pylist([{
        "jars": sum(1 for entry in sys.path if entry.endswith(".jar")),
        "preloaded": all(name in sys.modules
                         for name in ("pandas", "fastavro", "confluent_kafka", "txstream.task.publish")),
    }])


def test_python_workers_start_with_the_engine_imported_and_no_jar_on_their_path(spark) -> None:
    """Forked from txstream.spark.worker_daemon: the imports are inherited, the spark-core jar is gone
    (zipimport re-read its directory on every task's invalidate_caches)."""
    rows = spark.range(0, 2, 1, 2).mapInArrow(_worker_state, "jars long, preloaded boolean").collect()
    assert rows and all(r.jars == 0 and r.preloaded for r in rows), rows
