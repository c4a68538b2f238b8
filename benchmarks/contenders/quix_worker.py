"""The Quix Streams application (runs under benchmarks/.venv-quix; no imports from txstream).

In --mode latency the commit interval is 100 ms (like the hand-written loop) instead of Quix's
default 5 s, otherwise every record would wait for the next commit of an exactly-once
transaction.
"""
from __future__ import annotations

import argparse
import io
import json
import logging
import sys

import fastavro
from quixstreams import Application
from quixstreams.models import Deserializer, Serializer


class AvroDeserializer(Deserializer):
    def __init__(self, schema):
        super().__init__()
        self.schema = schema

    def __call__(self, value: bytes, ctx):
        return fastavro.schemaless_reader(io.BytesIO(value), self.schema, None)


class AvroSerializer(Serializer):
    def __init__(self, schema):
        self.schema = schema

    def __call__(self, value, ctx) -> bytes:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, self.schema, value)
        return buf.getvalue()


def enrich(order: dict) -> dict:
    amount = order["amount"]
    return {"id": order["id"], "customer_id": order["customer_id"],
            "amount_cents": int(amount * 100), "currency": order["currency"],
            "created_at": order["created_at"], "items": order["items"], "is_large": amount > 100}


def main() -> int:
    ap = argparse.ArgumentParser()
    for opt in ("--bootstrap-servers", "--input", "--output", "--group", "--state-dir",
                "--input-schema", "--output-schema"):
        ap.add_argument(opt, required=True)
    ap.add_argument("--mode", default="throughput")
    args = ap.parse_args()
    in_schema = fastavro.parse_schema(json.load(open(args.input_schema)))
    out_schema = fastavro.parse_schema(json.load(open(args.output_schema)))

    extra = {"commit_interval": 0.1} if args.mode == "latency" else {}
    app = Application(broker_address=args.bootstrap_servers, consumer_group=args.group,
                      auto_offset_reset="earliest", processing_guarantee="exactly-once",
                      state_dir=args.state_dir, loglevel="WARNING", use_changelog_topics=False,
                      **extra)
    source = app.topic(args.input, key_deserializer="bytes", value_deserializer=AvroDeserializer(in_schema))
    sink = app.topic(args.output, key_serializer="bytes", value_serializer=AvroSerializer(out_schema))
    sdf = app.dataframe(source)
    sdf = sdf.filter(lambda order: order["amount"] > 0)
    sdf = sdf.apply(enrich)
    sdf.to_topic(sink)
    app.run()
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main())
