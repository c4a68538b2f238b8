"""The Python worker's heap, settled once: the engine's modules out of the garbage collector's sight.

Spark's worker daemon runs a full `gc.collect()` in a reused worker after every task. With pandas,
pyarrow, confluent_kafka, fastavro and txstream loaded, that pass walks every object those
imports created, tens of milliseconds of CPU, after every one of a batch's many short tasks.
`gc.freeze()`
moves what exists now into the permanent generation, which collections skip; what later tasks
allocate is collected as usual. txstream's local worker daemon freezes before it forks
(spark/worker_daemon.py); `settle()` does the same once in a worker started by Spark's own daemon
(a cluster's executors).
"""
from __future__ import annotations

import gc

_settled = False


def settle() -> None:
    """Freeze the heap the first time this worker runs a txstream task; a no-op afterwards."""
    global _settled
    if not _settled:
        _settled = True
        gc.freeze()
