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
    (txstream/spark/session.py), G1 on a larger one (the JVM's own choice from 2 cores up). Each
    gets the collector that serves it best here: on 2 cores, 1,000,000 orders, 3 runs each
    alternating, Kafka Streams 126,962 against 118,664 records/s with it (CPU 10.8 against 11.8
    s), the ceiling 187,980 against 160,393 (benchmarks/results/side-by-side, -serial-gc-jvm-contenders)."""
    from txstream.spark.session import SERIAL_GC_MAX_TASK_THREADS
    from txstream.spark.setup import local_task_threads

    cores = local_task_threads("local[*]") or 1
    return "-XX:+UseSerialGC" if cores <= SERIAL_GC_MAX_TASK_THREADS else "-XX:+UseG1GC"


def all_contenders() -> list[Contender]:
    from benchmarks.contenders.ceiling import KafkaCeiling
    from benchmarks.contenders.handwritten import HandWrittenLoop
    from benchmarks.contenders.instances import Instances
    from benchmarks.contenders.kafka_streams import KafkaStreams
    from benchmarks.contenders.quix import QuixStreams
    from benchmarks.contenders.spark_ss import SparkStructuredStreaming
    from benchmarks.contenders.txstream_engine import PASSTHROUGH, TxStream

    return [TxStream("exactly-once"), TxStream("at-least-once"), TxStream("at-most-once"),
            TxStream("exactly-once", processor=PASSTHROUGH, name="txstream-passthrough",
                     label="txstream pass-through (exactly-once, no decode)"),
            TxStream("exactly-once", name="txstream-exactly-once-metrics",
                     label="txstream exactly-once, /metrics served", extra_args=("--metrics-port", "0")),
            # No lineage headers: a slot's ranges are read in one Python hand-off (task/reading.py).
            TxStream("exactly-once", name="txstream-exactly-once-nolineage",
                     label="txstream exactly-once, --no-lineage", extra_args=("--no-lineage",)),
            HandWrittenLoop(),
            Instances(HandWrittenLoop(), 2, {"--transactional-id": "-{i}"}, name="handwritten-x2",
                      label="hand-written confluent-kafka EOS loop, 2 instances"),
            SparkStructuredStreaming(), QuixStreams(),
            Instances(QuixStreams(), 2, {"--state-dir": "/{i}"}, name="quix-x2",
                      label="Quix Streams exactly-once, 2 instances"),
            KafkaStreams(), KafkaCeiling(), *_baselines(TxStream), *_variants(TxStream)]


def _variants(txstream_cls) -> list[Contender]:
    """txstream-exactly-once-variant: txstream exactly-once with the extra `txstream run`
    arguments of TXSTREAM_BENCH_VARIANT (e.g. "-X producer.linger.ms=50"), to measure a setting
    side by side with the default."""
    import shlex

    args = shlex.split(os.environ.get("TXSTREAM_BENCH_VARIANT", ""))
    if not args:
        return []
    return [txstream_cls("exactly-once", name="txstream-exactly-once-variant",
                         label=f"txstream exactly-once, {' '.join(args)}", extra_args=tuple(args))]


def _baselines(txstream_cls) -> list[Contender]:
    """txstream-exactly-once-baseline: the same run with another commit's txstream, from a git
    worktree named by TXSTREAM_BENCH_BASELINE (`git worktree add /tmp/base <commit>`)."""
    from pathlib import Path

    where = os.environ.get("TXSTREAM_BENCH_BASELINE")
    if not where:
        return []
    import subprocess

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=where, capture_output=True,
                            text=True).stdout.strip() or "?"
    return [txstream_cls("exactly-once", name="txstream-exactly-once-baseline",
                         label=f"txstream exactly-once at {commit} (baseline)", baseline=Path(where)),
            txstream_cls("exactly-once", name="txstream-exactly-once-nolineage-baseline",
                         label=f"txstream exactly-once, --no-lineage, at {commit} (baseline)",
                         baseline=Path(where), extra_args=("--no-lineage",))]
