"""Waiting on a condition with a timeout (never a bare sleep)."""
from __future__ import annotations

import time
from typing import Callable


def wait_until(condition: Callable[[], object], timeout: float, what: str, every: float = 0.2) -> None:
    """Until `condition()` is true; fails the test naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        time.sleep(every)
