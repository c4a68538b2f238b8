"""A router: each order goes to the topic of its currency through the `topic` column."""
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from txstream import Processor


class RouteByCurrency(Processor):
    input_topics = ["orders"]
    output_topic = "orders-other"          # rows whose `topic` is null go here
    value_schema = "schemas/order.avsc"
    topic_prefix = "orders-"
    routed = ("EUR", "USD")

    def transform(self, batch: DataFrame) -> DataFrame:
        currency = F.col("value.currency")
        topic = (F.when(currency.isin(*self.routed), F.concat(F.lit(self.topic_prefix), F.lower(currency)))
                 .otherwise(F.lit(None)))
        # A string `value` is published as UTF-8: here the order as JSON text.
        return batch.select("key", topic.alias("topic"),
                            F.to_json(F.col("value")).alias("value"))
