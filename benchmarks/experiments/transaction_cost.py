"""Where a batch's publish time goes at few and at many output partitions, exactly-once against
at-least-once, against a real local broker (what it found: docs/performance.md).

Two producers (txstream's two slots on a 2-core machine) each publish half of a batch's records,
keyed over every partition of the output topic, both at once; batches follow each other with a
short gap, as txstream's do. Per batch and producer:

    exactly-once:  begin_transaction, produce, flush, send_offsets_to_transaction, commit_transaction
    at-least-once: produce, flush, Consumer.commit(offsets)

with txstream's producer settings (task/spec.py). The explicit flush splits the commit in two: the
produce requests' acknowledgements (librdkafka sends one partition per produce request,
confluentinc/librdkafka#1700, and a broker serves one request of a connection at a time), then
the transaction's own round trips (AddOffsetsToTxn, TxnOffsetCommit, EndTxn), which wait while
the previous transaction's markers are being written (CONCURRENT_TRANSACTIONS, retried by
librdkafka). The first batch is reported apart: a new producer's first transaction and a fresh
topic's first index entries (page faults on the broker) are not a batch's steady cost.

`--own-partitions` has each producer write only the output partitions numbered like the input
partitions whose offsets it commits, as a key-preserving transform does when the input was keyed
by the output's partitioner (Java clients' murmur2); by default every producer writes every
partition, as with the benchmarks' input (librdkafka's default partitioner).

`--verification both` runs everything again against a second broker with
`transaction.partition.verification.enable=false`: since Kafka 3.6 the leader checks with the
transaction coordinator, before it appends, that a partition was added to the producer's open
transaction (KIP-890 part 1), once per partition and transaction. Settings are the broker's, not
a client's; the comparison only shows that check's share. Broker CPU is the broker process's, per
batch (both producers), a mean: /proc counts it in 10 ms ticks.

Run from the repository root:

    python -m benchmarks.experiments.transaction_cost [--partitions 4,256] [--records 25000] [--batches 12]
"""
from __future__ import annotations

import statistics
import threading
import time
import uuid
from typing import Any

PRODUCERS = 2


def _produce(producer: Any, topic: str, keys: list[bytes], value: bytes, partitions: list[int] | None) -> None:
    if partitions is None:
        for key in keys:
            producer.produce(topic, value, key)
    else:
        for n, key in enumerate(keys):
            producer.produce(topic, value, key, partitions[n % len(partitions)])


def _publish_batch(producer: Any, exactly_once: bool, topic: str, keys: list[bytes], value: bytes,
                   partitions: list[int] | None, offsets: list, group: Any) -> dict:
    """One producer's batch, each phase timed: produce, flush, the offsets (into the transaction,
    or committed through the group's consumer), the transaction's commit (0 for at-least-once)."""
    started = time.perf_counter()
    if exactly_once:
        producer.begin_transaction()
    _produce(producer, topic, keys, value, partitions)
    producer.poll(0)
    produced = time.perf_counter()
    producer.flush(60)
    flushed = time.perf_counter()
    if exactly_once:
        producer.send_offsets_to_transaction(offsets, group.consumer_group_metadata(), 60)
    else:
        group.commit(offsets=offsets, asynchronous=False)
    offered = time.perf_counter()
    if exactly_once:
        producer.commit_transaction(60)
    done = time.perf_counter()
    return {"produce": produced - started, "flush": flushed - produced, "offsets": offered - flushed,
            "commit": done - offered, "batch": done - started}


def measure(bootstrap: str, broker_pid: int, partitions: int, guarantee: str, records: int, batches: int,
            gap_s: float, own_partitions: bool = False) -> dict:
    """One guarantee at one partition count: per-batch phase times (max over the producers, as a
    batch waits for its slowest slot) and the broker's CPU per batch. With `own_partitions`, each
    producer writes only the output partitions numbered like the input partitions it commits."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    from benchmarks.common import create_topics, delete_topics
    from benchmarks.harness import broker_cpu_s
    from txstream.task.spec import PRODUCER_DEFAULTS, TRANSACTIONAL_LINGER

    broker = {"broker_pids": [broker_pid]}
    tag = f"txcost-{partitions}-{guarantee}-{uuid.uuid4().hex[:6]}"
    source, output = f"{tag}-in", f"{tag}-out"
    create_topics(bootstrap, [source, output], partitions)
    group = Consumer({"bootstrap.servers": bootstrap, "group.id": tag, "enable.auto.commit": False})
    exactly_once = guarantee == "exactly-once"
    producers = []
    for i in range(PRODUCERS):
        config = {"bootstrap.servers": bootstrap, **PRODUCER_DEFAULTS, "on_delivery": lambda err, msg: None}
        if exactly_once:
            config.update(TRANSACTIONAL_LINGER, **{"transactional.id": f"{tag}-{i}"})
        producer = Producer(config)
        if exactly_once:
            producer.init_transactions(60)
        producers.append(producer)
    value = b"v" * 100
    keys = [[f"{i}-{n}".encode() for n in range(records // PRODUCERS)] for i in range(PRODUCERS)]
    rows: list[dict] = []
    cpu: list[float] = []
    try:
        for batch in range(batches):
            outcome: list[dict] = [{} for _ in producers]

            def publish(i: int, batch: int = batch, outcome: list[dict] = outcome) -> None:
                owned = list(range(i, partitions, PRODUCERS))
                mine = [TopicPartition(source, p, batch + 1) for p in owned]
                outcome[i] = _publish_batch(producers[i], exactly_once, output, keys[i], value,
                                            owned if own_partitions else None, mine, group)

            before = broker_cpu_s(broker)
            threads = [threading.Thread(target=publish, args=(i,)) for i in range(PRODUCERS)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            cpu.append(broker_cpu_s(broker) - before)
            rows.append({k: max(o[k] for o in outcome) for k in outcome[0]})
            time.sleep(gap_s)
    finally:
        for producer in producers:
            producer.flush(10)
        group.close()
        delete_topics(bootstrap, [source, output])
    later = rows[1:]
    return {"partitions": partitions, "guarantee": guarantee, "own": own_partitions, "first": rows[0],
            "median": {k: statistics.median(r[k] for r in later) for k in rows[0]},
            "broker_cpu_first": cpu[0], "broker_cpu_mean": statistics.fmean(cpu[1:])}


def _line(result: dict, verification: bool) -> str:
    m, f = result["median"], result["first"]
    phases = " / ".join(f"{m[k] * 1000:.0f}" for k in ("produce", "flush", "offsets", "commit"))
    return (f"{result['partitions']:>5} partitions{' (own)' if result['own'] else '      '}  {result['guarantee']:<14}"
            f" verification {'on ' if verification else 'off'}"
            f"  batch {m['batch'] * 1000:6.0f} ms (first {f['batch'] * 1000:5.0f})"
            f"  produce / flush / offsets / commit {phases} ms"
            f"  broker CPU {result['broker_cpu_mean'] * 1000:5.0f} ms per batch (first {result['broker_cpu_first'] * 1000:.0f})")


def main() -> None:
    from benchmarks.experiments.broker import both_orders, local_broker, parser

    ap = parser(__doc__)
    ap.add_argument("--records", type=int, default=25_000, help="records per batch, over both producers")
    ap.add_argument("--batches", type=int, default=12, help="batches per guarantee and partition count")
    ap.add_argument("--gap", type=float, default=0.3, help="seconds between batches (Spark's share of a batch)")
    ap.add_argument("--verification", choices=("on", "both"), default="on",
                    help="both: also against a broker with transaction.partition.verification.enable=false")
    ap.add_argument("--own-partitions", action="store_true",
                    help="each producer writes only the output partitions numbered like its input partitions "
                         "(input and output keyed by the same partitioner, the key kept), not all of them")
    args = ap.parse_args()
    settings = [True] if args.verification == "on" else [True, False]
    lines = []
    for verification in settings:
        overrides = {} if verification else {"transaction.partition.verification.enable": "false"}
        with local_broker(overrides=overrides) as broker:
            for partitions in args.partitions:
                for guarantee in both_orders("exactly-once", "at-least-once"):
                    result = measure(broker.bootstrap, broker.pid, partitions, guarantee, args.records, args.batches,
                                     args.gap, args.own_partitions)
                    lines.append(_line(result, verification))
                    print(lines[-1], flush=True)
    print("\nphases: medians over the batches after the first, a batch's phase its slower producer's; "
          "broker CPU: mean over the same batches (/proc, in clock ticks)")
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
