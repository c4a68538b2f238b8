"""Contenders 1-3 and the pass-through: txstream's own engine, through its CLI.

    python -m txstream.cli run processors/enrich_orders.py:EnrichOrders --bootstrap-servers B
        --app-id ID --input IN --output OUT --until-caught-up --guarantee G --master local[2]

started as `python -m benchmarks.contenders.txstream_run run ...` (the same CLI, plus one log
line per batch with each task's timings; see that module). `txstream-passthrough` runs
processors/passthrough.py:PassThrough exactly once on the same input: no decode, no transform,
no encode, the bytes are copied; the difference to the enricher is what the Avro work costs.
In --latency mode `--until-caught-up` is left out and the harness stops the process.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from benchmarks.common import REPO, framed_copy
from benchmarks.contenders import Contender, Job, Unavailable

PROCESSOR = "processors/enrich_orders.py:EnrichOrders"
PASSTHROUGH = "processors/passthrough.py:PassThrough"


class TxStream(Contender):
    txstream = True

    def __init__(self, guarantee: str, processor: str = PROCESSOR, name: str | None = None,
                 label: str | None = None, max_records_per_partition: int | None = None,
                 extra_args: tuple[str, ...] = (), baseline: Path | None = None, secured: bool = False,
                 registry: bool = False) -> None:
        self.guarantee = guarantee
        # Through the run broker's TLS + SCRAM-SHA-512 listener (what security costs: docs/security.md).
        self.secured = secured
        # The input framed by a schema registry, read by schema id; the output registered and framed
        # (docs/schemas.md). The output check reads past the framing.
        self.registry = registry
        # A git worktree of another commit (TXSTREAM_BENCH_BASELINE): the same run with that
        # commit's txstream, side by side with this one's, for a change's measured effect.
        self.baseline = baseline
        self.processor = processor
        self.name = name or f"txstream-{guarantee}"
        self.label = label or f"txstream {guarantee}"
        self.exactly_once = guarantee != "at-least-once"
        self.max_records_per_partition = max_records_per_partition
        self.extra_args = extra_args   # e.g. the metrics endpoint on (its cost: docs/operations.md)
        self.copies = processor == PASSTHROUGH
        self.output_kind = "copy" if self.copies else "enriched"

    def value_fn(self, value: bytes) -> bytes:
        """What the output check decodes: the value past Confluent's framing (registry runs)."""
        if self.registry:
            if value[:1] != b"\x00" or len(value) < 5:
                raise ValueError("an output value without the schema registry's framing")
            return value[5:]
        return value

    def expected_output(self, job: Job) -> int:
        return job.records if self.copies else job.expected

    def settings(self) -> dict:
        return {"processor": self.processor, "guarantee": self.guarantee,
                "max_records_per_partition": self.max_records_per_partition or "default (100000)",
                **({"extra_args": " ".join(self.extra_args)} if self.extra_args else {})}

    def prepare(self, progress) -> None:
        if not (REPO / self.processor.split(":")[0]).exists():
            raise Unavailable(f"{self.processor.split(':')[0]} does not exist yet")
        probe = subprocess.run([sys.executable, "-m", "txstream.cli", "run", "--help"], cwd=REPO,
                               capture_output=True, text=True, timeout=120)
        if probe.returncode != 0:
            last = (probe.stderr or probe.stdout).strip().splitlines()[-1:] or ["no output"]
            raise Unavailable(f"`txstream run` is not available yet ({last[0][:160]})")
        for flag in ("--until-caught-up", "--guarantee", "--app-id", "--master"):
            if flag not in probe.stdout:
                raise Unavailable(f"`txstream run` has no {flag} option yet")

    def command(self, job: Job) -> tuple[list[str], dict]:
        argv = [sys.executable, "-m", "benchmarks.contenders.txstream_run", "run", self.processor,
                "--bootstrap-servers", job.bootstrap, "--app-id", job.group,
                "--input", job.input_topic, "--output", job.output_topic,
                "--guarantee", self.guarantee, "--master", "local[2]"]
        if not self.copies:  # the pass-through decodes nothing, so nothing can be dead-lettered
            argv += ["--dead-letter-topic", f"{job.output_topic}-dlq"]
        if self.max_records_per_partition:
            argv += ["--max-records-per-partition", str(self.max_records_per_partition)]
        if job.mode == "throughput":
            argv.append("--until-caught-up")
        argv += list(self.extra_args)
        if self.secured:
            if "secured" not in job.extra:
                raise Unavailable("needs the harness's own local broker (its TLS + SCRAM listener)")
            # The last --bootstrap-servers given wins.
            argv += ["--bootstrap-servers", job.extra["secured"]["bootstrap"],
                     "--command-config", job.extra["secured"]["config"]]
        if self.registry:
            if "registry" not in job.extra:
                raise Unavailable("needs the harness's local schema registry")
            argv[argv.index("--input") + 1] = framed_copy(job.bootstrap, job.input_topic, job.extra["registry"])
            argv += ["--schema-registry", job.extra["registry"]]
        if self.baseline is not None:
            # Its driver (and so Spark's JVM and Python workers) start in the worktree, whose
            # txstream comes first on sys.path.
            boot = (f"import os, runpy, sys; os.chdir({str(self.baseline)!r}); sys.path.insert(0, {str(self.baseline)!r}); "
                    "runpy.run_module('benchmarks.contenders.txstream_run', run_name='__main__')")
            argv = [sys.executable, "-c", boot, *argv[3:]]
        return argv, self.base_env()

    def fatal_in_log(self, text: str) -> str | None:
        failed = re.findall(r"batch \d+ failed.*", text)
        if len(failed) < 2:
            return None
        errors = re.findall(r"^\S*(?:Error|Exception)\S*: .*$", text, re.MULTILINE)
        python_errors = [e for e in errors if not e.startswith(("org.apache", "java.", "scala."))]
        errors = python_errors or errors
        detail = errors[-1][:300] if errors else failed[-1][:300]
        return f"{len(failed)} failed batch attempts, e.g. {detail}"

    def extra_topics(self, job: Job) -> list[str]:
        return [] if self.copies else [f"{job.output_topic}-dlq"]

    def versions(self) -> dict:
        try:
            import txstream

            return {"txstream": txstream.__version__}
        except Exception:
            return {}
