"""Stream-stream joins over two input streams (issue 61): orders (schemas/order.avsc) matched with
their payments (schemas/payment.avsc) within an hour, as Structured Streaming code writes it."""
from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

from pyspark.sql import functions as F

from tests.support.kafka import avro_bytes, produce
from txstream import Input, Processor
from txstream.serde.avro import load_schema

ORDER_SCHEMA, PAYMENT_SCHEMA = "schemas/order.avsc", "schemas/payment.avsc"
ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)


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


def _order(i: int, at: datetime) -> dict:
    return {"id": f"o{i}", "customer_id": "c", "amount": float(i), "currency": "EUR", "created_at": at, "items": 1,
            "note": None}


def seed_orders_and_payments(bootstrap: str, orders: str, payments: str, first: int, count: int) -> dict[str, float]:
    """Orders a minute apart; two in three paid 20 minutes after (their amount i + 0.5)."""
    order_schema, payment_schema = load_schema(str(ROOT / ORDER_SCHEMA)), load_schema(str(ROOT / PAYMENT_SCHEMA))
    made, paid = [], {}
    for i in range(first, first + count):
        at = T0 + timedelta(minutes=i)
        made.append((f"o{i}".encode(), avro_bytes(order_schema, _order(i, at))))
        if i % 3:
            paid[f"o{i}"] = i + 0.5
    produce(bootstrap, orders, made)
    produce(bootstrap, payments, [(o.encode(), avro_bytes(payment_schema, {"order_id": o, "amount": amount,
                                   "paid_at": T0 + timedelta(minutes=int(o[1:]) + 20)})) for o, amount in paid.items()])
    return paid
