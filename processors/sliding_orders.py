"""State across batches (docs/state.md): orders per currency in 5-minute windows sliding every
minute (each order counts in five windows), 30-second watermark, append mode."""
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from txstream import Processor


class SlidingOrders(Processor):
    input_topics = ["orders"]
    output_topic = "orders-per-currency-5m"
    value_schema = "schemas/order.avsc"
    output_value_schema = "schemas/currency_window.avsc"
    dead_letter_topic = "orders-dead-letters"
    output_mode = "append"

    def transform(self, batch: DataFrame) -> DataFrame:
        w = (batch.select("value.created_at", "value.currency", "value.amount")
             .withWatermark("created_at", "30 seconds")
             .groupBy(F.window("created_at", "5 minutes", "1 minute"), "currency")
             .agg(F.count("*").alias("orders"), F.sum("amount").alias("amount")))
        return w.select(F.col("currency").cast("binary").alias("key"),
                        F.struct(F.col("window.start").alias("start"), F.col("window.end").alias("end"),
                                 "currency", "orders", "amount").alias("value"))
