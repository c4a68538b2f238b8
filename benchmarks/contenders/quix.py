"""Contender 6: Quix Streams with processing_guarantee="exactly-once".

quixstreams pins confluent-kafka below the version txstream needs (pip's resolver would
downgrade it), so it lives in its own virtual environment, benchmarks/.venv-quix, created on
first use; the worker (quix_worker.py, standard library + quixstreams + fastavro only) runs
under that interpreter as a subprocess.
"""
from __future__ import annotations

import subprocess
import sys

from benchmarks.common import BENCH_DIR
from benchmarks.contenders import Contender, Job, Unavailable

VENV = BENCH_DIR / ".venv-quix"
PY = VENV / "bin" / "python"
REQUIREMENTS = ["quixstreams", "fastavro>=1.9"]


def ensure_venv(progress) -> None:
    marker = VENV / ".installed"
    if marker.exists() and PY.exists():
        return
    progress(f"  creating {VENV} for quixstreams (its confluent-kafka pin conflicts with txstream's) ...")
    steps = [[sys.executable, "-m", "venv", str(VENV)],
             [str(PY), "-m", "pip", "install", "--quiet", "--upgrade", "pip"],
             [str(PY), "-m", "pip", "install", "--quiet", *REQUIREMENTS]]
    for step in steps:
        res = subprocess.run(step, capture_output=True, text=True, timeout=900)
        if res.returncode != 0:
            raise Unavailable(f"could not install quixstreams into {VENV}: "
                              + (res.stderr or res.stdout).strip()[-200:])
    marker.touch()


class QuixStreams(Contender):
    name = "quix"
    label = "Quix Streams exactly-once"

    def __init__(self) -> None:
        self._versions: dict = {}

    def prepare(self, progress) -> None:
        ensure_venv(progress)
        res = subprocess.run([str(PY), "-c", "import quixstreams, confluent_kafka; "
                              "print(quixstreams.__version__, confluent_kafka.version())"],
                             capture_output=True, text=True, timeout=120)
        if res.returncode != 0:
            raise Unavailable("quixstreams does not import: " + res.stderr.strip()[-200:])
        quix, ck = res.stdout.split()
        self._versions = {"quixstreams": quix, "quix_confluent_kafka": ck}

    def command(self, job: Job) -> tuple[list[str], dict]:
        from benchmarks.common import ENRICHED_SCHEMA_PATH, ORDER_SCHEMA_PATH

        env = self.base_env()
        env.pop("PYTHONPATH", None)
        return ([str(PY), str(BENCH_DIR / "contenders" / "quix_worker.py"),
                 "--bootstrap-servers", job.bootstrap, "--input", job.input_topic,
                 "--output", job.output_topic, "--group", job.group, "--state-dir", job.workdir,
                 "--mode", job.mode,
                 "--input-schema", str(ORDER_SCHEMA_PATH), "--output-schema", str(ENRICHED_SCHEMA_PATH)],
                env)

    def versions(self) -> dict:
        return self._versions
