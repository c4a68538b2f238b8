"""First output of `txstream run` against brokers that differ only in
`group.initial.rebalance.delay.ms`: 0 (txstream's local broker, the other benchmarks') and Kafka's
default, 3000, which production brokers keep (a group's first member waits that long for others
before its assignment, on every start of an app whose group is empty). The driver joins an empty
group while Spark starts (driver/loop.py `_group_is_empty`), so the delay should cost nothing;
`--baseline PATH` (a git worktree of another commit) runs that commit's txstream beside this one's.

Each run: 20,000 of the enricher's Avro orders in 4 partitions (one input per broker), exactly-once,
`local[2]`, `--until-caught-up`; first output = launch to the first record a read_committed
consumer of the output sees. Settings alternate within each round; medians.

    python -m benchmarks.first_output [--rounds 3] [--baseline /path/to/worktree]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks.common import REPO, create_topics, seed_input, warm_up_broker
from benchmarks.measure import OutputWatcher

PROCESSOR = "processors/enrich_orders.py:EnrichOrders"


def first_output(bootstrap: str, source: str, tree: Path, timeout: float = 300) -> float:
    """Seconds from launching `txstream run` in `tree` to its first committed output record."""
    tag = uuid.uuid4().hex[:8]
    out = f"fo-out-{tag}"
    create_topics(bootstrap, [out, f"{out}-dlq"], 4)
    argv = [sys.executable, "-m", "txstream.cli", "run", PROCESSOR, "--bootstrap-servers", bootstrap,
            "--app-id", f"fo-{tag}", "--input", source, "--output", out, "--dead-letter-topic", f"{out}-dlq",
            "--guarantee", "exactly-once", "--master", "local[2]", "--until-caught-up"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    watcher = OutputWatcher(bootstrap, out, 4, expected=0, on_record=lambda _msg, _at: None).start()
    try:
        started = time.monotonic()
        proc = subprocess.run(argv, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"txstream run exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
        deadline = time.monotonic() + 30   # the output is committed: the watcher sees it within its next poll
        while watcher.first_at is None and watcher.error is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if watcher.first_at is None:
            raise RuntimeError(f"no output seen ({watcher.error or 'within 30 s of the exit'})")
        return watcher.first_at - started
    finally:
        watcher.stop()


def main() -> None:
    from txstream.local.cluster import LocalKafkaCluster, free_port_block

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--delays", default="0,3000", help="the brokers' group.initial.rebalance.delay.ms values")
    ap.add_argument("--baseline", type=Path, default=None, help="a git worktree of another commit, run beside this one")
    args = ap.parse_args()
    delays = [int(d) for d in args.delays.split(",")]
    trees = {"this": REPO, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    clusters, inputs = {}, {}
    try:
        for delay in delays:
            cluster = LocalKafkaCluster(port=free_port_block(1), data_dir=tempfile.mkdtemp(prefix="txstream-first-output-"),
                                        die_with_parent=True,
                                        overrides={"group.initial.rebalance.delay.ms": str(delay)})
            clusters[delay] = cluster
            bootstrap = cluster.start()
            warm_up_broker(bootstrap)
            inputs[delay] = f"fo-in-{uuid.uuid4().hex[:8]}"
            create_topics(bootstrap, [inputs[delay]], 4)
            seed_input(bootstrap, inputs[delay], args.records)
        figures: dict[tuple[str, int], list[float]] = {}
        for round_no in range(args.rounds):
            settings = [(tree, delay) for tree in trees for delay in delays]
            for tree, delay in settings if round_no % 2 == 0 else reversed(settings):
                took = first_output(clusters[delay].bootstrap_servers, inputs[delay], trees[tree])
                figures.setdefault((tree, delay), []).append(took)
                print(f"round {round_no + 1}: {tree} txstream, delay {delay} ms: first output {took:.2f} s", flush=True)
        print("\nfirst output s, median (runs) by group.initial.rebalance.delay.ms:")
        for tree in trees:
            medians = {delay: statistics.median(figures[(tree, delay)]) for delay in delays}
            print(f"  {tree:8s} " + "  ".join(f"{d} ms: {m:.2f} ({', '.join(f'{x:.1f}' for x in figures[(tree, d)])})"
                                            for d, m in medians.items())
                  + (f"  ratio {delays[-1]}/{delays[0]}: {medians[delays[-1]] / medians[delays[0]]:.2f}" if len(delays) > 1 else ""))
    finally:
        for cluster in clusters.values():
            cluster.stop()


if __name__ == "__main__":
    main()
