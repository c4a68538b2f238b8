"""A stop is not a crash: `txstream run` under a real SIGINT (as a terminal's Ctrl-C sends it, to
the whole process group) or SIGTERM finishes the batch in flight, leaves the group, prints one
stop line naming the committed offsets and exits 0; a second signal aborts (exit 130). Real
broker, real Spark, real subprocesses and signals (driver/stopping.py)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from processors.sample_orders import orders
from tests.support.waiting import wait_until
from txstream.kafka.lookups import committed_offsets, describe_group
from txstream.tools.topic_io import produce_lines

REPO = Path(__file__).resolve().parents[2]
PROCESSOR = "processors.enrich_orders:EnrichOrders"
STOP_LINE = re.compile(r"^stopped after batch (\d+): (SIG\w+)(.*); committed up to (.*)$")


class Run:
    """A `txstream run` in a process group of its own (a terminal's foreground job), its stderr
    collected line by line."""

    def __init__(self, bootstrap: str, app_id: str, source: str, sink: str, dlq: str, *extra: str,
                 env: dict[str, str] | None = None) -> None:
        args = [sys.executable, "-m", "txstream.cli", "run", PROCESSOR, "-b", bootstrap, "--app-id", app_id,
                "--input", source, "--output", sink, "--dead-letter-topic", dlq, "--master", "local[2]", *extra]
        self.proc = subprocess.Popen(args, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for_line(self, prefix: str, timeout: float = 240) -> None:
        wait_until(lambda: any(line.startswith(prefix) for line in self.lines) or self.proc.poll() is not None,
                   timeout, f"a line starting {prefix!r}")
        assert any(line.startswith(prefix) for line in self.lines), "\n".join(self.lines)

    def ctrl_c(self) -> None:
        self.signal_group(signal.SIGINT)

    def signal_group(self, signum: int) -> None:
        os.killpg(self.proc.pid, signum)

    def finish(self, timeout: float = 120) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(10)
        return code

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@pytest.fixture
def pipeline(bootstrap_servers: str, admin, make_topic):  # noqa: ANN001, ANN201
    source = make_topic("orders", 4)
    wait_until(lambda: source in admin.list_topics(timeout=10).topics, 30, f"{source} in the metadata")
    produce_lines(bootstrap_servers, source, (_json(o) for o in orders(4000, seed=3)),
                  _schema(), key_field="customer_id")
    return source, make_topic("enriched", 4), make_topic("dlq", 4), f"stop-{uuid.uuid4().hex[:8]}"


def _schema() -> dict:
    from txstream.serde.avro import load_schema

    return load_schema(str(REPO / "schemas" / "order.avsc"))


def _json(order: dict) -> str:
    import json

    return json.dumps({**order, "created_at": order["created_at"].isoformat()})


def _committed_total(admin, app_id: str) -> int | None:  # noqa: ANN001
    """The group's committed offsets summed; None while the group coordinator does not answer."""
    from txstream.errors import TxstreamError

    try:
        return sum(o or 0 for o in committed_offsets(admin, app_id, None, stable=True, timeout=5).values())
    except TxstreamError:
        return None


def _stopped_cleanly(run: Run, code: int, admin, app_id: str, signal_name: str) -> dict[str, int]:  # noqa: ANN001
    assert code == 0, run.text
    stops = [STOP_LINE.match(line) for line in run.lines if line.startswith("stopped after batch")]
    assert len(stops) == 1 and stops[0] is not None, run.text
    assert stops[0].group(2) == signal_name and stops[0].group(3) == "", run.text
    for noise in ("Traceback", "Aborted!", "Exception", " ERROR ", " WARN ", "\tat "):
        assert noise not in run.text, run.text
    printed = dict(part.split("@") for part in stops[0].group(4).split(", "))
    committed = committed_offsets(admin, app_id, None, stable=True, timeout=30)
    assert {f"{p.topic}[{p.partition}]": str(o) for p, o in committed.items()} == printed, run.text
    assert not describe_group(admin, app_id, timeout=30).members, "the run did not leave its group"
    return printed


def test_ctrl_c_during_a_backlog_finishes_the_batch(bootstrap_servers, admin, pipeline) -> None:  # noqa: ANN001
    source, sink, dlq, app_id = pipeline
    run = Run(bootstrap_servers, app_id, source, sink, dlq, "--max-records-per-partition", "100")
    run.wait_for_line("batch 2 ")
    run.ctrl_c()
    printed = _stopped_cleanly(run, run.finish(), admin, app_id, "SIGINT")
    assert 0 < sum(map(int, printed.values())) < 4000, "the stop came after the backlog was done"


def test_sigterm_to_the_process_group_during_a_backlog(bootstrap_servers, admin, pipeline) -> None:  # noqa: ANN001
    """`kill -TERM -PGID` (systemd's stop of the unit's processes, a supervisor's group kill): the
    Spark JVM shares the driver's group and must not die under the batch being finished (it did:
    'Job cancelled because SparkContext was shut down', a traceback, exit 1)."""
    source, sink, dlq, app_id = pipeline
    run = Run(bootstrap_servers, app_id, source, sink, dlq, "--max-records-per-partition", "100")
    run.wait_for_line("batch 2 ")
    run.signal_group(signal.SIGTERM)
    printed = _stopped_cleanly(run, run.finish(), admin, app_id, "SIGTERM")
    assert 0 < sum(map(int, printed.values())) < 4000, "the stop came after the backlog was done"
    assert not any(" failed (" in line for line in run.lines), run.text


def test_sigterm_when_idle(bootstrap_servers, admin, pipeline) -> None:  # noqa: ANN001
    source, sink, dlq, app_id = pipeline
    run = Run(bootstrap_servers, app_id, source, sink, dlq)
    wait_until(lambda: _committed_total(admin, app_id) == 4000 or run.proc.poll() is not None, 240,
               "the backlog committed")
    began = time.monotonic()
    run.proc.send_signal(signal.SIGTERM)
    printed = _stopped_cleanly(run, run.finish(), admin, app_id, "SIGTERM")
    assert sum(map(int, printed.values())) == 4000
    assert time.monotonic() - began < 60, "an idle run took long to stop"


def test_a_second_ctrl_c_aborts(bootstrap_servers, admin, pipeline, tmp_path) -> None:  # noqa: ANN001
    """The first batch's publishing task hangs before its commit (a fault), so both signals are
    certain to arrive while that batch is in flight."""
    source, sink, dlq, app_id = pipeline
    faults = tmp_path / "faults"
    run = Run(bootstrap_servers, app_id, source, sink, dlq, "--max-records-per-partition", "100",
              env={"TXSTREAM_FAULTS": "publish.before_commit=hang@1", "TXSTREAM_FAULTS_DIR": str(faults)})
    wait_until(lambda: (faults / "publish.before_commit.1").exists() or run.proc.poll() is not None, 240,
               "the first batch's publisher hanging before its commit")
    run.ctrl_c()
    wait_until(lambda: any("finishing the batch in flight" in line for line in run.lines), 30, "the first stop line")
    run.ctrl_c()
    code = run.finish()
    assert code == 128 + signal.SIGINT, run.text
    assert any("SIGINT again: aborting the batch in flight" in line for line in run.lines), run.text
    stops = [line for line in run.lines if line.startswith("stopped ")]
    assert len(stops) == 1 and stops[0].startswith("stopped in batch 1: SIGINT, then SIGINT aborted it;"), run.text
    assert "Traceback" not in run.text and "Aborted!" not in run.text, run.text
    assert not any(" failed (" in line for line in run.lines), "the aborted batch was reported as a failure"
    assert not describe_group(admin, app_id, timeout=30).members, "the run did not leave its group"
    assert not describe_group(admin, app_id, timeout=30).members


def test_the_stop_line_says_when_no_batch_ran_and_what_has_no_offset() -> None:
    import threading

    from txstream.driver.stopping import StopSignals

    stop = StopSignals(threading.Event(), lambda _line: None, lambda: None)
    stop.signal_name = "SIGTERM"
    assert stop.line(0, {("orders", 0): None, ("orders", 1): 7}) == \
        "stopped before any batch: SIGTERM; committed up to orders[0]@-, orders[1]@7"
    assert stop.line(3, {("orders", 0): 12}) == "stopped after batch 3: SIGTERM; committed up to orders[0]@12"
    stop.aborted_by = signal.SIGINT
    assert stop.line(4, None).startswith("stopped in batch 4: SIGTERM, then SIGINT aborted it; ")
