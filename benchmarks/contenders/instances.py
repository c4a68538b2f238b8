"""N instances of one contender in one consumer group, measured as one contender.

`handwritten-x2` and `quix-x2` are the hand-written loop and Quix Streams run as two processes
that share the run's consumer group and split the input partitions between them: the fair
comparison with txstream on `local[2]` (both cores) for one-process-per-core designs.

The harness measures one subprocess per contender (CPU and RSS of its process tree, its log,
SIGTERM to its process group when the output is complete). So the contender's command is this
module as a small launcher:

    python -m benchmarks.contenders.instances --count 2 -- <argv of one instance>

It starts `--count` children, each from the argv with every `{i}` replaced by the instance
number (0, 1, ...), relays their output line by line prefixed with `[i] `, forwards SIGTERM and
SIGINT to them, waits for all, and exits non-zero if any failed. A child that fails while the
others run stops the whole run (the others are terminated): a run with one instance left
would be the one-instance figure under the two-instance name.

Each child gets its own process group (so a signal to the launcher's group reaches a child
once, forwarded, and not twice: Quix Streams turns a second SIGINT into KeyboardInterrupt) and
PR_SET_PDEATHSIG (SIGKILL when the launcher dies without stopping them). The harness still
kills every straggler of the tree it saw. Standard library only, apart from the contender
classes below, which the launcher does not use.
"""
from __future__ import annotations

import argparse
import os
import resource
import shlex
import signal
import subprocess
import sys
import threading
import time

from benchmarks.contenders import Contender, Job

STOP_GRACE_S = 15.0  # after a stop, SIGKILL children still running (the harness waits 20 s, then kills)


class Instances(Contender):
    """`count` instances of `inner` in one consumer group. `per_instance` maps options of the
    inner command to a suffix for their value (e.g. {"--transactional-id": "-{i}"}) so that each
    instance gets its own; everything else, the group included, is shared."""

    def __init__(self, inner: Contender, count: int = 2, per_instance: dict[str, str] | None = None,
                 name: str | None = None, label: str | None = None) -> None:
        self.inner = inner
        self.count = count
        self.per_instance = dict(per_instance or {})
        self.name = name or f"{inner.name}-x{count}"
        self.label = label or f"{inner.label}, {count} instances in one group"
        for attr in ("long_running", "exactly_once", "startup_timeout", "output_kind", "txstream"):
            setattr(self, attr, getattr(inner, attr))

    def settings(self) -> dict:
        return {**self.inner.settings(), "instances": self.count}

    def prepare(self, progress) -> None:
        self.inner.prepare(progress)

    def command(self, job: Job) -> tuple[list[str], dict]:
        argv, env = self.inner.command(job)
        argv = list(argv)
        for opt, suffix in self.per_instance.items():
            at = argv.index(opt) + 1  # ValueError: the inner command changed; better loud than shared
            argv[at] += suffix
        return ([sys.executable, "-m", "benchmarks.contenders.instances", "--count", str(self.count), "--", *argv],
                env)

    def fatal_in_log(self, text: str) -> str | None:
        return self.inner.fatal_in_log(text)

    def extra_topics(self, job: Job) -> list[str]:
        return self.inner.extra_topics(job)

    def versions(self) -> dict:
        return self.inner.versions()


# ---------------------------------------------------------------------------------------------
# The launcher
# ---------------------------------------------------------------------------------------------

def _child_setup() -> None:
    os.setpgid(0, 0)
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


_out_lock = threading.Lock()


def _emit(prefix: bytes, line: bytes) -> None:
    if not line.endswith(b"\n"):
        line += b"\n"
    with _out_lock:
        sys.stdout.buffer.write(prefix + line)
        sys.stdout.buffer.flush()


def _say(message: str) -> None:
    _emit(b"[instances] ", message.encode())


def _relay(i: int, stream) -> None:
    prefix = f"[{i}] ".encode()
    for line in iter(stream.readline, b""):
        _emit(prefix, line)
    stream.close()


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: python -m benchmarks.contenders.instances --count N -- ARGV... ({i} = instance number)",
              file=sys.stderr)
        return 2
    split = argv.index("--")
    ap = argparse.ArgumentParser(prog="python -m benchmarks.contenders.instances")
    ap.add_argument("--count", type=int, required=True)
    args = ap.parse_args(argv[:split])
    template = argv[split + 1:]
    if args.count < 1 or not template:
        ap.error("need --count >= 1 and a command after --")

    stop_signal: list[int] = []  # the signal we were asked to stop with, once

    def _on_signal(signum, _frame):
        if not stop_signal:
            stop_signal.append(signum)
        for p in procs:
            if p.poll() is None:
                try:
                    p.send_signal(signum)
                except ProcessLookupError:
                    pass

    procs: list[subprocess.Popen] = []
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    relays = []
    for i in range(args.count):
        child_argv = [a.replace("{i}", str(i)) for a in template]
        p = subprocess.Popen(child_argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             preexec_fn=_child_setup)
        procs.append(p)
        _say(f"instance {i}: pid {p.pid}: {shlex.join(child_argv)}")
        t = threading.Thread(target=_relay, args=(i, p.stdout), daemon=True)
        t.start()
        relays.append(t)
        if stop_signal:  # a signal between two starts: the handler did not see this one yet
            p.send_signal(stop_signal[0])

    failed: tuple[int, int] | None = None   # (instance, returncode) of the first failure
    stop_since: float | None = None
    reported: set[int] = set()
    while True:
        codes = []
        for i, p in enumerate(procs):
            if i in reported:
                codes.append(p.returncode)
                continue
            before = _children_cpu()
            rc = p.poll()  # reaps it: RUSAGE_CHILDREN grows by its CPU (and its reaped children's)
            codes.append(rc)
            if rc is None:
                continue
            reported.add(i)
            _say(f"instance {i} exited with {rc} after {_children_cpu() - before:.2f} CPU s")
            clean = rc == 0 or (stop_signal and rc == -stop_signal[0])
            if not clean and failed is None:
                failed = (i, rc)
                if not stop_signal:
                    _say(f"instance {i} failed: stopping the others")
                    _on_signal(signal.SIGTERM, None)
        if all(rc is not None for rc in codes):
            break
        if stop_signal:
            stop_since = stop_since or time.monotonic()
            if time.monotonic() - stop_since > STOP_GRACE_S:
                for i, p in enumerate(procs):
                    if p.poll() is None:
                        _say(f"instance {i} still running {STOP_GRACE_S:.0f}s after the stop: SIGKILL")
                        p.kill()
                stop_since = float("inf")  # once
        time.sleep(0.1)
    for t in relays:
        t.join(2.0)
    if failed is not None:
        return _exit_code(failed[1]) or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
