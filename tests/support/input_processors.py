"""Processors of several input streams (Processor.inputs), for tests/driver/test_inputs.py:
orders in Avro (schemas/order.avsc, key = order id) and returns as raw text (key = order id,
value = the reason)."""
from __future__ import annotations

from pyspark.sql import functions as F

from txstream import Input, Processor


class OrdersAndReturns(Processor):
    """Per batch: both streams in one shape, `order:<id>` or `return:<id>:<reason>`."""

    inputs = {"orders": Input(["orders"], value_schema="schemas/order.avsc"), "returns": Input(["returns"])}

    def transform(self, orders, returns):
        o = orders.select("key", F.concat(F.lit("order:"), F.col("value.id")).cast("binary").alias("value"))
        r = returns.select("key", F.concat(F.lit(b"return:"), F.col("key"), F.lit(b":"), F.col("value")).alias("value"))
        return o.unionByName(r)


class EventsPerOrder(Processor):
    """Stateful over the union: per order id, how many of its events (an order, its returns) so far."""

    inputs = {"orders": Input(["orders"], value_schema="schemas/order.avsc"), "returns": Input(["returns"])}
    output_mode = "update"

    def transform(self, orders, returns):
        events = orders.select(F.col("value.id").alias("id")).unionByName(
            returns.select(F.col("key").cast("string").alias("id")))
        counts = events.groupBy("id").count()
        return counts.select(F.col("id").cast("binary").alias("key"),
                             F.concat(F.col("id"), F.lit("="), F.col("count").cast("string")).cast("binary")
                             .alias("value"))


class JoinsItsStreams(Processor):
    """A left outer join of the two streams with no watermark: refused at start, as Structured
    Streaming refuses it (its rows would wait forever for a partner)."""

    inputs = {"orders": Input(["orders"], value_schema="schemas/order.avsc"), "returns": Input(["returns"])}

    def transform(self, orders, returns):
        joined = orders.join(returns, orders["key"] == returns["key"], "leftOuter")
        return joined.select(orders["key"], returns["value"])
