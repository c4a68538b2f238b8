"""A stream joined to a table kept from a compacted topic (docs/joins.md): each order with its
customer's name and tier, as the `customers` topic held them when the batch was planned.

    txstream run processors/orders_with_customer_table.py:OrdersWithCustomerTable --table customers=TOPIC
"""
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from txstream import Processor, Table


class OrdersWithCustomerTable(Processor):
    input_topics = ["orders"]
    output_topic = "orders-with-customer"
    value_schema = "schemas/order.avsc"
    output_value_schema = "schemas/order_with_customer.avsc"
    tables = {"customers": Table("customers", value_schema="schemas/customer.avsc")}

    def transform(self, orders: DataFrame, customers: DataFrame) -> DataFrame:
        c = customers.select(F.col("value.customer_id").alias("c_id"), F.col("value.name").alias("name"),
                             F.col("value.tier").alias("tier"))
        joined = orders.join(c, F.col("value.customer_id") == F.col("c_id"), "left")
        return joined.select(
            F.col("key"),
            F.struct(F.col("value.id").alias("id"), F.col("value.customer_id").alias("customer_id"),
                     F.col("value.amount").alias("amount"), F.col("name"), F.col("tier")).alias("value"),
            F.col("offset"))
