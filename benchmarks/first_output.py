"""First output of `txstream run` against brokers that differ only in
`group.initial.rebalance.delay.ms`: 0 (txstream's local broker, the other benchmarks') and Kafka's
default, 3000, which production brokers keep (a group's first member waits that long for others
before its assignment, on every start of an app whose group is empty). The driver joins an empty
group while Spark starts, so the delay should cost nothing;
`--baseline PATH` (a git worktree of another commit) runs that commit's txstream beside this one's.

Each run: 20,000 of the enricher's Avro orders in 4 partitions (one input per broker), exactly-once,
`local[2]`, `--until-caught-up`; first output = launch to the first record a read_committed
consumer of the output sees. Settings alternate within each round; medians. The figures go to
`<stamp>-first-output.json` and `.md` under `--results-dir` (benchmarks/results/, whose newest
such file docs/performance.md's generated section shows).

    python -m benchmarks.first_output [--rounds 3] [--baseline /path/to/worktree] [--results-dir DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone
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
    ap.add_argument("--results-dir", type=Path, default=REPO / "benchmarks" / "results",
                    help="where the results files go (default benchmarks/results)")
    ap.add_argument("--no-figures", action="store_true", help="leave docs/performance.md's figures alone")
    ap.add_argument("--quick", action="store_true", help="smoke run: one round (files named -quick)")
    args = ap.parse_args()
    if args.quick:
        args.rounds = 1
    from benchmarks.harness import git_state, hardware

    results: dict = {"mode": "first-output", "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                     "settings": {"records": args.records, "rounds": args.rounds, "partitions": 4,
                                  "processor": PROCESSOR, "guarantee": "exactly-once", "master": "local[2]",
                                  "quick": args.quick},
                     "hardware": hardware(), "git_at_start": git_state(),
                     "baseline": str(args.baseline) if args.baseline else None}
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
        lines = ["first output s, median (runs) by group.initial.rebalance.delay.ms:"]
        for tree in trees:
            medians = {delay: statistics.median(figures[(tree, delay)]) for delay in delays}
            lines.append(f"  {tree:8s} " + "  ".join(f"{d} ms: {m:.2f} ({', '.join(f'{x:.1f}' for x in figures[(tree, d)])})"
                                                     for d, m in medians.items())
                         + (f"  ratio {delays[-1]}/{delays[0]}: {medians[delays[-1]] / medians[delays[0]]:.2f}"
                            if len(delays) > 1 else ""))
        print("\n" + "\n".join(lines))
        results["hardware"]["loadavg_at_end"] = os.getloadavg()
        results["first_output_s"] = {tree: {str(d): figures[(tree, d)] for d in delays} for tree in trees}
        results["median_s"] = {tree: {str(d): statistics.median(figures[(tree, d)]) for d in delays} for tree in trees}
        write_results(args.results_dir, results, lines, figures=not args.no_figures)
    finally:
        for cluster in clusters.values():
            cluster.stop()


def write_results(directory: Path, results: dict, lines: list[str], figures: bool) -> None:
    """`<stamp>-first-output.json` and `.md`, then docs/performance.md's figures (benchmarks/figures.py)."""
    from benchmarks import figures as figures_section

    directory.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    path = directory / f"{stamp}-first-output{'-quick' if results['settings']['quick'] else ''}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    s = results["settings"]
    path.with_suffix(".md").write_text("\n".join([
        f"# txstream benchmark — first output ({results['started_at']})", "",
        f"`txstream run` {s['processor']}, {s['guarantee']}, `--master {s['master']}`, {s['records']:,} orders in "
        f"{s['partitions']} partitions, {s['rounds']} round(s); seconds from launch to the first output record a "
        f"read_committed consumer sees; txstream at {results.get('git_at_start', '?')}.", "", "```", *lines, "```", ""]))
    print(f"wrote {path} and {path.with_suffix('.md').name}")
    figures_section.update_after_run(directory, not figures, print)


if __name__ == "__main__":
    main()
