"""The chaos suite (issue 5), modelled on Apache Kafka's transactions system test.

Every test here is marked `chaos`. `make test` runs them at a reduced size; `TXSTREAM_SOAK=1`
makes them long (more bounces, more records) for manual runs:

    TXSTREAM_SOAK=1 .venv/bin/python -m pytest tests/chaos -s

Each scenario prints one line: records in / out / dead-lettered / duplicates / missing.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator

import pytest

from tests.chaos import harness as h
from txstream.local.cluster import LocalKafkaCluster, free_port_block


def pytest_collection_modifyitems(items) -> None:  # noqa: ANN001 - pytest hook
    for item in items:
        if "/tests/chaos/" in str(item.fspath):
            item.add_marker(pytest.mark.chaos)


@pytest.fixture(autouse=True)
def _close_probes() -> Iterator[None]:
    yield
    h.close_probes()


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalKafkaCluster]:
    """Three KRaft nodes (broker+controller), RF 3 / min ISR 2 internal topics; gone at the end."""
    data_dir = tempfile.mkdtemp(prefix="txstream-chaos-cluster-")
    nodes = LocalKafkaCluster(port=free_port_block(3), data_dir=data_dir, brokers=3, die_with_parent=True)
    try:
        began = time.monotonic()
        nodes.start(progress=print, timeout=240)
        print(f"3-node cluster up in {time.monotonic() - began:.1f}s", flush=True)
        yield nodes
    finally:
        for node in nodes.nodes:
            nodes.stop_node(node.node_id, hard=True)
        nodes.destroy()
        shutil.rmtree(data_dir, ignore_errors=True)
        assert not nodes.alive_pids(), f"brokers survive the test: {nodes.alive_pids()}"
