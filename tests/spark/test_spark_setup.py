"""Which master and settings a run gets (txstream/spark/setup.py): the user's, wherever they set
them, before txstream's; the local-only settings only for local masters."""
from __future__ import annotations

from pathlib import Path

from txstream.spark.setup import (
    ARROW_JAVA_OPTIONS,
    LOCAL_DEFAULTS,
    is_local,
    read_defaults,
    resolve,
    with_arrow_options,
)


def _conf_dir(tmp_path: Path, text: str) -> dict[str, str]:
    (tmp_path / "spark-defaults.conf").write_text(text)
    return {"SPARK_CONF_DIR": str(tmp_path)}


def test_nothing_set_anywhere_runs_locally_with_txstreams_settings(tmp_path: Path) -> None:
    setup = resolve(None, {}, None, env={})
    assert (setup.master, setup.master_source, setup.local) == ("local[*,2]", "default", True)
    assert setup.to_set["spark.python.daemon.module"] == LOCAL_DEFAULTS["spark.python.daemon.module"]
    assert setup.to_set["spark.ui.enabled"] == "false"


def test_spark_defaults_conf_gives_the_master_and_wins_over_txstreams_settings(tmp_path: Path) -> None:
    env = _conf_dir(tmp_path, "# the team's cluster\nspark.master  spark://spark-master:7077\n"
                              "spark.ui.enabled false\nspark.driver.memory=6g\n")
    setup = resolve(None, {}, None, env=env)
    assert (setup.master, setup.master_source, setup.local) == ("spark://spark-master:7077", "spark-defaults.conf", False)
    # The user's settings are not overridden (they reach Spark from the file itself).
    assert "spark.ui.enabled" not in setup.to_set and "spark.driver.memory" not in setup.to_set
    # Local-only tricks stay off a cluster master.
    assert "spark.python.daemon.module" not in setup.to_set


def test_master_option_then_conf_then_spark_submit_then_defaults(tmp_path: Path) -> None:
    env = _conf_dir(tmp_path, "spark.master spark://from-file:7077\n")
    submitted = {"spark.master": "spark://from-submit:7077", "spark.app.name": "x"}
    assert resolve("local[2]", {}, submitted, env=env).master == "local[2,2]"
    assert resolve(None, {"spark.master": "spark://conf:7077"}, submitted, env=env).master_source == "--conf"
    under_submit = resolve(None, {}, submitted, env=env)
    # Under spark-submit the JVM already holds its master: the builder leaves it alone.
    assert (under_submit.master, under_submit.master_source, under_submit.local) == (None, "spark-submit", False)
    assert resolve(None, {}, None, env=env).master == "spark://from-file:7077"


def test_spark_submit_settings_are_the_users(tmp_path: Path) -> None:
    submitted = {"spark.master": "spark://m:7077", "spark.sql.shuffle.partitions": "64"}
    setup = resolve(None, {}, submitted, env={})
    assert "spark.sql.shuffle.partitions" not in setup.to_set
    assert setup.to_set["spark.sql.session.timeZone"] == "UTC"


def test_pyspark_submit_args_count_as_the_users(tmp_path: Path) -> None:
    env = {"PYSPARK_SUBMIT_ARGS": "--master spark://args:7077 --conf spark.driver.memory=5g pyspark-shell"}
    setup = resolve(None, {}, None, env=env)
    assert setup.master == "spark://args:7077" and "spark.driver.memory" not in setup.to_set


def test_a_standalone_master_gets_cores_max_from_the_input_partitions_unless_set() -> None:
    assert resolve("spark://m:7077", {}, None, env={}, cores_hint=6).to_set["spark.cores.max"] == "6"
    assert "spark.cores.max" not in resolve("spark://m:7077", {"spark.cores.max": "2"}, None, env={},
                                            cores_hint=6).to_set.keys() - {"spark.cores.max"}
    assert resolve("spark://m:7077", {"spark.cores.max": "2"}, None, env={}, cores_hint=6).to_set["spark.cores.max"] == "2"
    assert "spark.cores.max" not in resolve("local[2]", {}, None, env={}, cores_hint=6).to_set
    assert "spark.cores.max" not in resolve("yarn", {}, None, env={}, cores_hint=6).to_set


def test_a_cluster_masters_executors_read_arrow_without_per_access_checks(tmp_path: Path) -> None:
    """Added to the user's executor options wherever they set them; left out where they name the
    properties; a local master's executor is the driver JVM (spark/session.py's options)."""
    executor = "spark.executor.extraJavaOptions"
    assert resolve("spark://m:7077", {}, None, env={}).to_set[executor] == ARROW_JAVA_OPTIONS
    env = _conf_dir(tmp_path, "spark.executor.extraJavaOptions -XX:+UseG1GC\n")
    assert resolve("spark://m:7077", {}, None, env=env).to_set[executor] == f"-XX:+UseG1GC {ARROW_JAVA_OPTIONS}"
    assert resolve("spark://m:7077", {executor: "-Xss4m"}, None, env=env).to_set[executor] == f"-Xss4m {ARROW_JAVA_OPTIONS}"
    off = "-Darrow.enable_null_check_for_get=true"
    assert executor not in resolve("spark://m:7077", {}, None, env=_conf_dir(tmp_path, f"{executor} {off}\n")).to_set
    assert executor not in resolve("local[2]", {}, None, env={}).to_set


def test_only_options_that_set_the_arrow_properties_keep_them_out() -> None:
    """A property named as such (-Dname or -Dname=value, quoted or not) is the user's; the same
    words elsewhere (a path, another property's value) are not."""
    mine = "-Darrow.enable_unsafe_memory_access=false"
    assert with_arrow_options(f"-Xss4m {mine}") == f"-Xss4m {mine}"
    assert with_arrow_options("'-Darrow.enable_null_check_for_get'") == "'-Darrow.enable_null_check_for_get'"
    path = "-Dlog.dir=/var/arrow.enable_unsafe_memory_access"
    assert with_arrow_options(path) == f"{path} {ARROW_JAVA_OPTIONS}"
    assert with_arrow_options("-Darrow.enable_unsafe_memory_accessor=1") == \
        f"-Darrow.enable_unsafe_memory_accessor=1 {ARROW_JAVA_OPTIONS}"
    assert with_arrow_options("") == ARROW_JAVA_OPTIONS


def test_the_ui_port_asked_for_wins_and_a_cluster_gets_its_ui() -> None:
    assert resolve("spark://m:7077", {}, None, env={}).to_set["spark.ui.enabled"] == "true"
    setup = resolve("local[2]", {}, None, env={}, ui_port=4141)
    assert (setup.to_set["spark.ui.enabled"], setup.to_set["spark.ui.port"]) == ("true", "4141")


def test_local_masters() -> None:
    assert all(is_local(m) for m in ("local", "local[2]", "local[*,3]", "local-cluster[2,1,1024]"))
    assert not any(is_local(m) for m in ("spark://h:7077", "yarn", "k8s://https://api:6443", "localhost"))


def test_defaults_file_syntax(tmp_path: Path) -> None:
    path = tmp_path / "spark-defaults.conf"
    path.write_text("# comment\n! also\n\nspark.a   1\nspark.b=2\nspark.c : 3\nspark.d\n")
    assert read_defaults(path) == {"spark.a": "1", "spark.b": "2", "spark.c": "3", "spark.d": ""}


def test_loopback_bootstrap_addresses_are_recognised() -> None:
    from txstream.driver.preflight import loopback_hosts

    assert loopback_hosts("localhost:9092,10.0.0.5:9092,127.0.0.2:9093,[::1]:9094") == [
        "localhost:9092", "127.0.0.2:9093", "[::1]:9094"]
    assert loopback_hosts("kafka-1:9092") == []



def test_the_master_is_described_as_the_user_wrote_it(tmp_path) -> None:  # noqa: ANN001
    """local[2] runs as local[2,2] (one task retry, as a cluster would), but the run's line names
    what the user asked for, not the internal form."""
    setup = resolve("local[2]", {}, env={"SPARK_CONF_DIR": str(tmp_path)})
    assert setup.master == "local[2,2]"
    assert setup.describe() == "Spark master local[2] (from --master)"
