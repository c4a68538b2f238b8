"""1:n fan-out: one output record per item of an order (explode), keyed by order id."""
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from txstream import Processor


class FanOutItems(Processor):
    input_topics = ["orders"]
    output_topic = "order-items"
    value_schema = "schemas/order.avsc"
    output_value_schema = "schemas/order_item.avsc"

    def transform(self, batch: DataFrame) -> DataFrame:
        lines = batch.select(F.col("value.id").alias("order_id"), F.col("value.amount").alias("amount"),
                             F.explode(F.sequence(F.lit(1), F.col("value.items"))).alias("line"),
                             F.col("value.items").alias("items"))
        return lines.select(
            F.col("order_id").cast("binary").alias("key"),
            F.struct("order_id", "line",
                     (F.col("amount") / F.col("items")).alias("line_amount")).alias("value"))
