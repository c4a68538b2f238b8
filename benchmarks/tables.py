"""A stream joined to a table (issue 61's first benchmark): orders enriched with their customer's
name and tier from a customers table kept in a compacted topic, txstream exactly-once against
Spark Structured Streaming's stream-static join and Kafka Streams' GlobalKTable join, side by side
in one run, through benchmarks/windowed.py's harness.

    python -m benchmarks --tables --keys 1000000 --records 1000000   # what `make bench` runs
    python -m benchmarks --tables --quick                            # smoke run: 20,000 customers

The work, in Spark's words (processors/orders_with_customer_table.py):
`orders.join(customers, value.customer_id == customer, "left")`, each order with its customer's
name and tier, as schemas/order_with_customer.avsc. The input: `--keys` customers (key =
customer_id, schemaless Avro Customer) in a compacted topic, written before the orders; `--records`
orders (default: as many as customers), order i's customer i mod keys, except every hundredth
order's, a customer the table does not hold (name and tier null). The table does not change
during the run (Spark SS's static side would not see it).

Contenders: `txstream-tables` (`Table("customers")`, broadcast to the join, read at each batch's
version), `spark-ss-tables` (contenders/spark_ss_tables.py: the table read once as a batch,
latest per key, cached, broadcast), `kafka-streams-tables` (kstreams/.../CustomerTable.java: a
GlobalKTable, restored into RocksDB before processing). Check: every order exactly once (a
duplicate fails the exactly-once contenders and is counted for Spark's), its name and tier the
table's (null for the orders of no customer).

Measured as the windowed benchmark measures (benchmarks/windowed.py's docstring). Results:
benchmarks/results/<timestamp>-tables[-quick].{json,md}.
"""
from __future__ import annotations

import argparse
import random
import sys

from benchmarks.common import ORDER_SCHEMA, REPO, decode_all, encode, make_order, produce_waiting, producer_config
from benchmarks.stateful import EVENT_START_MS, Stateful, _verdict
from benchmarks.windowed import log
from benchmarks.windowed import main as run_workload
from txstream.serde.avro import load_schema

CUSTOMER_SCHEMA_PATH = REPO / "schemas" / "customer.avsc"
TIERS = ("gold", "silver", "bronze")


class TableInput:
    """What the harness wrote: the table's topic, each order's expected (name, tier)."""

    def __init__(self, topic: str, table: str) -> None:
        self.topic, self.table = topic, table
        self.records = 0
        self.input_bytes = 0
        self.expected: dict[str, tuple[str | None, str | None]] = {}   # order id -> (name, tier)


def seed_tables(bootstrap: str, topic: str, records: int, keys: int, seed: int = 7) -> TableInput:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    table = f"{topic}-customers"
    partitions = len(AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=30).topics[topic]
                     .partitions)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(table, partitions, -1, config={"cleanup.policy": "compact"})])[table].result(60)
    out = TableInput(topic, table)
    producer = Producer(producer_config(bootstrap))
    customer_schema = load_schema(str(CUSTOMER_SCHEMA_PATH))
    for k in range(keys):
        cid = f"customer-{k:09d}"
        produce_waiting(producer, table, cid.encode(),
                        encode(customer_schema, {"customer_id": cid, "name": f"name-{k}", "tier": TIERS[k % 3]}))
        if (k + 1) % max(1, keys // 5) == 0:
            log(f"  table: {k + 1:,}/{keys:,} customers")
    rng = random.Random(seed)
    for i in range(records):
        order = make_order(rng, i, EVENT_START_MS + i)
        k = keys + i if i % 100 == 99 else i % keys
        order["customer_id"] = f"customer-{k:09d}"
        key, value = order["id"].encode(), encode(ORDER_SCHEMA, order)
        out.records += 1
        out.input_bytes += len(key) + len(value)
        produce_waiting(producer, topic, key, value)
        out.expected[order["id"]] = (f"name-{k}", TIERS[k % 3]) if k < keys else (None, None)
        if (i + 1) % max(1, records // 5) == 0:
            log(f"  orders: {i + 1:,}/{records:,}")
    remaining = producer.flush(120)
    if remaining:
        raise RuntimeError(f"{remaining} seed records were not delivered")
    return out


def check_tables(records, expected: dict[str, tuple], exactly_once: bool, schema) -> dict:
    """Every order exactly once with its customer's (name, tier); at-least-once: a repeat is counted."""
    seen: dict[str, int] = {}
    wrong: list[str] = []
    values, undecodable, bad_keys = decode_all(records, schema, "id")
    for v in values:
        seen[v["id"]] = seen.get(v["id"], 0) + 1
        want = expected.get(v["id"])
        if want is not None and (v["name"], v["tier"]) != want:
            wrong.append(f"{v['id']}: {(v['name'], v['tier'])} (want {want})")
    duplicates = sum(n - 1 for n in seen.values())
    missing = sum(1 for i in expected if i not in seen)
    unexpected = sum(1 for i in seen if i not in expected)
    return _verdict(
        {"emitted": len(seen), "expected": len(expected), "missing": missing, "unexpected": unexpected,
         "wrong": len(wrong), "duplicates": duplicates},
        [(missing > 0, f"{missing} of {len(expected)} orders missing"),
         (unexpected > 0, f"{unexpected} orders not in the input"),
         (bool(wrong), f"{len(wrong)} orders joined wrongly, e.g. " + "; ".join(wrong[:3])),
         (undecodable > 0, f"{undecodable} values do not decode as OrderWithCustomer"),
         (bad_keys > 0, f"{bad_keys} keys differ from their order id"),
         (duplicates > 0 and exactly_once, f"{duplicates} orders emitted more than once")], records)


class Tables(Stateful):
    mode = "tables"
    labels = ("txstream exactly-once (join with a Table from a compacted topic, broadcast)",
              "Spark SS stream-static join (table read once, cached, broadcast), Kafka sink (at-least-once)",
              "Kafka Streams exactly_once_v2, KStream-GlobalKTable leftJoin")
    processor = "processors/orders_with_customer_table.py:OrdersWithCustomerTable"
    output_schema_path = REPO / "schemas" / "order_with_customer.avsc"
    unit = "orders"
    kstreams_main = "txstream.bench.kstreams.CustomerTable"
    kstreams_topics = ()
    checker, want = staticmethod(check_tables), "expected"
    spark_mode = "append"
    spark_module = "benchmarks.contenders.spark_ss_tables"
    kstreams_note = ("CustomerTable.java`: the customers topic as a GlobalKTable (restored into RocksDB before "
                     "processing), orders leftJoin it by their customer_id, no repartition")
    check_note = ("every order exactly once (duplicates fail the exactly-once contenders and are counted for "
                  "Spark's), its name and tier the table's (null for an order of no customer).")
    table = ""

    def finish_arguments(self, ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        super().finish_arguments(ap, args)
        if args.records is None:
            args.records = args.keys

    def seed(self, bootstrap: str, topic: str, args: argparse.Namespace):
        log(f"seeding {args.keys:,} customers and {args.records:,} orders into {topic} ...")
        inp = seed_tables(bootstrap, topic, args.records, args.keys)
        self.table = inp.table
        return inp

    def extra_topics(self, app_id: str) -> list[str]:
        return [*super().extra_topics(app_id), self.table]

    def txstream_args(self) -> list[str]:
        return ["--table", f"customers={self.table}"]

    def spark_args(self) -> list[str]:
        return ["--table", self.table, "--table-schema", str(CUSTOMER_SCHEMA_PATH)]

    def kstreams_args(self, contender: str, args: argparse.Namespace) -> list[str]:
        return ["--table", self.table, "--table-schema", str(CUSTOMER_SCHEMA_PATH)]

    def input_meta(self, inp, args: argparse.Namespace) -> dict:
        unknown = sum(1 for name, _ in inp.expected.values() if name is None)
        return {"keys": args.keys, "orders_of_no_customer": unknown}

    def target(self, inp, contender: str) -> int:
        return len(inp.expected)

    def weight(self, contender: str, schema):
        return None

    def notes(self, meta: dict) -> list[str]:
        from benchmarks.windowed import txstream_note

        return [txstream_note(self.processor) + " `--table customers=TOPIC`; the table broadcast to the join.",
                "- Spark SS: `benchmarks/contenders/spark_ss_tables.py`: the customers topic read once as a batch "
                "(latest value per key, cached), broadcast to the stream-static left join; Spark's Kafka source and "
                "sink (at-least-once), from_avro/to_avro, processingTime 0 trigger, maxOffsetsPerTrigger = txstream's "
                "batch.",
                f"- Kafka Streams: `benchmarks/contenders/kstreams/src/main/java/txstream/bench/kstreams/"
                f"{self.kstreams_note}; exactly_once_v2, 2 stream threads.",
                f"- Check: {self.check_note} CPU: the contender's process tree."]

    def title(self, inp: dict) -> tuple[str, str]:
        return (f"Orders enriched from a {inp.get('keys', 0):,}-customer table",
                "`orders.join(customers, value.customer_id == customer, \"left\")`, the customers a compacted "
                f"topic; {inp.get('orders_of_no_customer', 0):,} orders of no customer.")


def main(argv: list[str] | None = None) -> int:
    return run_workload(list(sys.argv[1:] if argv is None else argv), Tables())


if __name__ == "__main__":
    sys.exit(main())
