"""The broker under test is real for what txstream needs: transactions, isolation, offsets."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.waiting import wait_until
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


@pytest.mark.integration   # starts a broker of its own, with the request log
def test_the_request_log_names_each_request_and_its_partitions(tmp_path) -> None:
    """`request_log` (benchmarks/experiments/broker_requests.py): a transaction of records to two partitions
    shows in the log as what the broker did for it, its own markers apart."""
    import time

    from confluent_kafka import Producer

    from benchmarks.common import create_topics
    from benchmarks.experiments.broker_requests import read_requests
    from txstream.local.cluster import LocalKafkaCluster, free_port_block

    cluster = LocalKafkaCluster(port=free_port_block(1), data_dir=str(tmp_path / "kafka"), die_with_parent=True,
                                request_log=True)
    since = int(time.time() * 1000)
    bootstrap = cluster.start()
    try:
        create_topics(bootstrap, ["logged"], 2)
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "logged-txn", "linger.ms": 0})
        producer.init_transactions(60)
        producer.begin_transaction()
        for partition in (0, 1):
            producer.produce("logged", b"v", partition=partition)
        producer.flush(30)
        producer.commit_transaction(60)
        log = tmp_path / "kafka" / "node-1" / "requests.log"
        assert str(log) == cluster.request_log_file(cluster.nodes[0])
        def logged():   # the markers are written after EndTxn returns
            totals = read_requests(log, since, int(time.time() * 1000) + 60_000)
            return totals if "WRITE_TXN_MARKERS (broker)" in totals else None

        totals = wait_until(logged, 30, "the transaction's markers in the request log",
                            state=lambda: sorted(read_requests(log, since, int(time.time() * 1000) + 60_000)))
        producer.close()
    finally:
        cluster.stop()
    assert {"PRODUCE", "END_TXN", "ADD_PARTITIONS_TO_TXN", "WRITE_TXN_MARKERS (broker)"} <= set(totals), sorted(totals)
    assert totals["PRODUCE"].partitions == 2 and totals["END_TXN"].requests == 1
    assert totals["ADD_PARTITIONS_TO_TXN"].partitions >= 2   # the client's, before it produces
    markers = totals["WRITE_TXN_MARKERS (broker)"]
    assert markers.partitions == 2 and markers.local_ms > 0
