"""`make demo`: exactly-once through a crash, on a local Apache Kafka broker.

Starts a broker, seeds Avro orders, runs the order enricher with `txstream run`, kills it with
SIGKILL mid-run, restarts it until it has caught up, and shows what a read_committed reader
sees: every expected output once, nothing missing. Then a stateful processor over the same
orders (orders per currency per minute of event time, Structured Streaming's windowed code):
each window the watermark closed emitted once, with exact counts. Then stops the broker.
"""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import fastavro
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from processors.sample_orders import enriched, orders  # noqa: E402
from txstream.local.cluster import BrokerError, LocalKafkaCluster, free_port_block  # noqa: E402
from txstream.serde.avro import AvroCodec, load_schema  # noqa: E402
from txstream.tools.broker_check import transaction_round_trip  # noqa: E402
from txstream.tools.topic_io import produce_waiting, read_records  # noqa: E402
from txstream.tools.verify import audit  # noqa: E402

RECORDS = int(os.environ.get("DEMO_RECORDS", "60000"))
PARTITIONS = 4
INPUT, OUTPUT, DEAD = "orders", "orders-enriched", "orders-dead-letters"
WINDOWS = "orders-per-currency"
APP_ID = "demo-enrich-orders"


def say(message: str) -> None:
    print(message, flush=True)


def seed(bootstrap: str) -> list[dict]:
    schema = load_schema(str(ROOT / "schemas/order.avsc"))
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "partitioner": "murmur2_random"})
    data = list(orders(RECORDS))
    buf = io.BytesIO()
    for order in data:
        buf.seek(0)
        buf.truncate()
        fastavro.schemaless_writer(buf, schema, order)
        produce_waiting(producer, INPUT, buf.getvalue(), order["customer_id"].encode())
    producer.flush(60)
    return data


def committed_total(bootstrap: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": APP_ID, "isolation.level": "read_committed"})
    try:
        offsets = consumer.committed([TopicPartition(INPUT, p) for p in range(PARTITIONS)], 30)
        return sum(max(tp.offset, 0) for tp in offsets)
    finally:
        consumer.close()


def start_processor(bootstrap: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "txstream.cli", "run", "processors.enrich_orders:EnrichOrders",
         "--bootstrap-servers", bootstrap, "--app-id", APP_ID, "--until-caught-up",
         "--max-records-per-partition", "4000", "--master", "local[2]"],
        cwd=ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)


def show_batches(log: Path) -> None:
    """One run's batch lines, under that run's heading (each run has its own log)."""
    for line in log.read_text().splitlines():
        if line.startswith(("batch ", "caught up")):
            say("   | " + line)


def windows(bootstrap: str, data: list[dict], log: Path) -> bool:
    """Step 5: the windowed processor over the same orders; each closed window once, exact."""
    say("\n5. State across batches: txstream run processors.orders_per_currency:OrdersPerCurrency --until-caught-up")
    say("   (withWatermark('created_at', '30 seconds').groupBy(window('created_at', '1 minute'), 'currency'), "
        "output_mode append)")
    run = subprocess.run(
        [sys.executable, "-m", "txstream.cli", "run", "processors.orders_per_currency:OrdersPerCurrency",
         "--bootstrap-servers", bootstrap, "--app-id", "demo-orders-per-currency", "--until-caught-up",
         "--max-records-per-partition", "10000", "--master", "local[2]"],
        cwd=ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT, timeout=600)
    if run.returncode != 0:
        say(log.read_text()[-3000:])
        return False
    show_batches(log)
    codec = AvroCodec(load_schema(str(ROOT / "schemas/currency_window.avsc")))
    got = Counter()
    counts = {}
    for record in read_records(bootstrap, WINDOWS, codec.schema):
        v = record["value"]
        start = datetime.fromisoformat(str(v["start"]).replace("Z", "+00:00"))
        got[(start, v["currency"])] += 1
        counts[(start, v["currency"])] = v["orders"]
    # Orders behind the watermark (a partition read ahead of another) are dead-lettered, not counted.
    late = Counter()
    for record in read_records(bootstrap, DEAD):
        if dict(record.get("headers") or {}).get("txstream.dlq.stage") == "late":
            row = record["value"] if isinstance(record["value"], dict) else json.loads(record["value"])
            at = datetime.fromisoformat(row["created_at"].replace("Z", "+00:00"))
            late[(at.replace(second=0, microsecond=0), row["currency"])] += 1
    watermark = max(o["created_at"] for o in data).timestamp() - 30
    want = Counter((o["created_at"].replace(second=0, microsecond=0), o["currency"]) for o in data
                   if o["created_at"].replace(second=0, microsecond=0).timestamp() + 60 <= watermark)
    want.subtract(late)
    exact = counts == {k: n for k, n in want.items() if n}
    say(f"   {len(got)} windows emitted (each once: {max(got.values(), default=0) <= 1}), every window the "
        f"watermark closed with its exact count: {exact} ({sum(late.values())} late orders in '{DEAD}', "
        "stage late)")
    return exact and max(got.values(), default=0) <= 1


def main() -> int:
    port = int(os.environ.get("DEMO_PORT") or free_port_block(1))
    data_dir = tempfile.mkdtemp(prefix="txstream-demo-")
    cluster = LocalKafkaCluster(port=port, data_dir=data_dir, die_with_parent=True)
    try:
        bootstrap = cluster.start(progress=say)
    except BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    first_log, second_log = Path(data_dir) / "processor-killed.log", Path(data_dir) / "processor-restarted.log"
    processor: subprocess.Popen | None = None
    try:
        say("\n1. The broker honours transactions:")
        say(transaction_round_trip(bootstrap).report())

        admin = AdminClient({"bootstrap.servers": bootstrap})
        for topic, parts in ((INPUT, PARTITIONS), (OUTPUT, PARTITIONS), (DEAD, 1), (WINDOWS, 2)):
            admin.create_topics([NewTopic(topic, parts)])[topic].result(30)
        del admin  # no client may outlive the broker (it would log connection failures)
        data = seed(bootstrap)
        say(f"\n2. Seeded {len(data)} Avro orders into '{INPUT}' ({PARTITIONS} partitions).")

        say("\n3. txstream run processors.enrich_orders:EnrichOrders --until-caught-up ...")
        processor = start_processor(bootstrap, first_log)
        deadline = time.monotonic() + 300
        while committed_total(bootstrap) < len(data) // 4:
            if processor.poll() is not None or time.monotonic() > deadline:
                say(first_log.read_text()[-3000:])
                return 1
            time.sleep(0.2)
        done = committed_total(bootstrap)
        os.killpg(processor.pid, signal.SIGKILL)
        processor.wait()
        say("   the first run printed:")
        show_batches(first_log)
        say(f"   kill -9 of the processor (driver, JVM, Python workers) with {done} of {len(data)} "
            "input records committed; some of its output may be in open transactions.")
        say("   restarting it ... the restarted run printed:")
        processor = start_processor(bootstrap, second_log)
        if processor.wait(timeout=600) != 0:
            say(second_log.read_text()[-3000:])
            return 1
        show_batches(second_log)

        say(f"\n4. What a read_committed consumer of '{OUTPUT}' sees:")
        codec = AvroCodec(load_schema(str(ROOT / "schemas/order_enriched.avsc")))
        seen = Counter(r["value"]["id"] for r in read_records(bootstrap, OUTPUT, codec.schema))
        expected = {o["id"] for o in data if enriched(o) is not None}
        duplicates = sum(n - 1 for n in seen.values() if n > 1)
        missing = len(expected - set(seen))
        report = audit(bootstrap, [INPUT], [OUTPUT], dead_letter=DEAD, app_id=APP_ID)
        say(f"   records in {len(data)}, out {sum(seen.values())} (expected {len(expected)}: void orders are "
            f"filtered), dead-lettered {report.totals['dead_lettered']}, duplicates {duplicates}, missing {missing}")
        say(f"   txstream verify: {'clean' if report.clean else 'PROBLEMS'} "
            f"(duplicate source offsets {report.totals['duplicates']})")
        if duplicates or missing or not report.clean:
            return 1
        return 0 if windows(bootstrap, data, Path(data_dir) / "windows.log") else 1
    finally:
        if processor is not None and processor.poll() is None:
            os.killpg(processor.pid, signal.SIGKILL)
            processor.wait()
        cluster.destroy()
        say("Kafka stopped.")


if __name__ == "__main__":
    sys.exit(main())
