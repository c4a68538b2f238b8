"""The transaction engine (txstream/kafka/transactions.py) driven directly against the real broker:
its attempt loop aborts after an abortable error and commits once, a fenced attempt stops and
reports what the attempt that fenced it did, and a read_committed reader sees each committed
transaction's records once and nothing of an aborted one, on every topic it wrote."""
from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from tests.support.kafka import committed, live_member, produce, read_all
from txstream.errors import FencedError
from txstream.kafka import transactions
from txstream.kafka.config import KafkaClients
from txstream.kafka.transactions import CallableTransaction, Transaction, TransactionalPublisher, publish_plain
from txstream.task.spec import PRODUCER_DEFAULTS

TIMEOUT_S = 30


def _config(bootstrap_servers: str) -> dict[str, Any]:
    return KafkaClients(bootstrap_servers).producer(**PRODUCER_DEFAULTS, **{"transaction.timeout.ms": 20_000})


def _publisher(bootstrap_servers: str, tid: str) -> TransactionalPublisher:
    publisher = TransactionalPublisher(_config(bootstrap_servers), tid, None, TIMEOUT_S)
    publisher.init()
    return publisher


def test_an_abortable_error_aborts_and_the_loop_commits_the_records_once(bootstrap_servers, make_topic) -> None:
    """The first attempt's offsets carry the metadata of a member that has left: the broker
    refuses them (an abortable error), the loop aborts and produces again, the second commits."""
    source, sink = make_topic("engine-retry-in", 1), make_topic("engine-retry-out", 1)
    produce(bootstrap_servers, source, [(b"k", b"v")] * 10)
    app_id = f"engine-retry-{uuid.uuid4().hex[:8]}"
    with live_member(bootstrap_servers, app_id, source) as gone:
        stale = gone.consumer_group_metadata()

    class Batch(Transaction):
        def __init__(self) -> None:
            self.produced = self.offered = 0

        def produce(self, producer: Any) -> None:
            self.produced += 1
            for i in range(10):
                producer.produce(sink, f"v{i}".encode(), b"k")

        def offsets(self) -> tuple[list, Any]:
            self.offered += 1
            return [TopicPartition(source, 0, 10)], stale if self.offered == 1 else current

    with live_member(bootstrap_servers, app_id, source) as member:
        current = member.consumer_group_metadata()
        publisher = _publisher(bootstrap_servers, f"{app_id}-0")
        batch = Batch()
        try:
            outcome = transactions.run(batch, publisher, fresh=True, renew=None)
        finally:
            publisher.close()
    assert outcome.committed and outcome.attempts == 2 and batch.produced == 2, outcome
    assert batch.offered == 2 and outcome.message, "the refused offsets' error is reported"
    assert committed(bootstrap_servers, app_id, source, 1) == {0: 10}
    assert sorted(r.value for r in read_all(bootstrap_servers, sink)) == [f"v{i}".encode() for i in range(10)]


def test_a_fenced_attempt_stops_and_reports_what_the_attempt_that_fenced_it_did(
        bootstrap_servers, make_topic) -> None:
    """While attempt A produces, attempt B of the same work initialises the transactional.id
    (fencing A) and commits the work. A's commit is refused; A does not publish again but waits
    for B's outcome and reports it; only B's record is ever visible."""
    source, sink = make_topic("engine-fence-in", 1), make_topic("engine-fence-out", 1)
    produce(bootstrap_servers, source, [(b"k", b"v")])
    app_id = f"engine-fence-{uuid.uuid4().hex[:8]}"
    tid = f"{app_id}-0"
    offsets = [TopicPartition(source, 0, 1)]

    class Raced(Transaction):
        def __init__(self) -> None:
            self.asked = 0

        def produce(self, producer: Any) -> None:
            producer.produce(sink, b"from a")
            other = _publisher(bootstrap_servers, tid)   # fences A
            try:
                other.begin()
                other.producer.produce(sink, b"from b")
                other.send_offsets(offsets, metadata)
                other.commit()
            finally:
                other.close()

        def offsets(self) -> tuple[list, Any]:
            return offsets, metadata

        def other_attempt(self) -> str | None:
            self.asked += 1
            return "published by b" if committed(bootstrap_servers, app_id, source, 1) == {0: 1} else None

    def renew() -> TransactionalPublisher:
        raise AssertionError("a producer initialised for this attempt is not renewed after a fence")

    with live_member(bootstrap_servers, app_id, source) as member:
        metadata = member.consumer_group_metadata()
        publisher = _publisher(bootstrap_servers, tid)
        raced = Raced()
        try:
            outcome = transactions.run(raced, publisher, fresh=True, renew=renew, other_attempt_s=TIMEOUT_S)
            with pytest.raises(FencedError):   # without `renew` the fence is the caller's
                transactions.run(CallableTransaction(lambda p: None, lambda: (offsets, metadata)), publisher,
                                 fresh=True, renew=None)
        finally:
            publisher.close()
    assert not outcome.committed and outcome.attempts == 1, outcome
    assert isinstance(outcome.fence, FencedError) and outcome.status == "published by b" and raced.asked >= 1
    assert [r.value for r in read_all(bootstrap_servers, sink)] == [b"from b"]


def test_a_reader_sees_each_committed_transaction_once_and_nothing_of_an_aborted_one(
        bootstrap_servers, make_topic) -> None:
    """Ten transactions through one producer, each to two topics; every third is refused by its
    produce (aborted by the loop after its records went out). read_committed readers of both
    topics see the committed ones' records once each, and the group's offset is the last
    committed transaction's."""
    source = make_topic("engine-batches-in", 1)
    sinks = [make_topic("engine-batches-out", 2), make_topic("engine-batches-side", 1)]
    produce(bootstrap_servers, source, [(b"k", b"v")] * 10)
    app_id = f"engine-batches-{uuid.uuid4().hex[:8]}"

    class Batch(Transaction):
        def __init__(self, n: int) -> None:
            self.n = n

        def produce(self, producer: Any) -> str | None:
            for sink in sinks:
                for i in range(200):
                    producer.produce(sink, f"{self.n}-{i}".encode(), f"{i}".encode())
            return "refused" if self.n % 3 == 2 else None

        def offsets(self) -> tuple[list, Any]:
            return [TopicPartition(source, 0, self.n + 1)], metadata

    expected: Counter = Counter()
    with live_member(bootstrap_servers, app_id, source) as member:
        metadata = member.consumer_group_metadata()
        publisher = _publisher(bootstrap_servers, f"{app_id}-0")
        try:
            for n in range(10):
                outcome = transactions.run(Batch(n), publisher, fresh=n == 0, renew=None)
                assert (outcome.committed, outcome.status) == ((True, None) if n % 3 != 2 else (False, "refused"))
                if outcome.committed:
                    expected.update(f"{n}-{i}".encode() for i in range(200))
        finally:
            publisher.close()
    for sink in sinks:
        seen = Counter(r.value for r in read_all(bootstrap_servers, sink))
        assert seen == expected, (f"{sink}: {sum((expected - seen).values())} committed records missing, "
                                  f"{sum((seen - expected).values())} extra (aborted or twice)")
    assert committed(bootstrap_servers, app_id, source, 1) == {0: 10}


def test_the_plain_path_returns_once_every_record_is_acknowledged(bootstrap_servers, make_topic) -> None:
    sink = make_topic("engine-plain-out", 2)
    config = KafkaClients(bootstrap_servers).producer(**PRODUCER_DEFAULTS)

    def produce_all(producer: Any) -> int:
        for i in range(500):
            producer.produce(sink, f"v{i}".encode(), f"{i}".encode())
        return 500

    produced, _waited = publish_plain(config, produce_all, TIMEOUT_S, "the test's output")
    assert produced == 500
    # Acknowledged means written: a read_uncommitted reader finds every record at once.
    seen = Counter(r.value for r in read_all(bootstrap_servers, sink, isolation="read_uncommitted"))
    assert seen == Counter(f"v{i}".encode() for i in range(500))
