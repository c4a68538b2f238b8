"""`txstream topics ensure` (issue 16) against the real broker: the plan first, the topics a
processor declares created, an existing topic never changed (it says how it differs)."""
from __future__ import annotations

import uuid

import pytest
from click.testing import CliRunner
from confluent_kafka.admin import ConfigResource

from txstream.cli.main import main
from txstream.errors import topic_missing

PROCESSOR = "processors.enrich_orders:EnrichOrders"


@pytest.fixture
def names(admin):  # noqa: ANN001
    """Unique topic names for one test; whatever of them exists at the end is deleted."""
    tag = uuid.uuid4().hex[:8]
    chosen = {role: f"{role}-ensure-{tag}" for role in ("orders", "enriched", "dlq")}
    yield chosen
    existing = [n for n in chosen.values() if n in admin.list_topics(timeout=30).topics]
    if existing:
        admin.delete_topics(existing)


def ensure(bootstrap: str, names: dict, *extra: str):  # noqa: ANN201
    args = ["topics", "ensure", PROCESSOR, "--bootstrap-servers", bootstrap, "--input", names["orders"],
            "--output", names["enriched"], "--dead-letter-topic", names["dlq"], *extra]
    return CliRunner().invoke(main, args, catch_exceptions=False)


def visible(admin, topic: str) -> None:  # noqa: ANN001
    """Wait until the brokers' metadata lists a topic just created (the controller answers first)."""
    from tests.support.waiting import wait_until

    wait_until(lambda: topic in admin.list_topics(timeout=10).topics, 30, f"{topic} in the metadata")


def topics_now(admin) -> dict[str, int]:  # noqa: ANN001
    return {n: len(t.partitions) for n, t in admin.list_topics(timeout=30).topics.items()}


def config_of(admin, topic: str, key: str) -> str:  # noqa: ANN001
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return admin.describe_configs([resource])[resource].result(30)[key].value


def test_dry_run_prints_the_plan_and_creates_nothing(bootstrap_servers, admin, names) -> None:
    from confluent_kafka.admin import NewTopic

    admin.create_topics([NewTopic(names["orders"], 3, 1)])[names["orders"]].result(30)
    visible(admin, names["orders"])
    result = ensure(bootstrap_servers, names, "--dry-run")
    assert result.exit_code == 0, result.output
    lines = {line.split()[1]: line for line in result.stdout.splitlines()}
    assert "exists" in lines[names["orders"]] and "3 partitions" in lines[names["orders"]]
    for topic in (names["enriched"], names["dlq"]):
        assert " create " in lines[topic] and f"3 partitions (as input '{names['orders']}')" in lines[topic], lines
    assert "dry run: nothing created" in result.stderr
    now = topics_now(admin)
    assert names["enriched"] not in now and names["dlq"] not in now


def test_ensure_creates_the_declared_topics_then_refuses_to_change_them(bootstrap_servers, admin, names) -> None:
    result = ensure(bootstrap_servers, names, "--partitions", "2", "--config", "retention.ms=86400000")
    assert result.exit_code == 0, result.output
    # The input was missing too: created with the rest, every one as asked.
    assert all(" create " in line for line in result.stdout.splitlines()), result.stdout
    assert f"created {', '.join(sorted(names.values()))}" in result.stderr
    now = topics_now(admin)
    assert [now.get(n) for n in names.values()] == [2, 2, 2]
    assert all(config_of(admin, n, "retention.ms") == "86400000" for n in names.values())

    again = ensure(bootstrap_servers, names, "--partitions", "2", "--config", "retention.ms=86400000")
    assert again.exit_code == 0, again.output
    assert "nothing to create" in again.stderr
    assert all(" exists " in line for line in again.stdout.splitlines()), again.stdout

    # Asked for something else: it says how each topic differs, and changes and creates nothing.
    refused = ensure(bootstrap_servers, names, "--partitions", "4", "--config", "retention.ms=1000",
                     "--replication-factor", "1")
    assert refused.exit_code == 1, refused.output
    for name in names.values():
        assert f"topic {name!r} has 2 partitions, 4 asked, has retention.ms=86400000, 1000 asked" in refused.stderr, \
            refused.stderr
    assert "never alters" in refused.stderr
    assert [topics_now(admin).get(n) for n in names.values()] == [2, 2, 2]
    assert config_of(admin, names["enriched"], "retention.ms") == "86400000"
    dry = ensure(bootstrap_servers, names, "--partitions", "4", "--dry-run")
    assert dry.exit_code == 1 and "3 existing topic(s) differ" in dry.stderr, dry.output


def test_without_partitions_new_topics_follow_the_input(bootstrap_servers, admin, names) -> None:
    from confluent_kafka.admin import NewTopic

    admin.create_topics([NewTopic(names["orders"], 3, 1)])[names["orders"]].result(30)
    visible(admin, names["orders"])
    result = ensure(bootstrap_servers, names)
    assert result.exit_code == 0, result.output
    now = topics_now(admin)
    assert (now[names["enriched"]], now[names["dlq"]]) == (3, 3)


def test_the_missing_topic_error_names_the_command() -> None:
    one = topic_missing("output", "orders-enriched", "localhost:9092")
    assert one.startswith("output topic 'orders-enriched' does not exist on localhost:9092; create it first")
    assert "txstream topics ensure PROCESSOR" in one
    two = topic_missing("input", "orders", "", [("dead-letter", "orders-dlq")])
    assert two.startswith("input topic 'orders', dead-letter topic 'orders-dlq' do not exist; create them first")


def test_txstreams_own_topics_are_created_or_checked_in_one_way(admin, names) -> None:  # noqa: ANN001
    """kafka/internal_topics.py ensure_topic: creates with the config and waits for the leaders;
    a second call (another instance's race included) is no error; a state topic with other
    partitions is refused; a topic that may grow gets the partitions it lacks."""
    from txstream.errors import InfrastructureError
    from txstream.kafka.internal_topics import ensure_topic

    name = names["orders"]
    assert ensure_topic(admin, name, 2, {"cleanup.policy": "compact"}, app_id="ensure") is True
    assert topics_now(admin)[name] == 2 and config_of(admin, name, "cleanup.policy") == "compact"
    assert ensure_topic(admin, name, 2, {"cleanup.policy": "compact"}, app_id="ensure") is False
    with pytest.raises(InfrastructureError, match=f"the state topic {name} has 2 partitions, not 3"):
        ensure_topic(admin, name, 3, {}, app_id="ensure", what="state topic")
    assert ensure_topic(admin, name, 3, {}, app_id="ensure", grow=True) is False
    assert topics_now(admin)[name] == 3
    assert ensure_topic(admin, name, 1, {}, app_id="ensure", grow=True) is False   # more than asked: kept


def test_a_table_topic_is_created_compacted_and_a_plain_one_is_said_to_differ(admin, names) -> None:  # noqa: ANN001
    """Processor.tables (docs/joins.md): ensure creates a table's topic with cleanup.policy=compact
    and says so of an existing one that is not."""
    from confluent_kafka.admin import NewTopic

    from txstream.tools import topics as tt

    table, plain = names["orders"] + "-table", names["orders"] + "-plain"
    try:
        states = tt.plan(admin, tt.declared([names["orders"]], None, None, [table]), partitions=2)
        assert [(s.role, s.action) for s in states] == [("input", "create"), ("table", "create")]
        assert "cleanup.policy=compact" in states[1].describe() and "cleanup" not in states[0].describe()
        tt.create(admin, states)
        visible(admin, table)
        assert config_of(admin, table, "cleanup.policy") == "compact"
        assert config_of(admin, names["orders"], "cleanup.policy") == "delete"
        admin.create_topics([NewTopic(plain, 1, 1)])[plain].result(30)
        visible(admin, plain)
        (state,) = tt.plan(admin, tt.declared([], None, None, [plain]))
        assert state.differences == ["has cleanup.policy=delete, compact asked"]
    finally:
        admin.delete_topics([t for t in (table, plain) if t in admin.list_topics(timeout=30).topics])
