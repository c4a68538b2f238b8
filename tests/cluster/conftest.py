"""A real multi-host setting for txstream: a Spark standalone master and two workers, each worker on
its own simulated host (tests/support/hosts.py), and a Kafka broker listening on the hosts'
bridge (`txstream kafka up --listen`'s code path). One of each per test module.

Each worker's /tmp holds two interpreter links the runs choose between with
`spark.pyspark.python`: `/tmp/txs-env` is the project's environment on both hosts;
`/tmp/txs-env-b` is it on w1 and, on w2, an environment with every library but txstream — one
path, a different environment per host, as on real machines.

Where namespaces cannot be made (not root), these tests are skipped with the reason, except
under CI (TXSTREAM_CI=1), where they must run and fail instead.
"""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.conftest import MULTI_HOST
from tests.support.hosts import SimulatedHosts, namespaces_available
from tests.support.spark_standalone import SparkStandalone
from txstream.local.cluster import LocalKafkaCluster, free_port_block
from txstream.local.paths import cache_dir

GOOD_ENV = "/tmp/txs-env"
SPLIT_ENV = "/tmp/txs-env-b"


@pytest.fixture(scope="module")
def simulated_hosts() -> Iterator[SimulatedHosts]:
    ok, why = namespaces_available()
    if not ok:
        MULTI_HOST["state"] = f"NOT RUN: {why}"
        if os.environ.get("TXSTREAM_CI") == "1":
            pytest.fail(f"the multi-host tests must run in CI, but {why}")
        pytest.skip(f"multi-host tests not run: {why}")
    hosts = SimulatedHosts()
    MULTI_HOST["state"] = f"ran on simulated hosts (network namespaces on 10.77.{hosts.subnet}.0/24)"
    try:
        yield hosts
    finally:
        hosts.close()
        assert not hosts.leftovers(), f"left behind: {hosts.leftovers()}"


def _environment_without_txstream() -> Path:
    """A virtual environment that sees the project's libraries but not txstream: the project's
    site-packages through a .pth line (whose own .pth files, the editable txstream among them,
    are not processed). Outside /tmp, which the hosts do not share."""
    where = cache_dir() / "test-envs" / f"without-txstream-{sys.version_info[0]}{sys.version_info[1]}"
    if not (where / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--clear", str(where)], check=True)
    site = next(where.glob("lib/python*/site-packages"))
    (site / "project-libraries.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # Without PYTHONPATH: a Spark session this process started has put the checkout on it
    # (txstream/spark/session.py, for its workers), and would make txstream importable here.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    check = subprocess.run([str(where / "bin" / "python"), "-c", "import pyspark, pyarrow, confluent_kafka; "
                            "import importlib.util as u; print(u.find_spec('txstream') is None)"],
                           capture_output=True, text=True, cwd=str(where), env=env)
    assert check.stdout.strip() == "True", (check.stdout, check.stderr)
    return where


@pytest.fixture(scope="module")
def spark_standalone(simulated_hosts: SimulatedHosts, tmp_path_factory: pytest.TempPathFactory,
                     request: pytest.FixtureRequest) -> Iterator[SparkStandalone]:
    base = tmp_path_factory.mktemp("spark-standalone")
    venv = Path(sys.prefix)
    lacking = _environment_without_txstream()
    cluster = SparkStandalone(simulated_hosts, base / "logs", workers=2, cores_per_worker=1,
                              tmp_links=[{GOOD_ENV: str(venv), SPLIT_ENV: str(venv)},
                                         {GOOD_ENV: str(venv), SPLIT_ENV: str(lacking)}])
    failed_before = request.session.testsfailed
    try:
        yield cluster
    finally:
        if request.session.testsfailed > failed_before:
            print(f"\n--- Spark standalone logs ({base / 'logs'}) ---\n{cluster.logs(40)}")
        cluster.stop()


# The broker's SASL/PLAIN user: a run through its secured listener must leave the password nowhere.
SASL_USER, SASL_PASSWORD = "cluster-app", "cl-Pa55-" + uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def hosts_kafka_cluster(simulated_hosts: SimulatedHosts,
                        tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafkaCluster]:
    """A broker that listens on the bridge: reachable from the driver and from every host, in
    plaintext and through SASL/PLAIN (`secured_bootstrap_servers`)."""
    cluster = LocalKafkaCluster(port=free_port_block(1, blocks=3), data_dir=str(tmp_path_factory.mktemp("kafka")),
                                listen=simulated_hosts.gateway, die_with_parent=True,
                                sasl_users={SASL_USER: SASL_PASSWORD})
    cluster.start(timeout=180)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def hosts_kafka(hosts_kafka_cluster: LocalKafkaCluster) -> str:
    return hosts_kafka_cluster.bootstrap_servers


@pytest.fixture
def hosts_topic(hosts_kafka: str):
    admin = AdminClient({"bootstrap.servers": hosts_kafka})

    def make(prefix: str, partitions: int) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
        return name

    return make
