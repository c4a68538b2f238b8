"""The one cache directory: Kafka's jars, local cluster registrations and data, Spark's home and
class archive, the benchmark's connector jars."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """TXSTREAM_CACHE_DIR if set, else $XDG_CACHE_HOME/txstream, else ~/.cache/txstream."""
    base = os.environ.get("TXSTREAM_CACHE_DIR")
    if base:
        return Path(base)
    return Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")) / "txstream"
