"""The three delivery guarantees under kill -9, with real `txstream run` processes.

Each mode copies the same input (4 partitions, PassThrough, 2000 records per partition per batch)
while the whole process group (driver, JVM, Python workers) is SIGKILLed mid-batch several
times: at deterministic points (TXSTREAM_FAULTS) and once at a random moment after progress is
seen. The process is restarted after every kill until a run exits 0. Then the output, read with
read_committed, shows what each mode promises and what it does not:

- exactly-once: output == input as multisets (no duplicate, no gap), and `txstream verify` agrees.
- at-least-once: every input is in the output (no gap), and duplicates did occur.
- at-most-once: no input is in the output twice (no duplicate), and gaps did occur.

The kill points differ per mode where that is what shows the difference:
- at-least-once: `publish.after_commit=kill@3` = the first slot of the second batch has its
  output acknowledged (two slots per batch), but the driver has not committed the batch's
  offsets, so the restart repeats that output.
- at-most-once: `publish.mid_produce=kill@1` = the first task of the first batch has produced part
  of its output. The driver committed the batch's end offsets before it ran, and two of its four
  tasks have not even started, so the restart skips their ranges.
"""
from __future__ import annotations

import os
import random
import signal
import tempfile
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.support.kafka import committed, read_all
from tests.support.running import App
from tests.support.seeding import seed_numbered
from tests.support.waiting import wait_until
from txstream.tools import verify

PARTITIONS = 4
# 20 batches of input: a "random" kill, up to 1.5 s after a run's first batch, must find the run
# still busy.
PER_PARTITION = 40_000
CAP = 2_000

# One entry per process start: a TXSTREAM_FAULTS spec (the run must die by it), "random" (kill
# at a random moment after the first batch), or None (run to the end, exit 0).
SCHEDULES = {
    "exactly-once": ["publish.mid_produce=kill@3", "publish.before_commit=kill@2", "random", None],
    "at-least-once": ["publish.after_commit=kill@3", "random", None],
    "at-most-once": ["publish.mid_produce=kill@1", "random", None],
}


def seed(bootstrap: str, topic: str) -> list[bytes]:
    """PER_PARTITION records on each partition; their values (all distinct)."""
    sent = seed_numbered(bootstrap, topic, PARTITIONS, PARTITIONS * PER_PARTITION)
    return [value for _key, value in sent.elements()]


def run_chain(guarantee: str, bootstrap: str, source: str, sink: str, workdir: Path, rng: random.Random,
              extra: tuple[str, ...] = ()) -> dict:
    """Start, kill and restart `txstream run` along the mode's schedule; what happened."""
    workdir.mkdir()
    app = App(bootstrap, source, sink, PARTITIONS, app_id=f"guarantee-{guarantee}-{uuid.uuid4().hex[:8]}",
              cap=CAP, log_dir=str(workdir),
              # A killed member leaves the group after its session timeout: keep restarts quick.
              extra=["--guarantee", guarantee, "-X", "consumer.session.timeout.ms=6000", *extra])
    kills: list[str] = []
    after_first_kill = None
    for step, fault in enumerate(SCHEDULES[guarantee], start=1):
        app.faults = fault if fault not in (None, "random") else None
        app.faults_dir = tempfile.mkdtemp(dir=workdir) if app.faults else None
        run = app.start()
        try:
            if fault is None:
                code = run.wait(300, kill_rest=False)
                assert code == 0, f"final run of {guarantee} failed ({code}):\n{run.tail()}"
                assert run.events().of("caught_up"), run.tail()
                # The Spark JVM (in the driver's process group) ended with the driver, not after it.
                assert run.group_left() == [], f"left running after the driver exited: {run.group_left()}"
            elif fault == "random":
                assert wait_until(lambda run=run: run.events().batches, 300, "a first batch", run=run), \
                    f"{guarantee} run {step} exited ({run.poll()}) before its first batch:\n{run.tail()}"
                time.sleep(rng.uniform(0.0, 1.5))
                assert run.poll() is None, f"{guarantee} run {step} ended before the random kill:\n{run.tail()}"
                run.kill9()
                kills.append(f"at random after {len(run.events().batches)} batch(es)")
            else:
                code = run.wait(300)
                assert code == -signal.SIGKILL, f"{fault} did not kill {guarantee} run {step} ({code}):\n{run.tail()}"
                kills.append(f"{fault} in batch {len(run.events().batches) + 1}")
        finally:
            run.destroy()
        if step == 1 and guarantee != "exactly-once":
            after_first_kill = committed(bootstrap, app.app_id, source, PARTITIONS)
    return {"app_id": app.app_id, "kills": kills, "after_first_kill": after_first_kill}


def test_guarantee_matrix_under_kill_minus_nine(bootstrap_servers, make_topic, tmp_path) -> None:
    """The three modes side by side (concurrently: most of a run is start-up and group joins)."""
    rng_seed = int(os.environ.get("TXSTREAM_TEST_SEED", random.randrange(1 << 30)))
    topics = {g: (make_topic("in", partitions=PARTITIONS), make_topic("out", partitions=PARTITIONS))
              for g in SCHEDULES}
    inputs = {g: seed(bootstrap_servers, source) for g, (source, _) in topics.items()}
    with ThreadPoolExecutor(len(SCHEDULES)) as pool:
        futures = {g: pool.submit(run_chain, g, bootstrap_servers, source, sink, tmp_path / g,
                                  random.Random(f"{rng_seed}-{g}"))
                   for g, (source, sink) in topics.items()}
        chains = {g: f.result() for g, f in futures.items()}

    figures = {}
    for guarantee, (source, sink) in topics.items():
        chain = chains[guarantee]
        out = Counter(r.value for r in read_all(bootstrap_servers, sink))
        expected = Counter(inputs[guarantee])
        duplicates = sum(n - 1 for n in out.values() if n > 1)
        gaps = sum(1 for v in expected if v not in out)
        figures[guarantee] = (duplicates, gaps)
        print(f"\n{guarantee}: kills {'; '.join(chain['kills'])}; output {sum(out.values())} records "
              f"for {len(expected)} inputs: {duplicates} duplicates, {gaps} gaps (seed {rng_seed})")
        assert not [v for v in out if v not in expected]
        # Every mode ends with the whole input consumed.
        assert committed(bootstrap_servers, chain["app_id"], source, PARTITIONS) == {
            p: PER_PARTITION for p in range(PARTITIONS)}
        if guarantee == "exactly-once":
            assert (duplicates, gaps) == (0, 0)
            assert out == expected
            report = verify.audit(bootstrap_servers, [source], [sink], app_id=chain["app_id"], one_to_one=True)
            assert report.clean, [p for p in report.partitions if p.duplicates or p.gaps or p.unexpected]
            assert sum(p.consumed for p in report.partitions) == len(expected)
            assert sum(p.outputs for p in report.partitions) == len(expected)
        else:
            # DriverCommits at work, seen right after the first kill: at-most-once committed batch
            # 1's end offsets before running it (the kill came inside batch 1); at-least-once
            # committed batch 1 once its output was acknowledged, and not batch 2 (killed in it).
            assert chain["after_first_kill"] == {p: CAP for p in range(PARTITIONS)}, chain["after_first_kill"]
        if guarantee == "at-least-once":
            assert gaps == 0, "at-least-once lost records"
            assert duplicates > 0, "the kills were meant to repeat acknowledged output"
        if guarantee == "at-most-once":
            assert duplicates == 0, "at-most-once repeated records"
            assert gaps > 0, "the kills were meant to lose committed-but-unpublished ranges"


def test_exactly_once_without_lineage_under_kill_minus_nine(bootstrap_servers, make_topic, tmp_path) -> None:
    """The exactly-once schedule with a slot's 4 ranges read together in one Spark partition
    (`--no-lineage --task-slots 1`, task/reading.py read_ranges): killed mid-produce,
    before a commit and at random, the output is still the input exactly once."""
    rng_seed = int(os.environ.get("TXSTREAM_TEST_SEED", random.randrange(1 << 30)))
    source, sink = make_topic("in", partitions=PARTITIONS), make_topic("out", partitions=PARTITIONS)
    expected = Counter(seed(bootstrap_servers, source))
    chain = run_chain("exactly-once", bootstrap_servers, source, sink, tmp_path / "no-lineage",
                      random.Random(rng_seed), ("--no-lineage", "--task-slots", "1"))
    records = read_all(bootstrap_servers, sink)
    out = Counter(r.value for r in records)
    print(f"\nexactly-once, no lineage: kills {'; '.join(chain['kills'])}; output {sum(out.values())} records "
          f"for {len(expected)} inputs (seed {rng_seed})")
    assert out == expected, (f"{sum(n - 1 for n in out.values() if n > 1)} duplicates, "
                             f"{sum(1 for v in expected if v not in out)} gaps")
    assert not any(r.headers for r in records), "no lineage headers were asked for"
    assert committed(bootstrap_servers, chain["app_id"], source, PARTITIONS) == {
        p: PER_PARTITION for p in range(PARTITIONS)}
