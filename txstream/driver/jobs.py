"""A batch's Spark job: its DataFrames built, a narrow batch's job kept while the batch's shape
stays the same, and the job run in its own job group, watched and cancelled when it hangs.

Everything here runs on the driver and talks to Spark over Py4J; the tasks' own code is in
`task/` (reading.py, publish.py, units.py), which this module hands to `mapInArrow`.
"""
from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

from txstream.classify import understand
from txstream.constants import RANGE_COLUMN, batch_job_group, dry_run_job_group
from txstream.driver.checks import check_narrow, check_output, single_chain
from txstream.driver.range_tag import carry_range_tag
from txstream.driver.slots import SlotLayout
from txstream.driver.specs import TaskSpecs
from txstream.driver.tables import Tables
from txstream.errors import BatchTimeout, TransformError, TxstreamError
from txstream.settings import RunSettings
from txstream.task.publish import publish_slot
from txstream.task.reading import input_struct, read_planned_range
from txstream.task.result import result_schema
from txstream.task.spec import JOB_SPEC_PROPERTY, FromJob, JobSpec, PartitionPlan, ReadSpec
from txstream.task.spec import encode as encode_job_spec

SINK_COLUMNS = ("key", "value", "topic", "partition", "headers", "offset")
BATCH_PROGRESS_EVERY_S = 30.0  # a 'still running' line this often while a batch is slow


def range_frame(spark, spec: ReadSpec, accounts: Any = None, per_slot: bool = False,
                tagged: bool = False, name: str | None = None):  # SparkSession -> DataFrame
    """The batch's input DataFrame: one Spark partition per planned range, read by task i; with
    `per_slot`, one per slot (`spec.slot_width` consecutive reading tasks), its ranges read
    together in one Python hand-off (Spark pays a hand-off per partition: a slot of many ranges
    read one partition each would pay it per range).

    `tagged`: each row also carries its reading task in RANGE_COLUMN, which the returned frame
    hides (the transform never sees it: `struct("*")` must not pick it up); the driver carries it
    through the transform's plan to the publisher, for the lineage headers (driver/range_tag.py).

    `accounts`: a Spark accumulator (`ReadAccounts`) that takes each range's count and
    undecodable records instead of the side file, when no publisher of the same task follows
    (a wide batch: the output is shuffled to the units, docs/wide-transforms.md).

    A `mapInArrow` over `spark.range(n, numPartitions=n)` rather than a Python data source:
    partition i holds exactly the number i, so task i reads plan i, and Spark needs no Python
    process on the driver to plan the read (a data source costs planning round trips per batch
    and more Python daemons at start-up).

    The tasks read the ranges of the spec their job carries (task/spec.py FromJob), not
    `spec`'s, which gives the frame only its shape: a narrow batch's frame serves every batch of
    that shape. Run it with `SparkJobs.collect`. `name`: one of several input streams', whose
    tasks read that input's spec (JobSpec.inputs)."""
    n = max(1, len(spec.layout) or len(spec.plans))
    # spark.range splits [0, n) into equal consecutive runs: partition j holds slot j's tasks.
    partitions = n // spec.slot_width if per_slot and spec.slot_width > 1 else n
    frame = spark.range(0, n, 1, partitions).mapInArrow(
        functools.partial(read_planned_range, FromJob("inputs" if name else "read", spec.clients, spec.registry,
                                                      name), accounts, tagged),
        input_struct(spec.key_schema, spec.value_schema, tagged))
    return frame.drop(RANGE_COLUMN) if tagged else frame


@dataclass
class _NarrowJob:
    """A narrow batch's Spark job, kept for the next batches of the same shape."""

    key: tuple          # reading tasks, slot width, per-slot reading, tagged
    frame: Any          # the publishing DataFrame the batch collects (its ranges come with each job)


class SparkJobs:
    """Builds and runs the Spark jobs of one run's batches, narrow and wide alike."""

    def __init__(self, spark, settings: RunSettings, specs: TaskSpecs, echo: Callable[[str], None],
                 tables: Tables | None = None) -> None:
        self.spark = spark
        self.tables = tables                # the processor's tables (driver/tables.py), if it declares any
        self.last_tables: tuple = ()        # the tables' version the last job read
        self.settings = settings
        self.specs = specs
        self.echo = echo
        self.built = 0                     # narrow batch jobs built (tests, diagnostics)
        self.per_slot_reading = True       # until a batch's plan is not a single chain
        self._job: _NarrowJob | None = None
        self._thread: threading.Thread | None = None

    # -- building ---------------------------------------------------------------------------------

    def output_frame(self, batch_id: int, plans: list[PartitionPlan], accounts: Any = None):
        """The processor's transform over the planned ranges, its columns checked and reduced to
        the sink's (a narrow plan is checked by `check_narrow` on what is collected)."""
        streams = self.specs.for_inputs(batch_id, plans)
        if streams is not None:
            frames = {name: range_frame(self.spark, spec, accounts, name=name) for name, spec in streams.items()}
            return self.to_sink(self.transform(None, frames))
        source = range_frame(self.spark, self.specs.for_reading(batch_id, plans), accounts)
        return self.to_sink(self.transform(source))

    def transform(self, source, streams: dict[str, Any] | None = None):
        """The processor's transform of `source` (or of several input `streams`, as keyword
        arguments), with its tables as keyword arguments."""
        tables = self.tables.frames(self.spark) if self.tables else {}
        if streams is not None:
            return self.settings.processor.transform(**streams, **tables)
        return self.settings.processor.transform(source, **tables)

    def to_sink(self, out):
        """The transform's output, checked and reduced to the sink's columns."""
        check_output(out, self.settings)
        return out.select(*[c for c in SINK_COLUMNS if c in out.columns])

    def narrow_output(self, batch_id: int, plans: list[PartitionPlan], layout: SlotLayout, per_slot: bool):
        """The transform's output over a narrow job's source (its ranges come with each job)."""
        if self.specs.inputs:
            raise TransformError("a processor of several inputs runs the wide protocol only")   # driver/choice.py
        spec = self.specs.for_reading(batch_id, plans, layout.layout, layout.width)
        source = range_frame(self.spark, spec, None, per_slot, per_slot and self.settings.lineage)
        return self.to_sink(self.transform(source))

    def narrow_job(self, batch_id: int, plans: list[PartitionPlan], layout: SlotLayout, per_slot: bool, out=None):
        """A narrow batch's job: built once, run again for every batch of the same shape (the
        ranges travel with each job: task/spec.py; the Arrow batch settings are read by Spark
        each time the job runs: spark/arrow_batches.py). With the processor's
        `transform_each_batch`, built every batch: `transform` runs again, and so does what its
        plan computes once per execution (the broadcast side of a join re-reads its table).
        `out`: the transform's output for this reading mode, built already."""
        tagged = per_slot and self.settings.lineage
        key = (len(layout.layout) or len(plans), layout.width, per_slot, tagged)
        if self._job is not None and self._job.key == key and not self.settings.processor.transform_each_batch:
            return self._job.frame
        if out is None:
            out = self.narrow_output(batch_id, plans, layout, per_slot)
        frame = self._publishing_frame(out, layout, per_slot, tagged)
        if per_slot and (frame is None or not single_chain(frame)):
            self.per_slot_reading = False   # the transform's shape does not change within a run
            return self.narrow_job(batch_id, plans, layout, False)
        check_narrow(frame, own_coalesce=layout.width > 1 and not per_slot)
        self._job = _NarrowJob(key, frame)
        self.built += 1
        return frame

    def _publishing_frame(self, out, layout: SlotLayout, per_slot: bool, tagged: bool):
        """The transform's output `out`, grouped by slot, into the publishing tasks (None: read
        per slot, the plan cannot carry the rows' range tag the lineage needs)."""
        from pyspark.sql import functions as F

        if tagged:
            out = carry_range_tag(out)
            if out is None:
                return None
        elif not per_slot:
            out = carry_range_tag(out, tag=False, offset=self.settings.lineage)
            out = out.withColumn(RANGE_COLUMN, F.spark_partition_id())
            if layout.width > 1:
                out = out.coalesce(layout.publishing_tasks)
        job = FromJob("publish", self.specs.read.clients, self.specs.read.registry)
        return out.mapInArrow(functools.partial(publish_slot, job), result_schema())

    def forget(self) -> None:
        """The next narrow batch builds its job afresh (after a failed batch)."""
        self._job = None

    # -- running ----------------------------------------------------------------------------------

    def collect(self, frame, job: JobSpec, arrow: bool = False) -> Any:
        """Run a batch's job with its spec as the job's local property (task/spec.py): its rows
        as dicts, or with `arrow` as one Arrow table. Every batch job is run through here; a job
        whose spec names no version of the tables reads them as they are now."""
        if self.tables and job.tables is None:
            job = replace(job, tables=self.tables.reads(self.tables.current()))
        if self.specs.inputs and job.inputs is None:
            job = replace(job, inputs=self.specs.for_inputs(job.read.batch_id, list(job.read.plans)))
        self.last_tables = job.tables.versions if job.tables is not None else ()
        sc = self.spark.sparkContext
        sc.setLocalProperty(JOB_SPEC_PROPERTY, encode_job_spec(job))
        try:
            return frame.toArrow() if arrow else [row.asDict() for row in frame.collect()]
        finally:
            sc.setLocalProperty(JOB_SPEC_PROPERTY, None)

    def run(self, action: Callable[[], Any], batch_id: int, description: str,
            heartbeat: Callable[[float], Any]) -> Any:
        """Run a batch's Spark job (`action`) in its own job group, watched: a "still running" line
        now and then, and cancelled after batch_timeout_s (a hung task must not stall the run).
        `heartbeat(0)` is called while it runs: the group membership's poll, which serves its
        callbacks (a revocation waits for this batch: `wait`)."""
        outcome: dict[str, Any] = {}
        started = time.monotonic()
        job_group = batch_job_group(self.settings.app_id, batch_id)
        sc = self.spark.sparkContext

        def work() -> None:
            try:
                # Per-thread job group (Spark pins Python threads to JVM threads), so the
                # watchdog below can cancel exactly this batch's job.
                sc.setJobGroup(job_group, description, interruptOnCancel=True)
                outcome["rows"] = action()
            except BaseException as exc:
                outcome["error"] = exc

        self._thread = threading.Thread(target=work, name=f"txstream-batch-{batch_id}", daemon=True)
        self._thread.start()
        limit = self.settings.batch_timeout_s
        every = min(BATCH_PROGRESS_EVERY_S, limit / 2)
        next_report = started + every
        cancelled = False
        while self._thread.is_alive():
            # Wake the moment the job ends: a poll that waits would add its timeout to every
            # batch's latency (librdkafka heartbeats on its own thread).
            self._thread.join(0.1)
            heartbeat(0)
            now = time.monotonic()
            if now >= next_report and self._thread.is_alive():
                next_report = now + every
                self.echo(f"batch {batch_id} still running after {now - started:.0f}s: {self._progress()}")
            if not cancelled and now - started > limit:
                # Whatever was not committed is aborted or fenced on re-plan.
                self.echo(f"batch {batch_id} exceeded {limit:.0f}s; cancelling it")
                sc.cancelJobGroup(job_group)
                cancelled = True
        if "error" in outcome:
            if cancelled:
                raise BatchTimeout(f"batch {batch_id} cancelled after {limit:.0f}s "
                                   f"(batch_timeout_s); its transactions are aborted or fenced on re-plan") \
                    from outcome["error"]
            raise outcome["error"]
        return outcome["rows"]

    def wait(self) -> None:
        """Until the running batch's job ends (called from the membership's revocation)."""
        thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join()

    def _progress(self) -> str:
        """What the batch's Spark job is doing, for the 'still running' line."""
        tracker = self.spark.sparkContext.statusTracker()
        parts = []
        for stage_id in tracker.getActiveStageIds():
            info = tracker.getStageInfo(stage_id)
            if info is not None:
                parts.append(f"stage {stage_id}: {info.numCompletedTasks}/{info.numTasks} tasks done, "
                             f"{info.numActiveTasks} running, {info.numFailedTasks} failed")
        return "; ".join(parts) or "no active stage"

    def dry_run(self, batch_id: int, plans: list[PartitionPlan]) -> TxstreamError | None:
        """The transform over `plans`, computed and counted, nothing published (driver/poison.py)."""
        from txstream.task.dry_run import count_rows

        sc = self.spark.sparkContext
        sc.setJobGroup(dry_run_job_group(self.settings.app_id),
                       f"txstream {self.settings.app_id}: dry run of {len(plans)} range(s) (isolating a record)",
                       interruptOnCancel=True)
        try:
            spec = self.specs.for_reading(batch_id, plans)
            count = functools.partial(count_rows, FromJob("read", spec.clients, spec.registry))
            self.collect(self.output_frame(batch_id, plans).mapInArrow(count, "rows long"), JobSpec(spec))
            return None
        except Exception as exc:
            return understand(exc)
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)
            sc.setLocalProperty("spark.job.description", None)
