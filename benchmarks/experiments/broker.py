"""What every experiment needs around its measurement: a local broker of its own, warmed up and
removed at the end, partition counts from the command line, and both orders of two settings."""
from __future__ import annotations

import argparse
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from benchmarks.common import warm_up_broker
from txstream.local.cluster import LocalKafkaCluster, free_port_block


@dataclass
class Broker:
    cluster: LocalKafkaCluster
    bootstrap: str

    @property
    def pid(self) -> int:
        return self.cluster.alive_pids()[0]


@contextmanager
def local_broker(*, request_log: bool = False, overrides: dict[str, str] | None = None,
                 data_dir: str | None = None, warm_up_s: float = 10) -> Iterator[Broker]:
    """A single-node broker under a fresh data directory, its internal topics loaded and its JIT
    warmed (`warm_up_broker`) before the experiment measures anything; stopped and deleted after,
    since a request log alone is ~100 MB a run."""
    data = tempfile.mkdtemp(prefix="txstream-experiment-", dir=data_dir)
    cluster = LocalKafkaCluster(port=free_port_block(1), data_dir=data, die_with_parent=True,
                                request_log=request_log, overrides=overrides or {})
    try:
        bootstrap = cluster.start()
        warm_up_broker(bootstrap, load_s=warm_up_s)
        yield Broker(cluster, bootstrap)
    finally:
        cluster.stop()
        shutil.rmtree(data, ignore_errors=True)


def parser(doc: str | None) -> argparse.ArgumentParser:
    """The experiment's parser: its docstring's first line as description, `--partitions`."""
    ap = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    ap.add_argument("--partitions", type=partition_counts, default=[4, 256],
                    help="comma-separated input (and output) partition counts (default 4,256)")
    return ap


def partition_counts(text: str) -> list[int]:
    return [int(p) for p in text.split(",")]


def both_orders(first, second) -> tuple:
    """first, second, second, first: neither setting always runs on the warmer broker."""
    return first, second, second, first
