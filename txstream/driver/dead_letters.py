"""A narrow run's poison record, set aside by the driver (poison isolation, driver/poison.py):
the record to the dead-letter topic and its partition's offset moved past it.

It runs with a publishing task's protocol (docs/architecture.md §3.4), through the transaction
engine (kafka/transactions.py): under exactly-once the partition's transactional.ids are
initialised (fencing any zombie of the slot), the committed offset is checked, and the dead letter
and the next offset are one transaction. The weaker guarantees produce it, then the member commits.
"""
from __future__ import annotations

from typing import Any

from confluent_kafka import TopicPartition

from txstream.constants import COMMITTED, EXACTLY_ONCE, STALE_PLAN
from txstream.kafka import transactions
from txstream.kafka.transactions import CallableTransaction, publish_plain
from txstream.records import DeadLetter
from txstream.task.publish import current_offsets, fence_pool, range_collector
from txstream.task.spec import PartitionPlan, PublishSpec


def publish_dead_letter(spec: PublishSpec, plan: PartitionPlan, record: DeadLetter, membership: Any) -> str:
    """`record` (the poison record, as read) to the dead-letter topic, the partition's
    committed offset past it. COMMITTED, or STALE_PLAN when the committed offset is not the
    record's (the partition moved on meanwhile: nothing is published)."""
    offset = record.offset
    next_offset = [TopicPartition(plan.topic, plan.partition, offset + 1)]

    def produce(producer: Any) -> None:
        range_collector(spec, plan, producer).add_dead_letter(spec.dead_letter_topic, record, spec.app_id)

    if spec.guarantee != EXACTLY_ONCE:
        publish_plain(spec.producer_config(transactional=False), produce, spec.timeout_s,
                      f"the dead letter of {plan.topic}[{plan.partition}]@{offset}")
        membership.commit(next_offset)
        return COMMITTED
    publisher = fence_pool(spec, plan.transactional_ids, plan.transactional_id)
    try:
        if current_offsets(spec, [plan])[0] != offset:
            return STALE_PLAN
        transactions.run(CallableTransaction(produce, lambda: (next_offset, spec.group_metadata)), publisher,
                         fresh=True, renew=None)
        return COMMITTED
    finally:
        publisher.close()
