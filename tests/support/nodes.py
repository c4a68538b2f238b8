"""The chaos tests' view of a LocalKafkaCluster's nodes: who leads a partition, who coordinates a
transactional id, and a node restart that waits until every partition is fully replicated again.

Test-only: `txstream kafka up` never restarts single nodes, so these live beside the chaos tests
rather than in txstream.local.cluster.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka.admin import AdminClient

from tests.support.waiting import wait_until
from txstream.local.cluster import LocalKafkaCluster

_ADMINS: dict[str, AdminClient] = {}   # one per cluster, by its bootstrap servers


def _admin(cluster: LocalKafkaCluster) -> AdminClient:
    admin = _ADMINS.get(cluster.bootstrap_servers)
    if admin is None:
        admin = _ADMINS[cluster.bootstrap_servers] = AdminClient(
            {"bootstrap.servers": cluster.bootstrap_servers, "log_level": 0})
    return admin


def leader_of(cluster: LocalKafkaCluster, topic: str, partition: int, timeout: float = 30.0) -> int:
    """The node id leading `topic[partition]`, from cluster metadata (waits for a leader)."""
    last = ["no answer"]

    def leader() -> int | None:
        try:
            meta = _admin(cluster).list_topics(topic=topic, timeout=5)
        except Exception as exc:  # metadata is retried until the deadline
            last[0] = str(exc)
            return None
        tmeta = meta.topics.get(topic)
        if tmeta is None or tmeta.error is not None or partition not in tmeta.partitions:
            last[0] = str(tmeta.error if tmeta is not None else "unknown topic")
            return None
        last[0] = "no leader"
        found = tmeta.partitions[partition].leader
        return found + 1 if found >= 0 else None   # node 0 is a leader too: +1 keeps it truthy

    return wait_until(leader, timeout, f"a leader for {topic}[{partition}]", state=lambda: last[0]) - 1


def transaction_coordinator(cluster: LocalKafkaCluster, transactional_id: str, timeout: float = 30.0) -> int:
    """The node coordinating `transactional_id`: the leader of its __transaction_state partition.
    The topic is created on the first transactional producer's init, so call this after
    init_transactions."""
    deadline = time.monotonic() + timeout

    def state_topic():
        tmeta = _admin(cluster).list_topics(topic="__transaction_state", timeout=10).topics.get("__transaction_state")
        return tmeta if tmeta is not None and tmeta.error is None and tmeta.partitions else None

    tmeta = wait_until(state_topic, timeout, "__transaction_state (made by the first transactional "
                       "producer's init_transactions)")
    partition = transaction_state_partition(transactional_id, len(tmeta.partitions))
    return leader_of(cluster, "__transaction_state", partition, max(1.0, deadline - time.monotonic()))


def java_string_hash(text: str) -> int:
    """Java's String.hashCode(): 31*h + c over UTF-16 code units, 32-bit two's complement."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def transaction_state_partition(transactional_id: str, partitions: int = 10) -> int:
    """The __transaction_state partition owning an id as the broker computes it:
    Utils.abs(id.hashCode()) % partitions, where Kafka's Utils.abs maps Integer.MIN_VALUE to 0."""
    h = java_string_hash(transactional_id)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def fully_replicated(cluster: LocalKafkaCluster) -> tuple[bool, str]:
    """(True, "") when every node is in the metadata and every partition, internal topics
    included, has a leader and all its replicas in sync; else (False, what is missing)."""
    try:
        meta = _admin(cluster).list_topics(timeout=5)
    except Exception as exc:
        return False, f"metadata: {exc}"
    missing = {n.node_id for n in cluster.nodes} - set(meta.brokers)
    if missing:
        return False, f"node(s) {sorted(missing)} not in metadata"
    for name, tmeta in meta.topics.items():
        if tmeta.error is not None:
            return False, f"{name}: {tmeta.error}"
        for pid, pmeta in tmeta.partitions.items():
            if pmeta.leader < 0 or set(pmeta.isrs) != set(pmeta.replicas):
                return False, (f"{name}[{pid}] leader {pmeta.leader} isr {sorted(pmeta.isrs)} "
                               f"replicas {sorted(pmeta.replicas)}")
    return True, ""


def wait_fully_replicated(cluster: LocalKafkaCluster, timeout: float = 120.0) -> float:
    """Wait until `fully_replicated`; returns the seconds waited."""
    began = time.monotonic()
    wait_until(lambda: fully_replicated(cluster)[0], timeout,
               f"the cluster at {cluster.bootstrap_servers} fully replicated",
               every=0.25, state=lambda: fully_replicated(cluster)[1])
    return time.monotonic() - began


@dataclass(frozen=True)
class Bounce:
    """Where a node restart's time went: stopping, starting, catching up to full ISR (seconds)."""

    node: int
    hard: bool
    stop: float
    start: float
    replicate: float

    @property
    def total(self) -> float:
        return self.stop + self.start + self.replicate

    def __str__(self) -> str:
        return (f"node {self.node} {'killed' if self.hard else 'stopped'} in {self.stop:.1f}s, "
                f"started in {self.start:.1f}s, fully replicated in {self.replicate:.1f}s")


def bounce(cluster: LocalKafkaCluster, node_id: int, hard: bool = False, timeout: float = 120.0) -> Bounce:
    """Stop one node (SIGKILL when hard) and start it again; return once it is back in the
    metadata and every partition has its full ISR again; `timeout` for the start, and again for
    the catching up."""
    began = time.monotonic()
    cluster.stop_node(node_id, hard=hard)
    stopped = time.monotonic()
    cluster.start_node(node_id, wait=True, timeout=timeout)
    started = time.monotonic()
    # Its own `timeout`, not what the start left of it: on a loaded machine a JVM start can take
    # most of it (1 s was left at load 60, and the catching up "timed out" while under way).
    wait_fully_replicated(cluster, timeout)
    return Bounce(node_id, hard, stopped - began, started - stopped, time.monotonic() - started)
