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
