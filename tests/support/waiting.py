"""Waiting on a condition with a timeout (never a bare sleep)."""
from __future__ import annotations

import time
from typing import Any, Callable, Protocol, TypeVar

T = TypeVar("T")


class _Process(Protocol):
    """What a wait needs of a running process (tests/support/running.py Run)."""

    def poll(self) -> int | None: ...

    def dump_stacks(self) -> None: ...

    def tail(self) -> str: ...


def wait_until(condition: Callable[[], T], timeout: float, what: str, every: float = 0.2,
               run: _Process | None = None, state: Callable[[], Any] | None = None) -> T | None:
    """Poll `condition()` until it returns something truthy, and return that.

    After `timeout` seconds the test fails naming `what`, with `state()` when given and the tail
    of `run`'s log. With `run`, returns None as soon as the process has ended: the caller decides
    whether that is a failure (a run that exits 0 before the condition may simply have finished)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if run is not None and run.poll() is not None:
            return None
        if time.monotonic() > deadline:
            if run is not None:
                run.dump_stacks()
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}"
                                 + (f"; {state()}" if state is not None else "")
                                 + (f"\n--- txstream run log ---\n{run.tail()}" if run is not None else ""))
        time.sleep(every)
