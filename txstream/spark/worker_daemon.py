"""Spark's Python worker daemon, with the engine's imports done once before it forks workers.

Spark forks every Python worker from one daemon process and each worker then imports pyspark's
worker, pandas, pyarrow, confluent_kafka, fastavro and txstream on its own, over a second of CPU
per worker, and a run starts a reader and a publisher worker per task slot plus Spark's planning
workers. Imported here, the forked workers inherit the loaded modules.

Spark's own daemon imports nothing before forking because a library may start threads at import;
the only threads these imports start are pyarrow's allocator threads, and its allocators and
thread pools reinitialise themselves in a forked child (they register at-fork handlers).
Set with `spark.python.daemon.module=txstream.spark.worker_daemon` (spark/session.py does, for
local masters).
"""
from __future__ import annotations

import gc
import importlib
import os
import sys

# Spark puts its spark-core jar (a zip of thousands of classes) on the workers' PYTHONPATH, and
# pyspark calls importlib.invalidate_caches() at the start of every task, which makes zipimport
# re-read that jar's whole directory each time. Nothing Python is in it.
sys.path[:] = [entry for entry in sys.path if not entry.endswith(".jar")]
for _entry in [e for e in sys.path_importer_cache if e.endswith(".jar")]:
    del sys.path_importer_cache[_entry]

import confluent_kafka  # noqa: F401
import fastavro  # noqa: F401
import pandas  # noqa: F401 - the imports are the point
import pyarrow
import pyarrow.compute  # noqa: F401
import pyspark.daemon
import pyspark.sql.pandas.serializers
import pyspark.worker  # noqa: F401

import txstream.task.publish
import txstream.task.reading  # noqa: F401
from txstream.spark.setup import WORKER_IMPORTS

# What only some runs load, named by the driver (spark/session.py build_spark): a registry run's
# client costs each worker 0.2 s of CPU on its first batch otherwise.
for _module in filter(None, os.environ.get(WORKER_IMPORTS, "").split(",")):
    importlib.import_module(_module)

_run_one_task = pyspark.daemon.worker


def _worker(sock, authenticated: bool) -> int:
    """pyspark's per-task loop in a forked worker, quiet when the executor has gone: a stopping
    executor closes its Unix socket (spark/setup.py) and the idle worker's last flush then
    fails with EPIPE, which pyspark's daemon prints as a traceback per worker at every stop."""
    try:
        return _run_one_task(sock, authenticated)
    except (BrokenPipeError, ConnectionResetError):
        return 1   # the daemon then waits for the socket's close and exits the worker


pyspark.daemon.worker = _worker

if __name__ == "__main__":
    # The daemon's loaded modules are the forked workers' heap: frozen, the full collection
    # Spark runs in a reused worker after every task skips them (txstream/task/worker_heap.py).
    gc.freeze()
    pyspark.daemon.manager()
