"""Processors that join their stream to a table kept from a compacted topic (Processor.tables),
for tests/driver/test_tables.py. Orders: key = customer id, value = order id; customers: key =
customer id, value = name. A test gives the table's topic with `txstream run --table
customers=TOPIC`, or a subclass's own `tables`."""
from __future__ import annotations

from pyspark.sql import functions as F

from txstream import Processor, Table


class EnrichFromTable(Processor):
    """Narrow: each order with its customer's name as of the batch's version ("-" when none)."""

    tables = {"customers": Table("customers")}
    how = "left"

    def transform(self, orders, customers):
        joined = orders.join(customers.select(F.col("key").alias("c_key"), F.col("value").alias("name")),
                             orders["key"] == F.col("c_key"), self.how)
        value = F.concat(orders["value"], F.lit(b"="), F.coalesce(F.col("name"), F.lit(b"-")))
        return joined.select(orders["key"], value.alias("value"), orders["offset"])


class NamesPerBatch(Processor):
    """Wide (a per-batch aggregation): how many of the batch's orders each customer name has."""

    tables = {"customers": Table("customers")}
    output_mode = "per-batch"

    def transform(self, orders, customers):
        joined = orders.join(customers.select(F.col("key").alias("c_key"), F.col("value").alias("name")),
                             orders["key"] == F.col("c_key"), "left")
        counts = joined.groupBy(F.coalesce(F.col("name"), F.lit(b"-")).alias("name")).count()
        return counts.select(F.col("name").alias("key"),
                             F.concat(F.col("name"), F.lit(b"="), F.col("count").cast("string").cast("binary"))
                             .alias("value"))


class RunningNames(NamesPerBatch):
    """Stateful after the join (a table join, then a running aggregate): orders per name so far."""

    output_mode = "update"


class EnrichWide(EnrichFromTable):
    """EnrichFromTable through the wide protocol (a shuffle by key): each batch's plan, and the
    table's version with it, logged and re-run after a crash."""

    def transform(self, orders, customers):
        return super().transform(orders, customers).repartition(3, "key")


class EnrichFromAvroTable(Processor):
    """The customers table in Avro (schemas/customer.avsc): each order with its customer's name."""

    tables = {"customers": Table("customers", value_schema="schemas/customer.avsc")}

    def transform(self, orders, customers):
        c = customers.select(F.col("key").alias("c_key"), F.col("value.name").alias("name"))
        joined = orders.join(c, orders["key"] == F.col("c_key"), "left")
        return joined.select(orders["key"], F.concat(orders["value"], F.lit(b"="), F.col("name").cast("binary"))
                             .alias("value"))
