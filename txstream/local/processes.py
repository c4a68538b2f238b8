"""Child processes that must not outlive the process that started them."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

from txstream.errors import BrokerError


def die_with_parent() -> None:
    """A `preexec_fn`: runs in the child before exec and asks Linux to SIGKILL the child when its
    parent dies (PR_SET_PDEATHSIG), so a test run or a benchmark killed without its finally blocks
    leaves no broker, driver or contender behind. A no-op elsewhere."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def alive(pid: int, proc: subprocess.Popen | None = None) -> bool:
    """The process runs (a zombie of someone else's counts as gone); `proc`: our own child."""
    if proc is not None:
        return proc.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie of someone else's counts as gone
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def signal_and_wait(pid: int, sig: int, timeout: float, proc: subprocess.Popen | None = None) -> None:
    """Send `sig` and wait up to `timeout` for the process to end; SIGKILL it after that."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while alive(pid, proc):
        if time.monotonic() > deadline:
            if sig == signal.SIGKILL:
                return
            signal_and_wait(pid, signal.SIGKILL, 10, proc)
            return
        time.sleep(0.1)


def require_java() -> str:
    """The `java` on PATH, checked to be 17 or newer (Kafka 4, Spark 4 and the registry need it)."""
    java = shutil.which("java")
    if not java:
        raise BrokerError("Java was not found on PATH. Apache Kafka 4 and Spark 4 need Java 17 or "
                          "newer: install a JDK 17 (e.g. `apt-get install openjdk-17-jdk-headless`).")
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    try:
        major = int(out.split('"')[1].split(".")[0])
    except (IndexError, ValueError):
        major = 0
    if major and major < 17:
        raise BrokerError(f"Java {major} found at {java}; Apache Kafka 4 needs Java 17 or newer.")
    return java
