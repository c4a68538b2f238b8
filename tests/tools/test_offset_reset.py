"""auto.offset.reset, out-of-range committed offsets, and replay with `txstream offsets reset`.

In-process drivers on the session's Spark (no start-up per test), a real broker, and the real
`txstream offsets` command as a subprocess.
"""
from __future__ import annotations

import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

from processors.passthrough import PassThrough
from tests.support.kafka import committed, produce, read_all
from tests.support.running import DriverThread, resolve_settings
from tests.support.waiting import wait_until
from txstream.errors import NoCommittedOffsetError
from txstream.tools.topic_io import end_offsets

REPO = Path(__file__).resolve().parents[2]


def seed(bootstrap: str, topic: str, partitions: int, per_partition: int, tag: str = "", first: int = 0) -> list[bytes]:
    values = []
    for p in range(partitions):
        records = [(f"k{p}-{i}".encode(), f"{tag}p{p}-{i}".encode()) for i in range(first, first + per_partition)]
        produce(bootstrap, topic, records, partition=p)
        values += [v for _, v in records]
    return values


def values(bootstrap: str, topic: str) -> Counter:
    return Counter(r.value for r in read_all(bootstrap, topic))


def offsets_cli(bootstrap: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "txstream.cli", "offsets", *args, "--bootstrap-servers", bootstrap],
                          cwd=REPO, capture_output=True, text=True, timeout=120)


def background(spark, bootstrap: str, **overrides) -> DriverThread:
    """A PassThrough Driver on a thread (no --until-caught-up): looked at while it runs."""
    overrides.setdefault("app_id", f"test-reset-{uuid.uuid4().hex[:8]}")
    return DriverThread(resolve_settings(PassThrough, bootstrap, **overrides), spark).start()


def said(run: DriverThread, text: str, count: int = 1) -> int:
    return sum(text in message for message in run.events.messages()) >= count


def test_earliest_is_the_default_and_processes_everything(bootstrap_servers, make_topic, run_processor) -> None:
    source, sink = make_topic("in", partitions=2), make_topic("out", partitions=2)
    inputs = seed(bootstrap_servers, source, 2, 500)
    driver = run_processor(PassThrough, inputs=[source], output=sink)
    assert driver.settings.auto_offset_reset == "earliest"
    assert driver.exit_code == 0
    assert values(bootstrap_servers, sink) == Counter(inputs)
    assert committed(bootstrap_servers, driver.settings.app_id, source, 2) == {0: 500, 1: 500}


def test_latest_processes_only_records_produced_after_start(bootstrap_servers, make_topic, spark) -> None:
    source, sink = make_topic("in", partitions=2), make_topic("out", partitions=2)
    seed(bootstrap_servers, source, 2, 300, tag="before-")
    run = background(spark, bootstrap_servers, inputs=[source], output=sink, auto_offset_reset="latest")
    try:
        # The planner fixes each partition's start when it first plans it, and says so.
        wait_until(lambda: said(run, "auto.offset.reset=latest", 2) or not run.alive(), 120,
                   "both partitions' starts")
        assert said(run, f"{source}[0]: no committed offset; starting at the last stable offset 300"), run.lines
        after = seed(bootstrap_servers, source, 2, 200, tag="after-", first=300)
        app_id = run.driver.settings.app_id
        wait_until(lambda: committed(bootstrap_servers, app_id, source, 2) == {0: 500, 1: 500},
                   120, "the records produced after the start to be committed")
    finally:
        code = run.stop()
    assert code == 0, run.outcome
    assert values(bootstrap_servers, sink) == Counter(after)
    assert not said(run, "WARNING"), run.lines


def test_none_names_the_partitions_without_offsets_and_publishes_nothing(bootstrap_servers, admin, make_topic,
                                                                         run_processor) -> None:
    source, sink = make_topic("in", partitions=3), make_topic("out", partitions=3)
    seed(bootstrap_servers, source, 3, 100)
    app_id = f"test-none-{uuid.uuid4().hex[:8]}"
    # The group has an offset for partition 0 only.
    offsets = ConsumerGroupTopicPartitions(app_id, [TopicPartition(source, 0, 40)])
    admin.alter_consumer_group_offsets([offsets])[app_id].result(30)
    with pytest.raises(NoCommittedOffsetError) as error:
        run_processor(PassThrough, inputs=[source], output=sink, app_id=app_id, auto_offset_reset="none")
    message = str(error.value)
    assert f"{source}[1], {source}[2]" in message and f"{source}[0]" not in message, message
    assert "auto.offset.reset=none" in message and "txstream offsets reset" in message, message
    assert read_all(bootstrap_servers, sink) == []
    assert committed(bootstrap_servers, app_id, source, 3) == {0: 40, 1: None, 2: None}


def test_committed_offset_deleted_by_retention_is_reset_loudly(bootstrap_servers, admin, make_topic,
                                                               run_processor) -> None:
    source, sink = make_topic("in", partitions=2), make_topic("out", partitions=2)
    first = seed(bootstrap_servers, source, 2, 500)
    app_id = f"test-retention-{uuid.uuid4().hex[:8]}"
    assert run_processor(PassThrough, inputs=[source], output=sink, app_id=app_id).exit_code == 0
    assert committed(bootstrap_servers, app_id, source, 2) == {0: 500, 1: 500}
    more = seed(bootstrap_servers, source, 2, 500, first=500)
    # Retention (here: DeleteRecords) removes partition 0 below 800, beyond the committed 500.
    admin.delete_records([TopicPartition(source, 0, 800)])[TopicPartition(source, 0, 800)].result(30)
    assert end_offsets(bootstrap_servers, source, "read_committed")[0] == (800, 1000)

    # none: a clear error, nothing published, nothing committed.
    out_of_range = rf"{source}\[0\]: committed offset 500 is out of range \[800, 1000\]"
    with pytest.raises(NoCommittedOffsetError, match=out_of_range):
        run_processor(PassThrough, inputs=[source], output=sink, app_id=app_id, auto_offset_reset="none")
    assert values(bootstrap_servers, sink) == Counter(first)
    assert committed(bootstrap_servers, app_id, source, 2) == {0: 500, 1: 500}

    # earliest: reset to the new log start, with a WARNING line naming what was lost.
    driver = run_processor(PassThrough, inputs=[source], output=sink, app_id=app_id)
    assert driver.exit_code == 0
    warnings = [m for m in driver.events.messages() if m.startswith("WARNING")]
    assert len(warnings) == 1, driver.lines
    assert (f"{source}[0]: committed offset 500 is out of range [800, 1000]" in warnings[0]
            and "resetting to 800 by auto.offset.reset=earliest" in warnings[0]), warnings
    lost = {f"p0-{i}".encode() for i in range(500, 800)}
    assert values(bootstrap_servers, sink) == Counter(first) + Counter(v for v in more if v not in lost)
    assert committed(bootstrap_servers, app_id, source, 2) == {0: 1000, 1: 1000}


def test_reset_to_earliest_then_run_replays_everything(bootstrap_servers, make_topic, run_processor) -> None:
    source, sink = make_topic("in", partitions=2), make_topic("out", partitions=2)
    inputs = seed(bootstrap_servers, source, 2, 400)
    app_id = f"test-replay-{uuid.uuid4().hex[:8]}"
    assert run_processor(PassThrough, inputs=[source], output=sink, app_id=app_id).exit_code == 0
    assert values(bootstrap_servers, sink) == Counter(inputs)

    dry = offsets_cli(bootstrap_servers, "reset", "--app-id", app_id, "--to-earliest")
    assert dry.returncode == 0, dry.stderr
    assert "Dry run" in dry.stdout, dry.stdout
    assert committed(bootstrap_servers, app_id, source, 2) == {0: 400, 1: 400}

    done = offsets_cli(bootstrap_servers, "reset", "--app-id", app_id, "--to-earliest", "--execute")
    assert done.returncode == 0, done.stderr
    assert "Executed" in done.stdout, done.stdout
    assert committed(bootstrap_servers, app_id, source, 2) == {0: 0, 1: 0}

    again = run_processor(PassThrough, inputs=[source], output=sink, app_id=app_id)
    assert again.exit_code == 0 and again.totals["records_in"] == 800
    # A replay publishes everything again: each input twice (the first run's copy and the replay's).
    assert values(bootstrap_servers, sink) == Counter({v: 2 for v in inputs})


def test_reset_is_refused_while_an_instance_runs(bootstrap_servers, make_topic, spark) -> None:
    source, sink = make_topic("in", partitions=2), make_topic("out", partitions=2)
    seed(bootstrap_servers, source, 2, 100)
    run = background(spark, bootstrap_servers, inputs=[source], output=sink)
    try:
        app_id = run.driver.settings.app_id
        wait_until(lambda: run.events.of("assigned") or not run.alive(), 120, "partitions assigned")
        wait_until(lambda: committed(bootstrap_servers, app_id, source, 2) == {0: 100, 1: 100}, 120,
                   "the first records to be processed")
        refused = offsets_cli(bootstrap_servers, "reset", "--app-id", app_id, "--to-earliest", "--execute")
        assert refused.returncode != 0
        assert "live member" in refused.stderr and "stop them first" in refused.stderr, refused.stderr
        assert committed(bootstrap_servers, app_id, source, 2) == {0: 100, 1: 100}
    finally:
        code = run.stop()
    assert code == 0, run.outcome
    # Stopped (it left the group): now the reset goes through.
    done = offsets_cli(bootstrap_servers, "reset", "--app-id", app_id, "--to-earliest", "--execute")
    assert done.returncode == 0, done.stderr
    assert committed(bootstrap_servers, app_id, source, 2) == {0: 0, 1: 0}


def test_reset_of_a_wide_app_with_a_pending_batch_is_refused_unless_forced(bootstrap_servers, make_topic,
                                                                           tmp_path) -> None:
    """A wide run killed after every unit published batch 1 and before the batch was closed: its
    plan log says batch 1 is pending and the markers say the units published it. A reset would
    abandon that batch, so it is refused, naming the batch and the units; --force does it and says
    what it abandoned."""
    import os
    import signal

    source, sink = make_topic("in", partitions=2), make_topic("out", partitions=2)
    produce(bootstrap_servers, source, [(f"k{i}".encode(), b"v") for i in range(400)])
    app_id = f"test-wide-reset-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TXSTREAM_FAULTS": "driver.before_close=kill@1",
           "TXSTREAM_FAULTS_DIR": str(tmp_path / "faults")}
    # A session of its own: the fault SIGKILLs the run's process group.
    killed = subprocess.run([sys.executable, "-m", "txstream.cli", "run", "tests.support.wide_processors:BucketTotals",
                             "-b", bootstrap_servers, "--input", source, "--output", sink, "--app-id", app_id,
                             "--master", "local[2]", "--until-caught-up"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=600, start_new_session=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    from confluent_kafka.admin import AdminClient

    from txstream.kafka.lookups import describe_group

    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    # The killed driver's membership ends with its session timeout.
    wait_until(lambda: not describe_group(admin, app_id, timeout=10).members, 180, "the killed member to expire")
    before = committed(bootstrap_servers, app_id, source, 2)
    assert before == {0: 0, 1: 0}, before

    dry = offsets_cli(bootstrap_servers, "reset", "--app-id", app_id, "--to-latest")
    assert dry.returncode == 0, dry.stderr
    assert "is a wide app's" in dry.stderr and "batch 1 of group" in dry.stderr, dry.stderr

    refused = offsets_cli(bootstrap_servers, "reset", "--app-id", app_id, "--to-latest", "--execute")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"batch 1 of group {app_id} is pending" in refused.stderr, refused.stderr
    assert "unit(s) 0, 1 published it already" in refused.stderr and "--force" in refused.stderr
    assert committed(bootstrap_servers, app_id, source, 2) == before

    forced = offsets_cli(bootstrap_servers, "reset", "--app-id", app_id, "--to-latest", "--execute", "--force")
    assert forced.returncode == 0, forced.stderr
    assert "abandoning it: batch 1" in forced.stderr and "its next batch is batch 2" in forced.stderr, forced.stderr
    ends = end_offsets(bootstrap_servers, source, "read_committed")
    assert committed(bootstrap_servers, app_id, source, 2) == {p: end for p, (_start, end) in ends.items()}
