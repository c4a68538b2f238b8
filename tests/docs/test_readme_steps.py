"""The README's "Try a processor" commands, run exactly as printed against a fresh broker.

Each line runs through a shell in the repository's root (the block redirects a sample file into
`produce`), with `txstream` on PATH, a private TXSTREAM_CACHE_DIR (the cluster registry) and
TXSTREAM_BOOTSTRAP_SERVERS naming a free port: `kafka up` and `kafka down` take their default port
from it, the other commands their bootstrap servers, so the printed lines need no `--port`.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from txstream.local.cluster import free_port_block, port_is_free

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def block_after(text: str, heading: str) -> list[str]:
    """The command lines of the first fenced block after the line that starts with `heading`."""
    start = next(i for i, line in enumerate(text.splitlines()) if line.strip().startswith(heading))
    lines = text.splitlines()[start:]
    opened = next(i for i, line in enumerate(lines) if line.startswith("```"))
    closed = next(i for i in range(opened + 1, len(lines)) if lines[i].startswith("```"))
    return [line for line in lines[opened + 1:closed] if line.strip() and not line.lstrip().startswith("#")]


def try_a_processor() -> list[str]:
    return block_after(README.read_text(), "## Try a processor")


def test_the_block_is_found_and_starts_and_stops_a_broker() -> None:
    commands = try_a_processor()
    assert commands[0] == "txstream kafka up" and commands[-1] == "txstream kafka down", commands
    assert all(c.startswith("txstream ") for c in commands), commands


@pytest.fixture
def user_env(tmp_path: Path) -> dict[str, str]:
    """A user's shell: txstream on PATH, a private cache (what was resolved already is linked in,
    the cluster registry and data are its own) and the bootstrap servers of a free port."""
    from txstream.local.paths import cache_dir

    cache = tmp_path / "cache"
    cache.mkdir()
    for entry in cache_dir().iterdir():
        if entry.name not in ("clusters", "data"):
            os.symlink(entry, cache / entry.name)
    port = free_port_block(1)
    env = dict(os.environ, TXSTREAM_CACHE_DIR=str(cache), TXSTREAM_BOOTSTRAP_SERVERS=f"localhost:{port}",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    yield env
    subprocess.run([sys.executable, "-m", "txstream.cli", "kafka", "down", "--all"], env=env,
                   capture_output=True, timeout=120)
    assert port_is_free(port), f"a broker still listens on {port}"


def test_every_step_passes_as_printed(user_env: dict[str, str]) -> None:
    outputs = {}
    for command in try_a_processor():
        done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=user_env, capture_output=True, text=True,
                              timeout=900)
        assert done.returncode == 0, f"`{command}` exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        assert "Traceback" not in done.stderr, f"`{command}`:\n{done.stderr}"
        outputs[command.split()[1]] = done
    sample = (ROOT / "samples" / "orders.jsonl").read_text().splitlines()
    assert f"produced {len(sample)} records to orders" in outputs["produce"].stderr
    assert re.search(r"app id txstream-enrich-orders\b", outputs["run"].stderr), outputs["run"].stderr
    shown = [json.loads(line) for line in outputs["consume"].stdout.splitlines()]
    assert len(shown) == 5 and all(r["value"]["amount_cents"] > 0 for r in shown), shown
    verdict = outputs["verify"].stdout.lower()
    assert "clean" in verdict and "not clean" not in verdict, outputs["verify"].stdout


def test_the_two_commands_start_with_a_demo_that_passes() -> None:
    """The README's first block, `make demo`, as printed: a broker, the enricher killed with -9 and
    restarted, and a read_committed reader that finds no duplicate and nothing missing. (`make
    test`, the block's other line, is what runs this test.)"""
    block = [line.split("#")[0].strip() for line in block_after(README.read_text(), "## The two commands")]
    assert block == ["make demo", "make test"], block
    done = subprocess.run(["bash", "-c", block[0]], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"`make demo` exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    assert re.search(r"duplicates 0, missing 0", done.stdout), done.stdout
    assert "txstream verify: clean" in done.stdout, done.stdout
