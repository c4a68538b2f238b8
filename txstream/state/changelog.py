"""The changelog: one compacted topic per app and stateful operator, partition i for unit i,
written in unit i's transaction with its output and its marker (docs/state.md).

A record is key = the state key, value = the key's new encoded value or None (a tombstone: the key
was deleted), and one header, `txstream.state: <operator>/<batch>/<unit>`, naming who wrote it
(one header rather than three: each header is a separate allocation per record in the client and
a name the broker stores). Restore checks the batch against the unit's marker.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from txstream.kafka.config import KafkaClients
from txstream.state import partition
from txstream.state.errors import ForeignStateRecord, StateStoreError

HEADER = "txstream.state"
_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def check_operator(operator: str) -> str:
    """Operator names go into topic names and headers: Kafka's topic characters, no '/'."""
    if not _NAME.match(operator):
        raise StateStoreError(f"state operator name {operator!r}: use letters, digits, '.', '_' and '-'")
    return operator


def changelog_topic(app_id: str, operator: str) -> str:
    return f"{app_id}.{check_operator(operator)}.changelog"


def changelog_end(clients: KafkaClients, app_id: str, operator: str, unit: int, timeout: float = 30.0) -> int:
    """Unit's changelog end (high watermark): read after batch s committed and before s+1 began,
    the changelog offset a snapshot of the state after s covers."""
    return partition.end_offset(clients, app_id, changelog_topic(app_id, operator), unit, timeout)


def tombstone_retention_ms(clients: KafkaClients, app_id: str, operator: str, timeout: float = 30.0) -> int:
    """The changelog's delete.retention.ms (how long a tombstone outlives its first cleaning), as
    the broker says it, kept a few minutes per process: read only by a restore with a tail."""
    import time

    from txstream.kafka.lookups import admin_client, kafka_call

    topic = changelog_topic(app_id, operator)
    key = (clients.bootstrap_servers, topic)
    cached = _RETENTION.get(key)
    if cached is not None and time.monotonic() - cached[1] < _RETENTION_TTL_S:
        return cached[0]
    from confluent_kafka.admin import ConfigResource

    admin = admin_client(clients)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries = kafka_call(admin, f"reading the config of {topic}",
                         lambda: admin.describe_configs([resource], request_timeout=timeout)[resource].result(timeout),
                         timeout)
    entry = entries.get("delete.retention.ms")
    value = int(entry.value) if entry is not None and entry.value is not None else DEFAULT_DELETE_RETENTION_MS
    _RETENTION[key] = (value, time.monotonic())
    return value


def snapshot_topic(app_id: str, operator: str) -> str:
    return f"{app_id}.{check_operator(operator)}.snapshots"


# What Kafka Streams gives its changelogs, with `delete` added: retention.ms=-1 keeps every live
# key. A tombstone is removed delete.retention.ms after the cleaner first passed it (the broker's
# log.cleaner.delete.retention.ms, 24 h, unless set): a restore source (snapshot, local copy) that
# covers the changelog only to before a tombstone that old would miss the deletion, so restore
# refuses such a source (`tombstone_retention_ms`, state/restore.py).
CHANGELOG_CONFIG = {"cleanup.policy": "compact,delete", "retention.ms": "-1"}
DEFAULT_DELETE_RETENTION_MS = 86_400_000   # Kafka's log.cleaner.delete.retention.ms
_RETENTION: dict[tuple[str, str], tuple[int, float]] = {}   # per process: (ms, when read)
_RETENTION_TTL_S = 300.0
SNAPSHOT_CONFIG = {"cleanup.policy": "compact"}


def writer_header(operator: str, batch: int, unit: int) -> bytes:
    return f"{operator}/{batch}/{unit}".encode()


@dataclass(frozen=True)
class Writer:
    """Who wrote a changelog or snapshot record."""

    operator: str
    batch: int
    unit: int


class HeaderReader:
    """Reads `txstream.state` headers, each distinct value parsed once (a batch writes thousands
    of records with the same one), and refuses records of another operator or unit."""

    def __init__(self, operator: str, unit: int, topic: str, name: str = HEADER) -> None:
        self.operator, self.unit, self.topic, self.name = operator, unit, topic, name
        self._seen: dict[bytes, int] = {}

    def batch_of(self, record: Any) -> int:
        """The batch that wrote `record` (a confluent_kafka Message)."""
        headers = record.headers()
        if headers and len(headers) == 1 and headers[0][0] == self.name:
            value = headers[0][1]
        else:
            value = next((v for k, v in headers or () if k == self.name), None)
        batch = self._seen.get(value)
        if batch is None:
            if value is None:
                raise ForeignStateRecord(f"{self.topic}[{self.unit}]@{record.offset()} has no {self.name} header: "
                                         "the topic holds records txstream did not write")
            batch = self._seen[value] = self._parse(value, record.offset())
        return batch

    def _parse(self, value: bytes, offset: int) -> int:
        try:
            operator, batch, unit = value.decode().rsplit("/", 2)
            writer = Writer(operator, int(batch), int(unit))
        except (UnicodeDecodeError, ValueError) as exc:
            raise ForeignStateRecord(f"{self.topic}[{self.unit}]@{offset}: unreadable {self.name} header "
                                     f"{value!r}") from exc
        if writer.operator != self.operator or writer.unit != self.unit:
            raise ForeignStateRecord(f"{self.topic}[{self.unit}]@{offset} was written by operator "
                                     f"{writer.operator!r}, unit {writer.unit}, not by operator "
                                     f"{self.operator!r}, unit {self.unit}")
        return writer.batch


class ChangelogWriter:
    """Turns one batch's changes into changelog records, produced by the unit's transactional
    producer (inside its transaction: the caller begins and commits it)."""

    def __init__(self, app_id: str, operator: str, unit: int) -> None:
        self.topic = changelog_topic(app_id, operator)
        self.operator, self.unit = operator, unit

    def records(self, changes: Mapping[bytes, bytes | None], batch: int) -> Iterable[tuple[bytes, bytes | None, list]]:
        headers = [(HEADER, writer_header(self.operator, batch, self.unit))]
        return ((key, value, headers) for key, value in changes.items())

    def produce(self, producer: Any, changes: Mapping[bytes, bytes | None], batch: int) -> int:
        """Produce the batch's changes to partition `unit`; returns how many."""
        produce, topic, unit = producer.produce, self.topic, self.unit
        count = 0
        for key, value, headers in self.records(changes, batch):
            while True:
                try:
                    produce(topic, value, key, partition=unit, headers=headers)
                    break
                except BufferError:
                    producer.poll(0.05)   # the local queue is full: let deliveries drain it
            count += 1
        producer.poll(0)
        return count
