"""The task specs of a run, built once from RunSettings; per batch only the plans change."""
from __future__ import annotations

import os
import uuid
from dataclasses import replace

from txstream.settings import RunSettings
from txstream.task.spec import PartitionPlan, PublishSpec, ReadSpec


class TaskSpecs:
    """What every task of this run is given (task/spec.py), and where its files go."""

    def __init__(self, settings: RunSettings) -> None:
        s = settings
        # The readers' side files (task/sidefile.py): a directory of this name in each executor's
        # own local directory, one per run.
        self.side_dir = f"txstream-{s.app_id}-{uuid.uuid4().hex[:12]}"
        # Owner markers of cached producers (kafka/transactions.py), shared by the run's workers.
        # (relative: each host's own temporary directory).
        self.owner_dir = os.path.join("txstream-owners", s.app_id)
        self.read = ReadSpec(clients=s.clients, app_id=s.app_id, side_dir=self.side_dir,
                             key_schema=s.key_schema, value_schema=s.value_schema,
                             lenient_trailing_bytes=s.lenient_trailing_bytes, registry=s.schema_registry,
                             registry_keys=s.registry_keys)
        self.publish = PublishSpec(read=self.read, guarantee=s.guarantee,
                                   transaction_timeout_s=s.transaction_timeout_s, owner_dir=self.owner_dir,
                                   output_topic=s.output_topic, output_key_schema=s.output_key_schema,
                                   output_value_schema=s.output_value_schema,
                                   output_key_schema_id=s.output_key_schema_id,
                                   output_value_schema_id=s.output_value_schema_id,
                                   dead_letter_topic=s.dead_letter_topic, lineage=s.lineage,
                                   refused_topics=frozenset() if s.allow_output_to_input_topics
                                   else frozenset(s.input_topics))

        # Several input streams (Processor.inputs): each one's reader, with its own schemas.
        self.inputs = {i.name: replace(self.read, key_schema=i.key_schema, value_schema=i.value_schema)
                       for i in s.inputs}
        self.input_topics = {i.name: i.topics for i in s.inputs}

    def for_inputs(self, batch_id: int, plans: list[PartitionPlan]) -> dict[str, ReadSpec] | None:
        """Each input stream's readers' spec for a batch over `plans`: the plans of its topics."""
        if not self.inputs:
            return None
        return {name: spec.with_batch(batch_id, [p for p in plans if p.topic in self.input_topics[name]])
                for name, spec in self.inputs.items()}

    def for_reading(self, batch_id: int, plans: list[PartitionPlan], layout: tuple[int, ...] = (),
                    slot_width: int = 1) -> ReadSpec:
        return self.read.with_batch(batch_id, plans, layout, slot_width)

    def for_publishing(self, batch_id: int, plans: list[PartitionPlan], group_metadata: bytes | None,
                       layout: tuple[int, ...] = (), slot_width: int = 1, fence_all: bool = False) -> PublishSpec:
        return self.publish.with_batch(batch_id, plans, group_metadata, layout, slot_width, fence_all)
