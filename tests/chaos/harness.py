"""Shared machinery for the crash tests and the chaos suite: `txstream run` as a real subprocess
that is killed for real, conditions on the group's committed offsets, a feeder, a read_committed
checker thread, and the exactly-once verdict (output multiset == input, audit clean).

Every process a test starts lives in its own session (start_new_session=True); `Run.destroy`
kills the whole session, Spark's Python daemon included (it moves itself to its own process
group, so killing the driver's group alone can leave it behind for a moment).
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from txstream.kafka import headers as hdr
from txstream.local.processes import die_with_parent
from txstream.tools.topic_io import end_offsets as topic_io_end_offsets
from txstream.tools.topic_io import produce_waiting

REPO = Path(__file__).resolve().parents[2]
SOAK = os.environ.get("TXSTREAM_SOAK", "") not in ("", "0")
PASSTHROUGH = "processors/passthrough.py:PassThrough"


def scale(ci: int, soak: int) -> int:
    return soak if SOAK else ci


# ---------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------

def session_pids(sid: int) -> list[int]:
    """Every live process whose session id is `sid` (field 6 of /proc/PID/stat)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        # fields[0] is the state (field 3); session is field 6 -> index 3.
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(int(entry))
    return found


def kill_session(sid: int, timeout: float = 20.0) -> None:
    """SIGKILL the process group `sid`, then every straggler of the session; wait until none."""
    try:
        os.killpg(sid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + timeout
    while True:
        left = session_pids(sid)
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise AssertionError(f"processes of session {sid} survive SIGKILL: {left}")
        time.sleep(0.05)


@dataclass
class Run:
    """One `python -m txstream.cli run ...` in its own session, stderr to a log file."""

    args: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen | None = None
    started: float = 0.0
    cwd: Path | None = None   # default: the repository

    def start(self) -> "Run":
        # The shell records its own pid (== the new session's process group) for faults.py's
        # `kill` action, then execs the CLI so the pid stays the same.
        command = "TXSTREAM_DRIVER_PGID=$$ exec " + " ".join(_quote(a) for a in self.args)
        self.log = open(self.log_path, "ab")
        self.log.write(f"\n===== start {time.strftime('%H:%M:%S')}: {' '.join(self.args)}\n".encode())
        self.log.flush()
        self.proc = subprocess.Popen(["/bin/sh", "-c", command], cwd=self.cwd or REPO, env=self.env,
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
                                     start_new_session=True, preexec_fn=die_with_parent)
        self.started = time.monotonic()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def kill9(self) -> None:
        """kill -9 of the process group (a power cut), then the rest of the session."""
        kill_session(self.pid)
        self.proc.wait(30)
        self._close_log()

    def terminate(self, timeout: float = 180.0) -> int:
        """SIGTERM to the driver (as `kill PID`, docker stop or Kubernetes do): it finishes its
        in-flight batch, leaves the group and exits 0. Only the driver: a SIGTERM to the whole
        group would also reach Spark's JVM, which would die under the in-flight batch."""
        os.kill(self.pid, signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.destroy()
            raise AssertionError(f"txstream run did not stop within {timeout:.0f}s of SIGTERM\n{self.tail()}") from None
        kill_session(self.pid)  # Spark's daemon must be gone too
        self._close_log()
        return code

    def wait(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.destroy()
            raise AssertionError(f"txstream run did not finish within {timeout:.0f}s\n{self.tail()}") from None
        kill_session(self.pid)
        self._close_log()
        return code

    def destroy(self) -> None:
        if self.proc is not None:
            kill_session(self.pid)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self._close_log()

    def dump_stacks(self, timeout: float = 5.0) -> None:
        """Ask a stuck driver where it is: the CLI dumps every thread's stack on SIGUSR1 into
        the log; wait until the dump is there (or the timeout: the diagnosis is best effort)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        dumps_before = self.log_path.read_text(errors="replace").count("most recent call first")
        try:
            os.kill(self.pid, signal.SIGUSR1)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if self.log_path.read_text(errors="replace").count("most recent call first") > dumps_before:
                return
            time.sleep(0.1)

    def _close_log(self) -> None:
        log = getattr(self, "log", None)
        if log is not None and not log.closed:
            log.close()

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


@dataclass
class App:
    """A `txstream run` configuration that tests start, kill and restart."""

    bootstrap: str
    input: str
    output: str
    partitions: int
    app_id: str = field(default_factory=lambda: f"chaos-{uuid.uuid4().hex[:10]}")
    processor: str = PASSTHROUGH
    cap: int = 10_000
    master: str = "local[2]"
    extra: list[str] = field(default_factory=list)
    faults: str | None = None
    faults_dir: str | None = None
    log_dir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="txstream-chaos-log-"))
    runs: list[Run] = field(default_factory=list)
    env_extra: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None   # where `txstream run` starts (default: the repository)

    def command(self, until_caught_up: bool) -> list[str]:
        args = [sys.executable, "-m", "txstream.cli", "run", self.processor,
                "--bootstrap-servers", self.bootstrap, "--app-id", self.app_id,
                "--input", self.input, "--output", self.output, "--master", self.master,
                "--max-records-per-partition", str(self.cap), *self.extra]
        return args + (["--until-caught-up"] if until_caught_up else [])

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TXSTREAM_FAULTS")}
        env.pop("TXSTREAM_DRIVER_PGID", None)
        if self.faults:
            env["TXSTREAM_FAULTS"] = self.faults
            env["TXSTREAM_FAULTS_DIR"] = self.faults_dir or tempfile.mkdtemp(prefix="txstream-faults-")
            self.faults_dir = env["TXSTREAM_FAULTS_DIR"]
        env.update(self.env_extra)
        return env

    def start(self, until_caught_up: bool = True) -> Run:
        run = Run(self.command(until_caught_up), self.environment(),
                  Path(self.log_dir) / f"{self.app_id}.log", cwd=self.cwd).start()
        self.runs.append(run)
        return run

    def destroy_all(self) -> None:
        for run in self.runs:
            run.destroy()

    def passed(self) -> None:
        """Drop the logs (kept when a test fails, for the post-mortem)."""
        import shutil

        shutil.rmtree(self.log_dir, ignore_errors=True)
        if self.faults_dir:
            shutil.rmtree(self.faults_dir, ignore_errors=True)

    def log_text(self) -> str:
        try:
            return (Path(self.log_dir) / f"{self.app_id}.log").read_text(errors="replace")
        except OSError:
            return ""

    def committed_total(self) -> int | None:
        """Sum of the group's committed offsets; None while they cannot be read (a broker down,
        a transactional commit still pending)."""
        offsets = committed(self.bootstrap, self.app_id, self.input, self.partitions)
        if offsets is None:
            return None
        return sum(v or 0 for v in offsets.values())

    def baseline(self, timeout: float = 120) -> int:
        return wait_for(lambda: _plus_one(self.committed_total()), timeout, "readable committed offsets") - 1

    def progressed_since(self, baseline: int):  # a condition for wait_for
        def check() -> bool:
            total = self.committed_total()
            return total is not None and total > baseline
        return check


# ---------------------------------------------------------------------------------------------
# Broker-side observations
# ---------------------------------------------------------------------------------------------

_PROBES: dict[tuple[str, str], Consumer] = {}


def _plus_one(value: int | None) -> int | None:
    return None if value is None else value + 1


def committed(bootstrap: str, group: str, topic: str, partitions: int, timeout: float = 15) -> dict[int, int | None] | None:
    """The group's committed offsets, read stably (read_committed: pending txn commits resolved)."""
    key = (bootstrap, group)
    if key not in _PROBES:
        _PROBES[key] = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                 "isolation.level": "read_committed", "enable.auto.commit": False,
                                 "log_level": 0})
    try:
        result = _PROBES[key].committed([TopicPartition(topic, p) for p in range(partitions)], timeout)
    except Exception:  # noqa: BLE001 - a broker bouncing, a pending commit: poll again
        return None
    return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in result}


def close_probes() -> None:
    while _PROBES:
        _, consumer = _PROBES.popitem()
        consumer.close()


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """Each partition's last stable offset (the Kafka layer's listing, via tools/topic_io)."""
    ends = topic_io_end_offsets(bootstrap, topic, "read_committed")
    return {p: ends[p][1] for p in range(partitions)}


def wait_for(condition, timeout: float, what: str, interval: float = 0.2, run: Run | None = None):
    """Poll `condition()` until truthy; fail with `what` (and the run's log) at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if run is not None and run.poll() is not None:
            return None  # the run ended (caller decides what that means)
        if time.monotonic() > deadline:
            if run is not None:
                run.dump_stacks()
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}"
                                 + (f"\n--- txstream run log ---\n{run.tail()}" if run else ""))
        time.sleep(interval)


# ---------------------------------------------------------------------------------------------
# Input
# ---------------------------------------------------------------------------------------------

def record(n: int) -> tuple[bytes, bytes]:
    return f"k{n}".encode(), f"v{n}-{'x' * (n % 37)}".encode()


def seed(bootstrap: str, topic: str, partitions: int, count: int, first: int = 0,
         only: int | None = None) -> Counter:
    """`count` records spread round-robin over the partitions (or all into partition `only`);
    returns their (key, value) multiset."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20,
                         "batch.num.messages": 10_000, "queue.buffering.max.messages": 500_000})
    sent: Counter = Counter()
    for n in range(first, first + count):
        key, value = record(n)
        produce_waiting(producer, topic, value, key, n % partitions if only is None else only)
        sent[(key, value)] += 1
    assert producer.flush(120) == 0, "seeding did not finish"
    return sent


def top_up(app: "App", seeded: int, ahead: int) -> Counter:
    """Seed more records (numbered on from `seeded`) so that at least `ahead` lie beyond the app's
    committed offsets: a kill loop then always finds a run mid-input, however fast runs become.
    Returns the added (key, value) multiset (empty when enough input is left)."""
    missing = ahead - (seeded - app.baseline())
    if missing <= 0:
        return Counter()
    return seed(app.bootstrap, app.input, app.partitions, missing, first=seeded)


class Feeder(threading.Thread):
    """Keeps producing records (idempotent producer) at `rate` per second until stopped."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: float, first: int,
                 limit: int | None = None) -> None:
        super().__init__(name="feeder", daemon=True)
        self.bootstrap, self.topic, self.partitions, self.rate = bootstrap, topic, partitions, rate
        self.next = first
        self.last = first + limit if limit is not None else None  # at most `limit` records
        self.first = first
        self.stop_event = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True,
                             "linger.ms": 10, "acks": "all", "message.timeout.ms": 300_000,
                             "log_level": 0,
                             "error_cb": lambda err: None})
        began = time.monotonic()
        while not self.stop_event.is_set():
            due = self.first + int((time.monotonic() - began) * self.rate)
            if self.last is not None:
                due = min(due, self.last)
            while self.next < due and not self.stop_event.is_set():
                key, value = record(self.next)
                try:
                    producer.produce(self.topic, value, key, partition=self.next % self.partitions,
                                     on_delivery=self._delivered)
                    self.next += 1
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0.05)
        remaining = producer.flush(300)
        if remaining:
            self.errors.append(f"{remaining} records not delivered")

    def _delivered(self, err, _msg) -> None:
        if err is not None:
            self.errors.append(str(err))

    def finish(self) -> None:
        self.stop_event.set()
        self.join(330)
        assert not self.is_alive(), "the feeder did not finish"


# ---------------------------------------------------------------------------------------------
# The read_committed checker
# ---------------------------------------------------------------------------------------------

class Checker(threading.Thread):
    """Consumes the output with read_committed while the chaos happens.

    Every record must name its source and its publication (txstream.lineage); a source offset
    seen from two publications (or twice from one) is a duplicate, recorded as it happens."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        super().__init__(name="checker", daemon=True)
        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions
        self.stop_event = threading.Event()
        self.sources: dict[tuple[str, int, int], str] = {}
        self.pairs: Counter = Counter()
        self.duplicates: list[tuple] = []
        self.without_lineage = 0
        self.records = 0
        self.error: BaseException | None = None
        self.lock = threading.Lock()

    def run(self) -> None:
        try:
            consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"checker-{uuid.uuid4().hex}",
                                 "isolation.level": "read_committed", "enable.auto.commit": False,
                                 "auto.offset.reset": "earliest", "log_level": 0})
            consumer.assign([TopicPartition(self.topic, p, -2) for p in range(self.partitions)])
            try:
                while not self.stop_event.is_set():
                    for msg in consumer.consume(2000, 0.2):
                        if msg.error():
                            if msg.error().code() != KafkaError._PARTITION_EOF:
                                continue  # transient (a broker bouncing): keep consuming
                            continue
                        self._check(msg)
                self.position = {tp.partition: tp.offset for tp in
                                 consumer.position([TopicPartition(self.topic, p) for p in range(self.partitions)])}
            finally:
                consumer.close()
        except BaseException as exc:  # reported by finish()
            self.error = exc

    def _check(self, msg) -> None:
        headers = msg.headers() or []
        lineage = hdr.lineage_of(headers)
        source = lineage.source if lineage is not None else None
        publication = lineage.publication if lineage is not None else None
        with self.lock:
            self.records += 1
            self.pairs[(msg.key(), msg.value())] += 1
            if source is None or publication is None:
                self.without_lineage += 1
                return
            seen = self.sources.get(source)
            if seen is not None:
                self.duplicates.append((source, seen, publication.decode(), msg.partition(), msg.offset()))
            else:
                self.sources[source] = publication.decode()

    def drain(self, timeout: float = 120) -> None:
        """Read until the output's last stable offsets as they are now, then stop."""
        ends = end_offsets(self.bootstrap, self.topic, self.partitions)
        total = sum(ends.values())
        deadline = time.monotonic() + timeout
        # Offsets include control records: wait for the count of data records to stop growing
        # and the checker to have had time to pass the end (positions are checked at stop).
        last, steady = -1, 0
        while time.monotonic() < deadline:
            with self.lock:
                now = self.records
            steady = steady + 1 if now == last else 0
            last = now
            if steady >= 10:
                break
            time.sleep(0.3)
        self.stop_event.set()
        self.join(60)
        if self.error is not None:
            raise self.error
        behind = {p: (self.position.get(p, 0), ends[p]) for p in ends if self.position.get(p, 0) < ends[p]}
        assert not behind, f"the checker stopped before the output's end (position, end): {behind}; total {total}"


# ---------------------------------------------------------------------------------------------
# The verdict
# ---------------------------------------------------------------------------------------------

def read_pairs(bootstrap: str, topic: str) -> tuple[Counter, list]:
    from tests.support.kafka import read_all

    records = read_all(bootstrap, topic, timeout=300)
    return Counter((r.key, r.value) for r in records), records


def verdict(name: str, bootstrap: str, app: App, expected: Counter, checker: Checker | None = None,
            dead_letter: str | None = None, extra: str = "") -> dict:
    """Assert exactly-once: output multiset == input, audit clean, checker saw no duplicate.
    Prints one line: records in / out / dead-lettered / duplicates / missing."""
    from txstream.tools.verify import audit

    got, records = read_pairs(bootstrap, app.output)
    missing = sum((expected - got).values())
    extra_records = sum((got - expected).values())
    report = audit(bootstrap, app.input, app.output, dead_letter=dead_letter, app_id=app.app_id,
                   one_to_one=True, timeout=60)
    totals = report.totals
    checker_dups = len(checker.duplicates) if checker else 0
    duplicates = max(extra_records, totals["duplicates"], checker_dups)
    figures = {"in": sum(expected.values()), "out": len(records), "dead_lettered": totals["dead_lettered"],
               "duplicates": duplicates, "missing": max(missing, totals["gaps"]),
               "checker_seen": checker.records if checker else None}
    print(f"\n[{name}] records in {figures['in']}  out {figures['out']}  dead-lettered "
          f"{figures['dead_lettered']}  duplicates {figures['duplicates']}  missing {figures['missing']}"
          + (f"  checker saw {checker.records} (duplicates {checker_dups})" if checker else "")
          + (f"  {extra}" if extra else ""), flush=True)
    problems = []
    if missing or extra_records:
        sample_missing = list((expected - got).items())[:5]
        sample_extra = list((got - expected).items())[:5]
        problems.append(f"output != input: {missing} missing (e.g. {sample_missing}), {extra_records} extra "
                        f"(e.g. {sample_extra})")
    if not report.clean:
        problems.append("audit not clean:\n" + report.table())
    if totals["consumed"] != sum(expected.values()):
        problems.append(f"audit consumed {totals['consumed']} != {sum(expected.values())} input records "
                        "(the app's committed offsets do not cover the input)\n" + report.table())
    if checker is not None:
        if checker.duplicates:
            problems.append(f"the read_committed checker saw {len(checker.duplicates)} duplicate source offsets "
                            f"from two publications, e.g. {checker.duplicates[:5]}")
        if checker.without_lineage:
            problems.append(f"{checker.without_lineage} output records without lineage/publication headers")
        if checker.pairs != got:
            problems.append("the checker's view differs from a read_committed read after the run: "
                            f"{sum((got - checker.pairs).values())} not seen, "
                            f"{sum((checker.pairs - got).values())} extra")
    if not problems:
        app.passed()
    assert not problems, f"[{name}] exactly-once violated:\n" + "\n".join(problems) + \
        "\n--- txstream run log (tail) ---\n" + "\n".join(app.log_text().splitlines()[-60:])
    return figures


def stop_run(run: Run, action: str, rng: random.Random) -> None:
    """End a run as a bounce plan says: "kill" = SIGKILL of its whole session at a random moment
    (at once or within 3 s), "term" = SIGTERM within 2 s, which must end it cleanly."""
    if action == "kill":
        time.sleep(rng.choice([0.0, rng.uniform(0.0, 3.0)]))
        run.kill9()
    else:
        time.sleep(rng.uniform(0.0, 2.0))
        code = run.terminate()
        assert code == 0, f"SIGTERM: txstream run exited {code}\n{run.tail()}"
        assert "stopped:" in run.tail(), run.tail()


def random_delay(rng: random.Random, low: float, high: float) -> float:
    return rng.uniform(low, high)
