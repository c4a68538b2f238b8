"""The class users subclass: what to read, what to write, and the transform in between."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@dataclass(frozen=True)
class Table:
    """A table kept from a compacted topic: the latest value of each key, a tombstone deleting
    it (Kafka Streams' KTable). `transform` receives it as a DataFrame in the input's columns
    (`key`, `value`, `topic`, `partition`, `offset`, `timestamp`, `headers`), as of the batch's
    version: each of the topic's partitions read to its last stable offset when the batch was
    planned (docs/state.md, "Tables"). `broadcast`: Spark broadcasts it to the join (a table that
    fits in the executors' memory; False leaves the join's strategy to Spark)."""

    topic: str
    key_schema: str | None = None       # .avsc path or inline JSON; None: raw bytes
    value_schema: str | None = None
    broadcast: bool = True


@dataclass(frozen=True)
class Input:
    """One input stream of a processor that reads several (`Processor.inputs`): its topics and how
    its keys and values decode. `transform` receives it as a DataFrame in Spark's Kafka source
    columns, as the single input of other processors."""

    topics: tuple[str, ...] | list[str]
    key_schema: str | None = None       # .avsc path or inline JSON; None: raw bytes
    value_schema: str | None = None


class Processor:
    """A Kafka-to-Kafka processor whose transform is PySpark DataFrame code.

    The input DataFrame has the columns of Spark's Kafka source: `key`, `value` (binary, or a
    struct when `value_schema` is set), `topic`, `partition`, `offset`, `timestamp`, `headers`.
    The transform returns the columns of Spark's Kafka sink: `value` (required), and optionally
    `key`, `topic` (fan-out to several topics), `partition`, `headers`. Keep the input's
    `offset` column in the output to stamp exact per-record lineage (it is not published as a
    column). A narrow transform (no shuffle) publishes each input partition's output in that
    partition's own transaction; a wide one (groupBy, shuffled joins, distinct) publishes each
    batch through output units (docs/wide-transforms.md) and must be deterministic.
    """

    input_topics: ClassVar[list[str]] = []
    # Several input streams, each its own DataFrame, by the name of `transform`'s keyword argument:
    # `inputs = {"orders": Input(["orders"], value_schema=...), "returns": Input(["returns"])}` and
    # `def transform(self, orders, returns)` (instead of input_topics and the schemas; docs/joins.md).
    inputs: ClassVar[dict[str, Input]] = {}
    # Tables kept from compacted topics, by the name of `transform`'s keyword argument that
    # receives each: `tables = {"customers": Table("customers")}` and
    # `def transform(self, orders, customers)`.
    tables: ClassVar[dict[str, Table]] = {}
    output_topic: ClassVar[str | None] = None
    app_id: ClassVar[str | None] = None               # default: derived from the class name

    key_schema: ClassVar[str | None] = None            # .avsc paths, or inline JSON
    value_schema: ClassVar[str | None] = None
    output_key_schema: ClassVar[str | None] = None
    output_value_schema: ClassVar[str | None] = None
    dead_letter_topic: ClassVar[str | None] = None
    # A schema registry (docs/schemas.md): input decoded by each record's schema id against
    # value_schema (else the subject's latest), output framed with its registered schema's id.
    schema_registry_url: ClassVar[str | None] = None
    subject_name_strategy: ClassVar[str] = "topic"     # | "record" | "topic-record"
    auto_register_schemas: ClassVar[bool] = True        # False: the output schema must be registered
    use_latest_version: ClassVar[bool] = False          # publish with the output subject's latest

    guarantee: ClassVar[str] = "exactly-once"          # | "at-least-once" | "at-most-once"
    auto_offset_reset: ClassVar[str] = "earliest"      # | "latest" | "none"
    max_records_per_partition: ClassVar[int] = 100_000
    trigger_interval: ClassVar[float] = 0.0            # seconds between batch starts
    lineage: ClassVar[bool] = True                     # stamp source topic/partition/offset headers
    one_to_one: ClassVar[bool] = False                 # every input yields one output (for audits)

    # Wide transforms: "units" (K output units, each its own transaction) or "single-transaction"
    # (the whole batch in one transaction of the driver); K (None: the input partitions).
    wide_mode: ClassVar[str] = "units"
    output_units: ClassVar[int | None] = None
    allow_nondeterministic: ClassVar[bool] = False
    # State across batches (docs/state.md): "append", "update" or "complete", as in Structured
    # Streaming (None: its default, append, when the transform is stateful); "per-batch": each
    # batch aggregated (or deduplicated) alone.
    output_mode: ClassVar[str | None] = None
    # Opt-in: after this many seconds without input the watermark follows wall-clock time less
    # the delay, so quiet windows close (event times must be near wall-clock time).
    watermark_idle_s: ClassVar[float | None] = None
    # A state unit writes a snapshot once its changelog has grown this many records past the
    # newest one: a restore reads the snapshot and at most this many after it (docs/state.md).
    state_snapshot_every: ClassVar[int] = 200_000
    # Output (a row's `topic`, output_topic or dead_letter_topic) that names an input topic feeds
    # the run its own output: refused unless set, since the usual cause is a transform that kept
    # the input's `topic` column.
    allow_output_to_input_topics: ClassVar[bool] = False
    # Narrow transforms: publishing tasks per batch, each one producer and one transaction for
    # its share of the partitions (None: Spark's cores; docs/architecture.md §3.4).
    task_slots: ClassVar[int | None] = None
    # transactional.ids per slot: a slot's task keeps using the producer its Python worker
    # already holds for any of them, instead of init_transactions whenever Spark hands the task
    # to another worker (1: one id per slot).
    producers_per_slot: ClassVar[int] = 4
    # A run's first batch reads at most this many records in all (the next ones up to
    # max_records_per_partition): output appears within seconds of the start even over a
    # backlog, as a consumer's first poll would give it. 0: the first batch is as big as the cap.
    first_batch_records: ClassVar[int] = 10_000
    # The driver calls `transform` when it builds a batch's Spark job, and runs that job again for
    # the next batches while their shape holds (docs/architecture.md §2), as a Structured
    # Streaming query is defined once: what the plan computes once per execution (the broadcast
    # side of a join) is computed when the job is built. True: a new job every batch (a
    # transform that reads driver-side state, or a lookup table that changes, every batch).
    transform_each_batch: ClassVar[bool] = False
    # The batch's time, logged with its plan: the same on every re-run of the batch. Use it
    # (F.lit(self.batch_timestamp)) where a wide transform would use current_timestamp().
    batch_timestamp: datetime | None = None

    producer_config: ClassVar[dict[str, Any]] = {}     # librdkafka properties
    consumer_config: ClassVar[dict[str, Any]] = {}
    spark_conf: ClassVar[dict[str, str]] = {}

    def setup(self, spark: SparkSession) -> None:
        """Called once per run on the driver, before the first batch (load lookup tables, register
        UDFs, broadcast small tables). What it builds as DataFrames or broadcasts reaches the
        executors through Spark; Python objects it leaves on `self` do not, except as captured by
        the UDFs the transform uses (pickled with them). On a cluster, import what UDFs need from
        the processor's own package or module (shipped with the job: docs/cluster.md) or from
        libraries installed on the executors, not from files only the driver's host has."""

    def transform(self, batch: DataFrame) -> DataFrame:
        """Runs on the driver, building the DataFrame plan; its expressions and UDFs run in the
        executors' tasks. Called when the driver builds a batch's Spark job, which then serves
        the next batches of the same shape (a new assignment or a failed batch builds another);
        every batch with `transform_each_batch`. At start, the driver chooses the protocol on the
        first job's plan, or on a dry frame's where that job reads one Spark partition (one more
        call: docs/architecture.md §3)."""
        raise NotImplementedError(f"{type(self).__name__} must implement transform(batch)")
