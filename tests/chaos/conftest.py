"""The chaos suite (issue 5), modelled on Apache Kafka's transactions system test.

Every test here is marked `chaos` (by tests/conftest.py). `make test` runs them at a reduced size; `TXSTREAM_SOAK=1`
makes them long (more bounces, more records) for manual runs:

    TXSTREAM_SOAK=1 .venv/bin/python -m pytest tests/chaos -s

Each scenario prints one line: records in / out / dead-lettered / duplicates / missing.
"""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from txstream.local.cluster import LocalKafkaCluster


@pytest.fixture(scope="session")
def cluster(kafka_cluster_factory) -> Iterator[LocalKafkaCluster]:
    """Three KRaft nodes (broker+controller), RF 3 / min ISR 2 internal topics; killed at the end,
    whatever the tests did. One for the session (the broker bounces, the soak and the cluster
    bounces take it in turn: one xdist group, tests/conftest.py): each scenario makes its own
    topics and waits for the cluster to be fully replicated before and after its bounces."""
    fixture = kafka_cluster_factory(brokers=3, controlled=True)
    try:
        yield fixture.local
    finally:
        fixture.stop()
