"""A slot's re-check and send_offsets_to_transaction run beside its produce (task/publish.py
`_CommitPrelude`, docs/architecture.md §3.4): the offsets go out while the output is still
arriving, the commit waits for both, and a re-check that finds the plan stale or the ranges done
stops the produce and commits nothing."""
from __future__ import annotations

import threading
import time
import uuid

import pyarrow as pa

from tests.support.kafka import committed, drop_cached_publishers, live_member, produce, read_all
from txstream.kafka.config import KafkaClients
from txstream.task import publish
from txstream.task.publisher import TransactionalPublisher
from txstream.task.result import ALREADY_DONE, COMMITTED, STALE_PLAN, TaskResult
from txstream.task.spec import EXACTLY_ONCE, PartitionPlan, PublishSpec, ReadSpec

WAIT_S = 30
PIECES = 3_000


def _spec(bootstrap_servers: str, app_id: str, sink: str, owner_dir: str) -> PublishSpec:
    read = ReadSpec(clients=KafkaClients(bootstrap_servers), app_id=app_id,
                    side_dir=f"txstream-test-{uuid.uuid4().hex[:8]}")
    return PublishSpec(read=read, guarantee=EXACTLY_ONCE, transaction_timeout_s=20, owner_dir=owner_dir,
                       output_topic=sink)


def _rows(first: int, count: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [{"key": b"k", "value": f"v{i}".encode(), "offset": i} for i in range(first, first + count)])


def test_the_offsets_go_out_while_the_output_is_still_arriving(bootstrap_servers, make_topic, tmp_path,
                                                                monkeypatch) -> None:
    source, sink = make_topic("prelude-in", 1), make_topic("prelude-out", 1)
    produce(bootstrap_servers, source, [(b"k", b"v")] * 10)
    app_id = f"prelude-{uuid.uuid4().hex[:8]}"
    sent = threading.Event()
    send_offsets = TransactionalPublisher.send_offsets

    def spy(self, offsets, metadata):
        send_offsets(self, offsets, metadata)
        sent.set()

    monkeypatch.setattr(TransactionalPublisher, "send_offsets", spy)
    sent_before_the_last_batch: list[bool] = []

    def upstream():
        yield _rows(0, 5)
        # Serially (re-check, produce everything, then send the offsets) this waits in vain.
        sent_before_the_last_batch.append(sent.wait(WAIT_S))
        yield _rows(5, 5)

    plan = PartitionPlan(source, 0, 0, 10, None, f"{app_id}-{source}-0")
    with live_member(bootstrap_servers, app_id, source) as member:
        spec = _spec(bootstrap_servers, app_id, sink, str(tmp_path)).with_batch(1, [plan], member.consumer_group_metadata())
        try:
            result = TaskResult(0)
            publish.publish_transactional(spec, plan, upstream(), result)
        finally:
            drop_cached_publishers()
    assert sent_before_the_last_batch == [True]
    assert result.status == COMMITTED, result
    assert committed(bootstrap_servers, app_id, source, 1) == {0: 10}
    assert sorted(r.value for r in read_all(bootstrap_servers, sink)) == sorted(f"v{i}".encode() for i in range(10))


def test_a_refused_recheck_stops_the_produce_and_commits_nothing(bootstrap_servers, make_topic, tmp_path) -> None:
    """The first batch commits [0, 10). A plan made before it (nothing committed, end 6) is stale,
    one that repeats it (end 10) finds its range done: either way the task stops taking its input
    once the re-check has answered, and nothing more becomes visible."""
    source, sink = make_topic("refused-in", 1), make_topic("refused-out", 1)
    produce(bootstrap_servers, source, [(b"k", b"v")] * 10)
    app_id = f"refused-{uuid.uuid4().hex[:8]}"
    with live_member(bootstrap_servers, app_id, source) as member:
        spec = _spec(bootstrap_servers, app_id, sink, str(tmp_path))
        metadata = member.consumer_group_metadata()
        try:
            done = PartitionPlan(source, 0, 0, 10, None, f"{app_id}-{source}-0")
            first = TaskResult(0)
            publish.publish_transactional(spec.with_batch(1, [done], metadata), done, iter([_rows(0, 10)]), first)
            assert first.status == COMMITTED, first
            for batch, (end, expected) in enumerate([(6, STALE_PLAN), (10, ALREADY_DONE)], start=2):
                plan = PartitionPlan(source, 0, 0, end, None, f"{app_id}-{source}-0")
                taken: list[int] = []

                def endless(taken=taken):
                    # Paced, and bounded: a task that never stops taking input fails the test in
                    # 30 s instead of hanging the run.
                    for n in range(PIECES):
                        taken.append(n)
                        time.sleep(0.01)
                        yield _rows(100 + n, 1)

                result = TaskResult(0)
                publish.publish_transactional(spec.with_batch(batch, [plan], metadata), plan, endless(), result)
                assert result.status == expected, result
                assert len(taken) < PIECES, "the task kept taking input after the re-check refused the plan"
                assert result.committed == 10
        finally:
            drop_cached_publishers()
    assert committed(bootstrap_servers, app_id, source, 1) == {0: 10}
    assert sorted(r.value for r in read_all(bootstrap_servers, sink)) == sorted(f"v{i}".encode() for i in range(10))
