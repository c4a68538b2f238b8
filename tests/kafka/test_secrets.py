"""Credentials never leave the process in the clear (issue 54): the configuration's repr and the
job property a batch's tasks read. The end-to-end scan of a secured run's files is in
tests/cli/test_client_properties.py."""
from __future__ import annotations

import base64
import pickle
import zlib

import pytest

from tests.support.secret_scan import wrapped
from txstream.kafka.config import REDACTED, KafkaClients, redacted
from txstream.serde.registry import RegistryConfig
from txstream.task.spec import (
    JOB_SPEC_PROPERTY,
    FromJob,
    JobSpec,
    PartitionPlan,
    PublishSpec,
    ReadSpec,
    encode,
    resolve,
)

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


def _job_spec(clients: KafkaClients, registry: RegistryConfig) -> JobSpec:
    """A stateful batch's JobSpec: every part a task can read, each holding the credentials."""
    import pyarrow as pa

    from txstream.operators.base import MergeSpec
    from txstream.state.operator import OperatorDescription
    from txstream.task.units import UnitSpec

    read = ReadSpec(clients=clients, app_id="app", side_dir="side", registry=registry,
                    plans=(PartitionPlan("in", 0, 0, 10, None, "app-0"),))
    publish = PublishSpec(read=read, guarantee="exactly-once", transaction_timeout_s=60.0, owner_dir=None)
    unit = UnitSpec(publish=publish, batch_id=3, units=2, plan_id="p")
    description = OperatorDescription("agg", "aggregate", 2, "update", ["k"])
    merge = MergeSpec("app", clients, "side", 3, description, ("k",), ("_txs_p0",), pa.schema([("k", pa.string())]))
    return JobSpec(read, publish, unit, merge)


def test_a_batch_jobs_property_carries_no_credential() -> None:
    clients = KafkaClients.from_properties("broker:9092", PROPERTIES)
    registry = RegistryConfig("http://registry:8081", (("basic.auth.user.info", f"alice:{SECRET}"),))
    job = _job_spec(clients, registry)
    text = encode(job)
    assert wrapped(text.encode(), SECRET.encode()) is None
    back = pickle.loads(zlib.decompress(base64.b64decode(text)))
    assert back.read.plans == job.read.plans and back.read.clients != clients and back.read.registry != registry
    assert back.unit.publish.read.clients != clients and back.merge.clients != clients


@pytest.mark.parametrize("part", ["read", "publish", "unit", "merge"])
def test_a_task_gets_its_part_of_the_jobs_spec_with_the_credentials_of_its_closure(monkeypatch, part) -> None:
    import pyspark

    clients = KafkaClients.from_properties("broker:9092", PROPERTIES)
    registry = RegistryConfig("http://registry:8081", (("basic.auth.user.info", f"alice:{SECRET}"),))
    job = _job_spec(clients, registry)
    properties = {JOB_SPEC_PROPERTY: encode(job)}

    class Context:
        @staticmethod
        def getLocalProperty(name: str) -> str | None:
            return properties.get(name)

    monkeypatch.setattr(pyspark.TaskContext, "get", staticmethod(lambda: Context))
    got = resolve(FromJob(part, clients, registry))
    assert got == getattr(job, part)


def test_a_task_whose_job_carries_another_kind_of_spec_fails_as_machinery(monkeypatch) -> None:
    import pyspark

    from txstream.errors import InfrastructureError

    clients = KafkaClients("broker:9092")
    narrow = JobSpec(ReadSpec(clients=clients, app_id="app", side_dir="side"))
    monkeypatch.setattr(pyspark.TaskContext, "get", staticmethod(
        lambda: type("C", (), {"getLocalProperty": staticmethod(lambda name: encode(narrow))})))
    with pytest.raises(InfrastructureError, match="carries no 'unit' spec"):
        resolve(FromJob("unit", clients))
    monkeypatch.setattr(pyspark.TaskContext, "get", staticmethod(lambda: None))
    with pytest.raises(InfrastructureError, match="carries no txstream.batch.spec property"):
        resolve(FromJob("read", clients))
