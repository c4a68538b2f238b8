"""What a stable read of committed offsets costs right after a transaction committed them, against
a real local broker: a transactional producer commits a small transaction with a group's offsets
(`send_offsets_to_transaction`), and a read_committed consumer of the group asks `committed()` at
once (KIP-447's require_stable), as txstream's re-check does after a fencing `init_transactions`
and the driver does after a batch. Until the coordinator has written the transaction's markers the
broker answers UNSTABLE_OFFSET_COMMIT and librdkafka asks again after `retry.backoff.ms`: the
default (100 ms) against txstream's (kafka/config.py QUICK_STABLE_RETRY). Settings alternate, in
both orders; medians.

Run from the repository root:

    python -m benchmarks.stable_read_cost [--commits 60] [--rounds 2]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid


def main() -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from txstream.kafka.config import QUICK_STABLE_RETRY
    from txstream.local.cluster import LocalKafkaCluster, free_port_block

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commits", type=int, default=60, help="transactions per setting and round")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    cluster = LocalKafkaCluster(port=free_port_block(1), data_dir=tempfile.mkdtemp(prefix="txstream-stable-read-"),
                                die_with_parent=True)
    bootstrap = cluster.start()
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        source, output = f"stable-in-{uuid.uuid4().hex[:6]}", f"stable-out-{uuid.uuid4().hex[:6]}"
        for future in admin.create_topics([NewTopic(source, 4, 1), NewTopic(output, 4, 1)]).values():
            future.result(30)

        def run(extra: dict) -> list[float]:
            group = f"stable-read-{uuid.uuid4().hex[:8]}"
            member = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
            member.subscribe([source])
            deadline = time.monotonic() + 30
            while not member.assignment() and time.monotonic() < deadline:
                member.poll(0.1)
            reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                               "isolation.level": "read_committed", **extra})
            producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                                 "transactional.id": f"stable-read-{uuid.uuid4().hex[:8]}"})
            producer.init_transactions(30)
            waits = []
            try:
                for i in range(1, args.commits + 1):
                    producer.begin_transaction()
                    for k in range(100):
                        producer.produce(output, b"x" * 100, str(k).encode())
                    producer.send_offsets_to_transaction([TopicPartition(source, p, i) for p in range(4)],
                                                         member.consumer_group_metadata())
                    producer.commit_transaction(30)
                    started = time.perf_counter()
                    found = reader.committed([TopicPartition(source, p) for p in range(4)], 30)
                    waits.append(time.perf_counter() - started)
                    if any(tp.offset != i for tp in found):
                        raise RuntimeError(f"committed() after commit {i} answered {found}")
            finally:
                reader.close()
                member.close()
            return waits

        run({})   # the coordinators' first transactions and groups, not counted
        settings = {"librdkafka's default (100 ms)": {}, "txstream's": QUICK_STABLE_RETRY}
        results: dict[str, list[float]] = {name: [] for name in settings}
        for round_no in range(args.rounds):
            for name in (list(settings) if round_no % 2 == 0 else list(settings)[::-1]):
                results[name] += run(settings[name])
        print(f"committed() of 4 partitions right after commit_transaction, {args.commits} transactions x "
              f"{args.rounds} rounds per setting\n")
        print("| retry.backoff.ms | median ms | p90 ms | max ms | reads over 50 ms |")
        print("|---|---|---|---|---|")
        for name, waits in results.items():
            waits.sort()
            print(f"| {name} | {1000 * statistics.median(waits):.1f} | {1000 * waits[int(0.9 * len(waits))]:.1f} "
                  f"| {1000 * waits[-1]:.1f} | {sum(w > 0.05 for w in waits)} of {len(waits)} |")
    finally:
        cluster.destroy()


if __name__ == "__main__":
    main()
