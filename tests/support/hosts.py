"""Simulated hosts for multi-host tests: Linux network namespaces on a bridge, each with its own
address, hostname and private /tmp.

A Spark executor on another host has its own network address, its own loopback, its own /tmp and
none of the driver's files there; a worker "host" here is a network namespace joined to a bridge
in the root namespace (where the driver, the Spark master and the Kafka broker run, bound to the
bridge's address), plus a mount and UTS namespace held by a small holder process, which every
process started on that host enters. Killing every process of a namespace is a host dying.
Root only; everything is torn down on close, also when the test failed. Traffic only ever goes to
loopback and to these namespaces.
"""
from __future__ import annotations

import atexit
import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from txstream.local.processes import die_with_parent

_COUNTER = itertools.count()


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def namespaces_available() -> tuple[bool, str]:
    """Whether this machine lets the tests create hosts, and why not."""
    if os.geteuid() != 0:
        return False, "simulated hosts need root (network and mount namespaces)"
    for what, where in (("checkout", Path(__file__).resolve().parents[2]), ("Python", Path(sys.prefix).resolve())):
        if Path("/tmp") in (where, *where.parents):
            return False, (f"the {what} is under /tmp ({where}), which every simulated host replaces with "
                           "its own: its processes would not find it. Clone the repository elsewhere")
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return False, f"simulated hosts need `{tool}` (Debian packages iproute2, util-linux)"
    name = f"txsprobe{os.getpid() % 100000}"
    made = _ip("netns", "add", name, check=False)
    if made.returncode != 0:
        return False, f"cannot create a network namespace: {made.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return True, ""


def _used_subnets() -> set[int]:
    text = _ip("-br", "addr").stdout
    return {int(part.split(".")[2]) for part in text.split() if part.startswith("10.77.")}


@dataclass
class Host:
    """One simulated host: a network namespace plus a mount/UTS namespace held by `holder`."""

    name: str
    namespace: str
    address: str
    veth: str = ""   # the root namespace's end of the host's veth pair
    holder: subprocess.Popen | None = None
    processes: list[subprocess.Popen] = field(default_factory=list)

    def _enter(self) -> list[str]:
        assert self.holder is not None
        pid = str(self.holder.pid)
        return ["nsenter", f"--net=/var/run/netns/{self.namespace}", f"--mount=/proc/{pid}/ns/mnt",
                f"--uts=/proc/{pid}/ns/uts", "--"]

    def start_holder(self) -> None:
        """The host's own /tmp (a fresh tmpfs), hostname and /etc/hosts (its name resolves to its
        address, as on a real host), kept alive by a sleeping process."""
        script = (f"mount -t tmpfs -o size=2g,mode=1777 txs-tmp /tmp && hostname {self.name} && "
                  f"mkdir /tmp/.etc && cp /etc/hosts /tmp/.etc/hosts && echo '{self.address} {self.name}' "
                  ">> /tmp/.etc/hosts && mount --bind /tmp/.etc/hosts /etc/hosts && "
                  "echo ready && exec sleep infinity")
        self.holder = subprocess.Popen(
            ["ip", "netns", "exec", self.namespace, "unshare", "--mount", "--uts", "--propagation", "private",
             "--", "sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=die_with_parent)
        line = self.holder.stdout.readline() if self.holder.stdout else ""
        if line.strip() != "ready":
            raise RuntimeError(f"host {self.name} did not start: {self.holder.stderr.read() if self.holder.stderr else ''}")

    def run(self, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
        """Run a command on this host and wait for it."""
        return subprocess.run([*self._enter(), *argv], **kwargs)

    def popen(self, argv: list[str], env: dict[str, str] | None = None, stdout: IO | int | None = None,
              stderr: IO | int | None = None, tmp_links: dict[str, str] | None = None) -> subprocess.Popen:
        """Start a process on this host (its network, hostname and /tmp). `tmp_links` first makes
        symlinks in the host's /tmp ({"/tmp/name": "/real/target"})."""
        for link, target in (tmp_links or {}).items():
            assert link.startswith("/tmp/"), link
            self.run(["ln", "-sfn", target, link], check=True)
        proc = subprocess.Popen([*self._enter(), *argv], env=env, stdout=stdout, stderr=stderr,
                                stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=die_with_parent)
        self.processes.append(proc)
        return proc

    def pids(self) -> list[int]:
        """Every process in this host's network namespace."""
        out = _ip("netns", "pids", self.namespace, check=False).stdout
        return [int(p) for p in out.split()]

    def kill_all(self, sig: int = signal.SIGKILL, keep_holder: bool = True) -> list[int]:
        """Kill every process of the host (the holder too unless `keep_holder`): the host dies."""
        holder = self.holder.pid if self.holder is not None and keep_holder else None
        killed = []
        for pid in self.pids():
            if pid == holder:
                continue
            try:
                os.kill(pid, sig)
                killed.append(pid)
            except ProcessLookupError:
                pass
        for proc in self.processes:
            try:
                proc.wait(timeout=0 if sig != signal.SIGKILL else 10)
            except subprocess.TimeoutExpired:
                pass
        return killed

    def file_exists(self, path: str) -> bool:
        return self.run(["test", "-e", path]).returncode == 0


class SimulatedHosts:
    """A bridge in the root namespace (the `gateway` address) and hosts on it."""

    def __init__(self) -> None:
        ok, why = namespaces_available()
        if not ok:
            raise RuntimeError(why)
        self.tag = f"{os.getpid() % 1000}{next(_COUNTER)}"
        self.bridge = f"txs{self.tag}br"[:15]
        used = _used_subnets()
        self.subnet = next(s for s in range(10, 250) if s not in used)
        self.gateway = f"10.77.{self.subnet}.1"
        self.hosts: list[Host] = []
        self._closed = False
        atexit.register(self.close)   # also when the test process ends without a teardown
        _ip("link", "add", self.bridge, "type", "bridge")
        try:
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except Exception:
            self.close()
            raise

    def add_host(self, name: str) -> Host:
        index = len(self.hosts) + 1
        namespace = f"txs{self.tag}-{name}"
        outside, inside = f"txs{self.tag}h{index}"[:15], f"txs{self.tag}n{index}"[:15]
        host = Host(name=name, namespace=namespace, address=f"10.77.{self.subnet}.{10 + index}", veth=outside)
        self.hosts.append(host)
        _ip("netns", "add", namespace)
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", inside, "netns", namespace)
        _ip("link", "set", outside, "master", self.bridge)
        _ip("link", "set", outside, "up")
        _ip("-n", namespace, "addr", "add", f"{host.address}/24", "dev", inside)
        _ip("-n", namespace, "link", "set", inside, "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        host.start_holder()
        return host

    def close(self) -> None:
        """Kill everything on the hosts, delete namespaces, veths and the bridge. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for host in self.hosts:
            # Until the namespace is empty: a process forked while the others were being killed
            # (a Spark worker starting an executor) keeps the namespace, and so its veth, alive.
            deadline = time.monotonic() + 10
            while host.kill_all(keep_holder=False) and time.monotonic() < deadline:
                time.sleep(0.1)
            if host.holder is not None:
                try:
                    host.holder.kill()
                    host.holder.wait(timeout=10)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    pass
            _ip("netns", "del", host.namespace, check=False)
            # Deleting one end of a veth pair deletes both, whether or not the namespace that
            # held the other end is gone yet (the kernel frees a namespace asynchronously).
            if host.veth:
                _ip("link", "del", host.veth, check=False)
        _ip("link", "del", self.bridge, check=False)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.leftovers():
            time.sleep(0.1)

    def leftovers(self) -> list[str]:
        """Namespaces and links of this instance still present (none after close)."""
        names = _ip("netns", "list", check=False).stdout + _ip("-br", "link", check=False).stdout
        return [word for word in names.split() if word.startswith(f"txs{self.tag}")]

    def __enter__(self) -> SimulatedHosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
