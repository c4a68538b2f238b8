"""Chaos on a real three-node KRaft cluster: SIGKILL the partition leader, then the transaction
coordinator, while a transactional producer commits a transaction every few records. A
read_committed consumer must then see every committed record exactly once, in order.

The producer handles errors the way librdkafka classifies them: `retriable()` -> call again,
`txn_requires_abort()` -> abort and redo the transaction, `fatal()` -> a new producer (whose
init_transactions settles the old one's last transaction; we then read whether it committed).
"""
from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise

from confluent_kafka import Consumer, IsolationLevel, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from tests.support.nodes import (
    bounce,
    leader_of,
    transaction_coordinator,
    transaction_state_partition,
    wait_fully_replicated,
)
from txstream.local.cluster import LocalKafkaCluster

RECORDS_PER_TXN = 5
log = logging.getLogger("chaos")


# ---------------------------------------------------------------------------------------------
# A transactional writer that survives broker deaths
# ---------------------------------------------------------------------------------------------

class _Abort(Exception):
    pass


class _Fatal(Exception):
    pass


@dataclass
class TxnWriter:
    bootstrap: str
    topic: str
    transactional_id: str
    committed: list[int] = field(default_factory=list)        # txn numbers known committed
    commit_times: list[float] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)          # "retriable:<name>" etc.
    failure: BaseException | None = None
    call_deadline: float = 90.0                               # per call, retries included

    def __post_init__(self) -> None:
        self.stop = threading.Event()
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self._run, name="txn-writer", daemon=True)
        self.producers = 0

    # -- classification -------------------------------------------------------------------

    def _call(self, what: str, fn: Callable, *args):
        deadline = time.monotonic() + self.call_deadline
        while True:
            try:
                return fn(*args)
            except KafkaException as exc:
                err = exc.args[0]
                if err.fatal():
                    self.errors[f"fatal:{what}:{err.name()}"] += 1
                    raise _Fatal(err.str()) from None
                if err.txn_requires_abort():
                    self.errors[f"abort:{what}:{err.name()}"] += 1
                    raise _Abort(err.str()) from None
                if err.retriable() and time.monotonic() < deadline:
                    self.errors[f"retriable:{what}:{err.name()}"] += 1
                    continue
                raise

    def _new_producer(self) -> Producer:
        self.producers += 1
        producer = Producer({
            "bootstrap.servers": self.bootstrap, "transactional.id": self.transactional_id,
            "linger.ms": 2, "transaction.timeout.ms": 30000,
            "logger": logging.getLogger("chaos.rdkafka"),
        })
        self._call("init", producer.init_transactions, 30)
        return producer

    # -- the loop -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            producer = self._new_producer()
            txn, attempt = 0, 0
            while not self.stop.is_set():
                attempt += 1
                try:
                    self._call("begin", producer.begin_transaction)
                    for i in range(RECORDS_PER_TXN):
                        self._call("produce", producer.produce, self.topic,
                                   f"{txn}:{attempt}:{i}".encode(), None, 0)
                    self._call("commit", producer.commit_transaction, 30)
                except _Abort:
                    try:
                        self._call("abort", producer.abort_transaction, 30)
                        continue                                   # redo txn, new attempt
                    except _Fatal:
                        pass
                except _Fatal:
                    pass
                else:
                    self._committed(txn)
                    txn += 1
                    self.stop.wait(0.02)                          # pace: a commit every ~20 ms
                    continue
                # Fatal: a new producer fences the old one and settles its open transaction;
                # whether `txn` committed is then read from the topic itself.
                producer = self._new_producer()
                if any(t == txn for t, _a, _i in read_committed_records(self.bootstrap, self.topic)):
                    self.errors["fatal-but-committed"] += 1
                    self._committed(txn)
                    txn += 1
            self._call("flush", producer.flush, 30)
        except BaseException as exc:  # reported by the test
            self.failure = exc
            with self.changed:
                self.changed.notify_all()

    def _committed(self, txn: int) -> None:
        with self.changed:
            self.committed.append(txn)
            self.commit_times.append(time.monotonic())
            self.changed.notify_all()

    def wait_for_commits(self, count: int, timeout: float) -> None:
        with self.changed:
            ok = self.changed.wait_for(lambda: len(self.committed) >= count or self.failure is not None,
                                       timeout)
        assert self.failure is None, f"writer failed: {self.failure!r}"
        assert ok, f"only {len(self.committed)} of {count} transactions committed in {timeout}s"

    def longest_pause(self, since: float) -> float:
        times = [since] + [t for t in self.commit_times if t > since] + [time.monotonic()]
        return max((b - a for a, b in pairwise(times)), default=0.0)

    def start(self) -> None:
        self.thread.start()

    def finish(self, timeout: float = 60.0) -> None:
        self.stop.set()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "writer did not stop"


def read_committed_records(bootstrap: str, topic: str, timeout: float = 60.0) -> list[tuple[int, int, int]]:
    """(txn, attempt, index) of every record read_committed sees, up to the last stable offset;
    stops on position (offsets skip over commit/abort markers and aborted data)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    tp = TopicPartition(topic, 0)
    deadline = time.monotonic() + timeout

    def end(isolation: IsolationLevel) -> int:
        return admin.list_offsets({tp: OffsetSpec.latest()}, isolation_level=isolation,
                                  request_timeout=timeout)[tp].result(timeout).offset

    # commit_transaction() returns before the markers are written: wait until the last stable
    # offset passes everything written so far (the writer's transactions have all ended).
    written = end(IsolationLevel.READ_UNCOMMITTED)
    while (stable := end(IsolationLevel.READ_COMMITTED)) < written:
        assert time.monotonic() < deadline, f"{topic}: last stable offset stuck at {stable} < {written}"
        time.sleep(0.05)
    end = stable
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"chaos-reader-{uuid.uuid4().hex}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "log_level": 0})
    out: list[tuple[int, int, int]] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        while consumer.position([tp])[0].offset < end:
            assert time.monotonic() < deadline, f"reading {topic} stalled below offset {end}"
            for msg in consumer.consume(num_messages=10_000, timeout=0.2):
                if msg.error() is None and msg.offset() < end:
                    out.append(tuple(int(x) for x in msg.value().split(b":")))
    finally:
        consumer.close()
    return out


def coordinator_partition_from_logs(cluster: LocalKafkaCluster, transactional_id: str) -> int | None:
    """The __transaction_state partition the broker itself logged for the id, when it did."""
    pattern = re.compile(rf"Initialized transactionalId {re.escape(transactional_id)} .*?"
                         r"__transaction_state-(\d+)")
    for node in cluster.nodes:
        found = pattern.search(node.log_file.read_text(errors="replace") if node.log_file.exists() else "")
        if found:
            return int(found.group(1))
    return None


# ---------------------------------------------------------------------------------------------
# The test
# ---------------------------------------------------------------------------------------------

def test_hard_kills_of_leader_and_coordinator_keep_exactly_once(cluster: LocalKafkaCluster) -> None:
    began = time.monotonic()
    bootstrap = cluster.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    topic = f"chaos-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, 1, 3, config={"min.insync.replicas": "2"})])[topic].result(60)
    wait_fully_replicated(cluster, 60)
    leader = leader_of(cluster, topic, 0)

    # A throwaway transactional producer creates __transaction_state; then pick an id whose
    # coordinator is NOT the topic's leader, so the two kills hit two different roles.
    warmup = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"chaos-warmup-{uuid.uuid4().hex}",
                       "logger": logging.getLogger("chaos.rdkafka")})
    warmup.init_transactions(60)
    wait_fully_replicated(cluster, 60)
    txid = next(t for t in (f"chaos-{uuid.uuid4().hex[:8]}" for _ in range(100))
                if transaction_coordinator(cluster, t) != leader)

    writer = TxnWriter(bootstrap, topic, txid)
    writer.start()
    try:
        writer.wait_for_commits(20, timeout=60)
        coordinator = transaction_coordinator(cluster, txid)
        logged = coordinator_partition_from_logs(cluster, txid)
        if logged is not None:   # the broker agrees with our Java hashCode
            assert logged == transaction_state_partition(txid)
        print(f"leader of {topic}[0]: node {leader}; coordinator of {txid}: node {coordinator} "
              f"(__transaction_state-{transaction_state_partition(txid)}, "
              f"broker log says {logged})")

        # 1. SIGKILL the partition leader while transactions are in flight.
        before, since = len(writer.committed), time.monotonic()
        took = bounce(cluster, leader, hard=True, timeout=120)
        new_leader = leader_of(cluster, topic, 0)
        print(f"bounce of leader node {leader}: {took.total:.1f}s {took}, {len(writer.committed) - before} "
              f"transactions committed meanwhile (longest pause {writer.longest_pause(since):.1f}s); "
              f"leader now node {new_leader}")
        writer.wait_for_commits(len(writer.committed) + 20, timeout=60)

        # 2. SIGKILL the transaction coordinator.
        coordinator = transaction_coordinator(cluster, txid)
        before, since = len(writer.committed), time.monotonic()
        took = bounce(cluster, coordinator, hard=True, timeout=120)
        print(f"bounce of coordinator node {coordinator}: {took.total:.1f}s {took}, "
              f"{len(writer.committed) - before} transactions committed meanwhile "
              f"(longest pause {writer.longest_pause(since):.1f}s); "
              f"coordinator now node {transaction_coordinator(cluster, txid)}")
        writer.wait_for_commits(len(writer.committed) + 20, timeout=60)
    finally:
        writer.finish()
        warmup.flush(5)
    assert writer.failure is None, f"writer failed: {writer.failure!r}"
    print(f"writer: {len(writer.committed)} transactions committed, {writer.producers} producer(s), "
          f"errors {dict(writer.errors)}")

    # Every committed transaction exactly once, whole, in order; nothing else.
    records = read_committed_records(bootstrap, topic)
    committed = writer.committed
    assert committed == list(range(len(committed)))
    expected_txns = [t for t in committed for _ in range(RECORDS_PER_TXN)]
    seen_txns = [t for t, _a, _i in records]
    assert seen_txns == expected_txns, (
        f"read_committed saw {len(records)} records for {len(set(seen_txns))} transactions; "
        f"expected {len(expected_txns)} for {len(committed)}; first difference at "
        f"{next((k for k, (a, b) in enumerate(zip(seen_txns, expected_txns, strict=False)) if a != b), None)}")
    for k in range(0, len(records), RECORDS_PER_TXN):
        group = records[k:k + RECORDS_PER_TXN]
        assert [i for _t, _a, i in group] == list(range(RECORDS_PER_TXN)), group
        assert len({a for _t, a, _i in group}) == 1, f"one transaction mixes attempts: {group}"
    assert len({(t, a) for t, a, _i in records}) == len(committed)
    print(f"read_committed: {len(records)} records, all {len(committed)} committed transactions "
          f"exactly once and in order; test took {time.monotonic() - began:.1f}s")
