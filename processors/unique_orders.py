"""State across batches (docs/state.md): orders deduplicated by id within 10 minutes of event
time (a checkout that retried sends the same order twice). The first copy is kept, once."""
from pyspark.sql import DataFrame

from txstream import Processor


class UniqueOrders(Processor):
    input_topics = ["orders"]
    output_topic = "unique-orders"
    value_schema = "schemas/order.avsc"
    output_value_schema = "schemas/order.avsc"
    dead_letter_topic = "orders-dead-letters"
    output_mode = "append"

    def transform(self, batch: DataFrame) -> DataFrame:
        orders = batch.select("key", "value", "value.id", "value.created_at")
        unique = orders.withWatermark("created_at", "10 minutes").dropDuplicatesWithinWatermark(["id"])
        return unique.select("key", "value")
