"""Spark Structured Streaming's stream-static join, Spark's Kafka source and sink (at-least-once):
the Spark contender of benchmarks/tables.py.

    static:  spark.read.format("kafka") of the customers topic (a batch read, once, at start)
             -> the latest value per key (max_by offset; a tombstone deletes) -> from_avro -> cache()
    stream:  orders (from_avro) .join(broadcast(customers), value.customer_id == c_id, "left")
             -> to_avro (schemas/order_with_customer.avsc), outputMode("append")

Spark SS has no table kept from a compacted topic: the static side is read once and never sees
an update (txstream's table is read at each batch's version: docs/joins.md). Session, trigger
and the per-micro-batch lines as benchmarks/contenders/spark_ss_windowed.py.
"""
from __future__ import annotations

import sys
from pathlib import Path

from benchmarks.contenders.spark_ss_windowed import arguments, orders, run


def main(argv: list[str] | None = None) -> int:
    ap = arguments("python -m benchmarks.contenders.spark_ss_tables")
    ap.add_argument("--table", required=True)
    ap.add_argument("--table-schema", required=True)
    args = ap.parse_args(argv)
    spark, batch = orders(args)
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro, to_avro

    raw = (spark.read.format("kafka").option("kafka.bootstrap.servers", args.bootstrap_servers)
           .option("subscribe", args.table).option("startingOffsets", "earliest").load())
    latest = (raw.groupBy("key").agg(F.max_by("value", "offset").alias("value")).where(F.col("value").isNotNull())
              .select(from_avro("value", Path(args.table_schema).read_text()).alias("c")))
    customers = latest.select(F.col("c.customer_id").alias("c_id"), F.col("c.name").alias("name"),
                              F.col("c.tier").alias("tier")).cache()
    print(f"customers loaded: {customers.count()} keys", flush=True)
    joined = batch.join(F.broadcast(customers), F.col("value.customer_id") == F.col("c_id"), "left")
    out = joined.select("key", to_avro(F.struct(F.col("value.id").alias("id"),
                                                F.col("value.customer_id").alias("customer_id"),
                                                F.col("value.amount").alias("amount"), "name", "tier"),
                                       Path(args.output_schema).read_text()).alias("value"))
    return run(spark, out, args, "append")


if __name__ == "__main__":
    sys.exit(main())
