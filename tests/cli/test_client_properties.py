"""Client properties reach every command (-X, --command-config), and no broker is one clear line.

A 1-node cluster of its own with a SASL_PLAINTEXT (PLAIN) listener: `offsets show`, `verify`,
`produce`, `consume` (and a short `run`) work against it only when the SASL settings are given,
on the command line or in a properties file; without them they fail quickly and clearly.
"""
from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.commands import exercise, txstream
from tests.support.secret_scan import files_holding, wrapped
from txstream.local.cluster import LocalKafkaCluster, free_port_block

USER, PASSWORD = "alice", "alice-secret"
SASL = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
        "sasl.username": USER, "sasl.password": PASSWORD}
X_SASL = [arg for key, value in SASL.items() for arg in ("-X", f"{key}={value}")]
UNREACHABLE = "127.0.0.1:1"


def assert_one_clear_line(proc: subprocess.CompletedProcess, where: str) -> None:
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert f"Cannot reach Kafka at {where}" in proc.stderr, proc.stderr
    assert "txstream kafka up" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "|FAIL|" not in proc.stderr and "%3|" not in proc.stderr, proc.stderr   # librdkafka's own log


@pytest.fixture(scope="module")
def sasl_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafkaCluster]:
    cluster = LocalKafkaCluster(port=free_port_block(1, blocks=3), data_dir=str(tmp_path_factory.mktemp("sasl")),
                                die_with_parent=True, sasl_users={USER: PASSWORD, "admin": "admin-secret"})
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def topics(sasl_cluster: LocalKafkaCluster) -> tuple[str, str]:
    admin = AdminClient({"bootstrap.servers": sasl_cluster.bootstrap_servers})
    names = (f"sasl-in-{uuid.uuid4().hex[:6]}", f"sasl-out-{uuid.uuid4().hex[:6]}")
    for future in admin.create_topics([NewTopic(n, 2) for n in names]).values():
        future.result(30)
    return names


def test_commands_work_with_dash_x(sasl_cluster: LocalKafkaCluster, topics: tuple[str, str]) -> None:
    exercise(sasl_cluster.sasl_bootstrap_servers, *topics, X_SASL)


def test_commands_work_with_a_command_config_file(sasl_cluster: LocalKafkaCluster, topics: tuple[str, str],
                                                   tmp_path: Path) -> None:
    config = tmp_path / "client.properties"
    config.write_text("# as Kafka's tools take it\n" + "".join(f"{k}={v}\n" for k, v in SASL.items()))
    exercise(sasl_cluster.sasl_bootstrap_servers, *topics, ["--command-config", str(config)])


def test_dash_x_wins_over_the_file(sasl_cluster: LocalKafkaCluster, topics: tuple[str, str],
                                   tmp_path: Path) -> None:
    config = tmp_path / "client.properties"
    config.write_text("".join(f"{k}={v}\n" for k, v in {**SASL, "sasl.password": "wrong"}.items()))
    proc = txstream("offsets", "show", "--app-id", "sasl-app", "--topic", topics[0], "--bootstrap-servers",
                    sasl_cluster.sasl_bootstrap_servers, "--command-config", str(config),
                    "-X", f"sasl.password={PASSWORD}", "--timeout", "20")
    assert proc.returncode == 0 and topics[0] in proc.stdout, proc.stderr


@pytest.mark.parametrize("command", ["produce", "consume", "offsets", "verify"])
def test_without_the_sasl_settings_a_command_fails_clearly(sasl_cluster: LocalKafkaCluster,
                                                           topics: tuple[str, str], command: str) -> None:
    sasl, (topic, output) = sasl_cluster.sasl_bootstrap_servers, topics
    args = {"produce": ["produce", topic, "--timeout", "3"],
            "consume": ["consume", topic, "--timeout", "3"],
            "offsets": ["offsets", "show", "--app-id", "sasl-app", "--timeout", "3"],
            "verify": ["verify", "--input", topic, "--output", output, "--timeout", "3"]}[command]
    proc = txstream(*args, "--bootstrap-servers", sasl, stdin='{"n": 1}\n', timeout=60)
    assert_one_clear_line(proc, sasl)


def test_a_wrong_password_fails_clearly(sasl_cluster: LocalKafkaCluster) -> None:
    proc = txstream("offsets", "show", "--app-id", "sasl-app", "--bootstrap-servers",
                    sasl_cluster.sasl_bootstrap_servers, *X_SASL[:-1], "sasl.password=wrong", "--timeout", "5",
                    timeout=60)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and "%3|" not in proc.stderr, proc.stderr
    assert "Error:" in proc.stderr and "uthentication" in proc.stderr, proc.stderr


@pytest.mark.parametrize("args", [
    ["offsets", "show", "--app-id", "x", "--timeout", "2"],
    ["verify", "--input", "a", "--output", "b", "--timeout", "2"],
    ["produce", "t", "--timeout", "2"],
    ["consume", "t", "--timeout", "2"],
    ["kafka", "check", "--timeout", "2"],
], ids=lambda a: " ".join(a[:2]))
def test_an_unreachable_cluster_is_one_clear_line(args: list[str]) -> None:
    proc = txstream(*args, "--bootstrap-servers", UNREACHABLE, stdin='{"n": 1}\n', timeout=60)
    assert_one_clear_line(proc, UNREACHABLE)
    assert len([line for line in proc.stderr.splitlines() if line.strip()]) == 1, proc.stderr


def test_run_against_an_unreachable_cluster_is_one_clear_line() -> None:
    proc = txstream("run", "processors.passthrough:PassThrough", "--input", "x", "--output", "y",
                    "--bootstrap-servers", UNREACHABLE, "--until-caught-up", timeout=300)
    assert_one_clear_line(proc, UNREACHABLE)
    assert proc.stderr.strip().splitlines()[-1].startswith("Error: Cannot reach Kafka at 127.0.0.1:1")


def test_run_through_the_sasl_listener_with_dash_x(sasl_cluster: LocalKafkaCluster, tmp_path: Path) -> None:
    sasl = sasl_cluster.sasl_bootstrap_servers
    admin = AdminClient({"bootstrap.servers": sasl_cluster.bootstrap_servers})
    source, sink = f"sasl-run-in-{uuid.uuid4().hex[:6]}", f"sasl-run-out-{uuid.uuid4().hex[:6]}"
    for future in admin.create_topics([NewTopic(source, 2), NewTopic(sink, 2)]).values():
        future.result(30)
    lines = "".join(json.dumps({"n": i}) + "\n" for i in range(20))
    assert txstream("produce", source, "--bootstrap-servers", sasl, *X_SASL, stdin=lines).returncode == 0
    # Everything the run writes lands under tmp_path: Spark's event log, its local directories
    # (the tasks' side files), the temporary files of every process.
    written = tmp_path / "written"
    (written / "events").mkdir(parents=True)
    proc = txstream("run", "processors.passthrough:PassThrough", "--input", source, "--output", sink,
                    "--app-id", f"sasl-run-{uuid.uuid4().hex[:6]}", "--master", "local[1]",
                    "--conf", "spark.eventLog.enabled=true", "--conf", f"spark.eventLog.dir=file://{written}/events",
                    "--conf", f"spark.local.dir={written}/local", "--log-format", "json",
                    "--bootstrap-servers", sasl, *X_SASL, "--until-caught-up", timeout=600, TMPDIR=str(written))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # No credential in anything the run wrote or printed, in the clear or wrapped (issue 54).
    assert list((written / "events").iterdir()), "Spark wrote no event log"
    assert files_holding(written, PASSWORD) == {}
    assert wrapped((proc.stdout + proc.stderr).encode(), PASSWORD.encode()) is None, proc.stderr[-3000:]
    proc = txstream("verify", "--input", source, "--output", sink, "--one-to-one", "--bootstrap-servers", sasl,
                    *X_SASL, "--timeout", "20")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "CLEAN" in proc.stdout
