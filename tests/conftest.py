"""Fixtures: a real Apache Kafka broker for the whole test run, and uniquely named topics.

The broker is, in order of preference: the cluster named by TXSTREAM_BOOTSTRAP_SERVERS; the
official Kafka image through testcontainers when a Docker engine answers; else (CI here) Apache
Kafka from its Maven Central jars, started once per run and stopped at the end. Never a mock.
"""
from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.cluster import KafkaClusterFixture, create_cluster
from tests.support.kafka import close_clients_left_open, close_probes
from tests.support.waiting import wait_until

_BROKER_KIND = {"kind": "no broker (none of the selected tests needed one)"}
_CLOSED_AT_END: list[str] = []   # clients the tests left open, closed before exit (summary line)
# Set by tests/cluster/conftest.py: whether the simulated hosts could be made, or why not.
MULTI_HOST = {"state": ""}

# Fixtures that need a Kafka broker, a Spark session or a schema registry: a test using any of
# them (directly or through another fixture) is an integration test.
INTEGRATION_FIXTURES = {"kafka_cluster_factory", "bootstrap_servers", "admin", "make_topic", "spark",
                        "run_processor", "cluster", "schema_registry"}
_CHAOS_DIR = Path(__file__).parent / "chaos"
_CLUSTER_DIR = Path(__file__).parent / "cluster"   # simulated hosts: always integration
_PROCESS_MODULES = {"tests.chaos.harness", "tests.support.running"}


def _starts_processes(item: pytest.Item) -> bool:
    """Test modules that start processes import subprocess, or the helpers that do (the chaos
    harness, tests/support/running.py)."""
    module = getattr(item, "module", None)
    imported = vars(module).values() if module is not None else ()
    return any(value is subprocess or value is subprocess.Popen
               or getattr(value, "__name__", "") in _PROCESS_MODULES
               or getattr(value, "__module__", "") in _PROCESS_MODULES for value in imported)


# The chaos files whose tests take the 3-node cluster (tests/chaos/conftest.py `cluster`): one
# pytest-xdist work unit, so one worker starts that cluster once and runs them one after another.
_THREE_NODE_FILES = {"tests/chaos/test_broker_bounces.py", "tests/chaos/test_soak.py",
                     "tests/chaos/test_cluster_bounces.py"}


def _work_unit(nodeid: str) -> str:
    """Under `make test` (pytest-xdist): a file's tests stay on one worker, so its module
    fixtures (a run its tests share, a cluster of its own) are built once; the 3-node files share one."""
    path = nodeid.split("::", 1)[0]
    return "3-node cluster" if path in _THREE_NODE_FILES else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """pytest-xdist's hook: its own `--dist loadgroup` cannot group under pytest 9 (it renames
    node ids through an attribute pytest 9 no longer reads), so the work units are made here."""
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _work_unit(nodeid)

    return ByWorkUnit(config, log)


# The longest work units, longest first: they start first, so that the short ones fill the
# workers' ends instead of one long unit starting last (the Makefile passes --no-loadscope-reorder:
# pytest-xdist would otherwise put the units with the most tests first).
_LONGEST_FIRST = ("3-node cluster", "tests/chaos/test_state_crashes.py", "tests/driver/test_crash_recovery.py",
                  "tests/cluster/test_cluster_runs.py", "tests/driver/test_guarantees.py",
                  "tests/chaos/test_resources.py", "tests/local/test_security.py", "tests/serde/test_registry_runs.py",
                  "tests/chaos/test_client_bounces.py", "tests/chaos/test_wide_crashes.py",
                  "tests/tools/test_verify_matrix.py", "tests/driver/test_scaling.py",
                  "tests/semantics/test_differential.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`chaos`: everything under tests/chaos. `integration`: a broker, Spark or processes.
    `make test-fast` runs the rest (`-m "not integration and not chaos"`). The longest work
    units run first (a stable sort: a file's tests stay together, in their order)."""
    rank = {unit: i for i, unit in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(_work_unit(item.nodeid), len(rank)))
    root = Path(__file__).parent.parent
    for item in items:
        if (_CHAOS_DIR in Path(str(item.path)).parents and "cluster" in getattr(item, "fixturenames", ())
                and Path(str(item.path)).relative_to(root).as_posix() not in _THREE_NODE_FILES):
            raise pytest.UsageError(f"{item.nodeid} takes the 3-node cluster: name its file in "
                                    "tests/conftest.py _THREE_NODE_FILES")
        if _CHAOS_DIR in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.chaos)
        if (INTEGRATION_FIXTURES & set(getattr(item, "fixturenames", ())) or _starts_processes(item)
                or _CLUSTER_DIR in Path(str(item.path)).parents):
            item.add_marker(pytest.mark.integration)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Under CI (TXSTREAM_CI=1) an integration or chaos test that skips is a failure: CI must run
    every test against the real broker, Spark and hosts."""
    outcome = yield
    report = outcome.get_result()
    if (report.skipped and os.environ.get("TXSTREAM_CI") == "1"
            and (item.get_closest_marker("integration") or item.get_closest_marker("chaos"))):
        report.outcome = "failed"
        report.longrepr = f"{item.nodeid} was skipped under CI: {report.longrepr}"


@pytest.fixture(autouse=True)
def _unit_tests_start_no_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keeps the split honest: a test not marked integration that starts a process fails, naming
    the reason, instead of slowing `make test-fast` down."""
    if request.node.get_closest_marker("integration") is not None:
        return

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"{request.node.nodeid} starts a process: mark it pytest.mark.integration "
                             "(or use an integration fixture)")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)


@pytest.fixture(autouse=True)
def _close_offset_probes() -> Iterator[None]:
    """The consumers `committed_or_none` keeps for polling live as long as the test."""
    yield
    close_probes()


@pytest.fixture(scope="session")
def kafka_cluster_factory() -> Iterator[Callable[..., KafkaClusterFixture]]:
    """Clusters on demand: `kafka_cluster_factory(brokers=1|3, controlled=False)` (see
    tests/support/cluster.py). Each is stopped by the fixture that asked for it, or at the end of
    the session at the latest, whether the tests passed or not."""
    clusters: list[KafkaClusterFixture] = []

    def create(brokers: int = 1, controlled: bool = False, timeout: float = 240.0) -> KafkaClusterFixture:
        cluster = create_cluster(brokers, controlled=controlled, timeout=timeout)
        clusters.append(cluster)
        return cluster

    try:
        yield create
    finally:
        errors = []
        for cluster in reversed(clusters):
            try:
                cluster.stop()
            except Exception as exc:  # stop every cluster, then report
                errors.append(exc)
        if errors:
            raise errors[0]


@pytest.fixture(scope="session")
def bootstrap_servers(kafka_cluster_factory: Callable[..., KafkaClusterFixture]) -> Iterator[str]:
    """The session's broker: TXSTREAM_BOOTSTRAP_SERVERS, else Docker, else local Maven jars."""
    # A deadline for a hung start, not a speed limit: under load (74 on 2 cores) one node took
    # over 120 s to come up, and every test of the session then failed in setup.
    cluster = kafka_cluster_factory(brokers=1, timeout=300.0)
    _BROKER_KIND["kind"] = repr(cluster)
    try:
        yield cluster.bootstrap_servers
    finally:
        try:
            _CLOSED_AT_END.extend(close_clients_left_open())   # while their broker still answers
        finally:
            cluster.stop()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """After every fixture's teardown: whatever client is still open (one of a cluster a test
    module stopped) is closed now, not by the interpreter's shutdown. An xdist worker hands its
    summary lines to the controller, which prints them."""
    _CLOSED_AT_END.extend(close_clients_left_open())
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["txstream"] = {"broker": _BROKER_KIND["kind"], "multi_host": MULTI_HOST["state"],
                              "closed": list(_CLOSED_AT_END)}


_WORKERS: dict[str, dict] = {}   # xdist controller: each worker's summary (pytest_sessionfinish)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist's hook, in the controller: a worker finished."""
    summary = getattr(node, "workeroutput", {}).get("txstream")
    if summary:
        _WORKERS[node.gateway.id] = summary
        _CLOSED_AT_END.extend(summary["closed"])
        MULTI_HOST["state"] = MULTI_HOST["state"] or summary["multi_host"]


def pytest_terminal_summary(terminalreporter) -> None:
    kinds = [f"{worker}: {w['broker']}" for worker, w in sorted(_WORKERS.items())] or [_BROKER_KIND["kind"]]
    terminalreporter.write_line(f"txstream tests ran against: {'; '.join(kinds)}")
    if MULTI_HOST["state"]:
        terminalreporter.write_line(f"multi-host tests (tests/cluster): {MULTI_HOST['state']}")
    if _CLOSED_AT_END:
        counts = {kind: _CLOSED_AT_END.count(kind) for kind in sorted(set(_CLOSED_AT_END))}
        kinds = ", ".join(f"{n} {kind.lower()}{'s' if n > 1 else ''}" for kind, n in counts.items())
        terminalreporter.write_line(f"Kafka clients the tests left open (task caches, fenced zombies), closed before exit: {kinds}")


class _SessionAdmin:
    """The session's AdminClient, released when its broker stops. AdminClient has no close():
    it goes when the last reference does, and a test's closure or frame can outlive the test
    (CI: the session's admin, still alive after the broker stopped, retried it until exit). The
    tests hold this holder; the fixture's teardown drops the client itself."""

    def __init__(self, client: AdminClient) -> None:
        self._client: AdminClient | None = client

    def __getattr__(self, name: str):
        if self._client is None:
            raise RuntimeError("the session's AdminClient is gone: its broker stopped")
        return getattr(self._client, name)

    def release(self) -> None:
        self._client = None


@pytest.fixture(scope="session")
def schema_registry() -> Iterator[str]:
    """The session's schema registry (the URL of its Confluent API): TXSTREAM_SCHEMA_REGISTRY_URL,
    else a local Apicurio Registry (txstream/local/registry.py) started once, for the tests that
    ask for it, and stopped at the end."""
    own = os.environ.get("TXSTREAM_SCHEMA_REGISTRY_URL")
    if own:
        yield own
        return
    from txstream.local.cluster import free_port_block
    from txstream.local.registry import LocalRegistry

    registry = LocalRegistry(port=free_port_block(2, blocks=1), die_with_parent=True)
    try:
        yield registry.start(timeout=180)
    finally:
        registry.stop()


@pytest.fixture(scope="session")
def admin(bootstrap_servers: str) -> Iterator[AdminClient]:
    holder = _SessionAdmin(AdminClient({"bootstrap.servers": bootstrap_servers}))
    yield holder  # type: ignore[misc]
    holder.release()


def _led(admin: AdminClient, name: str, partitions: int) -> bool:
    topic = admin.list_topics(name, timeout=10).topics.get(name)
    return (topic is not None and topic.error is None and len(topic.partitions) == partitions
            and all(p.leader >= 0 for p in topic.partitions.values()))


@pytest.fixture
def make_topic(admin: AdminClient, request: pytest.FixtureRequest) -> Callable[..., str]:
    """Create a topic named after the test, unique per call: make_topic("orders", partitions=3)."""
    created: list[str] = []

    def create(prefix: str = "t", partitions: int = 1, replication: int = 1, **config: str) -> str:
        name = f"{prefix}-{request.node.name[:40]}-{uuid.uuid4().hex[:8]}".replace("[", "-").replace("]", "")
        name = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in name)
        admin.create_topics([NewTopic(name, partitions, replication, config=config)])[name].result(30)
        created.append(name)
        # The controller answers before every broker's metadata has the topic: a command run at
        # once could be told it does not exist.
        wait_until(lambda: _led(admin, name, partitions), 30, f"topic {name} in the brokers' metadata")
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
def run_processor(bootstrap_servers: str, spark):
    """Run a processor class in-process until caught up; returns the Driver (totals, reports,
    `events`: its JSON log parsed; tests/support/running.py)."""
    from tests.support.running import run_in_process

    return lambda cls, **overrides: run_in_process(cls, bootstrap_servers, spark, **overrides)
