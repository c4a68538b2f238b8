"""Test-only failure injection at the dangerous points of the protocol.

Production code calls `maybe_fail(point)` at a few places; it does nothing unless the
environment variable TXSTREAM_FAULTS is set, e.g.

    TXSTREAM_FAULTS="publish.before_commit=kill@2,read.end=raise@1"
    TXSTREAM_FAULTS_DIR=/tmp/faults-xyz        # counts occurrences across processes

`point=action@n` fires on the n-th time any process reaches `point` (default 1), once.
Actions: `raise` (the Spark task fails, so Spark or the driver retries), `kill` (SIGKILL to the
whole `txstream run` process group: driver, JVM and Python workers, like a power cut), `hang`
(the task blocks, as on a broker that never answers, until Spark interrupts it).
"""
from __future__ import annotations

import os
import signal
from functools import lru_cache
from pathlib import Path

from txstream.errors import InfrastructureError

POINTS = (
    "read.end",                 # reader finished its range, before the publisher sees the end
    "publish.before_produce",   # transaction begun, nothing produced
    "publish.mid_produce",      # half of the range's output produced
    "publish.before_commit",    # all output and the offsets sent, commit not yet called
    "publish.after_commit",     # committed (acknowledged, under the weaker guarantees), the driver has not heard of it
    "driver.between_batches",   # in the driver loop, after a batch, before the next plan
    "driver.after_plan_log",    # wide: the batch's plan is logged, nothing of it has run
    "driver.before_close",      # wide: every unit published, the input offsets not committed
    "state.mid_restore",        # a unit's restore has applied part of the changelog's tail
    "state.before_snapshot_commit",   # a snapshot's chunks produced, its transaction not committed
)


class InjectedFault(InfrastructureError):
    """Raised by a `raise` fault; never seen unless TXSTREAM_FAULTS is set. A failure of the
    machinery, never of the data."""


@lru_cache(maxsize=1)
def _spec() -> dict[str, tuple[str, int]]:
    raw = os.environ.get("TXSTREAM_FAULTS", "")
    spec: dict[str, tuple[str, int]] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        point, _, action = item.partition("=")
        action, _, nth = action.partition("@")
        if point not in POINTS or action not in ("raise", "kill", "hang"):
            raise ValueError(f"TXSTREAM_FAULTS: unknown fault {item!r} (points: {', '.join(POINTS)})")
        spec[point] = (action, int(nth or 1))
    return spec


def remember_driver() -> None:
    """Called by the driver before Spark starts: `kill` then hits the driver's process group
    (Spark's Python workers run in a process group of their own)."""
    if "TXSTREAM_FAULTS" in os.environ:
        os.environ.setdefault("TXSTREAM_DRIVER_PGID", str(os.getpgid(0)))


def maybe_fail(point: str, detail: object = None) -> None:
    if "TXSTREAM_FAULTS" not in os.environ:
        return
    entry = _spec().get(point)
    if entry is None:
        return
    action, nth = entry
    if _occurrence(point) != nth:
        return
    if action == "kill":
        group = int(os.environ.get("TXSTREAM_DRIVER_PGID", os.getpgid(0)))
        os.killpg(group, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)  # a Python worker is in Spark's daemon group, not the driver's
    if action == "hang":
        import time

        while True:  # ends when Spark kills the worker (job cancelled)
            time.sleep(1)
    raise InjectedFault(f"injected fault at {point} ({detail})")


def _occurrence(point: str) -> int:
    """1, 2, 3 ... across every process of the run, counted with exclusive file creation."""
    directory = Path(os.environ.get("TXSTREAM_FAULTS_DIR", "/tmp/txstream-faults"))
    directory.mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        try:
            fd = os.open(directory / f"{point}.{n}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.close(fd)
            return n
        except FileExistsError:
            n += 1
