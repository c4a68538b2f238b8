"""What `--metrics-port` costs per batch (issue 16): `txstream run` of the order enricher with and
without the endpoint, alternating, small batches (so there are many), on a local broker.

Both variants log JSON (`--log-format json`); a batch's cycle is the time from one batch line to
the next (the metrics update included, the first batch left out). Run from the repository root:

    python -m benchmarks.metrics_cost [--records 60000] [--rounds 3] [--cap 1500]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    from processors.sample_orders import orders
    from tests.support.kafka import avro_bytes
    from txstream.local.cluster import LocalKafkaCluster, free_port_block
    from txstream.serde.avro import load_schema

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=60_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cap", type=int, default=1500, help="--max-records-per-partition")
    args = ap.parse_args()
    schema = load_schema(str(REPO / "schemas/order.avsc"))
    cluster = LocalKafkaCluster(port=free_port_block(1), data_dir=tempfile.mkdtemp(prefix="txstream-metrics-cost-"),
                                die_with_parent=True)
    bootstrap = cluster.start()
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        source = "metrics-cost-orders"
        admin.create_topics([NewTopic(source, 4, 1)])[source].result(30)
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
        for i, order in enumerate(orders(args.records, seed=3)):
            producer.produce(source, avro_bytes(schema, order), order["id"].encode(), partition=i % 4)
            if i % 10_000 == 0:
                producer.flush()
        producer.flush()
        cycles: dict[str, list[float]] = {"without": [], "with": []}
        for round_no in range(args.rounds):
            for variant in ("without", "with"):
                output = f"metrics-cost-{uuid.uuid4().hex[:6]}"
                for future in admin.create_topics([NewTopic(output, 4, 1), NewTopic(output + "-dlq", 1, 1)]).values():
                    future.result(30)
                argv = [sys.executable, "-m", "txstream.cli", "run", "processors/enrich_orders.py:EnrichOrders",
                        "--bootstrap-servers", bootstrap, "--app-id", output, "--input", source, "--output", output,
                        "--dead-letter-topic", output + "-dlq", "--until-caught-up", "--master", "local[2]",
                        "--max-records-per-partition", str(args.cap), "--log-format", "json"]
                argv += ["--metrics-port", "0"] if variant == "with" else []
                proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=900,
                                      env={**os.environ, "PYTHONPATH": str(REPO)})
                times = [json.loads(line)["time"] for line in proc.stderr.splitlines()
                         if line.startswith("{") and '"event": "batch"' in line]
                if proc.returncode != 0 or len(times) < 3:
                    sys.exit(f"run failed:\n{proc.stderr[-3000:]}")
                steady = [b - a for a, b in zip(times[1:], times[2:], strict=False)]
                cycles[variant].append(statistics.median(steady))
                print(f"round {round_no + 1} {variant} the endpoint: {len(times)} batches, median cycle "
                      f"{statistics.median(steady):.3f}s", flush=True)
        for variant, values in cycles.items():
            print(f"{variant} the endpoint: median of the rounds' medians {statistics.median(values):.3f}s per batch "
                  f"({', '.join(f'{v:.3f}' for v in values)})")
    finally:
        cluster.destroy()


if __name__ == "__main__":
    main()
