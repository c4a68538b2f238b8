"""What a run's batches cost when their shape varies from batch to batch, against a real local
broker: the driver builds a batch's Spark job once and runs it again for every batch of the same
shape (driver/loop.py), so whatever changes the shape makes the next batch build a job (~0.2 s of
driver time here). Two streams that used to do that every batch:

- `sizes`: records of lognormal size (median ~1 KB, up to 60 KB), 500 per partition per batch,
  `--until-caught-up`: the Arrow batch row count follows the largest record (spark/arrow_batches.py);
- `sparse`: 16 partitions fed at 100 records/s for 40 s: each batch has records in another set of
  partitions (driver/slots.py Slots.layout).

`txstream run` of `processors/passthrough.py`, exactly-once, local[2], this tree and, with
TXSTREAM_BENCH_BASELINE=<git worktree of another commit>, that one, in alternating rounds. A batch
that built its job is one whose driver time before the job was 0.1 s or more (planning alone
takes 0.00-0.03 s here).

Run from the repository root:

    python -m benchmarks.job_rebuilds [--scenario sizes|sparse|both] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from benchmarks import batchlog
from benchmarks.common import create_topics

REPO = Path(__file__).resolve().parent.parent


def _seed_sizes(bootstrap: str, topic: str, records: int = 40_000) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    rng = random.Random(5)
    for i in range(records):
        value = b"v" * min(60_000, int(rng.lognormvariate(6.9, 1.0)))
        while True:
            try:
                producer.produce(topic, value, str(i).encode())
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(60)


def _feed(bootstrap: str, topic: str, rate: float, seconds: float) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    rng = random.Random(1)
    started = time.monotonic()
    n = 0
    while time.monotonic() - started < seconds:
        producer.produce(topic, b"x" * 100, str(rng.random()).encode())
        producer.poll(0)
        n += 1
        time.sleep(max(0.0, started + n / rate - time.monotonic()))
    producer.flush(30)


def _run(tree: Path, bootstrap: str, source: str, partitions: int, extra: list[str],
         stop_after: float | None) -> tuple[str, float]:
    output = f"{source}-out-{uuid.uuid4().hex[:6]}"
    create_topics(bootstrap, [output], partitions)
    argv = [sys.executable, "-m", "txstream.cli", "run", "processors/passthrough.py:PassThrough",
            "--bootstrap-servers", bootstrap, "--app-id", f"rebuilds-{uuid.uuid4().hex[:8]}",
            "--input", source, "--output", output, "--master", "local[2]", *extra]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if stop_after is not None:
        threading.Timer(stop_after, lambda: proc.poll() is None and proc.send_signal(signal.SIGTERM)).start()
    out, _ = proc.communicate(timeout=600)
    if proc.returncode != 0 and (stop_after is None or "SIGTERM" not in out):
        raise RuntimeError(f"txstream run in {tree} exited {proc.returncode}:\n{out[-2000:]}")
    return out, time.monotonic() - started


def _figures(log: str, wall: float) -> dict:
    batches = batchlog.parse(log)["batches"]
    driver = [b.get("driver_s") or 0.0 for b in batches]
    return {"batches": len(batches), "built": sum(d >= 0.1 for d in driver), "driver_s": sum(driver),
            "batch_s": sum(b["seconds"] for b in batches),
            "mean_batch_s": statistics.mean(b["seconds"] for b in batches), "wall_s": wall}


def main() -> None:
    from txstream.local.cluster import LocalKafkaCluster, free_port_block

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", choices=("sizes", "sparse", "both"), default="both")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    trees = {"this tree": REPO}
    if os.environ.get("TXSTREAM_BENCH_BASELINE"):
        trees["baseline"] = Path(os.environ["TXSTREAM_BENCH_BASELINE"]).resolve()
    cluster = LocalKafkaCluster(port=free_port_block(1), data_dir=tempfile.mkdtemp(prefix="txstream-rebuilds-"),
                                die_with_parent=True)
    bootstrap = cluster.start()
    try:
        scenarios = ["sizes", "sparse"] if args.scenario == "both" else [args.scenario]
        for scenario in scenarios:
            rows: dict[str, list[dict]] = {name: [] for name in trees}
            source = f"rebuilds-{scenario}-{uuid.uuid4().hex[:6]}"
            if scenario == "sizes":
                create_topics(bootstrap, [source], 4)
                _seed_sizes(bootstrap, source)
            for round_no in range(args.rounds):
                for name in (list(trees) if round_no % 2 == 0 else list(trees)[::-1]):
                    if scenario == "sizes":
                        log, wall = _run(trees[name], bootstrap, source, 4,
                                         ["--max-records-per-partition", "500", "--until-caught-up"], None)
                    else:
                        topic = f"{source}-{round_no}-{name.replace(' ', '-')}"
                        create_topics(bootstrap, [topic], 16)
                        feeder = threading.Thread(target=_feed, args=(bootstrap, topic, 100, 40))
                        feeder.start()
                        log, wall = _run(trees[name], bootstrap, topic, 16, [], 45)
                        feeder.join()
                    rows[name].append(_figures(log, wall))
            what = ("lognormal record sizes, 40,000 records, 500 per partition per batch" if scenario == "sizes"
                    else "16 partitions at 100 records/s for 40 s")
            print(f"\n{scenario}: {what}; {args.rounds} rounds, median (range)\n")
            print("| tree | batches | batches that built their job | driver s before the jobs | batch s summed "
                  "| mean batch s | wall s |")
            print("|---|---|---|---|---|---|---|")
            for name, runs in rows.items():
                def cell(key: str, fmt: str, runs: list[dict] = runs) -> str:
                    values = sorted(r[key] for r in runs)
                    return f"{statistics.median(values):{fmt}} ({values[0]:{fmt}}-{values[-1]:{fmt}})"
                print(f"| {name} | {cell('batches', '.0f')} | {cell('built', '.0f')} | {cell('driver_s', '.2f')} "
                      f"| {cell('batch_s', '.2f')} | {cell('mean_batch_s', '.3f')} | {cell('wall_s', '.1f')} |")
    finally:
        cluster.destroy()


if __name__ == "__main__":
    main()
