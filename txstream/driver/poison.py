"""Isolating a record that makes the transform fail, so it never blocks its partition.

A row-level error inside a DataFrame transform (a UDF that raises, an ANSI cast or division
error) fails the whole Spark task: Spark cannot say which row. When a batch fails, the driver
re-runs its transform without publishing (a dry run). If the dry run fails too, the failure is
in the data, not in Kafka: the driver bisects each partition's range with dry runs down to the
first failing record, publishes the good records before it as a normal batch, and sends the
failing record to the dead-letter topic (stage `transform`) in a transaction that also moves
the offset past it. What is caught: any error raised while the transform computes a row. What
is not: errors that do not depend on the data (a wrong column name fails validation at start).
"""
from __future__ import annotations

import re
import time
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Iterator

import pyarrow as pa
from confluent_kafka import Consumer, TopicPartition

from txstream.driver.planning import PartitionPlan

if TYPE_CHECKING:
    from txstream.driver.loop import Driver

# Failures that come from Kafka or the publishing protocol, never from the data.
_INFRASTRUCTURE = ("KafkaException", "KafkaError", "FencedError", "AbortableError", "TimeoutError",
                   "InjectedFault", "Connection refused", "BrokerError")


def _count_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    total = sum(batch.num_rows for batch in batches)
    yield pa.RecordBatch.from_pylist([{"rows": total}], schema=pa.schema([("rows", pa.int64())]))


def error_line(text: str) -> str:
    """The 'SomeError: message' line of an error that crossed the JVM boundary."""
    matches = re.findall(r"^\s*([A-Za-z_.]*(?:Error|Exception)[A-Za-z_]*: .+)$", text, re.MULTILINE)
    python_side = [m for m in matches if not m.lstrip().startswith(("org.", "java.", "py4j.", "pyspark.errors"))]
    chosen = (python_side or matches or [text.strip().splitlines()[0] if text.strip() else "unknown error"])[-1]
    return chosen.strip()[:1000]


class PoisonIsolator:
    def __init__(self, driver: Driver) -> None:
        self.driver = driver

    def dry_run(self, plans: list[PartitionPlan]) -> str | None:
        """None when the transform computes every row of `plans`; else the error text."""
        try:
            self.driver.output_frame(plans).mapInArrow(_count_rows, "rows long").collect()
            return None
        except Exception as exc:  # noqa: BLE001 - classified by the caller
            return str(exc)

    def is_data_error(self, text: str) -> bool:
        return not any(marker in text for marker in _INFRASTRUCTURE)

    def first_failing_offset(self, plan: PartitionPlan) -> tuple[int, str] | None:
        """Bisect `plan`'s range with dry runs: (offset of the first failing record, its error)."""
        error = self.dry_run([plan])
        if error is None or not self.is_data_error(error):
            return None
        lo, hi = plan.start, plan.end
        while hi - lo > 1:
            mid = (lo + hi) // 2
            left = self.dry_run([replace(plan, end=mid)])
            if left is not None and self.is_data_error(left):
                hi, error = mid, left
            else:
                lo = mid
        return lo, error

    def isolate(self, plans: list[PartitionPlan], commits, echo: Callable[[str], None]) -> bool:  # noqa: ANN001
        """Publish around the first poison record of each failing partition. True if any was found."""
        error = self.dry_run(plans)
        if error is None or not self.is_data_error(error):
            return False  # the data computes: the failure was Kafka's, retry the batch
        found = False
        for plan in plans:
            hit = self.first_failing_offset(plan)
            if hit is None:
                continue
            found = True
            offset, error = hit
            message = error_line(error)
            if offset > plan.start:
                self.driver.run_batch([replace(plan, end=offset)], commits)
            self._dead_letter(plan, offset, message)
            echo(f"{plan.topic}[{plan.partition}]@{offset} failed in the transform ({message}); "
                 f"sent to {self.driver.settings.dead_letter_topic}")
        return found

    def _dead_letter(self, plan: PartitionPlan, offset: int, message: str) -> None:
        from txstream.task.publish import STALE_PLAN, PoisonRecordError, publish_dead_letter

        driver = self.driver
        if not driver.settings.dead_letter_topic:
            raise PoisonRecordError(
                f"record {plan.topic}[{plan.partition}]@{offset} failed in the transform: {message}. "
                "Declare a dead_letter_topic on the processor (or --dead-letter-topic) to set such "
                "records aside; nothing from this record on was published.")
        record = self._raw_record(plan, offset, message)
        committed = driver.membership.committed([TopicPartition(plan.topic, plan.partition)])
        current = committed.get((plan.topic, plan.partition))
        spec = driver._publish_spec([plan], driver.membership.group_metadata())
        status = publish_dead_letter(spec, replace(plan, committed=current).to_dict(), record, driver.membership)
        if status == STALE_PLAN:
            raise RuntimeError(f"{plan.topic}[{plan.partition}] moved on while isolating offset {offset}")

    def _raw_record(self, plan: PartitionPlan, offset: int, message: str, timeout: float = 30) -> tuple:
        s = self.driver.settings
        consumer = Consumer({"bootstrap.servers": s.bootstrap_servers, "group.id": f"{s.app_id}-poison-{uuid.uuid4().hex[:6]}",
                             "isolation.level": "read_committed", "enable.auto.commit": False,
                             **{k: v for k, v in s.consumer_config.items() if k.startswith(("security.", "sasl.", "ssl."))}})
        consumer.assign([TopicPartition(plan.topic, plan.partition, offset)])
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is None or msg.error():
                    continue
                if msg.offset() == offset:
                    return (msg.key(), msg.value(), msg.headers(), msg.timestamp()[1], offset, "transform", message)
        finally:
            consumer.close()
        raise TimeoutError(f"could not read {plan.topic}[{plan.partition}]@{offset} to dead-letter it")
