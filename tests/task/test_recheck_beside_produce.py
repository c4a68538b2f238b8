"""A slot's re-check runs beside its produce (task/publish.py `_Recheck`,
docs/architecture.md §3.4); its offsets go into the transaction only once the output is produced,
so stable readers of the group's offsets are not kept waiting; a re-check that finds the plan
stale or the ranges done stops the produce and commits nothing."""
from __future__ import annotations

import threading
import time
import uuid
from typing import Callable

import pyarrow as pa
from confluent_kafka import Consumer, TopicPartition

from tests.support.kafka import committed, drop_cached_publishers, live_member, produce, read_all
from txstream.constants import ALREADY_DONE, COMMITTED, EXACTLY_ONCE, STALE_PLAN
from txstream.kafka.config import KafkaClients
from txstream.task import publish
from txstream.task.result import TaskResult
from txstream.task.spec import PartitionPlan, PublishSpec, ReadSpec

WAIT_S = 30
PIECES = 3_000


def _spec(bootstrap_servers: str, app_id: str, sink: str, owner_dir: str) -> PublishSpec:
    read = ReadSpec(clients=KafkaClients(bootstrap_servers), app_id=app_id,
                    side_dir=f"txstream-test-{uuid.uuid4().hex[:8]}")
    return PublishSpec(read=read, guarantee=EXACTLY_ONCE, transaction_timeout_s=20, owner_dir=owner_dir,
                       output_topic=sink)


def _recheck_spy() -> tuple[threading.Event, Callable]:
    """A stand-in for publish.current_offsets, the re-check's read: the event is set once a
    re-check has read the offsets (so a test waits on that, not on time)."""
    checked = threading.Event()
    current_offsets = publish.current_offsets

    def spy(spec, plans):
        found = current_offsets(spec, plans)
        checked.set()
        return found

    return checked, spy


def _rows(first: int, count: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [{"key": b"k", "value": f"v{i}".encode(), "offset": i} for i in range(first, first + count)])


def test_the_recheck_runs_beside_the_produce_and_the_offsets_wait_for_the_output(
        bootstrap_servers, make_topic, tmp_path, monkeypatch) -> None:
    """The re-check answers while the input is still arriving; the offsets are not pending in the
    transaction meanwhile, so a stable reader of the group's offsets (a read_committed consumer's
    committed(), as monitoring uses) is answered at once instead of waiting for the batch."""
    source, sink = make_topic("prelude-in", 1), make_topic("prelude-out", 1)
    produce(bootstrap_servers, source, [(b"k", b"v")] * 10)
    app_id = f"prelude-{uuid.uuid4().hex[:8]}"
    checked, spy = _recheck_spy()
    monkeypatch.setattr(publish, "current_offsets", spy)
    seen_mid_produce: list[tuple[bool, float]] = []
    reader = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": app_id,
                       "isolation.level": "read_committed", "enable.auto.commit": False})

    def upstream():
        yield _rows(0, 5)
        rechecked = checked.wait(WAIT_S)
        started = time.monotonic()
        reader.committed([TopicPartition(source, 0)], timeout=WAIT_S)   # stable: waits on pending offsets
        seen_mid_produce.append((rechecked, time.monotonic() - started))
        yield _rows(5, 5)

    plan = PartitionPlan(source, 0, 0, 10, None, f"{app_id}-{source}-0")
    with live_member(bootstrap_servers, app_id, source) as member:
        spec = _spec(bootstrap_servers, app_id, sink, str(tmp_path)).with_batch(1, [plan], member.consumer_group_metadata())
        try:
            result = TaskResult(0)
            publish.publish_transactional(spec, plan, upstream(), result)
        finally:
            drop_cached_publishers()
            reader.close()
    [(rechecked, stable_read_s)] = seen_mid_produce
    assert rechecked, "the re-check did not answer before the last input batch"
    # Offsets sent beside the produce keep this read waiting until the transaction ends: here,
    # never (the task waits for this generator), so it times out after WAIT_S.
    assert stable_read_s < WAIT_S / 3, f"a stable read during the produce took {stable_read_s:.1f}s"
    assert result.status == COMMITTED, result
    assert committed(bootstrap_servers, app_id, source, 1) == {0: 10}
    assert sorted(r.value for r in read_all(bootstrap_servers, sink)) == sorted(f"v{i}".encode() for i in range(10))


def test_a_refused_recheck_stops_the_produce_and_commits_nothing(bootstrap_servers, make_topic, tmp_path,
                                                                monkeypatch) -> None:
    """The first batch commits [0, 10). A plan made before it (nothing committed, end 6) is stale,
    one that repeats it (end 10) finds its range done: either way the task stops taking its input
    once the re-check has answered, and nothing more becomes visible."""
    source, sink = make_topic("refused-in", 1), make_topic("refused-out", 1)
    produce(bootstrap_servers, source, [(b"k", b"v")] * 10)
    app_id = f"refused-{uuid.uuid4().hex[:8]}"
    checked, spy = _recheck_spy()
    with live_member(bootstrap_servers, app_id, source) as member:
        spec = _spec(bootstrap_servers, app_id, sink, str(tmp_path))
        metadata = member.consumer_group_metadata()
        try:
            done = PartitionPlan(source, 0, 0, 10, None, f"{app_id}-{source}-0")
            first = TaskResult(0)
            publish.publish_transactional(spec.with_batch(1, [done], metadata), done, iter([_rows(0, 10)]), first)
            assert first.status == COMMITTED, first
            monkeypatch.setattr(publish, "current_offsets", spy)
            for batch, (end, expected) in enumerate([(6, STALE_PLAN), (10, ALREADY_DONE)], start=2):
                plan = PartitionPlan(source, 0, 0, end, None, f"{app_id}-{source}-0")
                checked.clear()
                taken: list[int] = []

                def endless(taken=taken):
                    # Once the re-check has answered, input keeps coming without pause: a task
                    # that does not stop takes all of it.
                    for n in range(PIECES):
                        taken.append(n)
                        yield _rows(100 + n, 1)
                        if n == 0:
                            assert checked.wait(WAIT_S), "the re-check did not answer"

                result = TaskResult(0)
                publish.publish_transactional(spec.with_batch(batch, [plan], metadata), plan, endless(), result)
                assert result.status == expected, result
                # Two or three (the re-check's answer lands just after the spy's signal); all
                # PIECES without the stop.
                assert len(taken) < 100, f"the task took {len(taken)} input batches after the re-check refused"
                assert result.committed == 10
        finally:
            drop_cached_publishers()
    assert committed(bootstrap_servers, app_id, source, 1) == {0: 10}
    assert sorted(r.value for r in read_all(bootstrap_servers, sink)) == sorted(f"v{i}".encode() for i in range(10))
