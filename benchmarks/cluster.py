"""What the cluster path costs: txstream exactly-once on `local[2]` vs a Spark standalone cluster
with one worker of 2 cores vs two workers of 1 core each on separate simulated hosts.

    python -m benchmarks.cluster --records 200000 --runs 2
    python -m benchmarks.cluster --master local[2] --master standalone-2x1

Same input (the enricher's Avro orders, 4 partitions) for every setting, rounds interleaved so the
machine's drift spreads over all of them. The broker listens on the hosts' bridge and the workers
run in network namespaces (tests/support/hosts.py; root only). On one 2-core machine two workers
cannot be faster than local[2]: the point is the price of the cluster path — executors in JVMs of
their own, Python workers forked by pyspark's stock daemon instead of txstream's pre-importing one,
the processor's code shipped, the preflight, task results and shuffles over the network.
Results: benchmarks/results/<timestamp>-cluster.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks.common import REPO, create_topics, seed_input, warm_up_broker

SETTINGS = {
    "local[2]": None,                 # (workers, cores per worker)
    "standalone-1x2": (1, 2),
    "standalone-2x1": (2, 1),
}
PROCESSOR = "processors/enrich_orders.py:EnrichOrders"


def _count(bootstrap: str, topic: str, timeout: float = 120.0) -> int:
    from tests.support.kafka import read_all

    return len(read_all(bootstrap, topic, timeout=timeout))


def _batch_figures(log: str) -> tuple[int, float]:
    """(batches, seconds inside batches) from the run's batch lines."""
    seconds = [float(m) for m in re.findall(r"^batch \d+ .*?  ([\d.]+)s  \(read", log, re.M)]
    return len(seconds), sum(seconds)


def run_one(setting: str, clusters: dict, bootstrap: str, source: str, records: int, expected: int,
            log_dir: Path, partitions: int) -> dict:
    out = f"bench-cl-out-{uuid.uuid4().hex[:8]}"
    dlq = out + "-dlq"
    create_topics(bootstrap, [out, dlq], partitions)
    argv = [sys.executable, "-m", "txstream.cli", "run", PROCESSOR, "--bootstrap-servers", bootstrap, "--app-id",
            f"bench-cl-{uuid.uuid4().hex[:8]}", "--input", source, "--output", out, "--dead-letter-topic", dlq,
            "--until-caught-up"]
    if setting == "local[2]":
        argv += ["--master", "local[2]"]
    else:
        conf = {**clusters[setting].driver_conf(cores_max=2), "spark.pyspark.python": sys.executable}
        argv += ["--master", conf.pop("spark.master")]
        argv += [a for k, v in conf.items() for a in ("--conf", f"{k}={v}")]
    log_path = log_dir / f"{setting}-{out}.log"
    started = time.monotonic()
    with open(log_path, "w") as log:
        code = subprocess.run(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, timeout=1800).returncode
    wall = time.monotonic() - started
    text = log_path.read_text()
    if code != 0:
        raise RuntimeError(f"{setting}: txstream run exited {code}; see {log_path}\n{text[-2000:]}")
    produced = _count(bootstrap, out)
    batches, in_batches = _batch_figures(text)
    return {"setting": setting, "seconds": round(wall, 2), "records_per_s": round(records / wall),
            "batches": batches, "in_batch_seconds": round(in_batches, 2),
            "in_batch_records_per_s": round(records / in_batches) if in_batches else None,
            "output": produced, "expected": expected, "exact_count": produced == expected, "log": str(log_path)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--runs", type=int, default=2, help="rounds; every setting runs once per round")
    parser.add_argument("--master", action="append", choices=sorted(SETTINGS),
                        help="setting(s) to compare (repeatable) [default: all three]")
    args = parser.parse_args(argv)
    settings = args.master or list(SETTINGS)
    sys.path.insert(0, str(REPO))
    from tests.support.hosts import SimulatedHosts
    from tests.support.spark_standalone import SparkStandalone
    from txstream.local.cluster import LocalKafkaCluster, free_port_block

    work = Path(tempfile.mkdtemp(prefix="txstream-bench-cluster-"))
    print(f"logs: {work}", flush=True)
    results: list[dict] = []
    with SimulatedHosts() as hosts:
        kafka = LocalKafkaCluster(port=free_port_block(1), data_dir=str(work / "kafka"), listen=hosts.gateway,
                                  die_with_parent=True)
        clusters: dict[str, SparkStandalone] = {}
        try:
            bootstrap = kafka.start(timeout=180)
            warm_up_broker(bootstrap)
            for setting in settings:
                if SETTINGS[setting]:
                    workers, cores = SETTINGS[setting]
                    clusters[setting] = SparkStandalone(hosts, work / "spark", workers=workers, cores_per_worker=cores,
                                                        worker_memory="2g", name=f"s{workers}x{cores}w")
            source = f"bench-cl-in-{uuid.uuid4().hex[:8]}"
            create_topics(bootstrap, [source], args.partitions)
            seeded = seed_input(bootstrap, source, args.records, progress=lambda m: print(m, flush=True))
            for round_no in range(1, args.runs + 1):
                for setting in settings:
                    result = run_one(setting, clusters, bootstrap, source, args.records, seeded.expected_count,
                                     work, args.partitions)
                    result["round"] = round_no
                    results.append(result)
                    print(json.dumps(result), flush=True)
        finally:
            for cluster in clusters.values():
                cluster.stop()
            kafka.stop()
    report = _report(results, settings, args)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = REPO / "benchmarks" / "results" / f"{stamp}-cluster"
    out.with_suffix(".json").write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    out.with_suffix(".md").write_text(report)
    print(report)
    print(f"written: {out}.json, {out}.md")
    return 0 if all(r["exact_count"] for r in results) else 1


def _report(results: list[dict], settings: list[str], args) -> str:
    def median(values: list[float]) -> float:
        values = sorted(values)
        return values[len(values) // 2] if len(values) % 2 else (values[len(values) // 2 - 1] + values[len(values) // 2]) / 2

    rows = {s: [r for r in results if r["setting"] == s] for s in settings}
    base = median([r["records_per_s"] for r in rows.get("local[2]", [])]) if rows.get("local[2]") else None
    lines = [f"# txstream exactly-once on a cluster: {args.records:,} orders, {args.partitions} partitions, "
             f"{args.runs} round(s)", "",
             "| setting | records/s (median) | runs | in-batch records/s | batches | vs local[2] | output exact |",
             "|---|---|---|---|---|---|---|"]
    for setting, runs in rows.items():
        rate = median([r["records_per_s"] for r in runs])
        in_batch = median([r["in_batch_records_per_s"] or 0 for r in runs])
        ratio = f"{rate / base:.2f}x" if base else "-"
        each = ", ".join(f"{r['records_per_s']:,}" for r in runs)
        exact = all(r["exact_count"] for r in runs)
        lines.append(f"| {setting} | {rate:,.0f} | {each} | {in_batch:,.0f} | {runs[0]['batches']} | {ratio} | {exact} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
