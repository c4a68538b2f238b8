"""A partition's producer cached on one host, fenced from another (docs/cluster.md, issue 13).

On a cluster a partition's task lands on any executor; the owner markers that tell a worker its
cached producer was fenced exist per host only. These drive the publishing protocol
(task/publish.py) directly against a real broker, with a second producer of the same
transactional.id playing the other host.
"""
from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Consumer

from tests.support.kafka import drop_cached_publishers, read_all
from txstream.constants import ALREADY_DONE, COMMITTED, EXACTLY_ONCE
from txstream.kafka.config import KafkaClients
from txstream.kafka.transactions import TransactionalPublisher
from txstream.task import publish
from txstream.task.result import TaskResult
from txstream.task.spec import PartitionPlan, PublishSpec, ReadSpec


def _spec(bootstrap: str, app_id: str, output: str, owner_dir: Path, **extra) -> PublishSpec:
    clients = KafkaClients(bootstrap)
    read = ReadSpec(clients=clients, app_id=app_id, side_dir=f"txstream-test-{uuid.uuid4().hex[:8]}")
    return PublishSpec(read=read, guarantee=EXACTLY_ONCE, transaction_timeout_s=10, owner_dir=str(owner_dir),
                       output_topic=output, **extra)


def _rows(first: int, last: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{"key": f"k{i}".encode(), "value": f"v{i}".encode(), "offset": i}
                                       for i in range(first, last)])


def _group_metadata(bootstrap: str, app_id: str):
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": app_id})
    return consumer, consumer.consumer_group_metadata()


def _batch(spec: PublishSpec, batch_id: int, plan: PartitionPlan, metadata) -> PublishSpec:
    return spec.with_batch(batch_id, [plan], metadata)


def test_a_cached_producer_fenced_from_another_host_republishes_instead_of_failing(
        bootstrap_servers, make_topic, tmp_path):
    source, output = make_topic("xh-in", 1), make_topic("xh-out", 1)
    app_id = f"xh-{uuid.uuid4().hex[:8]}"
    tid = f"{app_id}-{source}-0"
    spec = _spec(bootstrap_servers, app_id, output, tmp_path / "host-a")
    member, metadata = _group_metadata(bootstrap_servers, app_id)
    try:
        first = PartitionPlan(source, 0, 0, 5, None, tid)
        result = TaskResult(0)
        publish.publish_transactional(_batch(spec, 1, first, metadata), first, iter([_rows(0, 5)]), result)
        assert result.status == COMMITTED and publish.cached_publishers() == [tid]
        # Host B (its own owner markers) runs the partition's next task: init_transactions fences A's.
        other = TransactionalPublisher(spec.producer_config(transactional=True), tid, str(tmp_path / "host-b"), 10)
        other.init()
        other.close()
        second = PartitionPlan(source, 0, 5, 20_005, 5, tid)
        result = TaskResult(0)

        def rows():   # enough batches for the broker's "fenced" to arrive while producing
            for first in range(5, 20_005, 500):
                yield _rows(first, first + 500)

        publish.publish_transactional(_batch(spec, 2, second, metadata), second, rows(), result)
        # Host A's cached producer learns of the fence from the broker (at produce or commit),
        # starts afresh, publishes the kept records and goes on: a second attempt, not a failed task.
        assert (result.status, result.committed, result.attempts) == (COMMITTED, 20_005, 2), result
    finally:
        drop_cached_publishers()
        member.close()
    values = sorted(r.value for r in read_all(bootstrap_servers, output, timeout=60))
    assert values == sorted(f"v{i}".encode() for i in range(20_005))


def test_an_attempt_fenced_by_a_racing_attempt_waits_for_its_commit(bootstrap_servers, make_topic, tmp_path):
    """Speculation: attempt A (fresh producer) is fenced by attempt B of the same range, which
    commits it. A must not report first (Spark would kill B); it reports the range as done."""
    source, output = make_topic("race-in", 1), make_topic("race-out", 1)
    app_id = f"race-{uuid.uuid4().hex[:8]}"
    tid = f"{app_id}-{source}-0"
    spec = _spec(bootstrap_servers, app_id, output, tmp_path / "host-a")
    member, metadata = _group_metadata(bootstrap_servers, app_id)
    plan = PartitionPlan(source, 0, 0, 5, None, tid)
    batch_spec = _batch(spec, 1, plan, metadata)

    def attempt_b() -> None:
        from confluent_kafka import TopicPartition

        b = TransactionalPublisher(spec.producer_config(transactional=True), tid, str(tmp_path / "host-b"), 10)
        b.init()
        b.begin()
        for i in range(5):
            b.producer.produce(output, f"v{i}".encode(), f"k{i}".encode())
        b.send_offsets([TopicPartition(source, 0, 5)], metadata)
        b.commit()
        b.close()

    def input_of_a():
        yield _rows(0, 5)
        attempt_b()   # B starts, fences A, and commits the range while A is still producing

    try:
        result = TaskResult(0)
        publish.publish_transactional(batch_spec, plan, input_of_a(), result)
        assert (result.status, result.committed) == (ALREADY_DONE, 5), result
    finally:
        drop_cached_publishers()
        member.close()
    values = sorted(r.value for r in read_all(bootstrap_servers, output, timeout=60))
    assert values == sorted(f"v{i}".encode() for i in range(5)), "the range was published more than once"


def test_idle_cached_producers_are_closed(bootstrap_servers, make_topic, tmp_path):
    source = make_topic("idle-in", 2)
    app_id = f"idle-{uuid.uuid4().hex[:8]}"
    spec = _spec(bootstrap_servers, app_id, source, tmp_path / "owners", producer_idle_s=0.0)
    plans = [PartitionPlan(source, p, 0, 1, None, f"{app_id}-{source}-{p}") for p in (0, 1)]
    try:
        publish.partition_publisher(spec, plans[0])
        assert publish.cached_publishers() == [plans[0].transactional_id]
        publish.partition_publisher(spec, plans[1])   # partition 0's producer has been idle longer than 0 s
        assert publish.cached_publishers() == [plans[1].transactional_id]
    finally:
        drop_cached_publishers()


def test_a_producer_fenced_on_the_same_host_is_replaced_before_use(bootstrap_servers, make_topic, tmp_path):
    """Another worker of this host initialised the id (its owner marker says so): the cached
    producer is dropped before the task begins, so the range needs one transaction, not two."""
    source, output = make_topic("sh-in", 1), make_topic("sh-out", 1)
    app_id = f"sh-{uuid.uuid4().hex[:8]}"
    tid = f"{app_id}-{source}-0"
    spec = _spec(bootstrap_servers, app_id, output, tmp_path / "host-a")
    member, metadata = _group_metadata(bootstrap_servers, app_id)
    try:
        first = PartitionPlan(source, 0, 0, 5, None, tid)
        publish.publish_transactional(_batch(spec, 1, first, metadata), first, iter([_rows(0, 5)]), TaskResult(0))
        other = TransactionalPublisher(spec.producer_config(transactional=True), tid, spec.owner_dir, 10)
        other.init()   # same host: same owner markers
        other.close()
        second = PartitionPlan(source, 0, 5, 10, 5, tid)
        result = TaskResult(0)
        publish.publish_transactional(_batch(spec, 2, second, metadata), second, iter([_rows(5, 10)]), result)
        assert (result.status, result.attempts) == (COMMITTED, 1), result
    finally:
        drop_cached_publishers()
        member.close()


# -- a slot's several transactional.ids (driver/slots.py, docs/architecture.md §3.4) -------------

def _pool(app_id: str, source: str) -> tuple[str, ...]:
    from txstream.driver.slots import slot_pool

    return slot_pool(f"{app_id}-{source}-0", 3)


def test_a_worker_publishes_through_any_id_of_its_slot_it_holds_without_init(bootstrap_servers, make_topic, tmp_path):
    source, output = make_topic("pool-in", 1), make_topic("pool-out", 1)
    app_id = f"pool-{uuid.uuid4().hex[:8]}"
    pool = _pool(app_id, source)
    spec = _spec(bootstrap_servers, app_id, output, tmp_path / "host-a")
    member, metadata = _group_metadata(bootstrap_servers, app_id)
    try:
        first = PartitionPlan(source, 0, 0, 5, None, pool[1], pool)
        result = TaskResult(0)
        publish.publish_transactional(_batch(spec, 1, first, metadata), first, iter([_rows(0, 5)]), result)
        assert (result.status, result.transactional_id) == (COMMITTED, pool[1]) and result.init_s > 0, result
        # The next batch's claim is another id: the worker's producer of `~1` publishes it, no init.
        second = PartitionPlan(source, 0, 5, 10, 5, pool[2], pool)
        result = TaskResult(0)
        publish.publish_transactional(_batch(spec, 2, second, metadata), second, iter([_rows(5, 10)]), result)
        assert (result.status, result.transactional_id, result.init_s) == (COMMITTED, pool[1], 0.0), result
        assert publish.cached_publishers() == [pool[1]]
    finally:
        drop_cached_publishers()
        member.close()
    values = sorted(r.value for r in read_all(bootstrap_servers, output, timeout=60))
    assert values == sorted(f"v{i}".encode() for i in range(10))


def test_fence_all_fences_a_zombie_on_any_id_of_the_slot(bootstrap_servers, make_topic, tmp_path):
    """A zombie (an attempt of a failed batch, on another host) holds `~2` with the range's
    records and offsets in its open transaction. The next batch fences all ids: the zombie's
    transaction is aborted, its commit refused, and the range is published once."""
    from confluent_kafka import TopicPartition

    from txstream.errors import FencedError

    source, output = make_topic("zombie-in", 1), make_topic("zombie-out", 1)
    app_id = f"zombie-{uuid.uuid4().hex[:8]}"
    pool = _pool(app_id, source)
    spec = _spec(bootstrap_servers, app_id, output, tmp_path / "host-a")
    member, metadata = _group_metadata(bootstrap_servers, app_id)
    zombie = TransactionalPublisher(spec.producer_config(transactional=True), pool[2], str(tmp_path / "host-b"), 10)
    try:
        zombie.init()
        zombie.begin()
        for i in range(5):
            zombie.producer.produce(output, b"zombie", f"k{i}".encode())
        zombie.send_offsets([TopicPartition(source, 0, 5)], metadata)
        plan = PartitionPlan(source, 0, 0, 5, None, pool[0], pool)
        result = TaskResult(0)
        publish.publish_transactional(spec.with_batch(1, [plan], metadata, fence_all=True), plan,
                                      iter([_rows(0, 5)]), result)
        assert (result.status, result.committed, result.transactional_id) == (COMMITTED, 5, pool[0]), result
        with pytest.raises(FencedError):
            zombie.commit()
    finally:
        drop_cached_publishers()
        member.close()
    values = sorted(r.value for r in read_all(bootstrap_servers, output, timeout=60))
    assert values == sorted(f"v{i}".encode() for i in range(5)), "the zombie's records became visible"


def test_a_held_producer_fenced_by_a_fence_all_attempt_finds_the_range_done(bootstrap_servers, make_topic, tmp_path):
    """Speculation with several ids: attempt A publishes through the `~1` its worker holds (no
    init); attempt B (a copy: it fences all ids) commits the range meanwhile. A's producer is
    fenced; A initialises the batch's claim id and finds the range done: once, not twice."""
    from confluent_kafka import TopicPartition

    source, output = make_topic("spec-in", 1), make_topic("spec-out", 1)
    app_id = f"spec-{uuid.uuid4().hex[:8]}"
    pool = _pool(app_id, source)
    spec = _spec(bootstrap_servers, app_id, output, tmp_path / "host-a")
    spec_b = _spec(bootstrap_servers, app_id, output, tmp_path / "host-b")
    member, metadata = _group_metadata(bootstrap_servers, app_id)
    try:
        first = PartitionPlan(source, 0, 0, 5, None, pool[1], pool)
        publish.publish_transactional(_batch(spec, 1, first, metadata), first, iter([_rows(0, 5)]), TaskResult(0))
        second = PartitionPlan(source, 0, 5, 10, 5, pool[0], pool)

        def attempt_b() -> None:
            b = publish.fence_pool(spec_b, pool, pool[0])
            b.begin()
            for i in range(5, 10):
                b.producer.produce(output, f"v{i}".encode(), f"k{i}".encode())
            b.send_offsets([TopicPartition(source, 0, 10)], metadata)
            b.commit()
            b.close()

        def input_of_a():
            yield _rows(5, 8)
            attempt_b()
            yield _rows(8, 10)

        result = TaskResult(0)
        publish.publish_transactional(_batch(spec, 2, second, metadata), second, input_of_a(), result)
        assert (result.status, result.committed, result.transactional_id) == (ALREADY_DONE, 10, pool[0]), result
    finally:
        drop_cached_publishers()
        member.close()
    values = sorted(r.value for r in read_all(bootstrap_servers, output, timeout=60))
    assert values == sorted(f"v{i}".encode() for i in range(10)), "the range was published more than once"
