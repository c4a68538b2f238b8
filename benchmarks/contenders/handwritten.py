"""Contender 4: a hand-written confluent-kafka consume-transform-produce loop with transactions.

The shape of confluent-kafka-python's examples/eos_transactions.py: a read_committed consumer
that subscribes to the input, a transactional producer, and every 100 ms (or every
`--max-batch` messages) the consumer's positions are sent to the transaction with the
consumer's group metadata and the transaction is committed. One Python process.

The harness runs this module as `python -m benchmarks.contenders.handwritten ...`. The batch
sweep sets `--max-batch` (records per transaction) with a commit interval long enough that the
count decides; a poll that finds nothing new commits what is pending, so the last transaction
does not wait for the interval (with the default 100 ms interval this changes nothing).
"""
from __future__ import annotations

import argparse
import io
import json
import signal
import sys
import time

from benchmarks.contenders import Contender, Job


class HandWrittenLoop(Contender):
    name = "handwritten"
    label = "hand-written confluent-kafka EOS loop"

    def __init__(self, max_batch: int | None = None, commit_interval_ms: float | None = None,
                 label: str | None = None) -> None:
        self.max_batch = max_batch
        self.commit_interval_ms = commit_interval_ms
        if label:
            self.label = label

    def settings(self) -> dict:
        return {"max_batch": self.max_batch or 10000, "commit_interval_ms": self.commit_interval_ms or 100}

    def command(self, job: Job) -> tuple[list[str], dict]:
        from benchmarks.common import ENRICHED_SCHEMA_PATH, ORDER_SCHEMA_PATH

        argv = [sys.executable, "-m", "benchmarks.contenders.handwritten",
                "--bootstrap-servers", job.bootstrap, "--input", job.input_topic,
                "--output", job.output_topic, "--group", job.group,
                "--transactional-id", f"{job.group}-txn",
                "--input-schema", str(ORDER_SCHEMA_PATH), "--output-schema", str(ENRICHED_SCHEMA_PATH)]
        if self.max_batch:
            argv += ["--max-batch", str(self.max_batch)]
        if self.commit_interval_ms:
            argv += ["--commit-interval-ms", str(self.commit_interval_ms)]
        return argv, self.base_env()

    def versions(self) -> dict:
        import confluent_kafka

        return {"confluent-kafka": confluent_kafka.version(), "librdkafka": confluent_kafka.libversion()[0]}


def main(argv: list[str] | None = None) -> int:
    import fastavro
    from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap-servers", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--transactional-id", required=True)
    ap.add_argument("--input-schema", required=True)
    ap.add_argument("--output-schema", required=True)
    ap.add_argument("--commit-interval-ms", type=float, default=100)
    ap.add_argument("--max-batch", type=int, default=10000)
    ap.add_argument("--poll-timeout-ms", type=float, default=None,
                    help="longest wait in one consume() (default: the commit interval, at most 100 ms)")
    args = ap.parse_args(argv)

    in_schema = fastavro.parse_schema(json.load(open(args.input_schema)))
    out_schema = fastavro.parse_schema(json.load(open(args.output_schema)))
    reader, writer = fastavro.schemaless_reader, fastavro.schemaless_writer

    running = True

    def _stop(_sig, _frame):
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)

    consumer = Consumer({
        "bootstrap.servers": args.bootstrap_servers,
        "group.id": args.group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,        # offsets go into the transaction
        "enable.partition.eof": False,
        "isolation.level": "read_committed",
    })
    producer = Producer({
        "bootstrap.servers": args.bootstrap_servers,
        "transactional.id": args.transactional_id,
        "linger.ms": 5,
        "batch.size": 262144,
        # Keyed output where every other contender puts it (the Java clients' partitioner, as
        # Kafka Streams, Spark, Quix Streams and txstream use). librdkafka's default (CRC32) is
        # also the seeder's: each record would go back to the partition it was read from, and a
        # transaction would touch only the partitions its poll had read.
        "partitioner": "murmur2_random",
    })
    producer.init_transactions()
    producer.begin_transaction()

    pending = 0
    last_commit = time.monotonic()
    interval = args.commit_interval_ms / 1000.0
    poll_timeout = (args.poll_timeout_ms if args.poll_timeout_ms is not None
                    else min(args.commit_interval_ms, 100.0)) / 1000.0
    out_topic = args.output

    def commit() -> None:
        nonlocal pending, last_commit
        if pending:
            positions = consumer.position(consumer.assignment())
            producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata())
            producer.commit_transaction()
            producer.begin_transaction()
            pending = 0
        last_commit = time.monotonic()

    # With more than one instance in the group (handwritten-x2) partitions move between them. What
    # this instance produced for a partition must be committed with that partition's offset before
    # it goes, while this member's generation is still current; a later commit would carry the
    # output without the offset (the next owner repeats it) or be fenced. One instance: no
    # revocation before close(), and nothing is pending then.
    def on_assign(_consumer, partitions) -> None:
        print(f"assigned partitions {sorted(tp.partition for tp in partitions)}", file=sys.stderr, flush=True)

    def on_revoke(_consumer, partitions) -> None:
        print(f"revoking partitions {sorted(tp.partition for tp in partitions)}"
              f"{f', committing {pending} pending' if pending and not failed else ''}", file=sys.stderr, flush=True)
        if not failed:
            commit()

    def on_lost(_consumer, partitions) -> None:  # another member may own them already: drop it all
        nonlocal pending
        print(f"lost partitions {sorted(tp.partition for tp in partitions)}, aborting {pending} pending",
              file=sys.stderr, flush=True)
        producer.abort_transaction()
        producer.begin_transaction()
        pending = 0

    failed = False
    consumer.subscribe([args.input], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
    try:
        while running:
            msgs = consumer.consume(num_messages=min(args.max_batch, 2000), timeout=poll_timeout)
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(err)
                order = reader(io.BytesIO(msg.value()), in_schema, None)
                amount = order["amount"]
                pending += 1  # consumed: its offset is committed even when the order is dropped
                if not amount > 0:
                    continue
                buf = io.BytesIO()
                writer(buf, out_schema, {
                    "id": order["id"], "customer_id": order["customer_id"],
                    "amount_cents": int(amount * 100), "currency": order["currency"],
                    "created_at": order["created_at"], "items": order["items"],
                    "is_large": amount > 100})
                while True:
                    try:
                        producer.produce(out_topic, key=msg.key(), value=buf.getvalue())
                        break
                    except BufferError:
                        producer.poll(0.01)
            producer.poll(0)
            if pending >= args.max_batch or (pending and time.monotonic() - last_commit >= interval) \
                    or (pending and not msgs):  # idle: nothing more to add to this transaction now
                commit()
        commit()
    except Exception:
        failed = True
        try:
            producer.abort_transaction()
        except Exception:
            pass
        raise
    finally:
        consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
