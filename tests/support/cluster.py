"""Kafka clusters for the tests, modelled on confluent-kafka-python's integration fixtures
(tests/integration/cluster_fixture.py: one KafkaClusterFixture, a variant that starts a cluster
with trivup and a bring-your-own one selected by an environment variable).

`create_cluster(brokers=1)` picks, in this order:
- `ByoFixture`: the cluster named by TXSTREAM_BOOTSTRAP_SERVERS (never started or stopped here);
- `DockerFixture`: the official Kafka image through testcontainers when a Docker engine answers
  (TXSTREAM_TEST_DOCKER=0 turns that off);
- `LocalFixture`: Apache Kafka from its Maven Central jars (txstream.local.cluster), on this machine.
A test that kills and restarts nodes (`controlled=True`, the 3-node chaos clusters) always gets a
`LocalFixture`: only there can it reach the node processes. Never a mock.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable

from txstream.local.cluster import LocalKafkaCluster, free_port_block

BYO_ENV = "TXSTREAM_BOOTSTRAP_SERVERS"
DOCKER_IMAGE = "apache/kafka:4.1.0"


class KafkaClusterFixture:
    """A running Kafka cluster for a test: where it is, what it is, and stop()."""

    kind = "a Kafka cluster"

    def __init__(self, brokers: int) -> None:
        self.brokers = brokers
        self._bootstrap = ""

    @property
    def bootstrap_servers(self) -> str:
        return self._bootstrap

    def stop(self) -> None:
        """Idempotent; runs at teardown whether the test passed or not."""

    def __repr__(self) -> str:
        return f"{self.kind} at {self.bootstrap_servers}"


class ByoFixture(KafkaClusterFixture):
    """Bring your own cluster: TXSTREAM_BOOTSTRAP_SERVERS names it; it is left running."""

    kind = "existing cluster"

    def __init__(self, brokers: int, bootstrap: str) -> None:
        super().__init__(brokers)
        self._bootstrap = bootstrap


class DockerFixture(KafkaClusterFixture):
    """One Apache Kafka node in Docker through testcontainers."""

    kind = "Apache Kafka in Docker (testcontainers)"

    def __init__(self, brokers: int) -> None:
        from testcontainers.kafka import KafkaContainer

        super().__init__(brokers)
        self._container = KafkaContainer(DOCKER_IMAGE).with_kraft()
        self._container.start()
        self._bootstrap = self._container.get_bootstrap_server()

    def stop(self) -> None:
        if self._container is not None:
            container, self._container = self._container, None
            container.stop()


class LocalFixture(KafkaClusterFixture):
    """Apache Kafka from its Maven jars: `brokers` combined KRaft nodes on localhost, in a
    temporary directory. `.local` is the LocalKafkaCluster, for tests that stop, kill and bounce
    nodes (tests/support/nodes.py). The JVMs die with the test process (PR_SET_PDEATHSIG) if teardown never runs."""

    kind = "Apache Kafka from Maven jars"

    def __init__(self, brokers: int, progress: Callable[[str], None] = print, timeout: float = 240.0) -> None:
        super().__init__(brokers)
        self._data_dir = tempfile.mkdtemp(prefix=f"txstream-test-kafka-{brokers}-")
        self.local: LocalKafkaCluster | None = LocalKafkaCluster(
            port=free_port_block(brokers), data_dir=self._data_dir, brokers=brokers, die_with_parent=True)
        try:
            began = time.monotonic()
            self._bootstrap = self.local.start(progress=progress, timeout=timeout)
            progress(f"{brokers}-node cluster up in {time.monotonic() - began:.1f}s")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """SIGKILL every node (the data goes anyway: no graceful shutdown), delete the data, and
        check that no JVM survived."""
        nodes, self.local = self.local, None
        if nodes is None:
            return
        try:
            for node in nodes.nodes:
                nodes.stop_node(node.node_id, hard=True)
        finally:
            nodes.destroy()
            shutil.rmtree(self._data_dir, ignore_errors=True)
        assert not nodes.alive_pids(), f"Kafka nodes survive the test: {nodes.alive_pids()}"


def docker_reachable() -> bool:
    if os.environ.get("TXSTREAM_TEST_DOCKER", "1") == "0":
        return False
    try:
        import docker  # comes with testcontainers

        docker.from_env(timeout=3).ping()
        return True
    except Exception:  # no engine, no socket, no package: not reachable
        return False


def create_cluster(brokers: int = 1, controlled: bool = False, progress: Callable[[str], None] = print,
                   timeout: float = 240.0) -> KafkaClusterFixture:
    """A cluster of `brokers` nodes (1 or 3). `controlled`: the test kills and restarts nodes, so
    it must be a LocalFixture whatever the environment says."""
    if brokers not in (1, 3):
        raise ValueError(f"brokers must be 1 or 3, not {brokers}")
    if not controlled:
        existing = os.environ.get(BYO_ENV)
        if existing:
            return ByoFixture(brokers, existing)
        if brokers == 1 and docker_reachable():
            return DockerFixture(brokers)
    return LocalFixture(brokers, progress=progress, timeout=timeout)
