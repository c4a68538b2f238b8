"""Issue 55: does Spark's Kafka batch source read exact ranges under read_committed, up to the
last stable offset, the way task/reading.py does? Control records, aborted data, a range that
holds only a marker, a range that ends on one.

    python -m benchmarks.experiments.spark_kafka_ranges [--bootstrap-servers B]

One partition is written in transactions: 10 committed records, 5 aborted, 10 committed, then one
transaction left open (its records lie past the last stable offset). Then each range below is
read with Spark's source (`startingOffsets`/`endingOffsets` per partition,
`kafka.isolation.level=read_committed`), and the offsets it yields are compared with what a
read_committed librdkafka consumer sees in the same range. Prints one line per range and exits 1
on any difference or failure; then, for information, what it does with a range that ends past the
last stable offset (txstream never plans one).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from benchmarks.common import RunBroker, create_topics
from benchmarks.contenders.spark_ss import connector_jars


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def write(bootstrap: str, topic: str):
    """The transactions; returns the open producer (its transaction must stay open while reading)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-txn"})
    producer.init_transactions(60)
    for count, commit in ((10, True), (5, False), (10, True)):
        producer.begin_transaction()
        for i in range(count):
            producer.produce(topic, f"{'c' if commit else 'a'}{i}".encode(), partition=0)
        producer.flush(30)
        (producer.commit_transaction if commit else producer.abort_transaction)(60)
    producer.begin_transaction()
    producer.produce(topic, b"open", partition=0)
    producer.flush(30)
    return producer


def librdkafka_offsets(bootstrap: str, topic: str, start: int, end: int) -> list[int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-check", "isolation.level": "read_committed",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, 0, start)])
    offsets: list[int] = []
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            if consumer.position([TopicPartition(topic, 0)])[0].offset >= end:
                break
            for msg in consumer.consume(100, 0.2):
                if msg.error() is None and msg.offset() < end:
                    offsets.append(msg.offset())
    finally:
        consumer.close()
    return offsets


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap-servers")
    args = ap.parse_args(argv)
    broker = RunBroker.start(args.bootstrap_servers, log, "spark-kafka-ranges-")
    try:
        return run(broker.bootstrap)
    finally:
        broker.stop(log)


def run(bootstrap: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    from txstream.spark.session import build_spark, stop_spark

    topic = f"ranges-{int(time.time())}"
    create_topics(bootstrap, [topic], 1)
    producer = write(bootstrap, topic)
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-probe", "isolation.level": "read_committed"})
    _, stable = probe.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)   # read_committed: the LSO
    probe.close()
    log(f"last stable offset {stable} (10 committed at 0-9, marker 10, 5 aborted 11-15, marker 16, "
        "10 committed 17-26, marker 27, an open transaction after)")
    ranges = {"whole, ending at the LSO": (0, stable), "first transaction and its marker": (0, 11),
              "ending just before a marker": (0, 10), "aborted records and their marker only": (11, 17),
              "a marker only": (10, 11), "starting inside the aborted records": (13, 20),
              "the last marker only": (27, stable)}
    jars, _ = connector_jars(log)
    spark = build_spark("local[2]", "spark-kafka-ranges", {"spark.jars": ",".join(jars)})
    failures = 0
    try:
        for name, (start, end) in ranges.items():
            want = librdkafka_offsets(bootstrap, topic, start, end)
            frame = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                     .option("assign", json.dumps({topic: [0]}))
                     .option("startingOffsets", json.dumps({topic: {"0": start}}))
                     .option("endingOffsets", json.dumps({topic: {"0": end}}))
                     .option("kafka.isolation.level", "read_committed").load())
            started = time.perf_counter()
            try:
                got = sorted(row["offset"] for row in frame.select("offset").collect())
            except Exception as exc:   # reported per range
                got, error = None, str(exc).strip().splitlines()[0][:300]
            else:
                error = None
            took = time.perf_counter() - started
            ok = got == want
            failures += not ok
            log(f"{'ok  ' if ok else 'DIFF'} [{start}, {end}) {name}: Spark {got if error is None else error} "
                f"librdkafka {want} ({took:.2f}s)")
        # Never planned by txstream (its ends are the LSO): what Spark's source does past it.
        frame = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                 .option("assign", json.dumps({topic: [0]}))
                 .option("startingOffsets", json.dumps({topic: {"0": 20}}))
                 .option("endingOffsets", json.dumps({topic: {"0": stable + 1}}))
                 .option("kafkaConsumer.pollTimeoutMs", "5000")
                 .option("kafka.isolation.level", "read_committed").load())
        started = time.perf_counter()
        try:
            outcome = str(sorted(row["offset"] for row in frame.select("offset").collect()))
        except Exception as exc:
            outcome = " ".join(str(exc).split())[:400]
        log(f"info [20, {stable + 1}) past the LSO, into the open transaction: {outcome} "
            f"({time.perf_counter() - started:.2f}s)")
    finally:
        stop_spark(spark)
        producer.abort_transaction(30)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
