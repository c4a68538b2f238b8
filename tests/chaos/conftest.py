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


@pytest.fixture(scope="module")
def cluster(kafka_cluster_factory) -> Iterator[LocalKafkaCluster]:
    """Three KRaft nodes (broker+controller), RF 3 / min ISR 2 internal topics; killed at the end,
    whatever the tests did."""
    fixture = kafka_cluster_factory(brokers=3, controlled=True)
    try:
        yield fixture.local
    finally:
        fixture.stop()
