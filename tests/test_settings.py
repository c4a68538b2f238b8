"""Settings are checked against the delivery guarantee on the driver, before Spark starts: a
client property that would quietly break it is refused with a message naming the property."""
from __future__ import annotations

import pytest

from processors.passthrough import PassThrough
from txstream.errors import SettingsError
from txstream.settings import resolve


def _resolve(guarantee: str = "exactly-once", **props: str):  # noqa: ANN202
    return resolve(PassThrough, bootstrap_servers="localhost:1", guarantee=guarantee,
                   inputs=["in"], output="out", librdkafka=props)


@pytest.mark.parametrize(("props", "named"), [
    ({"acks": "1"}, "acks=1"),
    ({"producer.acks": "0"}, "acks=0"),
    ({"enable.idempotence": "false"}, "enable.idempotence=false"),
    ({"max.in.flight.requests.per.connection": "6"}, "max.in.flight.requests.per.connection=6"),
    ({"producer.max.in.flight": "10"}, "max.in.flight=10"),
    ({"isolation.level": "read_uncommitted"}, "isolation.level=read_uncommitted"),
    ({"consumer.isolation.level": "read_uncommitted"}, "isolation.level=read_uncommitted"),
    ({"transactional.id": "mine"}, "transactional.id=mine"),
])
def test_properties_that_contradict_exactly_once_are_refused(props: dict, named: str) -> None:
    with pytest.raises(SettingsError, match=f"-X {named} contradicts --guarantee exactly-once"):
        _resolve(**props)


def test_what_is_compatible_passes_and_reaches_the_right_side() -> None:
    s = _resolve(**{"acks": "all", "enable.idempotence": "true", "max.in.flight.requests.per.connection": "5",
                    "isolation.level": "read_committed", "producer.linger.ms": "20"})
    assert s.producer_config["linger.ms"] == "20" and "linger.ms" not in s.consumer_config
    assert s.clients.producer()["acks"] == "all"
    # A transactional.id of the user's is only a contradiction where txstream sets its own.
    assert _resolve("at-least-once", **{"transactional.id": "mine"}).guarantee == "at-least-once"
    with pytest.raises(SettingsError, match="acks=1"):
        _resolve("at-least-once", acks="1")


def test_first_batch_records_must_not_be_negative() -> None:
    assert resolve(PassThrough, bootstrap_servers="localhost:9092").first_batch_records == 10_000
    assert resolve(PassThrough, bootstrap_servers="localhost:9092", first_batch_records=0).first_batch_records == 0
    with pytest.raises(SettingsError, match="first batch records"):
        resolve(PassThrough, bootstrap_servers="localhost:9092", first_batch_records=-1)


def test_state_snapshot_every_is_the_option_else_the_processors_else_200000() -> None:
    class Often(PassThrough):
        state_snapshot_every = 50

    assert resolve(PassThrough, bootstrap_servers="localhost:9092").state_snapshot_every == 200_000
    assert resolve(Often, bootstrap_servers="localhost:9092").state_snapshot_every == 50
    assert resolve(Often, bootstrap_servers="localhost:9092", state_snapshot_every=7).state_snapshot_every == 7
    with pytest.raises(SettingsError, match="state_snapshot_every must be a positive"):
        resolve(PassThrough, bootstrap_servers="localhost:9092", state_snapshot_every=-1)


def test_consumers_refetch_quickly_unless_the_user_says_otherwise() -> None:
    """librdkafka's 1 s fetch.queue.backoff.ms stalled every big read (kafka/config.py QUICK_REFETCH)."""
    s = _resolve()
    assert s.clients.consumer("g")["fetch.queue.backoff.ms"] == 10
    assert "fetch.queue.backoff.ms" not in s.clients.producer()
    mine = _resolve(**{"consumer.fetch.queue.backoff.ms": "500"})
    assert mine.clients.consumer("g")["fetch.queue.backoff.ms"] == "500"


def test_stable_readers_ask_again_quickly_unless_the_user_says_otherwise() -> None:
    """librdkafka waits retry.backoff.ms (100 ms) before asking again for offsets whose transaction
    markers are not written yet (kafka/config.py QUICK_STABLE_RETRY): the re-check's and the
    driver's stable reads get 10 ms, other clients keep librdkafka's default."""
    s = _resolve()
    reader = s.clients.stable_reader("g")
    assert (reader["retry.backoff.ms"], reader["isolation.level"], reader["enable.auto.commit"]) == (10, "read_committed", False)
    assert "retry.backoff.ms" not in s.clients.consumer("g") and "retry.backoff.ms" not in s.clients.producer()
    assert _resolve(**{"consumer.retry.backoff.ms": "250"}).clients.stable_reader("g")["retry.backoff.ms"] == "250"


def test_transactional_producers_linger_longer_unless_the_user_says_otherwise() -> None:
    """A transaction's output is invisible until its commit, which sends what waits at once
    (task/spec.py TRANSACTIONAL_LINGER): 100 ms there, 5 ms where output is visible when acknowledged."""
    from txstream.constants import EXACTLY_ONCE
    from txstream.kafka.config import KafkaClients
    from txstream.task.spec import PublishSpec, ReadSpec

    def spec(clients: KafkaClients) -> PublishSpec:
        return PublishSpec(read=ReadSpec(clients=clients, app_id="a", side_dir="s"), guarantee=EXACTLY_ONCE,
                           transaction_timeout_s=60, owner_dir=None)

    default = spec(KafkaClients("localhost:9092"))
    assert default.producer_config(transactional=True)["linger.ms"] == 100
    assert default.producer_config(transactional=False)["linger.ms"] == 5
    mine = spec(KafkaClients.from_properties("localhost:9092", {"producer.linger.ms": "20"}))
    assert mine.producer_config(transactional=True)["linger.ms"] == "20"
