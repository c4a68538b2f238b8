"""`txstream kafka up/down/status` as a user runs them: real processes, twice in a row; a bare
`down` stops the default port's cluster only."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from txstream.local.cluster import free_port_block, port_is_free


def _txstream(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "txstream.cli", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    """A private registry so these clusters never meet a user's; every cluster is stopped after."""
    env = dict(os.environ)
    registry = tmp_path / "cache"
    registry.mkdir()
    # Reuse the jars already resolved, but keep cluster registrations private.
    env["TXSTREAM_CACHE_DIR"] = str(registry)
    env.pop("TXSTREAM_BOOTSTRAP_SERVERS", None)   # the default port is then 9092
    from txstream.local.cluster import KAFKA_VERSION
    from txstream.local.paths import cache_dir

    shared = cache_dir() / f"kafka-{KAFKA_VERSION}"
    if shared.exists():
        os.symlink(shared, registry / f"kafka-{KAFKA_VERSION}")
    yield env
    _txstream(env, "kafka", "down", "--all", timeout=120)


def test_up_down_twice_and_second_up_refused(cli_env: dict[str, str], tmp_path: Path) -> None:
    port = free_port_block(1)
    data = str(tmp_path / "data")
    for _ in range(2):
        up = _txstream(cli_env, "kafka", "up", "--port", str(port), "--data-dir", data)
        assert up.returncode == 0, up.stderr
        assert up.stdout.strip() == f"localhost:{port}"
        assert f"localhost:{port}" not in up.stderr, up.stderr   # the address once, on stdout
        status = _txstream(cli_env, "kafka", "status")
        assert f"localhost:{port}  running" in status.stdout
        again = _txstream(cli_env, "kafka", "up", "--port", str(port), "--data-dir", data)
        assert again.returncode != 0
        assert "already runs" in again.stderr and "Traceback" not in again.stderr
        down = _txstream(cli_env, "kafka", "down", "--port", str(port))
        assert down.returncode == 0 and "Stopped" in down.stderr
        assert port_is_free(port)
    assert "No local Kafka cluster is running" in _txstream(cli_env, "kafka", "status").stdout


def test_port_taken_is_a_clear_error(cli_env: dict[str, str], tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        up = _txstream(cli_env, "kafka", "up", "--port", str(port), "--data-dir", str(tmp_path / "d"))
    assert up.returncode != 0
    assert f"Port {port} is already in use" in up.stderr and "Traceback" not in up.stderr


def test_missing_java_is_a_clear_error(cli_env: dict[str, str], tmp_path: Path) -> None:
    env = dict(cli_env, PATH=str(tmp_path))  # no java, no mvn on PATH
    up = subprocess.run([sys.executable, "-m", "txstream.cli", "kafka", "up", "--port",
                         str(free_port_block(1)), "--data-dir", str(tmp_path / "d")],
                        capture_output=True, text=True, env=env, timeout=60)
    assert up.returncode != 0
    assert ("Java was not found" in up.stderr or "Maven (`mvn`) was not found" in up.stderr), up.stderr
    assert "Traceback" not in up.stderr


def test_up_listens_and_advertises_the_address_asked(cli_env: dict[str, str], tmp_path: Path) -> None:
    """`--listen` another address (here 127.0.0.2, a loopback address that is not 127.0.0.1): the
    brokers advertise it, clients there get transactions, and nothing listens on 127.0.0.1."""
    import socket

    port = free_port_block(1)
    up = _txstream(cli_env, "kafka", "up", "--port", str(port), "--data-dir", str(tmp_path / "data"),
                   "--listen", "127.0.0.2")
    assert up.returncode == 0, up.stderr
    assert up.stdout.strip() == f"127.0.0.2:{port}"
    check = _txstream(cli_env, "kafka", "check", "-b", f"127.0.0.2:{port}", "--timeout", "30")
    assert check.returncode == 0, check.stdout + check.stderr
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0, "the broker also listens on 127.0.0.1"
    # The metadata names the advertised address: a client that bootstraps there is told to stay there.
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": f"127.0.0.2:{port}"})
    brokers = admin.list_topics(timeout=30).brokers
    assert {(b.host, b.port) for b in brokers.values()} == {("127.0.0.2", port)}
    # The check deleted the topic it created (the deletion reaches the metadata soon after).
    from tests.support.waiting import wait_until

    wait_until(lambda: not [t for t in admin.list_topics(timeout=10).topics if t.startswith("txstream-check-")],
               30, "the check's topic to be gone")


def test_bare_down_stops_the_default_ports_cluster_only(cli_env: dict[str, str], tmp_path: Path) -> None:
    """Two clusters in one registry: a bare `down` stops the one on the default port (here the
    port TXSTREAM_BOOTSTRAP_SERVERS names) and leaves the other running; a second bare `down`
    refuses and names the other; `--all` stops it. From another registry, `down --port` on the
    running one says what listens there and exits non-zero."""
    default, other = free_port_block(1), free_port_block(1)
    env = dict(cli_env, TXSTREAM_BOOTSTRAP_SERVERS=f"localhost:{default}")
    for port in (default, other):
        up = _txstream(env, "kafka", "up", "--port", str(port), "--data-dir", str(tmp_path / f"d{port}"))
        assert up.returncode == 0, up.stderr
    down = _txstream(env, "kafka", "down")
    assert down.returncode == 0 and f"Stopped Kafka at localhost:{default}" in down.stderr, down.stderr
    assert port_is_free(default) and not port_is_free(other)

    refused = _txstream(env, "kafka", "down")
    assert refused.returncode == 1, refused.stderr
    assert f"localhost:{other} (--port {other})" in refused.stderr and "--all" in refused.stderr
    assert not port_is_free(other)

    elsewhere = dict(env, TXSTREAM_CACHE_DIR=str(tmp_path / "another-cache"))
    foreign = _txstream(elsewhere, "kafka", "down", "--port", str(other))
    assert foreign.returncode == 1, foreign.stderr
    assert f"listens on port {other}" in foreign.stderr and "kafka.Kafka" in foreign.stderr, foreign.stderr
    assert "TXSTREAM_CACHE_DIR" in foreign.stderr and not port_is_free(other)
    nothing = _txstream(elsewhere, "kafka", "down", "--port", str(default))
    assert nothing.returncode == 0 and f"No local Kafka cluster runs on port {default}" in nothing.stderr

    every = _txstream(env, "kafka", "down", "--all")
    assert every.returncode == 0 and f"Stopped Kafka at localhost:{other}" in every.stderr
    assert port_is_free(other)
