"""The processor's tables on the driver (Processor.tables; their tasks: task/tables.py): each
batch's version read from the table topics, and each table's DataFrame, built once.

A table's frame has one Spark partition per topic partition; its tasks read the version their
batch's job carries (task/spec.py JobSpec.tables), so a narrow batch's job serves every batch of
its shape with the table as of each batch, and a wide batch re-run joins against the version its
plan logged (driver/wide.py).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

from confluent_kafka import IsolationLevel
from confluent_kafka.admin import OffsetSpec

from txstream.errors import TableChangedError, TransformError, TransientKafkaError, topic_missing
from txstream.kafka.lookups import cluster_topics, list_offsets
from txstream.settings import RunSettings
from txstream.task.spec import FromJob, ReadSpec
from txstream.task.tables import TableReads, TableVersion, read_table, table_arrow_schema


class Tables:
    """The run's tables: their partitions, versions and frames."""

    def __init__(self, settings: RunSettings, admin: Callable[[], Any], read: ReadSpec) -> None:
        self.settings, self.admin, self.read = settings, admin, read   # admin(): the run's current client
        self.sources = settings.tables
        self._partitions: dict[str, int] | None = None
        self._frames: dict[str, Any] | None = None

    def __bool__(self) -> bool:
        return bool(self.sources)

    def partitions(self) -> dict[str, int]:
        """Each table's number of partitions, looked up once (the run checked at start that
        each table topic exists: driver/loop.py check_topics)."""
        if self._partitions is None:
            counts = cluster_topics(self.admin(), timeout=30)
            missing = [s.topic for s in self.sources if not counts.get(s.topic)]
            if missing:
                raise TransformError(topic_missing("table", missing[0], others=[("table", t) for t in missing[1:]]))
            self._partitions = {s.name: counts[s.topic] for s in self.sources}
        return self._partitions

    def current(self) -> tuple[TableVersion, ...]:
        """The version a batch planned now reads: each table partition's last stable offset."""
        if not self.sources:
            return ()
        counts = self.partitions()
        self._check_partitions(counts)
        wanted = {(s.topic, p): OffsetSpec.latest() for s in self.sources for p in range(counts[s.name])}
        stable = list_offsets(self.admin(), wanted, IsolationLevel.READ_COMMITTED,
                              "reading the tables' stable offsets", 30, None)
        unknown = [f"{t}[{p}]" for (t, p), offset in stable.items() if offset < 0]
        if unknown:
            raise TransientKafkaError(f"the broker answered no stable offset for {', '.join(unknown[:5])} "
                                      "(a leader moving?)")
        return tuple(TableVersion(s.name, tuple(stable[(s.topic, p)] for p in range(counts[s.name])))
                     for s in self.sources)

    def _check_partitions(self, counts: dict[str, int]) -> None:
        """A table topic given partitions during the run would have its new partitions' keys
        missing from every join: the run stops and says so (a restart reads them all)."""
        for source in self.sources:
            found = self.admin().list_topics(topic=source.topic, timeout=30).topics.get(source.topic)
            now = len(found.partitions) if found is not None and found.error is None else counts[source.name]
            if now != counts[source.name]:
                raise TableChangedError(f"the table {source.name!r} ({source.topic}) has {now} partitions now, "
                                        f"{counts[source.name]} when the run started: restart the run, which reads "
                                        "every partition of the table")

    def reads(self, versions: tuple[TableVersion, ...]) -> TableReads | None:
        return TableReads(self.read, self.sources, versions) if self.sources else None

    def frames(self, spark: Any) -> dict[str, Any]:
        """Each table's DataFrame by its name (transform's keyword argument), built once."""
        if self._frames is None:
            from pyspark.sql import functions as F
            from pyspark.sql.pandas.types import from_arrow_schema

            frames = {}
            for source in self.sources:
                n = self.partitions()[source.name]
                # Over a projection of the range, not the range itself: the plan checks know the
                # stream's reader as a mapInArrow directly over a range (operators/plan.py).
                partitions = spark.range(0, n, 1, n).select(F.col("id").alias("table_partition"))
                frame = partitions.mapInArrow(
                    functools.partial(read_table, FromJob("tables", self.read.clients, self.read.registry), source.name),
                    from_arrow_schema(table_arrow_schema(source)))
                frames[source.name] = F.broadcast(frame) if source.broadcast else frame
            self._frames = frames
        return self._frames
