"""Creating txstream's own topics (the wide protocol's markers, the state's changelogs, snapshots
and descriptions): the one way, so each gets the same replication, the same answer to a race
with another instance, and the same refusal when the principal may not create it.

`ensure_topic` creates a topic or checks the one there: partitions as asked (or, for a topic
that may grow, at least as many: it adds the missing ones), replication min(3, brokers), the
config given at creation (an existing topic's config is the operator's business: it is left as
it is). TOPIC_ALREADY_EXISTS is success (another instance created it first); an authorisation
refusal is the AccessDenied that names the ACL (kafka/acls.py); it returns once every
partition has a leader in the brokers' metadata, so the first produce or fetch finds it.
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from txstream.errors import InfrastructureError
from txstream.kafka.acls import create_refused
from txstream.kafka.lookups import cluster_topics


def ensure_topic(admin: Any, name: str, partitions: int, config: Mapping[str, str], *, app_id: str,
                 what: str = "internal topic", grow: bool = False, timeout: float = 30.0) -> bool:
    """Create `name` with `partitions` partitions and `config`, or check the one there; returns
    whether this call created it. `grow`: an existing topic with fewer partitions gets more
    (more than asked is fine); otherwise a different count is an InfrastructureError."""
    from confluent_kafka.admin import NewPartitions, NewTopic

    known = cluster_topics(admin, timeout=timeout)
    created = False
    if name not in known:
        brokers = len(admin.list_topics(timeout=timeout).brokers)
        try:
            admin.create_topics([NewTopic(name, partitions, min(3, brokers), config=dict(config))])[name].result(timeout)
            created = True
        except Exception as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc).upper().replace(" ", "_"):
                raise (create_refused(exc, app_id) or exc) from None
            known = cluster_topics(admin, timeout=timeout)   # another instance's: check it as any other
    if not created and name in known:
        if grow and known[name] < partitions:
            admin.create_partitions([NewPartitions(name, partitions)])[name].result(timeout)
        elif not grow and known[name] != partitions:
            raise InfrastructureError(f"the {what} {name} has {known[name]} partitions, not {partitions}")
    wait_for_partitions(admin, name, partitions, what, timeout)
    return created


def wait_for_partitions(admin: Any, topic: str, count: int, what: str = "internal topic",
                        timeout: float = 30.0) -> None:
    """Until the brokers' metadata lists at least `count` partitions of `topic`, each with a
    leader: the controller acknowledges a creation before every broker has applied it."""
    deadline = time.monotonic() + timeout
    while True:
        meta = admin.list_topics(topic, timeout=10).topics.get(topic)
        if meta is not None and meta.error is None and len(meta.partitions) >= count \
                and all(p.leader >= 0 for p in meta.partitions.values()):
            return
        if time.monotonic() > deadline:
            raise InfrastructureError(f"the {what} {topic} has no leader for all {count} partitions after "
                                      f"{timeout:.0f}s")
        time.sleep(0.1)
