"""A Spark standalone cluster from the installed pyspark: the master in the root namespace (on the
hosts' gateway address), each worker on its own simulated host (tests/support/hosts.py).

Started as an operator would (`spark-class org.apache.spark.deploy.master.Master` / `...Worker`),
with the workers' work and local directories in their hosts' private /tmp. Waits on the master's
JSON status, never on a clock.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.hosts import Host, SimulatedHosts, read_tail
from tests.support.waiting import wait_until
from txstream.local.cluster import free_port_block

WORKER_TIMEOUT = "-Dspark.worker.timeout=8"


def _spark_package() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _daemon_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_HOME", "SPARK_CONF_DIR",
                                                            "PYSPARK_PYTHON", "SPARK_LOCAL_DIRS")}
    env.update({"SPARK_HOME": str(_spark_package()), "SPARK_DAEMON_MEMORY": "384m",
                "SPARK_NO_DAEMONIZE": "1"})
    env.update(extra or {})
    return env


class SparkStandalone:
    """A master and `workers` workers (one host each). `tmp_links[i]`: symlinks made in worker
    i's /tmp before it starts (a per-host environment at one path, e.g. /tmp/txs-env)."""

    def __init__(self, hosts: SimulatedHosts, log_dir: Path, workers: int = 2, cores_per_worker: int = 1,
                 worker_memory: str = "1g", tmp_links: list[dict[str, str]] | None = None,
                 timeout: float = 120.0, name: str = "w") -> None:
        self.hosts = hosts
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        base = free_port_block(2)
        self.port, self.ui_port = base, base + 1
        self.master_url = f"spark://{hosts.gateway}:{self.port}"
        self.workers: list[tuple[Host, subprocess.Popen]] = []
        spark_class = str(_spark_package() / "bin" / "spark-class")
        self._worker_args = (cores_per_worker, worker_memory)
        # A dead worker is noticed after spark.worker.timeout (60 s by default): 8 s here. Workers
        # heartbeat every quarter of their own setting, so both sides get it. Executors killed on
        # purpose must not get the app removed (spark.deploy.maxExecutorRetries).
        master_env = _daemon_env({"SPARK_MASTER_OPTS": f"{WORKER_TIMEOUT} -Dspark.deploy.maxExecutorRetries=-1"})
        self._name = name
        self._master_log = open(self.log_dir / f"{name}-master.log", "ab")
        self.master = subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", hosts.gateway,
             "--port", str(self.port), "--webui-port", str(self.ui_port)],
            env=master_env, stdout=self._master_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        self._logs = [self._master_log]
        try:
            self.wait_for(lambda s: s.get("status") == "ALIVE", timeout, "the master to come up")
            for i in range(workers):
                host = hosts.add_host(f"{name}{i + 1}")
                self.workers.append((host, self._start_worker(host, i, cores_per_worker, worker_memory,
                                                              tmp_links[i] if tmp_links and i < len(tmp_links) else None)))
            self.wait_for(lambda s: self._alive_workers(s) >= workers, timeout, f"{workers} workers to register")
        except BaseException:
            self.stop()
            raise

    def _start_worker(self, host: Host, index: int, cores: int, memory: str,
                      tmp_links: dict[str, str] | None) -> subprocess.Popen:
        self._worker_args = (cores, memory)
        log = open(self.log_dir / f"{self._name}{index + 1}-worker.log", "ab")
        self._logs.append(log)
        return host.popen(
            [str(_spark_package() / "bin" / "spark-class"), "org.apache.spark.deploy.worker.Worker",
             "--host", host.address, "--cores", str(cores), "--memory", memory, "--work-dir", "/tmp/spark-work",
             self.master_url],
            env=_daemon_env({"SPARK_LOCAL_DIRS": "/tmp/spark-local", "SPARK_LOCAL_IP": host.address,
                             "SPARK_WORKER_OPTS": WORKER_TIMEOUT}), stdout=log, stderr=subprocess.STDOUT,
            tmp_links=tmp_links)

    def restart_worker(self, index: int, timeout: float = 120.0) -> None:
        """Start worker `index` again on its host (after kill_host) and wait until it is ALIVE."""
        host = self.host(index)
        self.workers[index] = (host, self._start_worker(host, index, *self._worker_args, None))
        self.wait_for(lambda s: host.address in self.alive_workers_of(s), timeout, f"worker {index + 1} to re-register")

    @staticmethod
    def alive_workers_of(status: dict[str, Any]) -> list[str]:
        return sorted(w["host"] for w in status.get("workers", []) if w.get("state") == "ALIVE")

    # -- status -------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://{self.hosts.gateway}:{self.ui_port}/json/", timeout=5) as reply:
            return json.loads(reply.read())

    @staticmethod
    def _alive_workers(status: dict[str, Any]) -> int:
        return sum(1 for w in status.get("workers", []) if w.get("state") == "ALIVE")

    def alive_workers(self) -> list[str]:
        """The hosts of the workers the master sees alive."""
        return self.alive_workers_of(self.status())

    def wait_for(self, condition, timeout: float, what: str) -> None:
        """Poll the master's status until `condition(status)` holds; fails at once if the master exits."""
        last: list[Exception] = []

        def holds() -> bool:
            assert self.master.poll() is None, f"the Spark master exited before {what}\n{self.logs()}"
            try:
                return condition(self.status())
            except (OSError, ValueError) as exc:   # not listening yet, or its HTML page before the JSON one
                last[:] = [exc]
                return False

        wait_until(holds, timeout, what, state=lambda: f"{last[0] if last else ''}\n{self.logs()}")

    def logs(self, lines: int = 30) -> str:
        parts = [f"--- {path.name} ---\n{read_tail(path, lines)}" for path in sorted(self.log_dir.glob("*.log"))]
        return "\n".join(parts)

    # -- what a test does to it ---------------------------------------------------------------

    def host(self, index: int) -> Host:
        return self.workers[index][0]

    def executor_pids(self, index: int) -> list[int]:
        """The executor JVMs on worker `index`'s host."""
        pids = []
        for pid in self.host(index).pids():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"CoarseGrainedExecutorBackend" in cmdline:
                pids.append(pid)
        return pids

    def kill_executors(self, index: int) -> list[int]:
        killed = []
        for pid in self.executor_pids(index):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        return killed

    def kill_host(self, index: int) -> list[int]:
        """Every process of worker `index`'s host (worker, executors, Python workers): SIGKILL."""
        return self.host(index).kill_all()

    def driver_conf(self, cores_max: int | None = None) -> dict[str, str]:
        """What a driver in the root namespace needs: the master, an address the executors reach,
        the interpreter (the hosts share every file but /tmp), and all executors before the first job."""
        conf = {"spark.master": self.master_url, "spark.driver.host": self.hosts.gateway,
                "spark.driver.bindAddress": self.hosts.gateway, "spark.pyspark.python": sys.executable,
                "spark.executor.memory": "768m", "spark.scheduler.minRegisteredResourcesRatio": "1.0",
                "spark.scheduler.maxRegisteredResourcesWaitingTime": "60s"}
        if cores_max is not None:
            conf["spark.cores.max"] = str(cores_max)
        return conf

    def stop(self) -> None:
        for host, proc in self.workers:
            host.kill_all()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if self.master.poll() is None:
            self.master.kill()
            self.master.wait(timeout=20)
        for log in self._logs:
            log.close()
