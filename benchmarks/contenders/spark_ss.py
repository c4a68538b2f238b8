"""Contender 5: Spark Structured Streaming with Spark's own Kafka connector (at-least-once).

    readStream.format("kafka") -> from_avro -> where(amount > 0) -> to_avro -> writeStream.format("kafka")
    trigger(availableNow=True), local[2]

What Spark users run today: the Kafka sink is at-least-once (no transactions). The harness runs
this module as `python -m benchmarks.contenders.spark_ss ...`.

The connector jars (spark-sql-kafka-0-10_2.13, spark-avro_2.13) are resolved from Maven Central
with Maven (`mvn dependency:copy-dependencies`) into a cache directory and handed to Spark with
`spark.jars`. We would rather use `spark.jars.packages`, but Spark's Ivy resolution fails here:
the connectors are not on Maven Central for every pyspark release (e.g. 4.3.0), and
spark-sql-kafka's own dependency spark-token-provider-kafka-0-10 is missing for most 4.x
releases. So each artifact takes the installed pyspark version when Central has it, else the
newest release that is there (recorded in the results as `spark_connectors`).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import urllib.request
from pathlib import Path

from benchmarks.contenders import Contender, Job, Unavailable
from txstream.local.maven import Artifact, MavenError, resolve
from txstream.local.paths import cache_dir

CENTRAL = "https://repo1.maven.org/maven2"
# Newest first: tried after the installed pyspark version.
FALLBACKS = ["4.2.0", "4.1.1", "4.1.0", "4.0.2", "4.0.1", "4.0.0"]
ARTIFACTS = ["spark-sql-kafka-0-10_2.13", "spark-avro_2.13", "spark-token-provider-kafka-0-10_2.13"]


def _jar_exists(artifact: str, version: str) -> bool:
    url = f"{CENTRAL}/org/apache/spark/{artifact}/{version}/{artifact}-{version}.jar"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=20) as resp:
            return resp.status == 200
    except Exception:  # 404 or unreachable: try the next version
        return False


def connector_jars(progress=lambda _m: None) -> tuple[list[str], dict]:
    """Jars to add to Spark (those pyspark does not already ship), and the versions chosen."""
    import pyspark

    version = pyspark.__version__
    name = f"bench-spark-connectors-{version}"
    versions = cache_dir() / name / "versions.json"
    if versions.exists():
        chosen = json.loads(versions.read_text())
    else:
        if not shutil.which("mvn"):
            raise Unavailable("Maven (`mvn`) is needed to fetch Spark's Kafka and Avro connectors")
        chosen = {}
        for artifact in ARTIFACTS:
            for candidate in [version] + [v for v in FALLBACKS if v != version]:
                if _jar_exists(artifact, candidate):
                    chosen[artifact] = candidate
                    break
            else:
                raise Unavailable(f"no release of org.apache.spark:{artifact} for Spark 4 found on Maven Central")
        progress(f"  Spark connectors chosen on Maven Central: {chosen}")
    kafka, avro, token = ARTIFACTS
    artifacts = [
        # The token provider comes in alone: its release may differ from spark-sql-kafka's.
        Artifact("org.apache.spark", kafka, chosen[kafka],
                 exclusions=(("org.apache.spark", "spark-token-provider-kafka-0-10_2.13"),)),
        Artifact("org.apache.spark", token, chosen[token], exclusions=(("*", "*"),)),
        Artifact("org.apache.spark", avro, chosen[avro]),
    ]
    try:
        libs = resolve(name, artifacts, progress, what="Spark's Kafka and Avro connectors")
    except MavenError as exc:
        raise Unavailable(str(exc)) from exc
    versions.write_text(json.dumps(chosen))
    shipped = Path(pyspark.__file__).parent / "jars"
    have = {_artifact_name(p.name) for p in shipped.glob("*.jar")}
    ours = ("spark-sql-kafka", "spark-avro", "spark-token")
    jars = sorted(str(p) for p in libs.glob("*.jar") if _artifact_name(p.name) not in have or p.name.startswith(ours))
    return jars, chosen


def _artifact_name(jar: str) -> str:
    """'kafka-clients-3.9.2.jar' -> 'kafka-clients'."""
    parts = jar[:-4].split("-")
    while parts and parts[-1][:1].isdigit():
        parts.pop()
    return "-".join(parts)


class SparkStructuredStreaming(Contender):
    name = "spark-ss"
    label = "Spark Structured Streaming (at-least-once)"
    exactly_once = False

    def __init__(self) -> None:
        self.jars: list[str] = []
        self.chosen: dict = {}

    def prepare(self, progress) -> None:
        self.jars, self.chosen = connector_jars(progress)

    def command(self, job: Job) -> tuple[list[str], dict]:
        from benchmarks.common import ENRICHED_SCHEMA_PATH, ORDER_SCHEMA_PATH

        return ([sys.executable, "-m", "benchmarks.contenders.spark_ss",
                 "--bootstrap-servers", job.bootstrap, "--input", job.input_topic,
                 "--output", job.output_topic, "--group", job.group, "--workdir", job.workdir,
                 "--partitions", str(job.partitions), "--mode", job.mode, "--jars", ",".join(self.jars),
                 "--input-schema", str(ORDER_SCHEMA_PATH), "--output-schema", str(ENRICHED_SCHEMA_PATH)],
                self.base_env())

    def versions(self) -> dict:
        import pyspark

        return {"pyspark": pyspark.__version__, "spark_connectors": self.chosen}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    for opt in ("--bootstrap-servers", "--input", "--output", "--group", "--workdir", "--jars",
                "--input-schema", "--output-schema"):
        ap.add_argument(opt, required=True)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--mode", default="throughput")
    args = ap.parse_args(argv)
    # Before the session starts (Spark starts workers with the bare python3 otherwise).
    os.environ["PYSPARK_PYTHON"] = sys.executable

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro, to_avro

    spark = (SparkSession.builder.master("local[2]").appName(f"bench-{args.group}")
             .config("spark.jars", args.jars)
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", str(args.partitions))
             .config("spark.sql.streaming.checkpointLocation", os.path.join(args.workdir, "checkpoints"))
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    in_schema = Path(args.input_schema).read_text()
    out_schema = Path(args.output_schema).read_text()

    source = (spark.readStream.format("kafka")
              .option("kafka.bootstrap.servers", args.bootstrap_servers)
              .option("subscribe", args.input)
              .option("startingOffsets", "earliest")
              .option("groupIdPrefix", args.group)
              .load())
    orders = source.select(F.col("key"), from_avro(F.col("value"), in_schema).alias("o"))
    enriched = orders.where(F.col("o.amount") > 0).select(
        F.col("key"),
        to_avro(F.struct(
            F.col("o.id").alias("id"),
            F.col("o.customer_id").alias("customer_id"),
            (F.col("o.amount") * 100).cast("long").alias("amount_cents"),
            F.col("o.currency").alias("currency"),
            F.col("o.created_at").alias("created_at"),
            F.col("o.items").alias("items"),
            (F.col("o.amount") > 100).alias("is_large"),
        ), out_schema).alias("value"))
    writer = (enriched.writeStream.format("kafka")
              .option("kafka.bootstrap.servers", args.bootstrap_servers)
              .option("topic", args.output)
              .option("checkpointLocation", os.path.join(args.workdir, "checkpoint"))
              .outputMode("append"))
    if args.mode == "throughput":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="0 seconds")
    query = writer.start()
    try:
        query.awaitTermination()
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
