"""State across batches (docs/state.md): each customer's shopping sessions — orders no more than
30 seconds apart — with how many orders and their amount, emitted once a session has ended (the
watermark passed its last order plus the gap). Session windows merge across batches: a session
that a batch boundary cut in two is one session."""
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from txstream import Processor


class CustomerSessions(Processor):
    input_topics = ["orders"]
    output_topic = "customer-sessions"
    value_schema = "schemas/order.avsc"
    dead_letter_topic = "orders-dead-letters"
    output_mode = "append"

    def transform(self, batch: DataFrame) -> DataFrame:
        sessions = (batch.select("value.created_at", "value.customer_id", "value.amount")
                    .withWatermark("created_at", "10 seconds")
                    .groupBy(F.session_window("created_at", "30 seconds"), "customer_id")
                    .agg(F.count("*").alias("orders"), F.sum("amount").alias("amount")))
        return sessions.select(F.col("customer_id").alias("key"), F.to_json(F.struct(
            F.col("session_window.start").alias("start"), F.col("session_window.end").alias("end"),
            "customer_id", "orders", "amount")).alias("value"))
