"""Scale out and in: two `txstream run` processes of one app split the partitions, and when one
is killed -9 the other takes its partitions over; the combined output is one clean run's.

Input is produced by a thread at a steady rate while the instances come and go. Run once with the
default assignment (cooperative-sticky, classic protocol) and once with the Kafka 4 consumer
group protocol (KIP-848, `-X group.protocol=consumer`; the broker assigns, and a dead member is
only dropped after the broker's session timeout, 45 s by default).
"""
from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.support.kafka import committed, read_all
from tests.support.running import Events, Run
from tests.support.waiting import wait_until
from txstream.tools import verify
from txstream.tools.topic_io import end_offsets

PARTITIONS = 4
RATE = 200          # records per second, over all partitions (one instance handles several times that)
LIMIT = 200_000     # a bound, should a phase hang
CAP = 1_000         # records per partition per batch


class SteadyProducer(threading.Thread):
    """Produces `RATE` records/s round robin over the partitions until stopped; keeps the values."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20})
        self.topic = topic
        self.values: list[bytes] = []
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            began, n = time.monotonic(), 0
            while not self.halt.is_set():
                due = min(LIMIT, int((time.monotonic() - began) * RATE))
                while n < due:
                    value = f"s-{n}".encode()
                    self.producer.produce(self.topic, value, f"k-{n}".encode(), partition=n % PARTITIONS)
                    self.values.append(value)
                    n += 1
                self.producer.poll(0.05)
            assert self.producer.flush(60) == 0
        except BaseException as exc:  # checked by the test
            self.error = exc

    def finish(self) -> list[bytes]:
        self.halt.set()
        self.join(90)
        assert not self.is_alive() and self.error is None, self.error
        return self.values


def owned(events: Events) -> set[str]:
    """The partitions an instance owns after the assigned/revoked events it logged so far."""
    mine: set[str] = set()
    for event in events:
        if event["event"] in ("assigned", "revoked"):
            names = set(event["partitions"])
            mine = mine | names if event["event"] == "assigned" else mine - names
    return mine


def start(args: list[str], log: Path) -> Run:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXSTREAM_FAULTS")}
    return Run([sys.executable, "-m", "txstream.cli", "run", *args], env, log).start()


def wait_for(run: Run, predicate, timeout: float, what: str) -> None:  # noqa: ANN001
    """Until `predicate(run's events)` holds; fails at once, with the log's tail, if the run ends."""
    assert wait_until(lambda: predicate(run.events()), timeout, what, run=run), \
        f"txstream run exited ({run.poll()}) before {what}:\n{run.tail()}"


@pytest.mark.parametrize("protocol", ["cooperative-sticky", "consumer"])
def test_two_instances_split_then_one_takes_over_after_kill(protocol, bootstrap_servers, make_topic, tmp_path) -> None:
    source, sink = make_topic("in", partitions=PARTITIONS), make_topic("out", partitions=PARTITIONS)
    everything = {f"{source}[{p}]" for p in range(PARTITIONS)}
    app_id = f"scaling-{protocol}-{uuid.uuid4().hex[:8]}"
    args = ["processors/passthrough.py:PassThrough", "--bootstrap-servers", bootstrap_servers,
            "--app-id", app_id, "--input", source, "--output", sink, "--master", "local[2]",
            "--max-records-per-partition", str(CAP), "--log-format", "json"]
    if protocol == "consumer":
        args += ["-X", "group.protocol=consumer"]
    producer = SteadyProducer(bootstrap_servers, source)
    runs: list[Run] = []
    try:
        # The stream starts once the first instance is up (Spark start-up must not build a
        # backlog), and flows until the second instance has taken over.
        first = start(args, tmp_path / "first.log")
        runs.append(first)
        wait_for(first, lambda events: owned(events) == everything, 300, "the first instance to own every partition")
        producer.start()
        wait_for(first, lambda events: events.batches, 300, "a first batch")

        # Scale out: the second instance joins; the two split the partitions.
        second = start(args, tmp_path / "second.log")
        runs.append(second)
        wait_for(second, lambda events: owned(events) and events.batches, 300,
                 "the second instance to be assigned partitions and run a batch")
        wait_for(first, lambda events: owned(events) | owned(second.events()) == everything, 60,
                 "the two instances to cover every partition")
        mine, theirs = owned(first.events()), owned(second.events())
        assert mine and theirs and not mine & theirs and mine | theirs == everything, (mine, theirs)
        revoked = first.events().of("revoked")
        assert revoked, first.tail()
        if protocol == "cooperative-sticky":
            # Incremental: the first instance gave up only what moved, it never held nothing.
            assert all(len(event["partitions"]) < PARTITIONS for event in revoked), revoked
        batches_before = len(first.events().batches)
        wait_for(first, lambda events: len(events.batches) > batches_before, 120,
                 "a batch of the first instance on its share")

        # Scale in, the hard way: kill -9 the first one mid-stream; the second takes over.
        first.kill9()
        wait_for(second, lambda events: owned(events) == everything, 180,
                 "the second instance to take over every partition")
        taken_over = len(second.events().batches)
        wait_for(second, lambda events: len(events.batches) > taken_over, 120,
                 "a batch of the second instance after the take-over")

        inputs = producer.finish()
        ends = {p: end for p, (_low, end) in end_offsets(bootstrap_servers, source, "read_committed").items()}
        assert wait_until(lambda: committed(bootstrap_servers, app_id, source, PARTITIONS) == ends, 300,
                          "the second instance to commit every input", run=second), second.tail()
        assert second.terminate(120) == 0, second.tail()
        assert second.events().of("stopped"), second.tail()
    finally:
        producer.halt.set()
        for run in runs:
            run.destroy()

    out = Counter(r.value for r in read_all(bootstrap_servers, sink))
    print(f"\n{protocol}: {len(inputs)} inputs, {sum(out.values())} outputs; first instance "
          f"{len(first.events().batches)} batches, second {len(second.events().batches)}")
    assert out == Counter(inputs)
    report = verify.audit(bootstrap_servers, [source], [sink], app_id=app_id, one_to_one=True)
    assert report.clean, [p for p in report.partitions if p.duplicates or p.gaps or p.unexpected]
    assert sum(p.outputs for p in report.partitions) == len(inputs)
