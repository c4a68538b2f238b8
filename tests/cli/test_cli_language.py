"""The commands speak one language: one timeout policy (documented in --help, kept against a
dead broker), `--dead-letter-topic` wherever a dead-letter topic is named, `txstream --version`,
an app id that does not exist named as such; and `produce` says what it wrote when Kafka goes."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, KafkaException, TopicPartition

from tests.support.waiting import wait_until
from txstream.cli.main import main
from txstream.cli.options import DEFAULT_TIMEOUT_S
from txstream.local.cluster import free_port_block

REPO = Path(__file__).resolve().parents[2]


def _commands(group: click.Group, prefix: tuple[str, ...] = ()):  # noqa: ANN202
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _commands(command, (*prefix, name))
        else:
            yield (*prefix, name), command


def _option(command: click.Command, name: str) -> click.Option | None:
    return next((p for p in command.params if isinstance(p, click.Option) and name in p.opts), None)


def test_every_timeout_has_the_same_default_and_help() -> None:
    with_timeout = {path: _option(cmd, "--timeout") for path, cmd in _commands(main)}
    with_timeout = {path: option for path, option in with_timeout.items() if option is not None}
    assert {("produce",), ("consume",), ("run",), ("status",), ("kafka", "check"), ("topics", "create")} \
        <= set(with_timeout), sorted(with_timeout)
    for path, option in with_timeout.items():
        if path == ("verify",):   # cli/verify.py is the verify engineer's
            continue
        assert option.default == DEFAULT_TIMEOUT_S, path
        assert option.help and "Seconds to wait for Kafka" in option.help, path
    assert f"--timeout SECONDS (default {DEFAULT_TIMEOUT_S:g})" in " ".join(CliRunner().invoke(main, ["--help"]).output.split())


def test_dead_letter_topics_are_named_one_way() -> None:
    for path, command in _commands(main):
        for option in (p for p in command.params if isinstance(p, click.Option)):
            for name in option.opts:
                if "dead" in name:
                    assert name == "--dead-letter-topic" or path == ("verify",), (path, option.opts)


def test_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and result.output.startswith("txstream "), result.output


def _txstream(*args: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "txstream.cli", *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=timeout)
    return done, time.monotonic() - began


@pytest.mark.parametrize("command", [
    ["run", "processors.enrich_orders:EnrichOrders"],
    ["produce", "orders"],
    ["consume", "orders"],
    ["status", "--app-id", "app"],
    ["state", "show", "--app-id", "app"],
    ["topics", "create", "orders"],
])
def test_an_unreachable_broker_is_reported_within_the_timeout(command: list[str]) -> None:
    nowhere = f"localhost:{free_port_block(1)}"
    done, took = _txstream(*command, "-b", nowhere, "--timeout", "3")
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: Cannot reach Kafka at") and "within 3s" in last, done.stderr
    assert "Traceback" not in done.stderr
    assert took < 3 + 15, f"{command[0]} took {took:.1f}s to report an unreachable broker"
    if command[0] == "run":   # the app id comes first, before anything can fail
        assert done.stderr.startswith("app id txstream-enrich-orders: orders -> orders-enriched"), done.stderr


def test_status_of_an_unknown_app_lists_the_known_ones(bootstrap_servers: str, make_topic) -> None:  # noqa: ANN001
    topic = make_topic("payments", 1)
    real = f"txstream-big-payments-{uuid.uuid4().hex[:6]}"
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": real})

    def committed() -> bool:
        try:   # a fresh broker's group coordinator may still be loading
            consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
            return True
        except KafkaException:
            return False

    try:
        wait_until(committed, 60, f"an offset committed for {real}")
    finally:
        consumer.close()
    typo = real.removeprefix("txstream-")
    result = CliRunner().invoke(main, ["status", "--app-id", typo, "-b", bootstrap_servers])
    assert result.exit_code == 1, result.output
    assert f"no app {typo!r}" in result.output and f"did you mean {real!r}" in result.output, result.output
    assert real in result.output.split("app ids with committed offsets:")[1]
    found = CliRunner().invoke(main, ["status", "--app-id", real, "-b", bootstrap_servers])
    assert found.exit_code == 0 and topic in found.output, found.output
    # offsets show says the same of a typo; with --topic it shows the topic for a group yet to commit.
    shown = CliRunner().invoke(main, ["offsets", "show", "--app-id", typo, "-b", bootstrap_servers])
    assert shown.exit_code == 1 and f"did you mean {real!r}" in shown.output, shown.output
    planned = CliRunner().invoke(main, ["offsets", "show", "--app-id", typo, "--topic", topic, "-b", bootstrap_servers])
    assert planned.exit_code == 0 and topic in planned.output, planned.output


def test_produce_says_what_it_wrote_when_the_broker_dies(kafka_cluster_factory, tmp_path: Path) -> None:  # noqa: ANN001
    """A broker killed while `produce` streams its input: the command ends within its timeout and
    says how many records were written and how many were not."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from txstream.kafka.lookups import watermarks

    cluster = kafka_cluster_factory(1, controlled=True)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    admin.create_topics([NewTopic("lines", 1, 1)])["lines"].result(30)
    wait_until(lambda: "lines" in admin.list_topics(timeout=10).topics, 30, "the topic in the metadata")
    proc = subprocess.Popen([sys.executable, "-m", "txstream.cli", "produce", "lines", "-b", cluster.bootstrap_servers,
                             "--timeout", "4"], cwd=REPO, stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for i in range(100):
        proc.stdin.write(json.dumps({"n": i}) + "\n")
    proc.stdin.flush()
    wait_until(lambda: watermarks(admin, [("lines", 0)], 10)[("lines", 0)].log_end == 100, 60, "100 records written")
    for node in cluster.local.nodes:
        cluster.local.stop_node(node.node_id, hard=True)
    for i in range(100, 150):
        proc.stdin.write(json.dumps({"n": i}) + "\n")
    proc.stdin.close()
    began = time.monotonic()
    code = proc.wait(60)
    error = proc.stderr.read()
    assert code == 1, error
    # The broker wrote the first 100; their acknowledgements may die with it (a kill right after
    # the append), so the command may count fewer of them acknowledged, never more.
    said = re.search(r"producing to lines: (\d+) of 150 records acknowledged, (\d+) not", error)
    assert said, error
    acknowledged, missing = int(said[1]), int(said[2])
    assert acknowledged <= 100 and acknowledged + missing == 150, error
    assert "Message timed out" in error and "may or may not be in the topic" in error, error
    assert time.monotonic() - began < 4 * 2 + 10, "produce waited longer than its timeout allows"


def test_produce_stops_reading_its_input_once_kafka_stops_acknowledging(kafka_cluster_factory) -> None:  # noqa: ANN001
    """A large input and a broker that dies: the rest of the input is not read (each record would
    only wait its timeout too); the error says how far the input was read."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from txstream.errors import KafkaFailure
    from txstream.tools.topic_io import produce_lines

    cluster = kafka_cluster_factory(1, controlled=True)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    admin.create_topics([NewTopic("big", 1, 1)])["big"].result(30)
    wait_until(lambda: "big" in admin.list_topics(timeout=10).topics, 30, "the topic in the metadata")
    total, pulled = 3_000_000, [0]

    def lines():
        for i in range(total):
            pulled[0] += 1
            if i == 1000:
                for node in cluster.local.nodes:
                    cluster.local.stop_node(node.node_id, hard=True)
            yield f'{{"n": {i}}}'

    began = time.monotonic()
    with pytest.raises(KafkaFailure, match=r"the input was read up to its record \d+ only") as failed:
        produce_lines(cluster.bootstrap_servers, "big", lines(), timeout=3)
    assert pulled[0] < total // 2, (pulled[0], str(failed.value))
    assert time.monotonic() - began < 60, "produce went on reading after Kafka stopped answering"
