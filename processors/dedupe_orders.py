"""A wide processor: orders whose id repeats within a batch are published once (dropDuplicates).

Duplicates are dropped on the whole order (the id and every field), so which copy survives does
not matter: `dropDuplicates(["id"])` alone would keep an arbitrary copy of orders that differ in
other fields, which txstream refuses for a wide transform (docs/wide-transforms.md §4)."""
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from txstream import Processor


class DedupeOrders(Processor):
    input_topics = ["orders"]
    output_topic = "orders-deduplicated"
    value_schema = "schemas/order.avsc"
    output_value_schema = "schemas/order.avsc"
    dead_letter_topic = "orders-dead-letters"
    output_mode = "per-batch"   # each batch alone (docs/state.md); "update" keeps totals so far

    def transform(self, batch: DataFrame) -> DataFrame:
        return batch.select(F.col("value.id").alias("key"), F.col("value")).dropDuplicates(["key", "value"])
