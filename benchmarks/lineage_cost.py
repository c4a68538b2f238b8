"""What the lineage headers cost on the produce path, client and broker, against a real local
broker: one transactional producer writes the same records in transactions of 25,000, with
today's one `txstream.lineage` header (`txstream/kafka/headers.py`; values built beforehand, as
the collector builds a batch's at once), with the five headers of the earlier format (built per
record as the collector built them), with one short header (the source offset and the record's
position only: the floor of any per-record lineage), and with none. Modes alternate, in both
orders; medians.

Why: at 1,000,000 orders a batch's produce phase took 1.58 s with the five headers against 0.56 s
without (the throughput table's batch lines), and the output records were ~2.5x the bytes. This
separated what the number of headers costs from what their bytes cost, which gave the compact
format; now it measures that format against the others.
Run from the repository root:

    python -m benchmarks.lineage_cost [--records 300000] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
import uuid

TRANSACTION = 25_000
MODES = ("none", "five headers (before)", "txstream.lineage (today)", "one short header")


def main() -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from benchmarks.harness import broker_cpu_s
    from txstream.kafka import headers
    from txstream.local.cluster import LocalKafkaCluster, free_port_block

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    n = args.records
    cluster = LocalKafkaCluster(port=free_port_block(1), data_dir=tempfile.mkdtemp(prefix="txstream-lineage-cost-"),
                                die_with_parent=True)
    bootstrap = cluster.start()
    broker = {"broker_pids": cluster.alive_pids()}   # what harness.broker_cpu_s reads

    value = os.urandom(104)
    keys = [f"order-{i}".encode() for i in range(n)]
    offsets = [str(10_000_000 + i).encode() for i in range(n)]
    positions = [str(i).encode() for i in range(n)]
    publication = uuid.uuid4().hex.encode()
    fixed = [(headers.SOURCE_TOPIC, b"bench-in-20261124-214750"), (headers.SOURCE_PARTITION, b"3"),
             (headers.PUBLICATION, publication)]
    compact = [headers.lineage_value("bench-in-20261124-214750", 3, 10_000_000 + i, publication.decode(), i)
               for i in range(n)]

    def record_headers(mode: str, i: int):
        if mode == MODES[1]:
            return [*fixed, (headers.SOURCE_OFFSET, offsets[i]), (headers.PUBLICATION_SEQ, positions[i])]
        if mode == MODES[2]:
            return [(headers.LINEAGE, compact[i])]
        if mode == MODES[3]:
            return [("txl", offsets[i] + b"/" + positions[i])]
        return None

    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        topics = {mode: f"lineage-cost-{i}" for i, mode in enumerate(MODES)}
        for future in admin.create_topics([NewTopic(t, 4, 1) for t in topics.values()]).values():
            future.result(30)

        def run(mode: str) -> tuple[float, float, float]:
            producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                                 "transactional.id": f"lineage-cost-{uuid.uuid4().hex[:8]}"})
            producer.init_transactions(30)
            topic = topics[mode]
            before = resource.getrusage(resource.RUSAGE_SELF)
            started, broker_before = time.perf_counter(), broker_cpu_s(broker)
            for first in range(0, n, TRANSACTION):
                producer.begin_transaction()
                for i in range(first, min(n, first + TRANSACTION)):
                    while True:
                        try:
                            producer.produce(topic, value, keys[i], headers=record_headers(mode, i))
                            break
                        except BufferError:
                            producer.poll(0.05)
                producer.commit_transaction(30)
            wall = time.perf_counter() - started
            after = resource.getrusage(resource.RUSAGE_SELF)
            client = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            return wall, client, broker_cpu_s(broker) - broker_before

        run(MODES[0])   # the broker's and the client's first transactions, not counted
        results: dict[str, list[tuple[float, float, float]]] = {mode: [] for mode in MODES}
        for round_no in range(args.rounds):
            for mode in (MODES if round_no % 2 == 0 else MODES[::-1]):
                results[mode].append(run(mode))
        print(f"{n:,} records of a 104 B value in transactions of {TRANSACTION:,}, "
              f"{args.rounds} rounds, medians (CPU µs per record)\n")
        print("| headers | wall s | client CPU µs | broker CPU µs |")
        print("|---|---|---|---|")
        for mode in MODES:
            walls, clients, brokers = zip(*results[mode], strict=True)
            print(f"| {mode} | {statistics.median(walls):.2f} | {1e6 * statistics.median(clients) / n:.2f} "
                  f"| {1e6 * statistics.median(brokers) / n:.2f} |")
    finally:
        cluster.destroy()


if __name__ == "__main__":
    main()
