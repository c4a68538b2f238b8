"""Child processes that must not outlive the process that started them."""
from __future__ import annotations

import signal
import sys


def die_with_parent() -> None:
    """A `preexec_fn`: runs in the child before exec and asks Linux to SIGKILL the child when its
    parent dies (PR_SET_PDEATHSIG), so a test run or a benchmark killed without its finally blocks
    leaves no broker, driver or contender behind. A no-op elsewhere."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
