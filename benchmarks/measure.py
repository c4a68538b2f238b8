"""Measuring a contender: its process tree (CPU, peak RSS) and its output (count, done time)."""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import psutil

from txstream.local.processes import die_with_parent


def start_process(argv: list[str], env: dict | None, log_path: str, cwd: str) -> subprocess.Popen:
    log = open(log_path, "ab")
    try:
        return subprocess.Popen(argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=die_with_parent)
    finally:
        log.close()


def stop_process(proc: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM the process group, then SIGKILL it; also kill any straggler of its tree."""
    if proc is None:
        return
    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        tree = []
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for child in tree:
        try:
            child.kill()
        except psutil.Error:
            pass
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass


class TreeSampler:
    """Samples a process tree: CPU seconds (user + system, per pid, last value seen) and RSS."""

    def __init__(self, interval: float = 0.1) -> None:
        self.interval = interval
        self.roots: list[int] = []
        self.cpu: dict[tuple[int, float], float] = {}  # (pid, create_time) -> cpu seconds
        self.roles: dict[tuple[int, float], str] = {}  # (pid, create_time) -> process_role
        self.peak_rss = 0
        self._procs: dict[tuple[int, float], psutil.Process] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def add_root(self, pid: int) -> None:
        with self._lock:
            self.roots.append(pid)

    def start(self) -> "TreeSampler":
        self._thread = threading.Thread(target=self._loop, daemon=True, name="tree-sampler")
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> None:
        with self._lock:
            roots = list(self.roots)
        rss = 0
        for root in roots:
            try:
                top = psutil.Process(root)
                procs = [top] + top.children(recursive=True)
            except psutil.Error:
                continue
            for proc in procs:
                try:
                    with proc.oneshot():
                        key = (proc.pid, proc.create_time())
                        times = proc.cpu_times()
                        mem = proc.memory_info().rss
                        # Each sample: Spark's launcher script becomes the JVM by exec (same pid).
                        # An exited process not yet reaped (a zombie) has no command line: it
                        # keeps the role it had, else a Python worker's whole CPU would count
                        # as "main".
                        cmdline = proc.cmdline()
                        if cmdline or key not in self.roles:
                            self.roles[key] = process_role(cmdline)
                except psutil.Error:
                    continue
                self.cpu[key] = times.user + times.system
                rss += mem
        self.peak_rss = max(self.peak_rss, rss)

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(5)
        self.sample()

    @property
    def cpu_seconds(self) -> float:
        return sum(self.cpu.values())

    @property
    def cpu_by_role(self) -> dict[str, float]:
        """CPU seconds per process role (process_role), to tell start-up and per-record costs
        apart by where they are paid."""
        out: dict[str, float] = {}
        for key, seconds in self.cpu.items():
            role = self.roles.get(key, "main")
            out[role] = out.get(role, 0.0) + seconds
        return out


WATCHER_CLIENT_ID = "txstream-bench-watcher"   # the output watcher's Kafka client

WORKER_MODULES = ("txstream.spark.worker_daemon", "pyspark.daemon")


def process_role(cmdline: list[str]) -> str:
    """'JVM' (Spark's driver, Kafka Streams), 'Python workers' (Spark's daemon and the workers it
    forks: `python -m <daemon module>`) or 'main' (the contender's own process and anything else).
    By executable and module, not by any word of the command line: Spark's launcher names the
    daemon module in its --conf arguments."""
    exe = cmdline[0].rsplit("/", 1)[-1] if cmdline else ""
    if exe.startswith("java"):
        return "JVM"
    if exe.startswith("python") and len(cmdline) > 2 and cmdline[1] == "-m" and cmdline[2] in WORKER_MODULES:
        return "Python workers"
    return "main"


class OutputWatcher:
    """A read_committed consumer on every partition of the output topic, from the beginning.

    Counts records and keeps (key, value) pairs for verification; `done_at` is the monotonic
    time when the count first reached `expected`, `first_at` when the first record arrived.
    `weight(value)`: what a record counts for instead of 1 (the wide benchmark's totals count the
    orders they add up).
    """

    def __init__(self, bootstrap: str, topic: str, partitions: int, expected: int,
                 on_record=None, value_fn=None, weight=None) -> None:
        self.bootstrap, self.topic, self.partitions, self.expected = bootstrap, topic, partitions, expected
        self.on_record = on_record
        self.value_fn = value_fn  # what to keep of each value (e.g. a digest), default the value
        self.weight = weight
        self.records: list[tuple[bytes, bytes]] = []
        self.count = 0
        self.first_at: float | None = None
        self.first_count = 0  # records in the first chunk seen (they arrived at first_at)
        self.timeline: list[tuple[float, int]] = []  # (monotonic time, count) after each chunk
        self.done_at: float | None = None
        self.error: str | None = None
        self.keep = on_record is None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ready = threading.Event()

    def start(self) -> "OutputWatcher":
        self._thread = threading.Thread(target=self._loop, daemon=True, name="output-watcher")
        self._thread.start()
        self.ready.wait(30)
        return self

    def _loop(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        # client.id: benchmarks/experiments/broker_requests.py leaves the watcher's requests out of a contender's.
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"watch-{self.topic}",
                             "client.id": WATCHER_CLIENT_ID, "isolation.level": "read_committed", "enable.auto.commit": False,
                             "enable.partition.eof": False, "fetch.wait.max.ms": 50,
                             "auto.offset.reset": "earliest"})
        try:
            consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in range(self.partitions)])
            self.ready.set()
            while not self._stop.is_set():
                msgs = consumer.consume(num_messages=5000, timeout=0.1)
                if not msgs:
                    continue
                now = time.monotonic()
                for msg in msgs:
                    if msg.error():
                        continue
                    if self.first_at is None:
                        self.first_at = now
                    self.count += self.weight(msg.value()) if self.weight else 1
                    if self.keep:
                        value = msg.value()
                        self.records.append((msg.key(), self.value_fn(value) if self.value_fn else value))
                    else:
                        self.on_record(msg, now)
                if self.first_at == now:
                    self.first_count = self.count
                self.timeline.append((now, self.count))
                if self.done_at is None and self.expected and self.count >= self.expected:
                    self.done_at = now
        except Exception as exc:  # reported to the harness
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.ready.set()
            consumer.close()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(15)

    def count_at(self, when: float) -> int:
        """Records seen up to monotonic time `when`."""
        seen = 0
        for t, count in self.timeline:
            if t > when:
                break
            seen = count
        return seen


def verify_output(records: list[tuple[bytes, bytes]], expected: dict[bytes, bytes],
                  exactly_once: bool = True, decoded: bool = True) -> tuple[bool, str, dict]:
    """Every expected key present with exactly the expected Avro bytes; no extra keys.

    Byte equality of schemaless Avro is value equality (Avro's encoding is canonical for a
    given schema), which we also confirm by decoding a sample for the report. With
    `decoded=False` the values are digests of copied input (the pass-through): compared, not decoded.
    """
    from benchmarks.common import ENRICHED_SCHEMA, decode

    seen: dict[bytes, int] = {}
    wrong = 0
    extra = 0
    first_wrong = None
    for key, value in records:
        seen[key] = seen.get(key, 0) + 1
        want = expected.get(key)
        if want is None:
            extra += 1
        elif value != want:
            wrong += 1
            if first_wrong is None:
                first_wrong = (key, value, want)
    missing = sum(1 for k in expected if k not in seen)
    duplicates = sum(c - 1 for c in seen.values() if c > 1)
    stats = {"output_records": len(records), "expected_records": len(expected), "missing": missing,
             "duplicates": duplicates, "unexpected": extra, "wrong_values": wrong}
    sample = None
    for key, value in (records[:: max(1, len(records) // 5)][:5] if decoded else []):
        sample = decode(ENRICHED_SCHEMA, value)
        want = expected.get(key)
        if want is not None and decode(ENRICHED_SCHEMA, want) != sample:
            wrong += 1
    if sample is not None:
        stats["sample"] = {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in sample.items()}
    problems = []
    if missing:
        problems.append(f"{missing} missing")
    if extra:
        problems.append(f"{extra} unexpected")
    if wrong:
        problems.append(f"{wrong} wrong values")
        if first_wrong is not None and not decoded:
            stats["first_wrong"] = {"key": first_wrong[0].decode(errors="replace"), "got": first_wrong[1].hex(),
                                    "want": first_wrong[2].hex(), "compared": "digests of the values"}
        elif first_wrong is not None:
            try:
                got = decode(ENRICHED_SCHEMA, first_wrong[1])
            except Exception as exc:
                got = f"undecodable: {exc}"
            stats["first_wrong"] = {"key": first_wrong[0].decode(errors="replace"), "got": str(got),
                                    "want": str(decode(ENRICHED_SCHEMA, first_wrong[2]))}
    if duplicates and exactly_once:
        problems.append(f"{duplicates} duplicates")
    return (not problems, ", ".join(problems) or "ok", stats)


class ForeignLoad:
    """CPU used during a run by processes that are not the harness's (the machine is shared).

    Samples every process outside the harness's own tree once a second and keeps, per process,
    the CPU seconds it had when first seen and the last value seen. `cpu_seconds` is the sum of
    the differences (processes started during the run count from 0); `cores` is that over the
    elapsed time; `top` names the busiest ones (e.g. someone's pytest).
    """

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self.first: dict[tuple[int, float], float] = {}
        self.last: dict[tuple[int, float], float] = {}
        self.names: dict[tuple[int, float], str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0
        self._elapsed = 0.0
        self._baseline_done = False

    def start(self) -> "ForeignLoad":
        self._started = time.monotonic()
        self.sample()
        self._baseline_done = True
        self._thread = threading.Thread(target=self._loop, daemon=True, name="foreign-load")
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        me = os.getpid()
        try:
            ours = {me} | {p.pid for p in psutil.Process(me).children(recursive=True)}
        except psutil.Error:
            ours = {me}
        for proc in psutil.process_iter(["pid", "create_time", "cmdline", "cpu_times"]):
            info = proc.info
            if info["pid"] in ours or not info.get("cmdline") or info.get("cpu_times") is None:
                continue
            key = (info["pid"], info["create_time"] or 0.0)
            cpu = info["cpu_times"].user + info["cpu_times"].system
            if key not in self.first:
                self.first[key] = cpu if not self._baseline_done else 0.0
                self.names[key] = self._job_name(proc, info["cmdline"])
            self.last[key] = cpu

    @staticmethod
    def _job_name(proc: psutil.Process, cmdline: list[str]) -> str:
        """The job a process belongs to: its outermost ancestor that is a pytest/python/make run."""
        name = " ".join(cmdline)[:100]
        try:
            for parent in proc.parents()[:8]:
                line = " ".join(parent.cmdline())
                if any(word in line for word in ("pytest", "python", "make ")) and parent.pid > 1:
                    name = line[:100]
        except psutil.Error:
            pass
        return name

    def stop(self) -> dict:
        self._stop.set()
        if self._thread:
            self._thread.join(5)
        self.sample()
        self._elapsed = time.monotonic() - self._started
        used: dict[str, float] = {}
        for k in self.last:
            delta = self.last[k] - self.first[k]
            if delta > 0:
                used[self.names[k]] = used.get(self.names[k], 0.0) + delta
        total = sum(used.values())
        top = sorted(((v, name) for name, v in used.items() if v >= 0.5), reverse=True)[:3]
        return {"foreign_cpu_s": total, "foreign_cores": total / self._elapsed if self._elapsed > 0 else 0.0,
                "foreign_top": [f"{name} ({v:.0f} CPU s)" for v, name in top]}
