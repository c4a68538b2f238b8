"""What an executor has: the preflight's task body (driver/preflight.py compares the answers).

Shipped to the executors by value (cloudpickle), not by reference, and importing nothing but the
standard library at the top: it must run, and say so, on an executor where txstream itself, or
pyarrow, or the processor's module, is missing. It answers with a small dict per task through
an RDD (a handful of rows of control data, not a batch's records: no Arrow needed).
"""
from __future__ import annotations

import os
import socket
import sys
import time
import uuid
from typing import Any, Iterator

# import name -> distribution name, for the versions compared with the driver's
LIBRARIES = {"pyspark": "pyspark", "pyarrow": "pyarrow", "confluent_kafka": "confluent-kafka",
             "fastavro": "fastavro", "txstream": "txstream"}


def local_dirs() -> list[str]:
    """The executor's own scratch directories: Spark gives its Python workers SPARK_LOCAL_DIRS
    (spark.local.dir / the worker's per-application directories), removed when the app ends."""
    dirs = [d for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(",") if d]
    if not dirs:
        import tempfile

        dirs = [tempfile.gettempdir()]
    return dirs


def _version(module: str, distribution: str) -> str | None:
    try:
        __import__(module)
    except Exception as exc:  # missing or broken: the message is the answer
        return f"not importable ({type(exc).__name__}: {exc})"
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return getattr(sys.modules[module], "__version__", "unknown")


def _address_towards(bootstrap: str) -> str:
    """This executor's address on the route to Kafka (no packet is sent: a UDP connect only)."""
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((host.strip("[]") or "127.0.0.1", int(port or 9092)))
            return sock.getsockname()[0]
    except (OSError, ValueError):
        return "?"


def _kafka_cluster_id(admin_config: dict[str, Any], timeout_s: float) -> tuple[str | None, str | None]:
    try:
        from confluent_kafka.admin import AdminClient

        metadata = AdminClient({**admin_config, "log_level": 0}).list_topics(timeout=timeout_s)
        return metadata.cluster_id, None
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"


def _write_local_dir() -> str | None:
    for directory in local_dirs():
        path = os.path.join(directory, f"txstream-probe-{uuid.uuid4().hex}")
        try:
            with open(path, "wb") as out:
                out.write(b"x")
            os.unlink(path)
        except OSError as exc:
            return f"cannot write to {directory}: {exc}"
    return None


def probe(processor_module: str | None, admin_config: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """One executor slot's answers."""
    bootstrap = str(admin_config.get("bootstrap.servers", ""))
    answers: dict[str, Any] = {
        "host": socket.gethostname(),
        "address": _address_towards(bootstrap),
        "python": ".".join(map(str, sys.version_info[:3])),
        "executable": sys.executable,
        "versions": {name: _version(name, dist) for name, dist in LIBRARIES.items()},
    }
    answers["processor"] = None
    if processor_module:
        try:
            __import__(processor_module)
        except Exception as exc:
            answers["processor"] = f"cannot import {processor_module} ({type(exc).__name__}: {exc})"
    answers["cluster_id"], answers["kafka_error"] = _kafka_cluster_id(admin_config, timeout_s)
    answers["local_dir"] = _write_local_dir()
    return answers


def probe_partition(processor_module: str | None, admin_config: dict[str, Any], timeout_s: float,
                    hold_s: float) -> Any:
    """An RDD mapPartitions body. Each task holds its slot a moment, so that the job's tasks
    spread over every executor core instead of one fast core taking several."""
    def run(_rows: Iterator[Any]) -> Iterator[dict[str, Any]]:
        started = time.monotonic()
        answers = probe(processor_module, admin_config, timeout_s)
        time.sleep(max(0.0, hold_s - (time.monotonic() - started)))
        yield answers
    return run
