"""A stop the user asks for (Ctrl-C, `kill`): finish the batch in flight, then stop; a second
signal aborts that batch.

The first SIGINT or SIGTERM only sets the loop's stop event: the batch in flight commits (or
aborts) as one unit either way, so waiting for it loses nothing and the next run starts where the
group's offsets say. A second signal cancels Spark's jobs (the tasks' open transactions abort) for
a user who cannot wait. A terminal's Ctrl-C reaches the whole foreground process group, but the
Spark JVM ignores SIGINT and SIGTERM and its Python workers run in a group of their own, so the stop is ours
(SparkContext's own SIGINT handler, which cancels every job, is replaced again: spark/session.py).

Exit codes: 0 after a stop on request, 128 + the signal's number (130 SIGINT, 143 SIGTERM) when a
second signal aborted the batch, as a shell reports a process a signal ended.
"""
from __future__ import annotations

import signal
import threading
from typing import Callable

SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOPPED = 0


class StopSignals:
    """The run's SIGINT and SIGTERM handlers; `requested` is the loop's stop event."""

    def __init__(self, requested: threading.Event, echo: Callable[[str], None],
                 cancel: Callable[[], None]) -> None:
        self.requested = requested
        self.echo = echo
        self.cancel = cancel          # cancels the batch in flight (Spark's jobs)
        self.signal_name: str | None = None
        self.aborted_by: int | None = None

    def install(self) -> dict[int, object]:
        """The handlers this replaced, to put back when the run is closed. From the main thread
        only (Python delivers signals there); elsewhere nothing is installed."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {sig: signal.signal(sig, self._handle) for sig in SIGNALS}

    def _handle(self, signum: int, _frame) -> None:
        name = signal.Signals(signum).name
        if self.requested.is_set():
            if self.aborted_by is None:
                self.aborted_by = signum
                self.echo(f"{name} again: aborting the batch in flight (its transactions abort; the next run "
                          "reads those records again)")
                self.cancel()
            return
        self.signal_name = name
        self.echo(f"{name}: finishing the batch in flight, then stopping (a second signal aborts it)")
        self.requested.set()

    @property
    def exit_code(self) -> int:
        return STOPPED if self.aborted_by is None else 128 + self.aborted_by

    def line(self, batch_id: int, committed: dict[tuple[str, int], int | None] | None) -> str:
        """`stopped after batch N: SIGINT; committed up to orders[0]@120, ...`"""
        how = f"{self.signal_name}, then {signal.Signals(self.aborted_by).name} aborted it" \
            if self.aborted_by is not None else self.signal_name
        if committed is None and self.aborted_by is not None:
            where = ("the committed offsets could not be read: the aborted batch's transactions may "
                     "still be open until the next run fences them or they time out")
        elif committed is None:
            where = "the committed offsets could not be read"
        elif not committed:
            where = "no partition was assigned"
        else:
            where = "committed up to " + ", ".join(
                f"{topic}[{partition}]@{'-' if offset is None else offset}"   # '-': as kafka-consumer-groups.sh
                for (topic, partition), offset in sorted(committed.items()))
        if self.aborted_by is not None:
            return f"stopped in batch {batch_id}: {how}; {where}"
        return f"stopped after batch {batch_id}: {how}; {where}" if batch_id else f"stopped before any batch: {how}; {where}"
