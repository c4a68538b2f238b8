"""The abort path (issue 12, item 3): hundreds of transactions through the real publisher, many
aborted right after producing, none may end in a fatal producer error, and a read_committed
reader sees exactly the committed ones.

librdkafka can fail an abort issued right after produce() fatally with INVALID_TXN_STATE
(confluentinc/librdkafka#4849; here a bare producer looping begin -> produce 1,000 -> commit,
commit, abort failed on an abort in 1 of 2 runs of 300 transactions). TransactionalPublisher
waits for in-flight requests before aborting and replaces a producer whose abort still fails.
"""
from __future__ import annotations

import random
import uuid
from collections import Counter

from tests.support.kafka import read_all
from txstream.errors import AbortableError
from txstream.kafka.config import KafkaClients
from txstream.task.publisher import TransactionalPublisher
from txstream.task.spec import PRODUCER_DEFAULTS

TRANSACTIONS, RECORDS = 300, 1_000


def test_hundreds_of_aborts_right_after_produce_never_end_in_a_fatal_error(bootstrap_servers, make_topic):
    topic = make_topic("aborts", 2)
    config = KafkaClients(bootstrap_servers).producer(**PRODUCER_DEFAULTS, **{"transaction.timeout.ms": 60_000})
    publisher = TransactionalPublisher(config, f"test-aborts-{uuid.uuid4().hex[:8]}", owner_dir=None, timeout_s=30)
    publisher.init()
    rng = random.Random(7)
    committed: Counter = Counter()
    aborts = 0
    try:
        for txn in range(TRANSACTIONS):
            publisher.begin()
            produce = publisher.producer.produce
            for n in range(RECORDS):
                while True:
                    try:
                        produce(topic, f"{txn}-{n}".encode())
                        break
                    except BufferError:
                        publisher.producer.poll(0.01)
            roll = rng.random()
            if roll < 0.4:                  # abort at once, requests still in flight
                publisher.abort()
                aborts += 1
            elif roll < 0.5:                # an abortable failure mid-produce, as the task sees one
                try:
                    raise AbortableError("injected: abort after produce")
                except AbortableError:
                    publisher.abort()
                    aborts += 1
            else:
                publisher.commit()
                committed.update(f"{txn}-{n}".encode() for n in range(RECORDS))
    finally:
        publisher.close()
    assert aborts > 100, aborts
    seen = Counter(r.value for r in read_all(bootstrap_servers, topic, timeout=120))
    assert seen == committed, (f"{sum((committed - seen).values())} committed records missing, "
                               f"{sum((seen - committed).values())} extra (aborted or twice)")
    print(f"\n[aborts] {TRANSACTIONS} transactions, {aborts} aborted right after producing, "
          f"{publisher.renewals} producer(s) replaced after a fatal abort, {sum(seen.values())} records read")
