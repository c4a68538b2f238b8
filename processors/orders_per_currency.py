"""State across batches (docs/state.md): orders per currency per 1-minute tumbling window of event
time, under a 30-second watermark. Append mode: each (window, currency) is emitted once, when the
watermark passes the window's end; an order behind the watermark goes to the dead-letter topic
(stage `late`). Structured Streaming's own code, run exactly-once."""
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from txstream import Processor


class OrdersPerCurrency(Processor):
    input_topics = ["orders"]
    output_topic = "orders-per-currency"
    value_schema = "schemas/order.avsc"
    output_value_schema = "schemas/currency_window.avsc"
    dead_letter_topic = "orders-dead-letters"
    output_mode = "append"

    def transform(self, batch: DataFrame) -> DataFrame:
        w = (batch.select("value.created_at", "value.currency", "value.amount")
             .withWatermark("created_at", "30 seconds")
             .groupBy(F.window("created_at", "1 minute"), "currency")
             .agg(F.count("*").alias("orders"), F.sum("amount").alias("amount")))
        return w.select(F.col("currency").cast("binary").alias("key"),
                        F.struct(F.col("window.start").alias("start"), F.col("window.end").alias("end"),
                                 "currency", "orders", "amount").alias("value"))
