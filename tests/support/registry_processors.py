"""Processors and input for the schema-registry tests: no .avsc files anywhere, the input's schema
comes from the registry (the subject's latest), the output's is inline and registered at start."""
from __future__ import annotations

import json

from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from txstream import Processor

PRICED = {"type": "record", "name": "Priced", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "cents", "type": "long"},
    {"name": "currency", "type": "string"}]}
# The same subject, a field's type changed: no compatibility rule accepts it.
PRICED_INCOMPATIBLE = {"type": "record", "name": "Priced", "namespace": "shop", "fields": [
    {"name": "id", "type": "string"},
    {"name": "cents", "type": "boolean"},
    {"name": "currency", "type": "string"}]}


class PriceOrders(Processor):
    """Reads whichever Order version each record was written with, as the subject's latest."""

    output_value_schema = json.dumps(PRICED)
    one_to_one = True

    def transform(self, batch: DataFrame) -> DataFrame:
        return batch.select("key", "offset", F.struct(
            F.col("value.id").alias("id"),
            F.round(F.col("value.amount") * 100).cast("long").alias("cents"),
            F.col("value.currency").alias("currency")).alias("value"))


class PriceOrdersIncompatibly(PriceOrders):
    output_value_schema = json.dumps(PRICED_INCOMPATIBLE)

    def transform(self, batch: DataFrame) -> DataFrame:
        return batch.select("key", "offset", F.struct(
            F.col("value.id").cast("string").alias("id"), F.lit(True).alias("cents"),
            F.col("value.currency").alias("currency")).alias("value"))


CUSTOMER_KEY = {"type": "record", "name": "CustomerKey", "namespace": "shop",
                "fields": [{"name": "customer", "type": "string"}]}


class PriceOrdersByCustomer(PriceOrders):
    """Keys registry-framed too (TOPIC-key): the output key is the decoded key's field."""

    def transform(self, batch: DataFrame) -> DataFrame:
        priced = super().transform(batch)
        return priced.withColumn("key", F.col("key.customer"))


def produce_orders(bootstrap: str, registry_url: str, topic: str, orders: list[tuple[dict, dict]],
                   partitions: int, keyed: bool = False) -> None:
    """`orders`: (schema, value) pairs, serialized by confluent-kafka's own AvroSerializer (which
    registers each schema under TOPIC-value), order i into partition i mod `partitions`. `keyed`:
    keys framed too, a CustomerKey registered under TOPIC-key."""
    client = SchemaRegistryClient({"url": registry_url})
    serializers: dict[str, AvroSerializer] = {}
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20})
    context = SerializationContext(topic, MessageField.VALUE)
    key_context = SerializationContext(topic, MessageField.KEY)
    keys = AvroSerializer(client, json.dumps(CUSTOMER_KEY)) if keyed else None
    for i, (schema, value) in enumerate(orders):
        text = json.dumps(schema)
        serializer = serializers.get(text)
        if serializer is None:
            serializer = serializers[text] = AvroSerializer(client, text)
        key = (keys({"customer": f"c{value['id'] % 7}"}, key_context) if keys is not None
               else f"o{value['id']}".encode())
        producer.produce(topic, serializer(value, context), key, partition=i % partitions)
        producer.poll(0)
    assert producer.flush(60) == 0
