"""Stream-stream joins over two input streams (issue 61): orders (schemas/order.avsc) matched with
their payments (schemas/payment.avsc) within an hour, as Structured Streaming code writes it."""
from __future__ import annotations

import os

from pyspark.sql import functions as F

from txstream import Input, Processor

ORDER_SCHEMA, PAYMENT_SCHEMA = "schemas/order.avsc", "schemas/payment.avsc"


class OrdersWithPayments(Processor):
    """Each order with its payment within an hour of it, or alone (null payment) once the
    watermark proves none can come: a left outer join."""

    inputs = {"orders": Input(["orders"], value_schema=ORDER_SCHEMA),
              "payments": Input(["payments"], value_schema=PAYMENT_SCHEMA)}
    how = "leftOuter"

    def transform(self, orders, payments):
        o = orders.select(F.col("value.id").alias("o_id"), F.col("value.created_at").alias("o_ts"))
        p = payments.select(F.col("value.order_id").alias("p_id"), F.col("value.paid_at").alias("p_ts"),
                            F.col("value.amount").alias("p_amount"))
        joined = o.withWatermark("o_ts", "10 minutes").join(
            p.withWatermark("p_ts", "20 minutes"),
            F.expr("o_id = p_id AND p_ts BETWEEN o_ts AND o_ts + interval 1 hour"), self.how)
        return joined.select(F.col("o_id").cast("binary").alias("key"),
                             F.to_json(F.struct("o_id", "p_amount")).cast("binary").alias("value"))


class OrdersWithPaymentsFromEnv(OrdersWithPayments):
    """The same join, its topics named by TXSTREAM_TEST_ORDERS / TXSTREAM_TEST_PAYMENTS (a
    `txstream run` subprocess of a chaos test)."""

    inputs = {"orders": Input([os.environ.get("TXSTREAM_TEST_ORDERS", "orders")], value_schema=ORDER_SCHEMA),
              "payments": Input([os.environ.get("TXSTREAM_TEST_PAYMENTS", "payments")], value_schema=PAYMENT_SCHEMA)}
