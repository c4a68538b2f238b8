"""A wide processor: per batch, each customer's orders counted and summed (groupBy().agg()).

Keyed by customer: the key routes each customer's totals to one output unit (and one output
partition), docs/wide-transforms.md. `batch_timestamp` is the batch's logged time, the same on
every re-run of the batch, where `current_timestamp()` would differ (and is refused)."""
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from txstream import Processor


class CustomerTotals(Processor):
    input_topics = ["orders"]
    output_topic = "customer-totals"
    value_schema = "schemas/order.avsc"
    output_value_schema = "schemas/customer_totals.avsc"
    dead_letter_topic = "orders-dead-letters"
    output_mode = "per-batch"   # each batch alone (docs/state.md); "update" keeps totals so far

    def transform(self, batch: DataFrame) -> DataFrame:
        totals = (batch.where(F.col("value.amount") > 0)
                  .groupBy(F.col("value.customer_id").alias("customer_id"))
                  .agg(F.count("*").alias("orders"), F.sum("value.amount").alias("amount"),
                       F.sum("value.items").cast("long").alias("items")))
        return totals.select(
            F.col("customer_id").alias("key"),
            F.struct("customer_id", F.lit(self.batch_timestamp).alias("batch_time"), "orders", "amount",
                     "items").alias("value"))
