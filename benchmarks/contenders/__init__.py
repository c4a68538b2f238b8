"""The contenders: each one moves the seeded orders from the input topic to its own output topic.

A contender is a subprocess the harness starts and measures (CPU and RSS of its process tree);
`Contender.command()` says how to start it. The ceiling overrides `run()` because it is two
processes in a row.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field


@dataclass
class Job:
    bootstrap: str
    input_topic: str
    output_topic: str
    partitions: int
    group: str          # consumer group / app id, fresh per run
    workdir: str        # a fresh scratch directory (checkpoints, state), removed after the run
    mode: str = "throughput"   # or "latency": run until stopped, commit often
    records: int = 0
    avg_value_size: int = 0
    expected: int = 0
    extra: dict = field(default_factory=dict)


class Unavailable(Exception):
    """The contender cannot run here; the message says why (shown as `unavailable: <reason>`)."""


class Contender:
    name = ""            # id used on the command line
    label = ""           # shown in tables
    long_running = True  # can be measured in --latency mode
    exactly_once = True  # output must have no duplicates
    startup_timeout = 600.0
    output_kind = "enriched"  # "enriched": OrderEnriched per kept order; "copy": the input values as
    #                           they are, every record; the ceiling checks a count only
    txstream = False     # its log has txstream's per-batch lines (benchmarks/batchlog.py)

    def settings(self) -> dict:
        """This contender's knobs, as recorded in the results (e.g. transaction size)."""
        return {}

    def prepare(self, progress) -> None:
        """Install or check what the contender needs; raise Unavailable with a reason."""

    def command(self, job: Job) -> tuple[list[str], dict]:
        raise NotImplementedError

    def fatal_in_log(self, text: str) -> str | None:
        """A reason to give up on a run early, read from its log (e.g. a retry loop that never ends)."""
        return None

    def extra_topics(self, job: Job) -> list[str]:
        """Topics besides the output topic that the harness creates fresh for a run."""
        return []

    def versions(self) -> dict:
        return {}

    @staticmethod
    def base_env() -> dict:
        env = dict(os.environ)
        env["PYSPARK_PYTHON"] = sys.executable
        env["PYSPARK_DRIVER_PYTHON"] = sys.executable
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env


def jvm_collector() -> str:
    """The collector of the JVM contenders (Kafka Streams, the ceiling's perf tools): serial on a
    machine of at most SERIAL_GC_MAX_TASK_THREADS usable cores, like txstream's own local JVM
    (txstream/spark/session.py), G1 on a larger one (the JVM's own choice from 2 cores up): each
    gets the collector that serves it best on the machine, so none is handicapped against txstream."""
    from txstream.spark.session import SERIAL_GC_MAX_TASK_THREADS
    from txstream.spark.setup import local_task_threads

    cores = local_task_threads("local[*]") or 1
    return "-XX:+UseSerialGC" if cores <= SERIAL_GC_MAX_TASK_THREADS else "-XX:+UseG1GC"
