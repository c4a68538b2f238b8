"""txstream's commands run as a user runs them (a subprocess of `python -m txstream.cli`), and the
produce / consume / offsets / verify round a secured listener must pass."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def txstream(*args: str, stdin: str = "", timeout: float = 180, **env_vars: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env_vars}
    env.pop("TXSTREAM_BOOTSTRAP_SERVERS", None)
    return subprocess.run([sys.executable, "-m", "txstream.cli", *args], input=stdin, capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=ROOT)


def exercise(sasl: str, topic: str, output: str, client_args: list[str]) -> None:
    """produce, consume, offsets show and verify through a secured listener with `client_args`."""
    lines = "".join(json.dumps({"n": i}) + "\n" for i in range(5))
    proc = txstream("produce", topic, "--bootstrap-servers", sasl, *client_args, "--timeout", "30", stdin=lines)
    assert proc.returncode == 0, proc.stderr
    assert "produced 5 records" in proc.stderr
    proc = txstream("consume", topic, "--bootstrap-servers", sasl, *client_args, "--timeout", "30")
    assert proc.returncode == 0, proc.stderr
    assert '{"n": 0}' in [json.loads(line)["value"] for line in proc.stdout.splitlines()]
    proc = txstream("offsets", "show", "--app-id", "secured-app", "--topic", topic, "--bootstrap-servers", sasl,
                    *client_args, "--timeout", "20")
    assert proc.returncode == 0, proc.stderr
    assert "LAST-STABLE-OFFSET" in proc.stdout and topic in proc.stdout
    proc = txstream("verify", "--input", topic, "--output", output, "--bootstrap-servers", sasl, *client_args,
                    "--timeout", "20")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "CLEAN" in proc.stdout


