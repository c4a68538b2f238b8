"""Credentials never leave the process in the clear (issue 54): the configuration's repr and the
job property a narrow batch's tasks read. The end-to-end scan of a secured run's files is in
tests/cli/test_client_properties.py."""
from __future__ import annotations

import base64
import pickle
import zlib

import pytest

from tests.support.secret_scan import wrapped
from txstream.kafka.config import REDACTED, KafkaClients, redacted
from txstream.serde.registry import RegistryConfig
from txstream.task.spec import PartitionPlan, PublishSpec, ReadSpec, encode

SECRET = "s3cret-Value-42"
PROPERTIES = {"sasl.password": SECRET, "producer.ssl.key.password": SECRET, "consumer.sasl.jaas.config": SECRET,
              "sasl.oauthbearer.client.secret": SECRET, "ssl.key.pem": SECRET, "sasl.username": "alice",
              "security.protocol": "SASL_SSL", "ssl.key.location": "/etc/key.pem"}


@pytest.mark.parametrize("name", ["sasl.password", "ssl.key.password", "ssl.keystore.password", "sasl.jaas.config",
                                  "sasl.oauthbearer.client.secret", "ssl.key.pem", "ssl_key", "bearer.auth.token",
                                  "basic.auth.user.info", "sasl.oauthbearer.config"])
def test_credential_names_are_redacted(name: str) -> None:
    assert redacted({name: SECRET}) == {name: REDACTED}


@pytest.mark.parametrize("name", ["sasl.username", "ssl.key.location", "ssl.ca.location", "security.protocol",
                                  "sasl.mechanism", "linger.ms"])
def test_other_names_are_shown(name: str) -> None:
    assert redacted({name: "v"}) == {name: "v"}


def test_the_clients_repr_shows_no_credential() -> None:
    clients = KafkaClients.from_properties("broker:9092", PROPERTIES)
    text = repr(clients) + str(clients)
    assert SECRET not in text
    assert "alice" in text and "broker:9092" in text and "/etc/key.pem" in text


def test_the_registry_settings_repr_shows_no_credential() -> None:
    registry = RegistryConfig("http://registry:8081", (("basic.auth.user.info", f"alice:{SECRET}"),
                                                       ("bearer.auth.token", SECRET)))
    assert SECRET not in repr(registry) + str(registry) and "registry:8081" in repr(registry)


def test_a_batch_jobs_property_carries_no_credential() -> None:
    clients = KafkaClients.from_properties("broker:9092", PROPERTIES)
    registry = RegistryConfig("http://registry:8081", (("basic.auth.user.info", f"alice:{SECRET}"),))
    read = ReadSpec(clients=clients, app_id="app", side_dir="side", registry=registry,
                    plans=(PartitionPlan("in", 0, 0, 10, None, "app-0"),))
    spec = PublishSpec(read=read, guarantee="exactly-once", transaction_timeout_s=60.0, owner_dir=None)
    text = encode(spec)
    assert wrapped(text.encode(), SECRET.encode()) is None
    back = pickle.loads(zlib.decompress(base64.b64decode(text)))
    assert back.read.plans == read.plans and back.read.clients != clients and back.read.registry is None
