"""Which Spark master and settings a run uses: the user's first, txstream's only where they set nothing.

The precedence is Spark's own (docs/cluster.md): an explicit `txstream run --master` or `--conf`,
then what spark-submit was given (when txstream runs under spark-submit, its JVM holds those
settings), then `spark-defaults.conf` (in SPARK_CONF_DIR, else SPARK_HOME/conf), and only then
txstream's defaults. `--master` has no default of its own: with nothing set anywhere the run is
`local[*]`.

txstream's start-up tricks (a SPARK_HOME without pyspark's zips, the driver's class archive, the
forking worker daemon that pre-imports the engine, workers on this interpreter with this
PYTHONPATH) only hold where the executors share this machine's files and environment, so they
are applied to local masters only.
"""
from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

LOCAL_DEFAULT_MASTER = "local[*]"

# txstream's settings for every master (each only where the user set nothing).
COMMON_DEFAULTS = {
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.python.worker.reuse": "true",
    # (The Arrow batch size is chosen per batch: spark/arrow_batches.py.)
    "spark.sql.shuffle.partitions": "8",
    "spark.driver.memory": "2g",
    # The executor talks to its Python workers over Unix domain sockets instead of loopback TCP,
    # whose small-write delays every Python hand-off (a reading range, a publishing slot) would
    # otherwise wait on. Spark >= 4.1.
    "spark.python.unix.domain.socket.enabled": "true",
}
# Arrow's Java library checks every buffer access against its bounds and every get() against the
# null bitmap unless told not to, the hottest frames of the executor's task threads. Every Arrow
# batch the executor reads or writes is one Spark or pyarrow built, and Spark asks isNullAt before
# every get, so the checks never fire. Added to the executors' JVM options (the driver's on a
# local master, which is the executor) unless the user's name them (docs/tuning.md).
ARROW_JAVA_OPTIONS = "-Darrow.enable_unsafe_memory_access=true -Darrow.enable_null_check_for_get=false"


def _system_properties(options: str) -> set[str]:
    """The names the JVM options set with -Dname[=value] (split as a shell would; the JVM's
    launcher gets them from spark-submit that way)."""
    try:
        words = shlex.split(options)
    except ValueError:   # an unbalanced quote: the JVM will say so; judge by whitespace here
        words = options.split()
    return {w[2:].split("=", 1)[0] for w in words if w.startswith("-D")}


def with_arrow_options(options: str) -> str:
    """The JVM options with ARROW_JAVA_OPTIONS added, unless they set either property already."""
    if _system_properties(options) & _system_properties(ARROW_JAVA_OPTIONS):
        return options
    return f"{options} {ARROW_JAVA_OPTIONS}".strip()


# Local masters only: the executors are this process's children on this machine.
LOCAL_DEFAULTS = {
    "spark.python.daemon.module": "txstream.spark.worker_daemon",
}
# The executor environment variable naming more modules for that daemon to import (comma-separated).
WORKER_IMPORTS = "TXSTREAM_WORKER_IMPORTS"


def is_local(master: str) -> bool:
    """local, local[N], local[N,F] and local-cluster[...]: executors on this machine, with its files."""
    return master == "local" or master.startswith(("local[", "local-cluster["))


def local_task_threads(master: str) -> int | None:
    """How many tasks the driver JVM itself runs at once: local = 1, local[N] and local[N,F] = N,
    local[*] = the cores this process may use; None where executors run the tasks
    (local-cluster[...], a cluster master)."""
    if master == "local":
        return 1
    found = re.fullmatch(r"local\[(\*|\d+)(?:,\d+)?\]", master)
    if found is None:
        return None
    if found.group(1) != "*":
        return int(found.group(1))
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def under_spark_submit() -> bool:
    """spark-submit starts the Python driver with a JVM already running (its gateway port set)."""
    return bool(os.environ.get("PYSPARK_GATEWAY_PORT"))


def defaults_file(env: dict[str, str] | None = None) -> Path | None:
    """spark-defaults.conf where spark-submit looks for it: SPARK_CONF_DIR, else SPARK_HOME/conf."""
    env = os.environ if env is None else env
    if env.get("SPARK_CONF_DIR"):
        path = Path(env["SPARK_CONF_DIR"]) / "spark-defaults.conf"
    elif env.get("SPARK_HOME"):
        path = Path(env["SPARK_HOME"]) / "conf" / "spark-defaults.conf"
    else:
        return None
    return path if path.is_file() else None


def read_defaults(path: Path | None) -> dict[str, str]:
    """A Java properties file as spark-submit reads spark-defaults.conf: `key value` or `key=value`,
    `#` comments. (Hand-parsed: the format is three rules, and Spark ships no Python reader.)"""
    if path is None:
        return {}
    settings: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        match = re.match(r"([^\s=:]+)\s*[=:\s]?\s*(.*)", line)
        if match:
            settings[match.group(1)] = match.group(2).strip()
    return settings


def submit_args_conf(env: dict[str, str] | None = None) -> dict[str, str]:
    """`--conf` and `--master` in PYSPARK_SUBMIT_ARGS (how a pyspark user passes spark-submit's flags)."""
    env = os.environ if env is None else env
    words = shlex.split(env.get("PYSPARK_SUBMIT_ARGS", ""))
    settings: dict[str, str] = {}
    for i, word in enumerate(words[:-1]):
        if word == "--master":
            settings["spark.master"] = words[i + 1]
        elif word == "--conf" and "=" in words[i + 1]:
            key, value = words[i + 1].split("=", 1)
            settings[key] = value
    return settings


@dataclass
class SparkSetup:
    """The resolved master and the settings txstream adds (never one the user set)."""

    master: str | None                   # None: leave it to spark-submit's JVM
    master_source: str                   # "--master", "--conf", "spark-submit", "spark-defaults.conf", "default"
    local: bool
    user_conf: dict[str, str]            # what the user set, wherever
    to_set: dict[str, str] = field(default_factory=dict)   # what the builder sets
    asked: str | None = None             # the master as the user wrote it (before local's retry)

    def describe(self) -> str:
        return f"Spark master {self.asked or self.master or '(spark-submit)'} (from {self.master_source})"


def resolve(master_option: str | None, cli_conf: dict[str, str], submitted_conf: dict[str, str] | None = None,
            env: dict[str, str] | None = None, ui_port: int | None = None,
            cores_hint: int | None = None) -> SparkSetup:
    """The master and settings of a run.

    `submitted_conf`: the settings of the JVM spark-submit started (None when not under
    spark-submit). `cores_hint`: the input partitions, for `spark.cores.max` on a standalone master.
    """
    env = os.environ if env is None else env
    files = {**read_defaults(defaults_file(env)), **submit_args_conf(env)}
    user = {**files, **(submitted_conf or {}), **cli_conf}
    if master_option:
        master, source = master_option, "--master"
    elif "spark.master" in cli_conf:
        master, source = cli_conf["spark.master"], "--conf"
    elif submitted_conf is not None and submitted_conf.get("spark.master"):
        master, source = submitted_conf["spark.master"], "spark-submit"
    elif files.get("spark.master"):
        master, source = files["spark.master"], "spark-defaults.conf"
    else:
        master, source = LOCAL_DEFAULT_MASTER, "default"
    local = is_local(master)
    asked = master
    if local and master.startswith("local[") and "," not in master:
        # Retry a failed task once, as a cluster would (local mode's default is no retry). Not
        # more: a record that fails the transform fails every attempt, and isolating it
        # (poison.py) runs several short jobs that each pay for the retries.
        master = master[:-1] + ",2]"
    defaults = {**COMMON_DEFAULTS, **(LOCAL_DEFAULTS if local else {}), **ui_settings(master, ui_port)}
    if master.startswith("spark://") and cores_hint:
        # A standalone master gives an app every free core unless told otherwise; a txstream
        # task per owned input partition is all a batch can use.
        defaults["spark.cores.max"] = str(cores_hint)
    to_set = {key: value for key, value in defaults.items() if key not in user}
    if ui_port is not None:   # asked for on the command line: wins over the files
        to_set.update(ui_settings(master, ui_port))
    to_set.update(cli_conf)
    if not local:   # (a local master's executor is the driver JVM: spark/session.py's options)
        executor = "spark.executor.extraJavaOptions"
        theirs = user.get(executor, "")   # (the command line's value, when it has one)
        ours = with_arrow_options(theirs)
        if ours != theirs:
            to_set[executor] = ours
    keep_submitted_master = submitted_conf is not None and source == "spark-submit"
    return SparkSetup(master=None if keep_submitted_master else master, master_source=source, local=local,
                      user_conf=user, to_set=to_set, asked=None if keep_submitted_master else asked)


def ui_settings(master: str, ui_port: int | None) -> dict[str, str]:
    """The Spark UI: off on a local master (a short run on a laptop has no use for it), on for a
    cluster (where a Spark user looks for jobs and executors), on at `ui_port` when one is given.
    A user's own spark.ui.* setting wins over the default."""
    if ui_port is not None:
        return {"spark.ui.enabled": "true", "spark.ui.port": str(ui_port)}
    return {"spark.ui.enabled": "false" if is_local(master) else "true"}
