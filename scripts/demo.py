"""`make demo`: start the local broker, show what txstream's guarantees rest on, stop the broker."""
from __future__ import annotations

import os
import sys

from txstream.broker_check import transaction_round_trip
from txstream.local_broker import BrokerError, LocalKafkaCluster, free_port_block


def main() -> int:
    port = int(os.environ.get("DEMO_PORT") or free_port_block(1))
    cluster = LocalKafkaCluster(port=port, data_dir=f"/tmp/txstream-demo-{port}")
    try:
        bootstrap = cluster.start(progress=print)
    except BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        result = transaction_round_trip(bootstrap)
        print(result.report())
        return 0 if result.ok else 1
    finally:
        cluster.destroy()
        print("Kafka stopped.")


if __name__ == "__main__":
    sys.exit(main())
