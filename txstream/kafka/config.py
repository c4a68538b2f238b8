"""Client configuration, built in one place: bootstrap servers plus the user's properties.

Every Kafka client txstream makes -- the driver's member and admin client, the readers and
publishers in tasks, the offsets/verify/produce/consume commands -- gets its configuration from a
`KafkaClients`, so a property the user gives once (`-X`, `--command-config`, a processor's
`producer_config`/`consumer_config`) reaches all of them, security settings included.

Properties are librdkafka's. `producer.`/`consumer.` prefixes target one side, as on
`txstream run`; unprefixed ones go to every client. librdkafka's own log lines go to the
`txstream.librdkafka` logger, not over the user's terminal.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

LOG = logging.getLogger("txstream.librdkafka")
# librdkafka's connection chatter ("%3|...|FAIL|...") is for whoever debugs a client, not for a
# user's terminal: off unless `show_client_logs()` (the commands' --client-logs flag).
LOG.addHandler(logging.NullHandler())
LOG.propagate = False


def show_client_logs(enabled: bool = True) -> None:
    """Let librdkafka's own log lines reach the root logger (stderr under basicConfig), or not."""
    LOG.propagate = enabled
    if enabled and not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s")

# A new client's first request goes out on its bootstrap connection, which librdkafka retires as
# soon as the metadata names the real brokers; the retry waits for the next connection, spaced by
# reconnect.backoff.ms / 2 (default 100 ms; the Java client's is 50). Every fresh client (the
# first batch's producers and readers, a worker taking a new slot) pays it; broken connections
# still back off exponentially (reconnect.backoff.max.ms). The user's own value wins.
FAST_FIRST_CONNECT = {"reconnect.backoff.ms": 20}

# Every consumer here reads ranges as fast as it can, yet once its queue holds
# queued.min.messages librdkafka postpones each partition's next fetch by fetch.queue.backoff.ms
# (default 1 s) however soon the queue is drained, and a read sits in empty consume() calls.
# The user's own value wins.
QUICK_REFETCH = {"fetch.queue.backoff.ms": 10}

# A stable read of committed offsets (read_committed: KIP-447's require_stable) that meets a
# commit whose markers are not written yet gets UNSTABLE_OFFSET_COMMIT and is asked again after
# retry.backoff.ms (default 100 ms), though the markers follow within a few ms. Such reads are the
# re-check after a fencing init_transactions and the driver's read after a batch. Retries still
# back off exponentially to retry.backoff.max.ms when the broker is away. The user's own value wins.
QUICK_STABLE_RETRY = {"retry.backoff.ms": 10}

# Property names whose values are credentials (librdkafka's, the Java clients' and the schema
# registry client's): shown as REDACTED wherever txstream shows a configuration. Spark's own
# spark.redaction.regex default, widened to Kafka's names (docs/security.md).
SECRET_NAME = re.compile(r"(?i)password|secret|token|jaas|user\.info|key\.pem|passphrase|^ssl_key$|oauthbearer\.config")
REDACTED = "*********(redacted)"


def redacted(properties: Mapping[str, Any]) -> dict[str, Any]:
    """`properties` with every credential's value replaced by REDACTED."""
    return {k: REDACTED if SECRET_NAME.search(k) else v for k, v in properties.items()}


# Properties that only make sense on the consumer side and that librdkafka refuses (rather than
# ignores) on a producer or admin client.
_CONSUMER_ONLY = ("auto.offset.reset", "isolation.level", "group.id", "group.protocol",
                  "group.instance.id", "enable.auto.commit", "partition.assignment.strategy")


@dataclass(frozen=True, repr=False)
class KafkaClients:
    """Where Kafka is and how to reach it. Picklable: it travels to tasks inside the closures of
    their Spark jobs, never in a job's properties (task/spec.py). Its repr redacts credentials."""

    bootstrap_servers: str
    common: Mapping[str, Any] = field(default_factory=dict)         # every client
    producer_only: Mapping[str, Any] = field(default_factory=dict)  # `producer.`-prefixed
    consumer_only: Mapping[str, Any] = field(default_factory=dict)  # `consumer.`-prefixed

    @classmethod
    def from_properties(cls, bootstrap_servers: str, *sources: Mapping[str, Any] | None) -> KafkaClients:
        """Merge property sources (later ones win) and split them by `producer.`/`consumer.` prefix."""
        common: dict[str, Any] = {}
        producer: dict[str, Any] = {}
        consumer: dict[str, Any] = {}
        for source in sources:
            for key, value in (source or {}).items():
                if key.startswith("producer."):
                    producer[key[len("producer."):]] = value
                elif key.startswith("consumer."):
                    consumer[key[len("consumer."):]] = value
                else:
                    common[key] = value
        common.pop("bootstrap.servers", None)
        return cls(bootstrap_servers, common, producer, consumer)

    def __repr__(self) -> str:
        return (f"KafkaClients({self.bootstrap_servers!r}, common={redacted(self.common)}, "
                f"producer_only={redacted(self.producer_only)}, consumer_only={redacted(self.consumer_only)})")

    def _base(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap_servers, "logger": LOG, **FAST_FIRST_CONNECT}

    def admin(self, **defaults: Any) -> dict[str, Any]:
        """An AdminClient's configuration: the defaults, then every unprefixed property."""
        shared = {k: v for k, v in self.common.items() if k not in _CONSUMER_ONLY}
        return {**self._base(), **defaults, **shared}

    def consumer(self, group_id: str | None = None, **defaults: Any) -> dict[str, Any]:
        """A Consumer's configuration: the defaults, then the user's (consumer side wins)."""
        config = {**self._base(), **QUICK_REFETCH, **defaults, **self.common, **self.consumer_only}
        if group_id is not None:
            config["group.id"] = group_id
        return config

    def stable_reader(self, group_id: str, **defaults: Any) -> dict[str, Any]:
        """A Consumer's configuration for stable reads of `group_id`'s committed offsets
        (read_committed, no auto-commit, QUICK_STABLE_RETRY); the user's settings win."""
        return self.consumer(group_id, **{"isolation.level": "read_committed", "enable.auto.commit": False,
                                          **QUICK_STABLE_RETRY, **defaults})

    def producer(self, **defaults: Any) -> dict[str, Any]:
        """A Producer's configuration: the defaults, then the user's (producer side wins)."""
        shared = {k: v for k, v in self.common.items() if k not in _CONSUMER_ONLY}
        return {**self._base(), **defaults, **shared, **self.producer_only}

    def user_properties(self, side: str) -> dict[str, Any]:
        """What the user set for one side ("producer" or "consumer"), for validation."""
        only = self.producer_only if side == "producer" else self.consumer_only
        return {**self.common, **only}


def as_clients(where: str | KafkaClients) -> KafkaClients:
    """A KafkaClients from itself or from bare bootstrap servers (tests and scripts pass a string)."""
    return where if isinstance(where, KafkaClients) else KafkaClients(where)


def command_properties(command_config: str | Path | None, pairs: Iterable[str]) -> dict[str, str]:
    """A command's client properties: the --command-config file first, then each -X (later wins)."""
    return {**(load_properties(command_config) if command_config else {}), **parse_pairs(pairs)}


def parse_pairs(values: Iterable[str], option: str = "-X") -> dict[str, str]:
    """`key=value` strings as a dict; a malformed one is a ValueError naming the option."""
    out: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{option}: expected key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def load_properties(path: str | Path) -> dict[str, str]:
    """A Java-style properties file (what Kafka's tools take as --command-config).

    `key=value` or `key: value` per line, `#`/`!` comments, blank lines ignored; a trailing
    backslash continues a line. Enough for client settings (no unicode escapes)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"cannot read the properties file {path}: {exc.strerror or exc}") from None
    props: dict[str, str] = {}
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if not line or line.startswith(("#", "!")):
            continue
        if line.endswith("\\"):
            pending = line[:-1]
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if cut <= 0:
            raise ValueError(f"{path}: expected key=value, got {raw.strip()!r}")
        props[line[:cut].strip()] = line[cut + 1:].strip()
    return props
