"""The order enricher (the README's example): Avro in, filter, computed columns, Avro out."""
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from txstream import Processor


class EnrichOrders(Processor):
    input_topics = ["orders"]
    output_topic = "orders-enriched"
    value_schema = "schemas/order.avsc"
    output_value_schema = "schemas/order_enriched.avsc"
    dead_letter_topic = "orders-dead-letters"

    def transform(self, batch: DataFrame) -> DataFrame:
        orders = batch.where(F.col("value.amount") > 0)
        return orders.select(
            F.col("key"),
            F.struct(
                F.col("value.id").alias("id"),
                F.col("value.customer_id").alias("customer_id"),
                (F.col("value.amount") * 100).cast("long").alias("amount_cents"),
                F.col("value.currency").alias("currency"),
                F.col("value.created_at").alias("created_at"),
                F.col("value.items").alias("items"),
                (F.col("value.amount") > 100).alias("is_large"),
            ).alias("value"))
