"""Spark Structured Streaming doing the wide benchmark's work with Spark's own Kafka sink (at-least-once).

    readStream.format("kafka") -> from_avro -> where(amount > 0)
    -> foreachBatch: groupBy(customer_id).agg(count, sum(amount), sum(items)) -> to_avro
                     -> batch_df.write.format("kafka")
    trigger(availableNow=True), maxOffsetsPerTrigger, local[2]

The same aggregation as processors/customer_totals.py:CustomerTotals, per micro-batch (not
`outputMode("update")`, which keeps state across batches): each micro-batch's orders are grouped
and written as one `CustomerTotals` record (schemas/customer_totals.avsc) per customer, keyed by
the customer id. `batch_time` is the driver's clock when the micro-batch starts, constant within
a batch. The Kafka sink has no transactions: a failed micro-batch that is re-run writes again.

Started by benchmarks/wide.py as `python -m benchmarks.contenders.spark_ss_wide ...`; the
connector jars come from benchmarks/contenders/spark_ss.py:connector_jars(). After the query
ends, one line per micro-batch from the query's progress:

    spark-batch 0  in 80000  1.234s
"""
from __future__ import annotations

import argparse
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

# txstream's own defaults for the same settings (txstream/spark/setup.py), so that the
# aggregation runs with the same shuffle width, time zone and driver memory in both.
SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "8",
    "spark.driver.memory": "2g",
    "spark.python.worker.reuse": "true",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.contenders.spark_ss_wide")
    for opt in ("--bootstrap-servers", "--input", "--output", "--group", "--workdir", "--jars",
                "--input-schema", "--output-schema"):
        ap.add_argument(opt, required=True)
    ap.add_argument("--max-offsets-per-trigger", type=int, required=True)
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args(argv)
    # Before the session starts (Spark starts workers with the bare python3 otherwise).
    os.environ["PYSPARK_PYTHON"] = sys.executable

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro, to_avro

    builder = SparkSession.builder.master(args.master).appName(f"bench-wide-{args.group}")
    builder = builder.config("spark.jars", args.jars)
    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    in_schema = Path(args.input_schema).read_text()
    out_schema = Path(args.output_schema).read_text()

    source = (spark.readStream.format("kafka")
              .option("kafka.bootstrap.servers", args.bootstrap_servers)
              .option("subscribe", args.input)
              .option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", str(args.max_offsets_per_trigger))
              .option("groupIdPrefix", args.group)
              .load())
    kept = (source.select(from_avro(F.col("value"), in_schema).alias("o"))
            .where(F.col("o.amount") > 0))

    def write_batch(batch_df, batch_id: int) -> None:
        batch_time = datetime.now(timezone.utc).replace(microsecond=0)
        totals = (batch_df.groupBy(F.col("o.customer_id").alias("customer_id"))
                  .agg(F.count("*").alias("orders"), F.sum("o.amount").alias("amount"),
                       F.sum("o.items").cast("long").alias("items")))
        out = totals.select(
            F.col("customer_id").cast("binary").alias("key"),
            to_avro(F.struct("customer_id", F.lit(batch_time).alias("batch_time"), "orders", "amount", "items"),
                    out_schema).alias("value"))
        (out.write.format("kafka")
         .option("kafka.bootstrap.servers", args.bootstrap_servers)
         .option("topic", args.output)
         .save())

    query = (kept.writeStream.foreachBatch(write_batch)
             .option("checkpointLocation", os.path.join(args.workdir, "checkpoint"))
             .trigger(availableNow=True)
             .start())
    try:
        query.awaitTermination()
        for progress in query.recentProgress:
            rows = progress.get("numInputRows", 0)
            seconds = progress.get("durationMs", {}).get("triggerExecution", 0) / 1000
            print(f"spark-batch {progress.get('batchId')}  in {rows}  {seconds:.3f}s", flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
