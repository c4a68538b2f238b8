"""A wide processor: a stream-static shuffled join (each order with its customer's segment).

The customers table is built in `setup()`; the `shuffle_hash` hint keeps Spark from
broadcasting it, as a table too large to broadcast would: both sides are shuffled by
customer_id, which makes the transform wide (docs/wide-transforms.md)."""
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from txstream import Processor

SEGMENTS = ["retail", "business", "staff", "partner"]


class OrdersWithCustomers(Processor):
    input_topics = ["orders"]
    output_topic = "orders-with-customers"
    value_schema = "schemas/order.avsc"
    dead_letter_topic = "orders-dead-letters"

    def setup(self, spark) -> None:
        self.customers = spark.range(0, 100_000).select(
            F.format_string("customer-%06d", F.col("id")).alias("customer_id"),
            F.element_at(F.array(*[F.lit(s) for s in SEGMENTS]), (F.col("id") % len(SEGMENTS) + 1).cast("int"))
            .alias("segment"))

    def transform(self, batch: DataFrame) -> DataFrame:
        orders = batch.select(F.col("key"), F.col("value.*"))
        joined = orders.join(self.customers.hint("shuffle_hash"), "customer_id", "left")
        return joined.select(
            F.col("key"),
            F.to_json(F.struct("id", "customer_id", "amount", "currency", F.coalesce("segment", F.lit("unknown"))
                               .alias("segment"))).alias("value"))
