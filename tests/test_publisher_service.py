"""A slot's long-lived producer process (task/publisher_service.py, docs/architecture.md §3, invariant 4).

These drive the service the way a publishing task does, against a real broker and real processes:
a stand-in "executor" process (the service ends with it), the test process as the task, and a
forked child as a task that is killed mid-transaction.
"""
from __future__ import annotations

import multiprocessing
import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Consumer

from tests.support.kafka import read_all
from txstream.errors import PoisonRecordError
from txstream.kafka.config import KafkaClients
from txstream.task import publish, publisher_service
from txstream.task.result import COMMITTED, STALE_PLAN, TaskResult
from txstream.task.sidefile import ReadResult, write_side_file
from txstream.task.spec import EXACTLY_ONCE, PartitionPlan, PublishSpec, ReadSpec

WAIT_S = 30.0


def _rows(first: int, last: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{"key": f"k{i}".encode(), "value": f"v{i}".encode(), "offset": i}
                                       for i in range(first, last)])


def _wait_for(condition, what: str, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


class Slot:
    """One slot of one app: its spec, the group member whose metadata the commits carry, a
    stand-in executor process, and the service started for it."""

    def __init__(self, bootstrap: str, source: str, output: str, owners: Path, **extra) -> None:
        self.app_id = f"svc-{uuid.uuid4().hex[:8]}"
        self.source, self.tid = source, f"{self.app_id}-{source}-0"
        read = ReadSpec(clients=KafkaClients(bootstrap), app_id=self.app_id,
                        side_dir=f"txstream-test-{uuid.uuid4().hex[:8]}")
        self.spec = PublishSpec(read=read, guarantee=EXACTLY_ONCE, transaction_timeout_s=10,
                                owner_dir=str(owners), output_topic=output, **extra)
        self.member = Consumer({"bootstrap.servers": bootstrap, "group.id": self.app_id})
        self.executor = subprocess.Popen(["sleep", "3600"])
        self.name = publisher_service.address(self.executor.pid, self.tid)

    def batch(self, batch_id: int, start: int, end: int, committed: int | None) -> PublishSpec:
        plan = PartitionPlan(self.source, 0, start, end, committed, self.tid)
        return self.spec.with_batch(batch_id, [plan], self.member.consumer_group_metadata())

    def publish(self, spec: PublishSpec, batches) -> list[TaskResult] | None:
        return publisher_service.publish(self.tid, publish.publish_slot_here, (spec, [0]), batches,
                                         spec.producer_idle_s, jvm_pid=self.executor.pid)

    def start_service(self) -> subprocess.Popen:
        """The first task finds no service: it starts one and publishes in its own worker."""
        assert self.publish(self.batch(0, 0, 0, None), iter(())) is None
        _wait_for(lambda: publisher_service.connect(self.name), "the service to listen")
        return publisher_service.started(self.name)

    def close(self) -> None:
        self.executor.kill()
        self.executor.wait()
        self.member.close()
        for tid in publish.cached_publishers():
            publish.drop_publisher(tid)


@pytest.fixture
def slot(bootstrap_servers, make_topic, tmp_path):
    made: list[Slot] = []

    def make(**extra) -> Slot:
        made.append(Slot(bootstrap_servers, make_topic("svc-in", 1), make_topic("svc-out", 1),
                         tmp_path / "owners", **extra))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_the_slots_producer_outlives_the_task_and_ends_with_its_executor(slot, bootstrap_servers):
    s = slot()
    service = s.start_service()
    first = s.publish(s.batch(1, 0, 5, None), iter([_rows(0, 5)]))
    second = s.publish(s.batch(2, 5, 10, 5), iter([_rows(5, 8), _rows(8, 10)]))
    assert [(r.status, r.committed, r.records_out) for r in first + second] == [
        (COMMITTED, 5, 5), (COMMITTED, 10, 5)]
    assert first[0].init_s > 0 and second[0].init_s == 0, "the second task paid init_transactions again"
    values = sorted(r.value for r in read_all(bootstrap_servers, s.spec.output_topic))
    assert values == sorted(f"v{i}".encode() for i in range(10))
    s.executor.kill()
    assert service.wait(WAIT_S) == 0, "the service outlived its executor"


def test_a_task_killed_mid_transaction_takes_the_service_with_it(slot, bootstrap_servers):
    s = slot()
    service = s.start_service()
    spec = s.batch(1, 0, 10, None)
    streaming = multiprocessing.get_context("fork").Event()

    def task_that_dies() -> None:   # sends half its rows, then hangs until it is killed
        def rows():
            yield _rows(0, 5)
            streaming.set()
            time.sleep(3600)
            yield _rows(5, 10)
        s.publish(spec, rows())

    child = multiprocessing.get_context("fork").Process(target=task_that_dies)
    child.start()
    try:
        assert streaming.wait(WAIT_S)
        untouched = iter([_rows(0, 10)])
        assert s.publish(spec, untouched) is None, "a second task was served while the first was"
        assert next(untouched, None) is not None, "a task the service refused lost its rows"
        os.kill(child.pid, signal.SIGKILL)
        assert service.wait(WAIT_S) != 0, "the service went on after its task was killed"
    finally:
        child.kill()
        child.join()
    # The next attempt (in its own worker, no service yet) fences what the service left open.
    result = TaskResult(0)
    publish.publish_transactional(spec, spec.plans[0], iter([_rows(0, 10)]), result)
    assert (result.status, result.committed) == (COMMITTED, 10), result
    values = sorted(r.value for r in read_all(bootstrap_servers, s.spec.output_topic))
    assert values == sorted(f"v{i}".encode() for i in range(10)), "a duplicate or a gap"


def test_a_stale_plan_is_answered_after_the_rest_of_the_rows(slot, bootstrap_servers):
    """The service decides before reading the rows (the re-check after init); the task is
    still sending them: the answer waits until they are read, and nothing is published."""
    s = slot()
    s.start_service()
    assert s.publish(s.batch(1, 0, 5, None), iter([_rows(0, 5)]))[0].status == COMMITTED
    big = pa.RecordBatch.from_pylist([{"key": b"k", "value": b"x" * 10_000, "offset": i} for i in range(100)])
    # 4 MB: more than the socket's buffers hold, so the task is still sending when the answer is ready.
    stale = s.publish(s.batch(2, 0, 4_000, None), (big for _ in range(40)))
    assert [(r.status, r.committed) for r in stale] == [(STALE_PLAN, 5)]
    assert len(read_all(bootstrap_servers, s.spec.output_topic)) == 5


def test_an_error_in_the_service_reaches_the_task_with_its_type(slot, bootstrap_servers):
    s = slot()
    s.start_service()
    spec = s.batch(1, 0, 3, None)
    dead = (b"k", b"\xff", [], 0, 1, "decode", "not Avro")
    write_side_file(spec.read.side_dir, 1, ReadResult(3, [dead], 0.01), 0)   # the reader's, this attempt
    with pytest.raises(PoisonRecordError, match=r"@1 failed at decode: not Avro"):
        s.publish(spec, iter([_rows(0, 1), _rows(2, 3)]))
    assert read_all(bootstrap_servers, s.spec.output_topic) == []


def test_an_idle_service_closes_its_producer_and_exits(slot):
    s = slot(producer_idle_s=1.0)
    service = s.start_service()
    assert s.publish(s.batch(1, 0, 2, None), iter([_rows(0, 2)]))[0].status == COMMITTED
    assert service.wait(WAIT_S) == 0
    assert publisher_service.connect(s.name) is None


def test_in_a_run_steady_batches_pay_no_init_transactions(bootstrap_servers, make_topic, run_processor):
    """Through Spark: the first batches start the slots' services (and publish in the workers);
    from then on every batch is published by a producer that is already initialised."""
    from collections import Counter

    from processors.passthrough import PassThrough
    from tests.support.kafka import produce

    partitions, per_partition, cap = 4, 4_000, 250
    source, sink = make_topic("steady-in", partitions), make_topic("steady-out", partitions)
    values = [f"v-{p}-{i}".encode() for p in range(partitions) for i in range(per_partition)]
    for p in range(partitions):
        produce(bootstrap_servers, source, [(None, v) for v in values[p * per_partition:(p + 1) * per_partition]],
                partition=p)
    run = run_processor(PassThrough, inputs=[source], output=sink, max_records_per_partition=cap,
                        first_batch_records=0)
    inits = [float(m.group(1)) for m in (re.search(r"^batch \d+ .* init (\d+\.\d+)\)", line) for line in run.lines) if m]
    assert len(inits) == per_partition // cap, run.lines
    assert inits[-8:] == [0.0] * 8, f"init_transactions seconds per batch: {inits}"
    assert Counter(r.value for r in read_all(bootstrap_servers, sink)) == Counter(values)
