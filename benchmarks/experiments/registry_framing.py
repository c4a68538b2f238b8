"""Registry-framed Avro against the file-schema run: the order enricher, exactly-once, over the same
orders written plainly (value_schema from schemas/order.avsc) and framed by a schema registry
(`--schema-registry`: each value's writer schema fetched by id, the output registered and framed).

    python -m benchmarks.experiments.registry_framing --bootstrap-servers B --schema-registry URL \
        [--records 400000] [--partitions 4] [--rounds 2]

Per run: records/s over the batches after the first (the first batch is capped and builds the
Spark job), from the run's JSON batch events: sum(records_in) / sum(seconds). The two kinds run
alternately, `--rounds` times each. Goal (issue 53): the registry run at >= 0.95x the file run.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import uuid
from pathlib import Path

import fastavro
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

REPO = Path(__file__).resolve().parents[2]
PROCESSOR = "processors/enrich_orders.py:EnrichOrders"


def seed(bootstrap: str, registry: str, records: int, partitions: int) -> tuple[str, str]:
    """The same orders into two topics: plain Avro, and framed with the id registered for them."""
    sys.path.insert(0, str(REPO))
    from processors.sample_orders import orders
    from txstream.serde.avro import load_schema
    from txstream.serde.registry import RegistryConfig, register_output

    schema = load_schema(str(REPO / "schemas/order.avsc"))
    stamp = uuid.uuid4().hex[:8]
    plain_topic, framed_topic = f"regbench-plain-{stamp}", f"regbench-framed-{stamp}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(t, partitions, 1) for t in (plain_topic, framed_topic)]).values():
        future.result(30)
    schema_id, _ = register_output(RegistryConfig(registry), f"{framed_topic}-value", schema)
    prefix = b"\x00" + schema_id.to_bytes(4, "big")

    def plain(order: dict) -> bytes:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, schema, order)
        return buf.getvalue()

    def framed(order: dict) -> bytes:
        return prefix + plain(order)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "queue.buffering.max.messages": 1_000_000})
    for i, order in enumerate(orders(records)):
        key = order["customer_id"].encode()
        for topic, encode in ((plain_topic, plain), (framed_topic, framed)):
            while True:
                try:
                    producer.produce(topic, encode(order), key, partition=i % partitions)
                    break
                except BufferError:
                    producer.poll(0.1)
    assert producer.flush(300) == 0
    return plain_topic, framed_topic


def run(bootstrap: str, topic: str, registry: str | None, partitions: int) -> float:
    """One exactly-once run to the end of `topic`; records/s of its batches after the first."""
    output = f"{topic}-out-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    names = [output, f"{output}-dlq"]
    for future in admin.create_topics([NewTopic(t, partitions, 1) for t in names]).values():
        future.result(30)
    argv = [sys.executable, "-m", "txstream.cli", "run", PROCESSOR, "-b", bootstrap, "--input", topic,
            "--output", output, "--dead-letter-topic", f"{output}-dlq", "--app-id", f"regbench-{uuid.uuid4().hex[:8]}",
            "--master", "local[2]", "--until-caught-up", "--log-format", "json"]
    if registry:
        argv += ["--schema-registry", registry]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, env=dict(os.environ), timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"run failed ({done.returncode}): {done.stderr[-2000:]}")
    batches = [e for e in (json.loads(line) for line in done.stdout.splitlines() if line.startswith("{"))
               if e.get("event") == "batch"]
    later = batches[1:] or batches
    return sum(b["records_in"] for b in later) / sum(b["seconds"] for b in later)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap-servers", default=os.environ.get("TXSTREAM_BOOTSTRAP_SERVERS", "localhost:9092"))
    ap.add_argument("--schema-registry", default=os.environ.get("TXSTREAM_SCHEMA_REGISTRY_URL"), required=False)
    ap.add_argument("--records", type=int, default=400_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    if not args.schema_registry:
        ap.error("--schema-registry URL (or TXSTREAM_SCHEMA_REGISTRY_URL) is required")
    plain_topic, framed_topic = seed(args.bootstrap_servers, args.schema_registry, args.records, args.partitions)
    rates: dict[str, list[float]] = {"file schema": [], "registry-framed": []}
    for _ in range(args.rounds):
        rates["file schema"].append(run(args.bootstrap_servers, plain_topic, None, args.partitions))
        rates["registry-framed"].append(run(args.bootstrap_servers, framed_topic, args.schema_registry,
                                            args.partitions))
    for name, values in rates.items():
        print(f"txstream exactly-once, {name}: median {statistics.median(values):,.0f} records/s "
              f"({', '.join(f'{v:,.0f}' for v in values)})")
    ratio = statistics.median(rates["registry-framed"]) / statistics.median(rates["file schema"])
    print(f"registry-framed / file schema: {ratio:.3f} (goal >= 0.95)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
