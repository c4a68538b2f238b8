"""The broker under test is real for what txstream needs: transactions, isolation, offsets."""
from __future__ import annotations

import subprocess
import sys

from txstream.tools.broker_check import transaction_round_trip


def test_read_committed_hides_aborted_and_open_transactions(bootstrap_servers: str) -> None:
    result = transaction_round_trip(bootstrap_servers)
    assert result.read_committed == [b"committed"]
    assert result.read_uncommitted == [b"aborted", b"committed", b"open"]


def test_offsets_sent_in_a_transaction_are_the_groups_committed_offsets(bootstrap_servers: str) -> None:
    result = transaction_round_trip(bootstrap_servers)
    assert result.committed_offset == result.sent_offset == 42


def test_kafka_check_command_reports_the_comparison(bootstrap_servers: str) -> None:
    out = subprocess.run([sys.executable, "-m", "txstream.cli", "kafka", "check",
                          "--bootstrap-servers", bootstrap_servers],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "read_committed   sees ['committed']" in out.stdout
    assert "honours transactions" in out.stdout


def test_a_property_override_is_the_local_brokers_last_word() -> None:
    """`overrides` (benchmarks/first_output.py sets Kafka's default rebalance delay) come after
    txstream's own properties; in a Java properties file the later line wins."""
    from txstream.local.cluster import LocalKafkaCluster

    cluster = LocalKafkaCluster(port=19092, data_dir="/nonexistent", overrides={"group.initial.rebalance.delay.ms": "3000"})
    lines = cluster._properties(cluster.nodes[0]).splitlines()  # noqa: SLF001
    assert lines.index("group.initial.rebalance.delay.ms=3000") > lines.index("group.initial.rebalance.delay.ms=0")
