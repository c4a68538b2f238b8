"""The Spark session's fixed costs: workers import byte-compiled pyspark, the JVM maps the class archive."""
from __future__ import annotations

import pyarrow as pa

from tests.support.waiting import wait_until
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
    assert "-XX:TieredStopAtLevel=1" in arguments, arguments   # a local driver JVM: C1 only


def test_a_local_driver_jvm_of_two_task_threads_collects_with_the_serial_collector(spark) -> None:
    """The session the tests share is local[2]: its JVM runs the serial collector, not G1."""
    jvm = spark.sparkContext._jvm
    collectors = {bean.getName() for bean in jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()}
    assert collectors == {"Copy", "MarkSweepCompact"}, collectors   # the serial collector's young and old


def test_the_driver_jvm_loads_the_code_generator_from_an_unsigned_jar(spark) -> None:
    """pyspark ships Janino signed, and the class archive skips every class of a signed jar: the
    session's SPARK_HOME holds an unsigned copy, which is the one on the JVM's class path."""
    jvm = spark.sparkContext._jvm
    for name in ("org.codehaus.janino.ClassBodyEvaluator", "org.codehaus.commons.compiler.CompileException"):
        source = jvm.java.lang.Class.forName(name).getProtectionDomain().getCodeSource()
        assert source.getCodeSigners() is None, name
        assert "/jars/" in source.getLocation().getPath() and "spark-home-" in source.getLocation().getPath(), \
            source.getLocation().getPath()


def _jar(path, files: dict[str, bytes]) -> None:
    import zipfile

    with zipfile.ZipFile(path, "w") as jar:
        for name, data in files.items():
            jar.writestr(name, data)


def test_signed_jars_are_copied_unsigned_and_the_others_linked(tmp_path) -> None:
    import os
    import zipfile

    from txstream.spark.session import _unsigned_jars

    source, jars = tmp_path / "package-jars", tmp_path / "home" / "jars"
    source.mkdir()
    (tmp_path / "home").mkdir()
    manifest = b"Manifest-Version: 1.0\r\nBundle-Name: janino\r\n \tcontinued\r\n\r\nName: a/B.class\r\nSHA-256-Digest: xyz\r\n\r\n"
    _jar(source / "signed.jar", {"META-INF/MANIFEST.MF": manifest, "META-INF/CODESIGN.SF": b"sig",
                                 "META-INF/CODESIGN.RSA": b"block", "a/B.class": b"\xca\xfe"})
    _jar(source / "plain.jar", {"META-INF/MANIFEST.MF": b"Manifest-Version: 1.0\r\n", "c/D.class": b"\xca\xfe"})
    _unsigned_jars(source, jars)
    assert os.readlink(jars / "plain.jar") == str(source / "plain.jar")
    assert not (jars / "signed.jar").is_symlink()
    with zipfile.ZipFile(jars / "signed.jar") as copy:
        assert sorted(copy.namelist()) == ["META-INF/MANIFEST.MF", "a/B.class"]
        assert copy.read("a/B.class") == b"\xca\xfe"
        assert copy.read("META-INF/MANIFEST.MF") == b"Manifest-Version: 1.0\r\nBundle-Name: janino\r\n \tcontinued\r\n"
    written = (jars / "signed.jar").stat().st_mtime_ns
    assert written == (source / "signed.jar").stat().st_mtime_ns   # a copy made again is the same file
    _unsigned_jars(source, jars)   # again: nothing rewritten (the class archive checks the jar's time and size)
    assert (jars / "signed.jar").stat().st_mtime_ns == written
    assert sorted(p.name for p in jars.iterdir()) == ["plain.jar", "signed.jar"]   # no partial file left


def test_homes_and_archives_of_removed_installations_are_removed(tmp_path, monkeypatch) -> None:
    """Each virtual environment gets its own home and ~160 MB archive; a gone one's are removed
    (python -m txstream.spark.session, which make install runs), a live one's kept."""
    from txstream.spark.session import class_archive, remove_abandoned

    monkeypatch.setenv("TXSTREAM_CACHE_DIR", str(tmp_path / "cache"))
    cache, package = tmp_path / "cache", tmp_path / "live-pyspark"
    (package / "bin").mkdir(parents=True)
    homes = {name: cache / f"spark-home-4.3.0-u-{name}" for name in ("live", "gone")}
    for name, home in homes.items():
        home.mkdir(parents=True)
        (home / "bin").symlink_to(package / "bin" if name == "live" else tmp_path / "deleted-venv" / "bin")
        (home / "jars").mkdir()
    recorded = {}
    for name, home in homes.items():
        recorded[name] = cache / f"spark-classes-4.3.0-{name}0000000.jsa"
        recorded[name].write_bytes(b"archive")
        recorded[name].with_suffix(".home").write_text(str(home))
    unrecorded = class_archive(str(homes["gone"]))   # written before archives named their home
    unrecorded.write_bytes(b"archive")
    elsewhere = cache / "spark-classes-4.3.0-user00000.jsa"   # the user's own SPARK_HOME, deleted
    elsewhere.write_bytes(b"archive")
    elsewhere.with_suffix(".home").write_text(str(tmp_path / "users-spark"))

    removed = remove_abandoned(echo=lambda _line: None)

    assert set(removed) == {homes["gone"], recorded["gone"], unrecorded, elsewhere}, removed
    assert homes["live"].is_dir() and recorded["live"].is_file() and recorded["live"].with_suffix(".home").is_file()
    assert not homes["gone"].exists() and not recorded["gone"].with_suffix(".home").exists()
    assert remove_abandoned(echo=lambda _line: None) == []


def test_the_local_executor_reads_arrow_without_per_access_checks(spark) -> None:
    """spark/setup.py ARROW_JAVA_OPTIONS, read by Arrow's own classes (not only set as properties)."""
    jvm = spark.sparkContext._jvm
    assert jvm.java.lang.System.getProperty("arrow.enable_unsafe_memory_access") == "true"
    assert jvm.org.apache.arrow.memory.BoundsChecking.BOUNDS_CHECKING_ENABLED is False
    assert jvm.org.apache.arrow.vector.NullCheckingForGet.NULL_CHECKING_ENABLED is False
    # Nulls still arrive as nulls through the Python hops (Spark asks isNullAt before a get).
    rows = spark.range(0, 4, 1, 2).selectExpr("id", "IF(id % 2 = 0, NULL, CAST(id AS STRING)) AS s") \
        .mapInArrow(_same, "id long, s string").collect()
    assert sorted((r.id, r.s) for r in rows) == [(0, None), (1, "1"), (2, None), (3, "3")]


def _same(batches):  # a mapInArrow function
    yield from batches


def test_a_local_driver_jvm_compiles_with_c1_only_unless_the_user_names_a_tier(tmp_path) -> None:
    from txstream.spark.session import _java_options

    home = str(tmp_path)
    assert "-XX:TieredStopAtLevel=1" in _java_options({}, home).split()
    mine = _java_options({"spark.driver.extraJavaOptions": "-Xmx2g -XX:TieredStopAtLevel=4"}, home)
    assert "-XX:TieredStopAtLevel=4" in mine and "TieredStopAtLevel=1" not in mine, mine
    assert "TieredStopAtLevel" not in _java_options({"spark.driver.extraJavaOptions": "-XX:-TieredCompilation"}, home)


def test_a_local_driver_jvm_collects_serially_up_to_two_task_threads_unless_a_gc_is_named(tmp_path, monkeypatch) -> None:
    from txstream.spark.session import _java_options

    home = str(tmp_path)
    for variable in ("JDK_JAVA_OPTIONS", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS"):
        monkeypatch.delenv(variable, raising=False)
    assert "-XX:+UseSerialGC" in _java_options({}, home, 1).split()
    assert "-XX:+UseSerialGC" in _java_options({}, home, 2).split()
    assert "GC" not in _java_options({}, home, 3)                # more task threads: the JVM's choice (G1)
    assert "GC" not in _java_options({}, home, None)             # the tasks run in executors elsewhere
    mine = _java_options({"spark.driver.extraJavaOptions": "-Xmx2g -XX:+UseParallelGC"}, home, 2)
    assert "-XX:+UseParallelGC" in mine and "SerialGC" not in mine, mine
    assert "SerialGC" not in _java_options({"spark.driver.extraJavaOptions": "-XX:-UseG1GC"}, home, 2)
    # A collector named where the JVM also reads options: a second one would stop the JVM.
    monkeypatch.setenv("JDK_JAVA_OPTIONS", "-XX:+UseZGC")
    assert "SerialGC" not in _java_options({}, home, 2)


def test_the_task_threads_of_a_local_master(monkeypatch) -> None:
    import os

    from txstream.spark.setup import local_task_threads

    assert local_task_threads("local") == 1
    assert local_task_threads("local[2]") == 2
    assert local_task_threads("local[2,2]") == 2
    assert local_task_threads("local[16]") == 16
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1, 2}, raising=False)
    assert local_task_threads("local[*]") == 3
    assert local_task_threads("local[*,2]") == 3
    assert local_task_threads("local-cluster[2,1,1024]") is None
    assert local_task_threads("spark://host:7077") is None
    assert local_task_threads("") is None


def test_arrow_checks_stay_on_where_the_user_asks(tmp_path) -> None:
    from txstream.spark.session import _java_options
    from txstream.spark.setup import ARROW_JAVA_OPTIONS

    assert ARROW_JAVA_OPTIONS in _java_options({}, str(tmp_path))
    mine = _java_options({"spark.driver.extraJavaOptions": "-Darrow.enable_unsafe_memory_access=false"}, str(tmp_path))
    assert "unsafe_memory_access=true" not in mine and "null_check_for_get" not in mine, mine


def _worker_state(batches):  # a mapInArrow function
    import gc
    import sys

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pylist([{
        "jars": sum(1 for entry in sys.path if entry.endswith(".jar")),
        "preloaded": all(name in sys.modules
                         for name in ("pandas", "fastavro", "confluent_kafka", "txstream.task.publish")),
        "frozen": gc.get_freeze_count(),
    }])


def test_python_workers_start_with_the_engine_imported_and_no_jar_on_their_path(spark) -> None:
    """Forked from txstream.spark.worker_daemon: the imports are inherited, the spark-core jar is gone
    (zipimport re-read its directory on every task's invalidate_caches), and the inherited heap is
    frozen (the collection Spark runs after each task skips it: task/worker_heap.py)."""
    rows = spark.range(0, 2, 1, 2).mapInArrow(_worker_state, "jars long, preloaded boolean, frozen long").collect()
    assert rows and all(r.jars == 0 and r.preloaded for r in rows), rows
    assert all(r.frozen > 50_000 for r in rows), rows   # the imports: ~80,000 objects
    assert spark.conf.get("spark.python.unix.domain.socket.enabled") == "true"


def _daemon(batches):  # a mapInArrow function
    import os

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pylist([{"daemon": os.getppid()}])


def test_the_warm_up_starts_the_daemon_the_batches_workers_come_from(spark) -> None:
    """warm_python_workers is an RDD job; its workers are only worth starting if Spark hands the
    batches' mapInArrow tasks to the same daemon (it keeps one per Python function environment).
    Whichever of the two ran first in this session, a second daemon would show here."""
    from txstream.spark.session import warm_python_workers

    warmed = warm_python_workers(spark)
    assert warmed, "the warm-up ran no Python worker"
    batches = {r.daemon for r in spark.range(0, 4, 1, 2).mapInArrow(_daemon, "daemon long").collect()}
    assert batches == warmed, (batches, warmed)
    assert "SPARK_SIMPLIFIED_TRACEBACK" not in spark.sparkContext.environment   # left as it was


def test_the_spark_ui_is_off_locally_on_for_a_cluster_and_where_asked() -> None:
    from txstream.spark.session import ui_settings

    assert ui_settings("local[2]", None) == {"spark.ui.enabled": "false"}
    assert ui_settings("spark://master:7077", None) == {"spark.ui.enabled": "true"}
    assert ui_settings("local[2]", 4141) == {"spark.ui.enabled": "true", "spark.ui.port": "4141"}


def test_txstream_run_serves_the_spark_ui_on_the_port_asked(bootstrap_servers, make_topic) -> None:
    import json
    import os
    import signal
    import socket
    import subprocess
    import sys
    import urllib.request
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    source, sink = make_topic("in"), make_topic("out")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    app_id = f"ui-{source[-8:]}"
    run = subprocess.Popen(
        [sys.executable, "-m", "txstream.cli", "run", "processors.passthrough:PassThrough", "--bootstrap-servers",
         bootstrap_servers, "--input", source, "--output", sink, "--app-id", app_id, "--master", "local[1]",
         "--spark-ui-port", str(port)],
        cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)}, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        def applications():
            if run.poll() is not None:
                return f"exit {run.poll()}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/applications", timeout=2) as answer:
                    return json.load(answer)
            except (OSError, ValueError):
                return None   # the UI (or its REST API) is not up yet

        apps = wait_until(applications, 180, f"the Spark UI on port {port}", every=0.5)
        assert isinstance(apps, list), f"no Spark UI on port {port} ({apps})"
        assert [a["name"] for a in apps] == [app_id], apps
    finally:
        os.killpg(run.pid, signal.SIGTERM)
        try:
            run.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(30)


SPARK_NOISE = ("log4j", "WARN ", "incubator", "NativeCodeLoader", "loopback address")


def _run_passthrough(bootstrap: str, source: str, sink: str, *extra: str):  # noqa: ANN202
    import os
    import subprocess
    import sys
    import uuid
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    return subprocess.run(
        [sys.executable, "-m", "txstream.cli", "run", "processors.passthrough:PassThrough", "-b", bootstrap,
         "--input", source, "--output", sink, "--app-id", f"logs-{uuid.uuid4().hex[:8]}", "--master", "local[1]",
         "--until-caught-up", *extra],
        cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)}, capture_output=True, text=True, timeout=600)


def test_spark_output_goes_to_the_runs_log_file_unless_asked(bootstrap_servers, make_topic) -> None:
    """By default Spark's banner and WARN lines are in the run's spark.log, named when Spark starts, and not on the terminal; with --log-format json stdout carries JSON objects only;
    --spark-logs shows Spark's lines again."""
    import json
    import re
    from pathlib import Path

    from tests.support.kafka import produce

    source = make_topic("in")
    produce(bootstrap_servers, source, [(None, b"x")] * 10)

    human = _run_passthrough(bootstrap_servers, source, make_topic("out"))
    assert human.returncode == 0, human.stderr
    assert not [line for line in human.stderr.splitlines() if any(n in line for n in SPARK_NOISE)], human.stderr
    named = re.search(r"^Spark's own log lines: (\S+) \(--spark-logs", human.stderr, re.MULTILINE)
    assert named, human.stderr
    assert "Using Spark's default log4j profile" in Path(named.group(1)).read_text()

    as_json = _run_passthrough(bootstrap_servers, source, make_topic("out"), "--log-format", "json")
    assert as_json.returncode == 0, as_json.stderr
    lines = as_json.stdout.splitlines()
    assert lines and all(line.startswith("{") for line in lines), as_json.stdout
    events = [json.loads(line) for line in lines]
    log_file = next(re.match(r"Spark's own log lines: (\S+)", e["message"]).group(1) for e in events
                    if e.get("message", "").startswith("Spark's own log lines"))
    assert "log4j" in Path(log_file).read_text() and as_json.stderr == "", as_json.stderr

    shown = _run_passthrough(bootstrap_servers, source, make_topic("out"), "--spark-logs")
    assert shown.returncode == 0, shown.stderr
    assert "Using Spark's default log4j profile" in shown.stderr and "Spark's own log lines" not in shown.stderr


def _has_registry_client(batches):  # a mapInArrow function
    import sys

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pylist([{"loaded": "confluent_kafka.schema_registry" in sys.modules}])


def test_a_registry_runs_workers_start_with_its_client_imported(spark) -> None:
    """build_spark(worker_imports=...) names modules in the executor environment; Spark starts a
    daemon per environment, and that daemon imports them before forking (0.2 s of CPU per worker
    otherwise). A run without a registry does not pay for the import."""
    from txstream.serde.registry import CLIENT_MODULES
    from txstream.spark.setup import WORKER_IMPORTS

    def loaded() -> set[bool]:
        return {r.loaded for r in spark.range(0, 2, 1, 2).mapInArrow(_has_registry_client, "loaded boolean").collect()}

    environment = spark.sparkContext.environment
    assert WORKER_IMPORTS not in environment
    assert loaded() == {False}
    environment[WORKER_IMPORTS] = ",".join(CLIENT_MODULES)
    try:
        assert loaded() == {True}
    finally:
        del environment[WORKER_IMPORTS]
