"""The ACLs an app's principal needs (docs/security.md), as Kafka's `kafka-acls.sh` says them, and
the check at start that the principal has them.

Every name an app uses derives from its app id: its group (`APP`, and `APP-poison` while a poison
record is isolated), its transactional ids (`APP-<topic>-<partition>`, `APP-unit-<i>`,
`APP-driver`, `APP-<operator>-snapshot-<i>`: all under the prefix `APP-`), and the internal topics
and groups of the wide and stateful protocols (`APP.units`, `APP.state`, `APP.<operator>.changelog`,
`APP.<operator>.snapshots`, `APP.state-reader`: under the prefix `APP.`).

The check asks the brokers what the principal may do (DescribeTopics and DescribeGroups with the
authorized operations, KIP-430) and proves the transactional ids with one `init_transactions` under
the prefix: an authorizer that says no answers at once. So a missing ACL stops `txstream run` before
Spark starts, naming the ACL, instead of failing a batch.
"""
from __future__ import annotations

from dataclasses import dataclass

from txstream.errors import UserError
from txstream.kafka.config import KafkaClients
from txstream.kafka.retry import retriable


class AccessDenied(UserError):
    """The app's principal lacks an ACL the app needs: the message names it."""


@dataclass(frozen=True)
class Need:
    resource: str                 # "topic" | "group" | "transactional-id"
    name: str
    operations: tuple[str, ...]   # Kafka's names: Read, Write, Describe, Create
    why: str
    prefixed: bool = False

    def acl_flags(self) -> list[str]:
        option = {"topic": "--topic", "group": "--group", "transactional-id": "--transactional-id"}[self.resource]
        return [*(f for op in self.operations for f in ("--operation", op)), option, self.name,
                *(["--resource-pattern-type", "prefixed"] if self.prefixed else [])]

    def describe(self) -> str:
        what = f"{self.resource} {'prefix ' if self.prefixed else ''}{self.name!r}"
        return f"{'/'.join(self.operations)} on {what} ({self.why})"


def app_needs(app_id: str, inputs: list[str], output: str | None, dead_letter: str | None, guarantee: str,
              protocol: str = "any") -> list[Need]:
    """What `txstream run` needs for `app_id`, by protocol ("narrow", "wide", "stateful", or "any":
    everything a run might choose)."""
    needs = [Need("topic", t, ("Read", "Describe"), "the tasks read it; the driver plans from its offsets")
             for t in inputs]
    needs += [Need("topic", t, ("Write", "Describe"), why) for t, why in
              ((output, "the output"), (dead_letter, "the dead letters")) if t]
    needs.append(Need("group", app_id, ("Read", "Describe"), "the driver's membership and the committed offsets"))
    needs.append(Need("group", f"{app_id}-poison", ("Read",), "reading a poison record alone"))
    if guarantee == "exactly-once":
        needs.append(Need("transactional-id", f"{app_id}-", ("Write", "Describe"),
                          "the transactional producers", prefixed=True))
    if protocol in ("wide", "stateful", "any"):
        needs.append(internal_topics_need(app_id))
    if protocol in ("wide", "stateful", "any"):
        needs.append(internal_groups_need(app_id))
    return needs


def internal_topics_need(app_id: str) -> Need:
    return Need("topic", f"{app_id}.", ("Create", "Read", "Write", "Describe"),
                "the wide and stateful protocols' own topics, created at the first start", prefixed=True)


def internal_groups_need(app_id: str) -> Need:
    return Need("group", f"{app_id}.", ("Read", "Describe"),
                "the units' markers (APP.units) and reading the state's topics", prefixed=True)


def denied(needs: list[Need]) -> AccessDenied:
    return AccessDenied(f"The app's principal lacks {len(needs)} ACL(s) it needs: "
                        + "; ".join(n.describe() for n in needs)
                        + ". `txstream acls --app-id ...` prints them all (docs/security.md).")


def create_refused(exc: BaseException, app_id: str) -> AccessDenied | None:
    """The AccessDenied for an internal topic the principal may not create, else None."""
    text = str(exc).upper()
    if "TOPIC_AUTHORIZATION_FAILED" in text or "CLUSTER_AUTHORIZATION_FAILED" in text:
        return denied([internal_topics_need(app_id)])
    return None


def check_internal_access(admin, clients: KafkaClients, app_id: str, topics: list[str], groups: list[str],
                          timeout: float) -> None:
    """The protocol's own topics (once they exist) and groups: the principal may use them (the
    prefixed ACLs of `internal_topics_need` and `internal_groups_need`), else AccessDenied naming
    the ACL."""
    for need, literal in ((internal_topics_need(app_id), [Need("topic", t, ("Read", "Write", "Describe"), "")
                                                          for t in topics]),
                          (internal_groups_need(app_id), [Need("group", g, ("Read", "Describe"), "") for g in groups])):
        try:
            check_access(admin, clients, literal, timeout)
        except AccessDenied:
            raise denied([need]) from None


def kafka_acls_commands(needs: list[Need], principal: str, bootstrap: str) -> list[str]:
    """The `kafka-acls.sh` lines that grant `needs` to `principal`."""
    return [" ".join(["kafka-acls.sh", "--bootstrap-server", bootstrap, "--add", "--allow-principal", principal,
                      *need.acl_flags()]) for need in needs]


def grant(admin, needs: list[Need], principal: str, timeout: float) -> None:
    """Create the ACLs of `needs` for `principal` through the admin API (what `--execute` does)."""
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

    kinds = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP,
             "transactional-id": ResourceType.TRANSACTIONAL_ID}
    bindings = [AclBinding(kinds[n.resource], n.name,
                           ResourcePatternType.PREFIXED if n.prefixed else ResourcePatternType.LITERAL,
                           principal, "*", AclOperation[_upper(op)], AclPermissionType.ALLOW)
                for n in needs for op in n.operations]
    for future in admin.create_acls(bindings, request_timeout=timeout).values():
        future.result()


def _upper(operation: str) -> str:
    return "".join("_" + c if c.isupper() and i else c for i, c in enumerate(operation)).upper()


def check_access(admin, clients: KafkaClients, needs: list[Need], timeout: float) -> None:
    """Raise AccessDenied naming every ACL of `needs` the principal lacks (topics and groups by
    their authorized operations; the transactional-id prefix by an `init_transactions`). Prefixed
    topics and groups are created or first used at start and are not checked here."""
    from confluent_kafka import TopicCollection

    missing: list[Need] = []
    topics = [n for n in needs if n.resource == "topic" and not n.prefixed]
    if topics:
        futures = admin.describe_topics(TopicCollection([n.name for n in topics]),
                                        include_authorized_operations=True, request_timeout=timeout)
        for need in topics:
            missing += _lacking(need, futures[need.name], "TOPIC_AUTHORIZATION_FAILED")
    for need in (n for n in needs if n.resource == "group" and not n.prefixed):
        # A group coordinator still loading answers NOT_COORDINATOR or LOAD_IN_PROGRESS for a moment.
        missing += retriable(lambda need=need: _lacking(need, admin.describe_consumer_groups(
            [need.name], include_authorized_operations=True, request_timeout=timeout)[need.name],
            "GROUP_AUTHORIZATION_FAILED"), timeout)
    for need in (n for n in needs if n.resource == "transactional-id"):
        if not _may_use_transactional_ids(clients, need.name, timeout):
            missing.append(need)
    if missing:
        raise denied(missing)


def _lacking(need: Need, future, refusal: str) -> list[Need]:
    """What of `need` the describe answer in `future` does not allow (`refusal`: the error name of
    a describe refused outright)."""
    from confluent_kafka import KafkaException

    try:
        allowed = {op.name for op in (future.result().authorized_operations or [])}
    except KafkaException as exc:
        if exc.args and exc.args[0].name() == refusal:
            return [need]
        if exc.args and exc.args[0].name() in ("UNKNOWN_TOPIC_OR_PART", "GROUP_ID_NOT_FOUND"):
            # Not an ACL (the principal may describe it, or it would have been refused): a topic
            # the run says does not exist, a group its first member creates.
            return []
        raise
    if not allowed:
        return []   # the broker did not say (no authorizer answers with every operation)
    lacking = tuple(op for op in need.operations if _upper(op) not in allowed)
    return [Need(need.resource, need.name, lacking, need.why, need.prefixed)] if lacking else []


def _may_use_transactional_ids(clients: KafkaClients, prefix: str, timeout: float) -> bool:
    """Whether a transactional id under `prefix` may be initialised (an authorizer answers at
    once). The id is the check's own: no producer of the app is fenced by it."""
    from confluent_kafka import KafkaError, KafkaException, Producer

    producer = Producer(clients.producer(**{"transactional.id": f"{prefix}access-check",
                                            "enable.idempotence": True}))
    try:
        producer.init_transactions(timeout)
    except KafkaException as exc:
        if exc.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
            return False   # (the producer is in a fatal state: nothing to flush)
        raise
    producer.flush(0)
    return True
