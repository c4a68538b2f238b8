"""Spark Structured Streaming's own running totals and deduplication, Spark's Kafka source and
sink (at-least-once): the Spark contender of benchmarks/stateful.py.

    --kind totals: from_avro -> where(amount > 0) -> groupBy(customer_id)
                   .agg(count, sum(amount), max(amount)) -> to_avro (customer_running_total.avsc),
                   outputMode("update")          processors/running_totals.py, word for word
    --kind dedup:  from_avro -> withWatermark("created_at", "10 minutes")
                   .dropDuplicatesWithinWatermark(["id"]) -> to_avro (order.avsc),
                   outputMode("append")          processors/unique_orders.py, word for word

Session, trigger (processingTime 0, maxOffsetsPerTrigger = txstream's batch), state store (HDFS-backed,
in the checkpoint directory) and the per-micro-batch lines as benchmarks/contenders/spark_ss_windowed.py.
"""
from __future__ import annotations

import sys
from pathlib import Path

from benchmarks.contenders.spark_ss_windowed import arguments, orders, run


def main(argv: list[str] | None = None) -> int:
    ap = arguments("python -m benchmarks.contenders.spark_ss_stateful")
    ap.add_argument("--kind", choices=("totals", "dedup"), required=True)
    args = ap.parse_args(argv)
    spark, batch = orders(args)
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import to_avro

    out_schema = Path(args.output_schema).read_text()
    if args.kind == "totals":
        totals = (batch.where(F.col("value.amount") > 0)
                  .groupBy(F.col("value.customer_id").alias("customer_id"))
                  .agg(F.count("*").alias("orders"), F.sum("value.amount").alias("amount"),
                       F.max("value.amount").alias("largest")))
        out = totals.select(F.col("customer_id").cast("binary").alias("key"),
                            to_avro(F.struct("customer_id", "orders", "amount", "largest"), out_schema).alias("value"))
        return run(spark, out, args, "update")
    unique = (batch.select("key", "value", "value.id", "value.created_at")
              .withWatermark("created_at", "10 minutes").dropDuplicatesWithinWatermark(["id"]))
    return run(spark, unique.select("key", to_avro("value", out_schema).alias("value")), args, "append")


if __name__ == "__main__":
    sys.exit(main())
