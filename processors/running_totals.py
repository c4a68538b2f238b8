"""State across batches (docs/state.md): each customer's orders since the app began, emitted in
update mode (a customer's new totals whenever a batch changed them). Keyed by customer, so a
compacted output topic holds every customer's latest totals."""
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from txstream import Processor


class RunningTotals(Processor):
    input_topics = ["orders"]
    output_topic = "customer-running-totals"
    value_schema = "schemas/order.avsc"
    output_value_schema = "schemas/customer_running_total.avsc"
    dead_letter_topic = "orders-dead-letters"
    output_mode = "update"

    def transform(self, batch: DataFrame) -> DataFrame:
        totals = (batch.where(F.col("value.amount") > 0)
                  .groupBy(F.col("value.customer_id").alias("customer_id"))
                  .agg(F.count("*").alias("orders"), F.sum("value.amount").alias("amount"),
                       F.max("value.amount").alias("largest")))
        return totals.select(F.col("customer_id").alias("key"),
                             F.struct("customer_id", "orders", "amount", "largest").alias("value"))
