"""Fixtures: a real Apache Kafka broker for the whole test run, and uniquely named topics.

The broker is, in order of preference: the cluster named by TXSTREAM_BOOTSTRAP_SERVERS; the
official Kafka image through testcontainers when a Docker engine answers; else (CI here) Apache
Kafka from its Maven Central jars, started once per run and stopped at the end. Never a mock.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from txstream.local.cluster import LocalKafkaCluster, free_port_block

_BROKER_KIND = {"kind": "not started"}


def _docker_reachable() -> bool:
    try:
        import docker  # comes with testcontainers

        docker.from_env(timeout=3).ping()
        return True
    except Exception:  # noqa: BLE001 - no engine, no socket, no package: not reachable
        return False


@pytest.fixture(scope="session")
def bootstrap_servers() -> Iterator[str]:
    existing = os.environ.get("TXSTREAM_BOOTSTRAP_SERVERS")
    if existing:
        _BROKER_KIND["kind"] = f"existing cluster at {existing}"
        yield existing
        return
    if os.environ.get("TXSTREAM_TEST_DOCKER", "1") != "0" and _docker_reachable():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer("apache/kafka:4.1.0").with_kraft() as container:
            _BROKER_KIND["kind"] = "Apache Kafka in Docker (testcontainers)"
            yield container.get_bootstrap_server()
        return
    data_dir = tempfile.mkdtemp(prefix="txstream-test-kafka-")
    cluster = LocalKafkaCluster(port=free_port_block(1), data_dir=data_dir, die_with_parent=True)
    try:
        bootstrap = cluster.start(progress=print)
        _BROKER_KIND["kind"] = f"Apache Kafka from Maven jars at {bootstrap}"
        yield bootstrap
    finally:
        cluster.destroy()
        shutil.rmtree(data_dir, ignore_errors=True)


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001 - pytest hook
    terminalreporter.write_line(f"txstream tests ran against: {_BROKER_KIND['kind']}")


@pytest.fixture(scope="session")
def admin(bootstrap_servers: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap_servers})


@pytest.fixture
def make_topic(admin: AdminClient, request: pytest.FixtureRequest) -> Callable[..., str]:
    """Create a topic named after the test, unique per call: make_topic("orders", partitions=3)."""
    created: list[str] = []

    def create(prefix: str = "t", partitions: int = 1, replication: int = 1, **config: str) -> str:
        name = f"{prefix}-{request.node.name[:40]}-{uuid.uuid4().hex[:8]}".replace("[", "-").replace("]", "")
        name = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in name)
        admin.create_topics([NewTopic(name, partitions, replication, config=config)])[name].result(30)
        created.append(name)
        return name

    yield create
    if created:
        admin.delete_topics(created)


@pytest.fixture(scope="session")
def spark():
    """One local Spark session for the in-process engine tests (2 task slots, retries on)."""
    from txstream.driver.loop import build_spark

    session = build_spark("local[2]", "txstream-tests")
    yield session
    session.stop()


@pytest.fixture
def run_processor(bootstrap_servers: str, spark):  # noqa: ANN001
    """Run a processor class in-process until caught up; returns the Driver (totals, reports)."""
    from txstream.driver.loop import Driver
    from txstream.settings import resolve

    def run(cls, **overrides):  # noqa: ANN001, ANN202
        overrides.setdefault("until_caught_up", True)
        overrides.setdefault("app_id", f"test-{cls.__name__.lower()}-{uuid.uuid4().hex[:8]}")
        settings = resolve(cls, bootstrap_servers=bootstrap_servers, master="local[2]", **overrides)
        lines: list[str] = []
        driver = Driver(settings, echo=lines.append, spark=spark)
        driver.exit_code = driver.run()
        driver.lines = lines
        return driver

    return run
