"""Spark Structured Streaming's own windowed aggregation with a watermark, Spark's Kafka sink
(at-least-once): the windowed benchmark's Spark contender (benchmarks/windowed.py).

    readStream.format("kafka") (maxOffsetsPerTrigger) -> from_avro
    -> withWatermark("created_at", "30 seconds")
    -> groupBy(window("created_at", "1 minute"), "currency").agg(count, sum(amount))
    -> to_avro (schemas/currency_window.avsc) -> writeStream.format("kafka"), outputMode("append")
    trigger(processingTime="0 seconds"), local[2]

The same query as processors/orders_per_currency.py:OrdersPerCurrency, word for word. The trigger
starts the next micro-batch as soon as one ends; Spark runs a batch with no data when the
watermark moved (spark.sql.streaming.noDataMicroBatches.enabled, default true), which emits the
windows the last data batch's watermark closed. It runs until SIGTERM: the harness stops it once
every window the input closes has been emitted. State: Spark's default HDFS-backed state store in
the checkpoint directory. One line per micro-batch from the query's progress, as it goes:

    spark-batch 0  in 40000  1.234s  watermark 2026-01-01T00:01:10.000Z
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from benchmarks.contenders.spark_ss_wide import SPARK_CONF


def _stop(_sig, _frame):
    raise KeyboardInterrupt("SIGTERM")


def arguments(prog: str) -> argparse.ArgumentParser:
    """The options every Spark SS contender of benchmarks/windowed.py's harness takes."""
    ap = argparse.ArgumentParser(prog=prog)
    for opt in ("--bootstrap-servers", "--input", "--output", "--group", "--workdir", "--jars",
                "--input-schema", "--output-schema"):
        ap.add_argument(opt, required=True)
    ap.add_argument("--max-offsets-per-trigger", type=int, required=True)
    ap.add_argument("--master", default="local[2]")
    return ap


def orders(args: argparse.Namespace):
    """The Spark session and the input as a stream of (key, decoded order `value`)."""
    signal.signal(signal.SIGTERM, _stop)
    # Before the session starts (Spark starts workers with the bare python3 otherwise).
    os.environ["PYSPARK_PYTHON"] = sys.executable

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    builder = SparkSession.builder.master(args.master).appName(f"bench-{args.group}")
    builder = builder.config("spark.jars", args.jars)
    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    source = (spark.readStream.format("kafka")
              .option("kafka.bootstrap.servers", args.bootstrap_servers)
              .option("subscribe", args.input)
              .option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", str(args.max_offsets_per_trigger))
              .option("groupIdPrefix", args.group)
              .load())
    return spark, source.select("key", from_avro(F.col("value"), Path(args.input_schema).read_text()).alias("value"))


def run(spark, out, args: argparse.Namespace, mode: str) -> int:
    """Write `out` (key, value) to the output topic in `mode` and print a line per micro-batch
    until SIGTERM."""
    query = (out.writeStream.format("kafka")
             .option("kafka.bootstrap.servers", args.bootstrap_servers)
             .option("topic", args.output)
             .option("checkpointLocation", os.path.join(args.workdir, "checkpoint"))
             .outputMode(mode)
             .trigger(processingTime="0 seconds")
             .start())
    printed = -1
    try:
        while query.isActive:
            query.awaitTermination(0.2)   # its batch lines tell the harness when all input was read
            for progress in query.recentProgress:
                if progress.get("batchId", -1) <= printed:
                    continue
                printed = progress["batchId"]
                seconds = progress.get("durationMs", {}).get("triggerExecution", 0) / 1000
                print(f"spark-batch {printed}  in {progress.get('numInputRows', 0)}  {seconds:.3f}s  "
                      f"watermark {progress.get('eventTime', {}).get('watermark', '-')}", flush=True)
        if query.exception() is not None:
            print(f"query failed: {query.exception()}", flush=True)
            return 1
    except KeyboardInterrupt:
        pass
    finally:
        spark.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = arguments("python -m benchmarks.contenders.spark_ss_windowed").parse_args(argv)
    spark, batch = orders(args)
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import to_avro

    out_schema = Path(args.output_schema).read_text()
    w = (batch.select("value.created_at", "value.currency", "value.amount")
         .withWatermark("created_at", "30 seconds")
         .groupBy(F.window("created_at", "1 minute"), "currency")
         .agg(F.count("*").alias("orders"), F.sum("amount").alias("amount")))
    out = w.select(F.col("currency").cast("binary").alias("key"),
                   to_avro(F.struct(F.col("window.start").alias("start"), F.col("window.end").alias("end"),
                                    "currency", "orders", "amount"), out_schema).alias("value"))
    return run(spark, out, args, "append")


if __name__ == "__main__":
    sys.exit(main())
