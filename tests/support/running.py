"""Running a processor for a test, in-process or as a real `txstream run`, and reading what it
said: the structured events of `--log-format json` (driver/metrics.py), never the human lines,
whose wording is free to change.

In-process (`run_in_process`, `DriverThread`): the Driver on the session's Spark. As a process
(`App`, `Run`): `python -m txstream.cli run ...` in its own session, killed for real; `Run.destroy`
kills the whole session, Spark's Python daemon included (it moves itself to its own process
group, so killing the driver's group alone can leave it behind for a moment).
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from tests.support.kafka import committed_or_none
from tests.support.waiting import wait_until
from txstream.local.processes import die_with_parent

REPO = Path(__file__).resolve().parents[2]
PASSTHROUGH = "processors/passthrough.py:PassThrough"


# ---------------------------------------------------------------------------------------------
# Events
# ---------------------------------------------------------------------------------------------

class Events(list):
    """A run's structured log: the JSON objects txstream prints, one per line, in order (other
    lines, Spark's own log and the CLI's last error line, are not txstream's events)."""

    @classmethod
    def parse(cls, lines: Iterable[str]) -> Events:
        events = cls()
        for line in lines:
            if not line.startswith("{"):
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:   # a line still being written
                continue
            if isinstance(event, dict) and "event" in event:
                events.append(event)
        return events

    def of(self, kind: str) -> list[dict]:
        return [e for e in self if e["event"] == kind]

    @property
    def batches(self) -> list[dict]:
        """One per published batch: records_in, records_out, dead_letters, statuses, totals, ..."""
        return self.of("batch")

    def messages(self) -> list[str]:
        """The text of every event that has one (the driver's notes and warnings, the summaries)."""
        return [e["message"] for e in self if "message" in e]

    def said(self, text: str) -> bool:
        """Whether a message contains `text`."""
        return any(text in message for message in self.messages())


# ---------------------------------------------------------------------------------------------
# In-process
# ---------------------------------------------------------------------------------------------

def resolve_settings(cls, bootstrap: str, **overrides: Any):
    """A processor class's settings for a test: its own app id, local[2], JSON events."""
    from txstream.settings import resolve

    overrides.setdefault("app_id", f"test-{cls.__name__.lower()}-{uuid.uuid4().hex[:8]}")
    overrides.setdefault("log_format", "json")
    return resolve(cls, bootstrap_servers=bootstrap, master="local[2]", **overrides)


def run_in_process(cls, bootstrap: str, spark, **overrides: Any):
    """Run a processor class on `spark` until caught up (unless overridden); returns the Driver,
    with `exit_code`, `lines` (what it printed) and `events` (those lines parsed)."""
    from txstream.driver.loop import Driver

    overrides.setdefault("until_caught_up", True)
    lines: list[str] = []
    driver = Driver(resolve_settings(cls, bootstrap, **overrides), echo=lines.append, spark=spark)
    driver.lines = lines
    driver.exit_code = driver.run()
    driver.events = Events.parse(lines)
    return driver


class DriverThread:
    """A Driver run on a thread of its own (as `txstream run` would, minus the process), for a
    test that looks at it while it runs; `stop()` asks it to stop as SIGTERM would."""

    def __init__(self, settings, spark) -> None:
        from txstream.driver.loop import Driver

        self.lines: list[str] = []
        self.driver = Driver(settings, echo=self.lines.append, spark=spark)
        self.outcome: dict[str, Any] = {}
        self.thread = threading.Thread(target=self._run, name="driver", daemon=True)

    def _run(self) -> None:
        try:
            self.outcome["code"] = self.driver.run()
        except BaseException as exc:   # reported by stop() and by the waits
            self.outcome["error"] = exc

    def start(self) -> DriverThread:
        self.thread.start()
        return self

    def alive(self) -> bool:
        return self.thread.is_alive()

    @property
    def events(self) -> Events:
        return Events.parse(list(self.lines))

    def stop(self, timeout: float = 120) -> int | None:
        """Ask the loop to stop and wait for it; the exit code (None: it raised, see `outcome`)."""
        self.driver.stop_requested.set()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the driver did not stop within {timeout:.0f}s: {self.lines[-5:]}"
        return self.outcome.get("code")


# ---------------------------------------------------------------------------------------------
# As a process
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
    """One `python -m txstream.cli run ...` in its own session, stdout and stderr to a log file."""

    args: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen | None = None
    started: float = 0.0
    cwd: Path | None = None   # default: the repository

    def start(self) -> Run:
        # The shell records its own pid (== the new session's process group) for fault_injection.py's
        # `kill` action, then execs the CLI so the pid stays the same.
        command = "TXSTREAM_DRIVER_PGID=$$ exec " + " ".join(shlex.quote(a) for a in self.args)
        self.log = open(self.log_path, "ab")
        self.log_start = self.log.tell()
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

    def wait(self, timeout: float, kill_rest: bool = True) -> int:
        """The exit code; then (`kill_rest`) nothing of the session is left running."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.destroy()
            raise AssertionError(f"txstream run did not finish within {timeout:.0f}s\n{self.tail()}") from None
        if kill_rest:
            kill_session(self.pid)
            self._close_log()
        return code

    def group_left(self) -> list[str]:
        """Processes still running in the driver's process group (state and command line)."""
        left = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if os.getpgid(int(entry.name)) != self.pid:
                    continue
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":   # a zombie has ended; its parent has not reaped it yet
                    left.append(f"{entry.name} {state} " + (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:120])
            except (ProcessLookupError, OSError, IndexError):
                pass
        return left

    def destroy(self) -> None:
        """For finally blocks: whatever state it is in, nothing of it survives."""
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
        dumps_before = self.text().count("most recent call first")
        try:
            os.kill(self.pid, signal.SIGUSR1)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if self.text().count("most recent call first") > dumps_before:
                return
            time.sleep(0.1)

    def _close_log(self) -> None:
        log = getattr(self, "log", None)
        if log is not None and not log.closed:
            log.close()

    def text(self) -> str:
        """This run's part of the log file (an App's runs share one)."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(getattr(self, "log_start", 0))
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def lines(self) -> list[str]:
        return self.text().splitlines()

    def events(self) -> Events:
        return Events.parse(self.lines())

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.lines()[-lines:])


@dataclass
class App:
    """A `txstream run` configuration that tests start, kill and restart; its runs write JSON
    events (and Spark's own lines) into one log file."""

    bootstrap: str
    input: str | None   # None: the processor names its inputs (Processor.inputs)
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
                *(["--input", self.input] if self.input else []), "--output", self.output, "--master", self.master,
                "--max-records-per-partition", str(self.cap), "--log-format", "json", *self.extra]
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

    def until_done(self, max_runs: int, timeout: float = 420) -> list[int]:
        """Start with --until-caught-up until a run exits 0 (faults kill the ones before);
        returns every run's exit code."""
        codes: list[int] = []
        for _ in range(max_runs):
            codes.append(self.start().wait(timeout))
            if codes[-1] == 0:
                return codes
        raise AssertionError(f"no run exited 0 in {max_runs} attempts (exit codes {codes})\n{self.log_text()[-4000:]}")

    def wait_restarting(self, run: Run, condition: Callable[[], object], timeout: float, what: str,
                        every: float = 0.2, exits: list[str] | None = None) -> Run:
        """Wait until `condition()`, starting the app again (without --until-caught-up) each time
        its run ends, the exit noted in `exits`; returns the run live at the end."""
        deadline = time.monotonic() + timeout
        while not wait_until(condition, max(1.0, deadline - time.monotonic()), what, every=every, run=run):
            code = run.poll()
            run.destroy()
            if exits is not None:
                exits.append(f"exit {code} waiting for {what}")
            assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what} (exit {code})"
            run = self.start(until_caught_up=False)
        return run

    def destroy_all(self) -> None:
        for run in self.runs:
            run.destroy()

    def passed(self) -> None:
        """Drop the logs (kept when a test fails, for the post-mortem)."""
        shutil.rmtree(self.log_dir, ignore_errors=True)
        if self.faults_dir:
            shutil.rmtree(self.faults_dir, ignore_errors=True)

    def log_text(self) -> str:
        try:
            return (Path(self.log_dir) / f"{self.app_id}.log").read_text(errors="replace")
        except OSError:
            return ""

    def events(self) -> Events:
        """Every run's events, in order."""
        return Events.parse(self.log_text().splitlines())

    def spark_log_text(self) -> str:
        """Spark's own log lines of every run: each run names its spark.log in an event."""
        prefix = "Spark's own log lines: "
        texts = []
        for message in self.events().messages():
            if message.startswith(prefix):
                try:
                    texts.append(Path(message[len(prefix):].split(" (")[0]).read_text(errors="replace"))
                except OSError:
                    pass
        return "\n".join(texts)

    def committed_total(self) -> int | None:
        """Sum of the group's committed offsets; None while they cannot be read (a broker down,
        a transactional commit still pending)."""
        offsets = committed_or_none(self.bootstrap, self.app_id, self.input, self.partitions)
        if offsets is None:
            return None
        return sum(v or 0 for v in offsets.values())

    def baseline(self, timeout: float = 120) -> int:
        """The committed total once it can be read (0 before the first commit)."""
        total = wait_until(lambda: _plus_one(self.committed_total()), timeout, "readable committed offsets")
        return total - 1

    def progressed_since(self, baseline: int):  # a condition for wait_until
        def check() -> bool:
            total = self.committed_total()
            return total is not None and total > baseline
        return check


def _plus_one(value: int | None) -> int | None:
    return None if value is None else value + 1
