"""A run's first batch is small (driver/pacing.py `cap`): output soon after the start, even over a
backlog; then batches as big as the cap allows. And the driver joins an empty group while Spark
starts, not after it."""
from __future__ import annotations

import threading
import time
from collections import Counter

from confluent_kafka.admin import AdminClient

from processors.passthrough import PassThrough
from tests.support.kafka import produce, read_all
from tests.support.waiting import wait_until
from txstream.kafka.lookups import describe_group

PARTITIONS, PER_PARTITION = 4, 5_000


def test_first_batch_reads_first_batch_records_then_the_cap(bootstrap_servers, make_topic, run_processor) -> None:
    source = make_topic("backlog", partitions=PARTITIONS)
    values = [f"v-{p}-{i}".encode() for p in range(PARTITIONS) for i in range(PER_PARTITION)]
    for p in range(PARTITIONS):
        produce(bootstrap_servers, source, [(None, v) for v in values[p * PER_PARTITION:(p + 1) * PER_PARTITION]],
                partition=p)

    ramped_sink = make_topic("ramped", partitions=PARTITIONS)
    ramped = run_processor(PassThrough, inputs=[source], output=ramped_sink, first_batch_records=2_000)
    # 2,000 in all (500 per partition), then the rest (within the cap, 100,000 per partition).
    assert [b["records_in"] for b in ramped.events.batches] == [2_000, 18_000], ramped.lines
    assert Counter(r.value for r in read_all(bootstrap_servers, ramped_sink)) == Counter(values)

    whole_sink = make_topic("whole", partitions=PARTITIONS)
    whole = run_processor(PassThrough, inputs=[source], output=whole_sink, first_batch_records=0)
    assert [b["records_in"] for b in whole.events.batches] == [20_000], whole.lines
    assert Counter(r.value for r in read_all(bootstrap_servers, whole_sink)) == Counter(values)


def test_the_driver_joins_an_empty_group_before_spark_is_ready(bootstrap_servers, make_topic, run_processor) -> None:
    """The processor's setup (after Spark starts, before the transform's check) waits until the
    broker lists the driver as the group's member with every partition assigned: a driver that
    joined only after its Spark start-up would never get there, and the run would fail."""
    source, sink = make_topic("early-in", partitions=PARTITIONS), make_topic("early-out", partitions=PARTITIONS)
    produce(bootstrap_servers, source, [(None, f"v{i}".encode()) for i in range(100)], partition=0)
    app_id = f"early-join-{time.monotonic_ns()}"
    joined = threading.Event()
    seen: list[str] = []

    def watch() -> None:
        admin = AdminClient({"bootstrap.servers": bootstrap_servers})

        def all_assigned() -> bool:
            group = describe_group(admin, app_id, timeout=10)
            assigned = sum(len(m.partitions) for m in group.members)
            seen.append(f"{group.state} {len(group.members)} member(s), {assigned} partition(s)")
            return assigned == PARTITIONS

        wait_until(all_assigned, 60, "the driver's membership", every=0.05)
        joined.set()

    class WaitsForItsGroup(PassThrough):
        def setup(self, spark) -> None:
            if not joined.wait(60):
                raise RuntimeError(f"not a member before the first batch: {seen[-3:]}")

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    driver = run_processor(WaitsForItsGroup, inputs=[source], output=sink, app_id=app_id)
    watcher.join(10)
    assert driver.exit_code == 0 and joined.is_set(), seen[-3:]
    assert Counter(r.value for r in read_all(bootstrap_servers, sink)) == Counter(f"v{i}".encode() for i in range(100))
