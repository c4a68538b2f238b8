"""The Spark session txstream runs in: configured once, with Python workers that start fast.

Why a module of its own: how the JVM and its Python workers are launched decides a large part
of txstream's fixed costs (session start-up, worker start, every task's set-up), and none of it
is about Kafka.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

from txstream.local.paths import cache_dir
from txstream.spark.setup import (
    WORKER_IMPORTS,
    SparkSetup,
    is_local,
    local_task_threads,
    resolve,
    ui_settings,
    under_spark_submit,
    with_arrow_options,
)

log = logging.getLogger("txstream")


def spark_home() -> str:
    """A SPARK_HOME for the pip-installed pyspark without its `python/lib` zips, and with its
    signed jars unsigned.

    Spark puts `$SPARK_HOME/python/lib/pyspark.zip` (sources, no bytecode) first on every Python
    worker's path. Workers then compile pyspark from source on each start, and every task's
    `importlib.invalidate_caches()` re-reads the zip's directory, a large share of the workers'
    CPU. This directory links everything of the pyspark package except `python/`, so the zips
    Spark names do not exist and workers import the installed, byte-compiled pyspark instead (the
    same files, the same version).

    `jars/` links every jar but the signed ones (`_unsigned_jars`).
    """
    import pyspark

    package = Path(pyspark.__file__).parent
    version = getattr(pyspark, "__version__", "unknown")
    # One per installed package: links to another virtual environment's pyspark must never be
    # re-pointed under a running JVM (or left dangling when that environment is deleted). The
    # layout's own version (`-u`: unsigned jars) keeps it apart from homes earlier txstream
    # versions made, whose runs may still use them.
    home = cache_dir() / f"spark-home-{version}-u-{hashlib.sha1(str(package).encode()).hexdigest()[:8]}"
    try:
        home.mkdir(parents=True, exist_ok=True)
        for entry in package.iterdir():
            if entry.name in ("python", "__pycache__"):
                continue
            if entry.name == "jars" and entry.is_dir():
                _unsigned_jars(entry, home / "jars")
                continue
            _link(home / entry.name, entry)
    except OSError as exc:  # read-only home, no symlinks: the package itself still works
        log.debug("using the pyspark package as SPARK_HOME: %s", exc)
        return str(package)
    return str(home)


def _link(link: Path, target: Path) -> None:
    if link.is_symlink() and os.readlink(link) == str(target):
        return
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)


_SIGNATURE_FILES = re.compile(r"META-INF/[^/]+\.(SF|RSA|DSA|EC)$", re.IGNORECASE)


def _unsigned_jars(source: Path, jars: Path) -> None:
    """`jars`: a link to each of pyspark's jars, except a signed jar, which is copied without its
    signature files (the same classes and resources).

    The JVM's class-data-sharing archive skips every class of a signed jar ("Skipping ...: Signed
    JAR"): pyspark 4.3 ships Janino and its commons-compiler signed, Spark's code generator, so
    the ~370 classes the first generated projection needs were loaded from the jar, and its
    entries' digests checked, while the first batch ran. A copy is written once, beside and then
    renamed over its name, so a JVM that is starting reads either nothing there or a whole jar.
    (Removing the signature changes nothing a run relies on: the JVM only checks a signed jar's
    digests against itself, and Spark never asks for code signers.)"""
    jars.mkdir(exist_ok=True)
    for jar in source.iterdir():
        target = jars / jar.name
        if target.is_symlink() and os.readlink(target) == str(jar):
            continue   # linked before (checking for a signature opens the jar)
        if target.is_file() and not target.is_symlink():
            continue   # the unsigned copy, written before
        if jar.suffix == ".jar" and _signed(jar):
            partial = jars / f".{jar.name}.{os.getpid()}.partial"
            with zipfile.ZipFile(jar) as signed, zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as unsigned:
                for item in signed.infolist():
                    if _SIGNATURE_FILES.match(item.filename):
                        continue
                    data = signed.read(item.filename)
                    if item.filename.upper() == "META-INF/MANIFEST.MF":
                        data = _main_section(data)   # not each entry's digest
                    unsigned.writestr(item, data)
            # The source jar's time: a copy written again (two first runs at once) is the same
            # file to the class archive, which checks each jar's size and time.
            source_time = jar.stat().st_mtime_ns
            os.utime(partial, ns=(source_time, source_time))
            os.replace(partial, target)
        else:
            _link(target, jar)


def _main_section(manifest: bytes) -> bytes:
    """A manifest's main attributes: everything before its first empty line."""
    lines = manifest.replace(b"\r\n", b"\n").split(b"\n")
    main = lines[:lines.index(b"")] if b"" in lines else lines
    return b"\r\n".join(main) + b"\r\n"


def _signed(jar: Path) -> bool:
    try:
        with zipfile.ZipFile(jar) as archive:
            return any(_SIGNATURE_FILES.match(name) for name in archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def class_archive(home: str | None = None) -> Path:
    """Where the JVM's class-data-sharing archive for this pyspark, this Java and this SPARK_HOME
    (default: the one the session uses) lives."""
    import pyspark

    home = home or _session_home()
    java = os.environ.get("JAVA_HOME", "") or shutil.which("java") or "java"
    tag = hashlib.sha1(f"{pyspark.__version__}|{os.path.realpath(java)}|{home}".encode()).hexdigest()[:10]
    return cache_dir() / f"spark-classes-{pyspark.__version__}-{tag}.jsa"


def _session_home() -> str:
    """The SPARK_HOME a local session runs with: the user's, else txstream's (spark_home)."""
    return os.environ.get("SPARK_HOME") or spark_home()


SERIAL_GC_MAX_TASK_THREADS = 2
# Where else a JVM takes options from: two collectors named is an error that stops the JVM.
_JAVA_OPTION_VARIABLES = ("JDK_JAVA_OPTIONS", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS")


def _java_options(spark_conf: dict[str, str], home: str, task_threads: int | None = None) -> str:
    """The driver JVM's options: the user's, plus the class archive when there is one, plus the
    JIT's first tier only (`-XX:TieredStopAtLevel=1`) unless the user's options name a tier, plus
    the serial collector when the JVM runs at most SERIAL_GC_MAX_TASK_THREADS task threads
    (`task_threads`, spark/setup.py local_task_threads) unless a GC is named, plus Arrow without
    its per-access checks (spark/setup.py ARROW_JAVA_OPTIONS).

    Loading Spark's classes is most of a session's start-up. `python -m txstream.spark.session`
    writes the archive (`make install` runs it); without one, Spark starts as usual.

    The optimising compiler (C2) spends whole cores for the first tens of seconds of a JVM, which
    a local run's Python workers need: the JVM's part of a local batch is Arrow copies and
    generated projections, where C1's code does about as well.

    The JVM picks G1 on any machine of 2 cores or more, and G1's concurrent threads and write
    barriers take CPU from the Python workers too. The local JVM's live heap is small (the records
    are in Arrow's off-heap buffers), so one collector thread keeps up with two task threads. More task threads allocate faster and a serial pause stops
    them all: there G1 stays."""
    options = spark_conf.get("spark.driver.extraJavaOptions", "")
    archive = class_archive(home)
    if os.environ.get("TXSTREAM_CLASS_ARCHIVE", "1") != "0" and archive.is_file() and "SharedArchiveFile" not in options \
            and "ArchiveClassesAtExit" not in options:
        # -Xshare:auto: an archive that does not match (another classpath) is ignored, not fatal;
        # -Xlog:cds=off keeps the JVM from printing why.
        options = f"{options} -XX:SharedArchiveFile={archive} -Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off".strip()
    if "Tiered" not in options:   # -XX:TieredStopAtLevel=N or -XX:-TieredCompilation: the user's choice
        options = f"{options} -XX:TieredStopAtLevel=1".strip()
    if task_threads is not None and task_threads <= SERIAL_GC_MAX_TASK_THREADS and not _names_a_gc(options):
        options = f"{options} -XX:+UseSerialGC".strip()
    return with_arrow_options(options)


def _names_a_gc(options: str) -> bool:
    """The options, or the JVM's option variables, choose a collector (-XX:+UseG1GC, ...)."""
    everywhere = " ".join([options, *(os.environ.get(name, "") for name in _JAVA_OPTION_VARIABLES)])
    return re.search(r"-XX:[+-]Use\w*GC\b", everywhere) is not None


def _local_environment(setup: SparkSetup) -> None:
    """Local masters only (spark/setup.py): Python workers on this interpreter (unless the user
    chose one), with the current directory importable, from a SPARK_HOME without pyspark's zips;
    the driver JVM maps the class archive."""
    if "SPARK_HOME" not in os.environ:
        os.environ["SPARK_HOME"] = spark_home()
    if "PYSPARK_PYTHON" not in os.environ and "spark.pyspark.python" not in setup.user_conf:
        os.environ["PYSPARK_PYTHON"] = sys.executable
    if "PYSPARK_DRIVER_PYTHON" not in os.environ and "spark.pyspark.driver.python" not in setup.user_conf:
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    paths = [os.getcwd(), *[p for p in sys.path if p and os.path.isdir(p) and p.startswith(os.getcwd())]]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths + os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    java_options = _java_options(setup.user_conf | setup.to_set, os.environ["SPARK_HOME"],
                                 local_task_threads(setup.master or ""))
    if java_options:
        setup.to_set["spark.driver.extraJavaOptions"] = java_options


def _submitted_conf() -> dict[str, str] | None:
    """Under spark-submit: the settings its JVM was started with (--master, --conf, defaults)."""
    if not under_spark_submit():
        return None
    from pyspark import SparkConf, SparkContext

    # Connects to spark-submit's JVM (no session yet); pyspark has no public call for this.
    SparkContext._ensure_initialized()  # noqa: SLF001
    return dict(SparkConf().getAll())


# Where the driver JVM's own output goes (Spark's banner, log4j lines, stack traces of a failed
# job, its Python workers' stderr): None, this process's stdout and stderr; else a file path.
_JVM_OUTPUT: dict[str, str | None] = {"path": None}


def send_jvm_output_to(path: str | os.PathLike | None) -> None:
    """Spark's own output to `path` (appended) from the next JVM this process launches; None: to
    this process's stdout and stderr. `txstream run` sends it to a file unless --spark-logs."""
    _JVM_OUTPUT["path"] = None if path is None else str(path)


def jvm_output() -> str | None:
    return _JVM_OUTPUT["path"]


def _launch_jvm(app_name: str, master: str | None, settings: dict[str, str]) -> None:
    """Start the driver JVM as pyspark would (spark-submit with the same settings), with its
    output where `send_jvm_output_to` says: pyspark's session builder has no way to ask for that
    (`launch_gateway` takes Popen's arguments, the builder does not pass any). Nothing is launched
    when a JVM already exists (spark-submit's, or a session's before).

    The JVM stays in the driver's process group, so a kill -9 of the group still ends driver, JVM
    and workers together; pyspark starts it ignoring SIGINT and txstream makes it ignore SIGTERM
    too (a `kill -TERM -PGID`, systemd's stop, would end it under the batch the driver is
    finishing); it exits when the driver does (its stdin closes). Spark's Python daemon puts itself
    and its workers in a group of their own, so a group's signal reaches the driver only."""
    from pyspark import SparkConf, SparkContext, java_gateway

    if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:  # noqa: SLF001
        return
    path = jvm_output()
    if path is None:
        return   # pyspark's own launch, output inherited
    conf = SparkConf(loadDefaults=False)
    conf.set("spark.app.name", app_name)
    if master is not None:
        conf.set("spark.master", master)
    for key, value in settings.items():
        conf.set(key, value)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    popen = java_gateway.Popen

    def ignoring_sigterm(command, **kwargs):  # noqa: ANN001, ANN003, ANN202
        # launch_gateway sets its own preexec_fn (SIGINT ignored); SIGTERM is added to it. An
        # ignored signal stays ignored across exec, and the JVM then installs no handler for it.
        first = kwargs.get("preexec_fn")

        def preexec() -> None:
            if first is not None:
                first()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)

        return popen(command, **{**kwargs, "preexec_fn": preexec})

    java_gateway.Popen = ignoring_sigterm
    try:
        with open(path, "ab") as output:   # the JVM keeps its own descriptor
            gateway = java_gateway.launch_gateway(conf, popen_kwargs={"stdout": output, "stderr": subprocess.STDOUT})
    finally:
        java_gateway.Popen = popen
    SparkContext._ensure_initialized(gateway=gateway)  # noqa: SLF001


def build_spark(master: str | None = None, app_name: str = "txstream", spark_conf: dict[str, str] | None = None,
                ui_port: int | None = None, cores_hint: int | None = None, echo=None,
                worker_imports: tuple[str, ...] = ()):
    """The run's Spark session: the user's master and settings first (spark/setup.py).

    `worker_imports`: modules the local worker daemon imports before it forks workers, beside the
    engine's own (spark/worker_daemon.py), for what only some runs load (a registry client)."""
    import signal
    import threading

    from pyspark.sql import SparkSession

    setup = resolve(master, dict(spark_conf or {}), _submitted_conf(), ui_port=ui_port, cores_hint=cores_hint)
    if setup.user_conf.get("spark.pyspark.python"):
        # Spark's precedence (the setting over PYSPARK_PYTHON); pyspark itself only reads the
        # variable when a Python process starts the JVM, so the setting would be ignored.
        os.environ["PYSPARK_PYTHON"] = setup.user_conf["spark.pyspark.python"]
    if setup.local:
        _local_environment(setup)
        if worker_imports:
            setup.to_set[f"spark.executorEnv.{WORKER_IMPORTS}"] = ",".join(worker_imports)
    if echo is not None:
        echo(setup.describe())
        if jvm_output() is not None and not under_spark_submit():
            echo(f"Spark's own log lines: {jvm_output()} (--spark-logs shows them here)")
    builder = SparkSession.builder.appName(app_name)
    if setup.master is not None:
        builder = builder.master(setup.master)
    for key, value in setup.to_set.items():
        builder = builder.config(key, value)
    _launch_jvm(app_name, setup.master, setup.to_set)
    main_thread = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGINT) if main_thread else None
    spark = builder.getOrCreate()
    if main_thread and handler not in (signal.default_int_handler, None):
        # SparkContext replaces the SIGINT handler with its own (cancel every job, raise
        # KeyboardInterrupt): a handler the caller installed (the run's stop) is put back.
        signal.signal(signal.SIGINT, handler)
    spark.sparkContext.setLogLevel(os.environ.get("TXSTREAM_SPARK_LOG_LEVEL", "ERROR"))
    return spark


def stop_spark(spark, timeout: float = 30.0) -> None:
    """Stop the session and, when this process launched the JVM (a local run, not spark-submit),
    end the JVM with it.

    PySpark leaves the JVM to notice that its stdin closed when Python exits; it then runs its
    shutdown for seconds after the driver is gone, reparented, taking CPU from whatever runs next."""
    from pyspark import SparkContext

    spark.stop()
    gateway = SparkContext._gateway  # noqa: SLF001 - PySpark keeps the launched JVM only there
    proc = getattr(gateway, "proc", None)
    if gateway is None or proc is None:
        return
    try:
        gateway.shutdown()
    except Exception:   # the JVM may be gone already
        pass
    try:
        if proc.stdin is not None:
            proc.stdin.close()   # what the JVM waits for (PythonGatewayServer)
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        log.warning("the Spark driver JVM did not exit %.0fs after the session stopped: killed", timeout)
        proc.kill()
        proc.wait(10)
    except Exception:
        pass
    SparkContext._gateway = None  # noqa: SLF001 - a later session launches a new JVM
    SparkContext._jvm = None  # noqa: SLF001


def _import_engine(batches):
    import confluent_kafka  # noqa: F401
    import fastavro  # noqa: F401

    import txstream.task.publish
    import txstream.task.reading  # noqa: F401

    yield from batches


# Spark's SQL Python runners add this variable to their workers' environment (the setting below,
# on by default); an RDD's Python function does not.
SIMPLIFIED_TRACEBACK = "SPARK_SIMPLIFIED_TRACEBACK"
SIMPLIFIED_TRACEBACK_SETTING = "spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled"


def warm_python_workers(spark) -> set[int]:
    """Start Spark's Python daemon and workers, with the engine imported, while the driver
    validates the transform and joins the group, instead of in the first batch (seconds on a
    busy machine). Returns the daemons' process ids (tests/spark/test_spark_session.py).

    An RDD job, not a DataFrame's: it needs none of Catalyst's planning, which on a cold JVM
    competes with the driver's own first DataFrame. Its workers must come from the daemon
    the batches' mapInArrow tasks use: Spark keeps one daemon per Python function environment,
    and its SQL runners add SPARK_SIMPLIFIED_TRACEBACK=1 to theirs when the setting is on, so the
    RDD's functions carry the same. `cache()` keeps pyspark from fusing the two functions into
    one worker: two workers per task, as a batch's reader and publisher hold. Local masters only:
    on a cluster the executor preflight (driver/preflight.py) checks the executors instead."""
    sc = spark.sparkContext
    if not is_local(sc.master):
        return set()
    simplified = str(spark.conf.get(SIMPLIFIED_TRACEBACK_SETTING, "true")).strip().lower() == "true"
    added = simplified and SIMPLIFIED_TRACEBACK not in sc.environment
    if added:
        sc.environment[SIMPLIFIED_TRACEBACK] = "1"
    try:
        slots = sc.defaultParallelism
        first = sc.parallelize(range(slots), slots).mapPartitions(_import_engine).cache()
        try:
            return set(first.mapPartitions(_daemon_of_worker).collect())
        finally:
            first.unpersist()
    except Exception as exc:   # the first batch meets the same cause and reports it by type
        log.debug("warming up the Python workers failed: %s", str(exc).strip().splitlines()[0][:300])
        return set()
    finally:
        if added:
            sc.environment.pop(SIMPLIFIED_TRACEBACK, None)


def _daemon_of_worker(items):
    import os

    for _ in _import_engine(items):
        pass
    yield os.getppid()   # a worker is forked by its daemon


def _representative_job(spark) -> None:
    """Load the classes a batch loads: Arrow both ways, Python workers, struct expressions."""
    warm_python_workers(spark)
    frame = spark.range(0, 1000, 1, 2).selectExpr(
        "id", "named_struct('id', cast(id as string), 'amount', id * 1.5D, 'at', timestamp_millis(id)) AS value",
        "cast(id as string) AS topic")
    frame = frame.where("value.amount > 1").withColumn("value", frame["value"].withField("cents", frame["id"] * 100))
    frame.mapInArrow(_import_engine, frame.schema).collect()


def write_class_archive(echo=print) -> Path:
    """Start Spark once with -XX:ArchiveClassesAtExit in a child process and keep the archive.

    A child, so the archive is complete (the JVM writes it when it exits) before it is renamed
    into place; a run that starts meanwhile simply does not use it yet."""
    home = _session_home()
    archive = class_archive(home)
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_suffix(f".{os.getpid()}.partial")
    code = ("import sys; from txstream.spark.session import build_spark, _representative_job; "
            "s = build_spark('local[2]', 'txstream-class-archive', "
            f"{{'spark.driver.extraJavaOptions': '-XX:ArchiveClassesAtExit={partial} -Xlog:cds=off -Xlog:cds+dynamic=off'}}); "
            "_representative_job(s); s.stop()")
    echo(f"writing Spark's class archive to {archive} (once; about 30 s)")
    env = {**os.environ, "TXSTREAM_CLASS_ARCHIVE": "0"}
    done = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=600)
    if done.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        tail = (done.stderr or "").strip().splitlines()[-3:]
        raise RuntimeError(f"could not write the class archive (exit {done.returncode}): {' | '.join(tail)}")
    os.replace(partial, archive)
    archive.with_suffix(".home").write_text(home)   # whose archive it is (remove_abandoned)
    return archive


def remove_abandoned(echo=print) -> list[Path]:
    """Remove the SPARK_HOMEs (spark_home) of pyspark installations that are gone, and the class
    archives written for them. Returns what was removed.

    Every virtual environment gets a home and an archive (~160 MB) of its own, so every fresh
    clone that runs `make test` (a CI job) added one, and nothing removed them. A home whose links
    point into a package that no longer exists serves no run any more, nor does its archive."""
    cache = cache_dir()
    removed: list[Path] = []
    for home in sorted(cache.glob("spark-home-*")):
        if _abandoned(home):
            # An archive written before archives named their home: the one this Java would use.
            archive = class_archive(str(home))
            if archive.is_file():
                archive.unlink()
                removed.append(archive)
            shutil.rmtree(home, ignore_errors=True)
            removed.append(home)
    for record in sorted(cache.glob("spark-classes-*.home")):
        try:
            home = Path(record.read_text().strip())
        except OSError:
            continue
        if not home.exists() or _abandoned(home):
            archive = record.with_suffix(".jsa")
            if archive.is_file():
                archive.unlink()
                removed.append(archive)
            record.unlink(missing_ok=True)
    for path in removed:
        echo(f"removed {path} (its pyspark installation is gone)")
    return removed


def _abandoned(home: Path) -> bool:
    probe = home / "bin"   # every home links pyspark's bin/
    return probe.is_symlink() and not probe.exists()


def main() -> int:
    remove_abandoned()
    archive = class_archive()
    if archive.is_file() and "--force" not in sys.argv[1:]:
        print(f"Spark's class archive is in place: {archive}")
        return 0
    write_class_archive()
    return 0


__all__ = ["build_spark", "class_archive", "remove_abandoned", "spark_home", "ui_settings", "warm_python_workers",
           "write_class_archive"]


if __name__ == "__main__":
    sys.exit(main())
