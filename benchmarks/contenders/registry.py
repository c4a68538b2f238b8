"""Every contender the harness knows, by name: the fixed set plus the ones the environment adds
(TXSTREAM_BENCH_BASELINE, TXSTREAM_BENCH_VARIANT). Apart from the package's base classes, which
each contender's module imports."""
from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from benchmarks.contenders import Contender
from benchmarks.contenders.ceiling import KafkaCeiling
from benchmarks.contenders.handwritten import HandWrittenLoop
from benchmarks.contenders.instances import Instances
from benchmarks.contenders.kafka_streams import KafkaStreams
from benchmarks.contenders.quix import QuixStreams
from benchmarks.contenders.spark_ss import SparkStructuredStreaming
from benchmarks.contenders.txstream_engine import PASSTHROUGH, TxStream


def all_contenders() -> list[Contender]:
    return [TxStream("exactly-once"), TxStream("at-least-once"), TxStream("at-most-once"),
            TxStream("exactly-once", processor=PASSTHROUGH, name="txstream-passthrough",
                     label="txstream pass-through (exactly-once, no decode)"),
            TxStream("exactly-once", name="txstream-exactly-once-metrics",
                     label="txstream exactly-once, /metrics served", extra_args=("--metrics-port", "0")),
            # No lineage headers: a slot's ranges are read in one Python hand-off (task/reading.py).
            TxStream("exactly-once", name="txstream-exactly-once-nolineage",
                     label="txstream exactly-once, --no-lineage", extra_args=("--no-lineage",)),
            TxStream("exactly-once", name="txstream-exactly-once-tls-scram",
                     label="txstream exactly-once over TLS + SCRAM-SHA-512", secured=True),
            TxStream("exactly-once", name="txstream-exactly-once-registry",
                     label="txstream exactly-once, registry-framed Avro", registry=True),
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
    side by side with the default. The value is split like a POSIX shell line (`shlex.split`), so
    quotes keep a value with spaces in one argument."""
    args = shlex.split(os.environ.get("TXSTREAM_BENCH_VARIANT", ""))
    if not args:
        return []
    return [txstream_cls("exactly-once", name="txstream-exactly-once-variant",
                         label=f"txstream exactly-once, {shlex.join(args)}", extra_args=tuple(args))]


def _baselines(txstream_cls) -> list[Contender]:
    """txstream-exactly-once-baseline: the same run with another commit's txstream, from a git
    worktree named by TXSTREAM_BENCH_BASELINE (`git worktree add /tmp/base <commit>`)."""
    where = os.environ.get("TXSTREAM_BENCH_BASELINE")
    if not where:
        return []
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=where, capture_output=True,
                            text=True).stdout.strip() or "?"
    return [txstream_cls("exactly-once", name="txstream-exactly-once-baseline",
                         label=f"txstream exactly-once at {commit} (baseline)", baseline=Path(where)),
            txstream_cls("exactly-once", name="txstream-exactly-once-nolineage-baseline",
                         label=f"txstream exactly-once, --no-lineage, at {commit} (baseline)",
                         baseline=Path(where), extra_args=("--no-lineage",))]
