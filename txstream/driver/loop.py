"""The driver loop (Kafka Streams' TaskManager): membership, planning, one Spark job per batch.

Each batch is one Spark job of one stage: task i reads planned range i (reading.py), runs the
processor's narrow transform, and publishes range i's output with its end offset in one
transaction (publishing.py). The driver only plans, runs and reports; the offsets are committed
by the tasks (exactly-once) or by `DriverCommits` (the weaker guarantees).
"""
from __future__ import annotations

import functools
import logging
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, Callable

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from txstream import faults
from txstream.driver.checks import check_narrow, check_output, single_chain, wide_parts
from txstream.driver.commits import DriverCommits
from txstream.driver.dead_letters import publish_dead_letter
from txstream.driver.membership import GroupMembership
from txstream.driver.metrics import Telemetry
from txstream.driver.planning import Planner, transactional_id
from txstream.driver.poison import PoisonIsolator
from txstream.driver.range_tag import carry_range_tag
from txstream.driver.slots import SlotLayout, Slots
from txstream.driver.specs import TaskSpecs
from txstream.errors import (
    BatchTimeout,
    DataError,
    Decision,
    InfrastructureError,
    PoisonRecordError,
    TransformError,
    TxstreamError,
    decide,
    one_line,
    topic_missing,
    understand,
)
from txstream.settings import RunSettings
from txstream.spark.arrow_batches import ArrowBatches
from txstream.spark.session import build_spark, stop_spark, warm_python_workers
from txstream.spark.setup import is_local
from txstream.task.job_spec import JOB_SPEC_PROPERTY, FromJob
from txstream.task.job_spec import encode as encode_job_spec
from txstream.task.publish import publish_slot
from txstream.task.reading import range_frame
from txstream.task.result import ACKED, ALREADY_DONE, COMMITTED, FENCED, STALE_PLAN, result_schema
from txstream.task.spec import RANGE_COLUMN, PartitionPlan, PublishSpec

log = logging.getLogger("txstream")

SINK_COLUMNS = ("key", "value", "topic", "partition", "headers", "offset")

# Errors that no retry can cure: the run stops with the message.
BATCH_PROGRESS_EVERY_S = 30.0  # a 'still running' line this often while a batch is slow
# The step of the wait for an assignment. The consumer's poll() serves the rebalance callback and
# then waits out the rest of its timeout (no record ever comes: every partition is paused), so a
# 0.1 s step cost every start ~100 ms after the assignment had arrived (measured: 98-101 ms).
ASSIGNMENT_POLL_S = 0.01


@dataclass
class _BatchJob:
    """A narrow batch's Spark job, kept for the next batches of the same shape."""

    key: tuple          # reading tasks, slot width, per-slot reading, tagged
    frame: Any          # the publishing DataFrame the batch collects (its ranges come with each job)


@dataclass
class BatchReport:
    batch_id: int
    plans: list[PartitionPlan]
    rows: list[dict]
    seconds: float
    # A wide batch's rows are per output unit, not per range (driver/wide.py): what was read
    # from each input partition, (records, undecodable records), comes separately.
    reads: dict[tuple[str, int], tuple[int, int]] | None = None
    # The driver's own time before Spark ran the batch: committed and end offsets, planning, and
    # building and checking the job's DataFrame (None: not measured, a wide batch).
    driver_s: float | None = None

    @property
    def statuses(self) -> dict[str, int]:
        """How many ranges ended how (committed, already-done, stale-plan, ...)."""
        return dict(Counter(row["status"] for row in self.rows))

    def total(self, column: str) -> int:
        return sum(int(r[column]) for r in self.rows)

    def line(self, lag: int | None = None) -> str:
        parts = [f"batch {self.batch_id}", f"partitions {len(self.plans)}",
                 f"in {self.total('records_in')}", f"out {self.total('records_out')}",
                 f"dead-lettered {self.total('dead_letters')}", f"{self.seconds:.2f}s"]
        timing = {k: max((float(r[k]) for r in self.rows), default=0.0)
                  for k in ("read_s", "upstream_s", "produce_s", "commit_s", "init_s")}
        # Max over the tasks: reading+decoding, encoding+producing, send_offsets+commit (or the
        # acknowledgements), init_transactions; then how long publishers waited for their input
        # (reading, the JVM hops and the transform together).
        parts.append("(read {read_s:.2f} produce {produce_s:.2f} commit {commit_s:.2f} init {init_s:.2f})"
                     .format(**timing))
        parts.append(f"upstream {timing['upstream_s']:.2f}")
        if self.driver_s is not None:
            parts.append(f"driver {self.driver_s:.2f}")
        others = {s: n for s, n in self.statuses.items() if s not in (COMMITTED, ACKED)}
        if others:
            parts.append(" ".join(f"{s}={n}" for s, n in sorted(others.items())))
        if lag is not None:
            parts.append(f"lag {lag}")
        return "  ".join(parts)


class Driver:
    def __init__(self, settings: RunSettings, echo: Callable[[str], None] = print, spark=None) -> None:
        self.settings = settings
        self.spark = spark
        self._own_spark = spark is None
        self.telemetry = Telemetry(self, echo)   # metrics and log lines (driver/metrics.py)
        self.echo = self.telemetry.echo
        self.admin = self._admin_client()
        self.stop_requested = threading.Event()
        self._batch_thread: threading.Thread | None = None
        self._planning_started: float | None = None   # when the loop began planning the batch
        self._job: _BatchJob | None = None   # the last narrow batch's job, run again while it fits
        self.jobs_built = 0                  # narrow batch jobs built (tests, diagnostics)
        self.specs = TaskSpecs(settings)
        self.batch_id = 0
        self.membership: GroupMembership | None = None
        self.slots: Slots | None = None
        self._per_slot_reading = True   # until a batch's plan is not a single chain (run_batch)
        self.targets: dict[tuple[str, int], int] = {}
        self.totals = {"records_in": 0, "records_out": 0, "dead_letters": 0, "batches": 0}
        self.stable_reads = 0   # the group's committed offsets read from Kafka (membership.py), at close
        self._rate: float | None = None    # records/s per partition, measured
        self._failures = 0                  # batches or plans failed in a row
        self.commits: DriverCommits | None = None
        self.poison = PoisonIsolator(self, self.echo, settings.dead_letter_topic)
        self._cap_warned = False
        # Records the run's first batch may read in all (None: the cap alone, from the second on).
        self._first_batch_budget: int | None = settings.first_batch_records or None
        self.input_partitions = 0
        self.input_topic_partitions: dict[str, int] = {}   # each input topic's partition count (check_topics)
        self.arrow: ArrowBatches | None = None   # the Arrow batch size, per batch (spark/arrow_batches.py)
        self.wide = None   # driver/wide.py, when the transform is wide
        # The membership's generation_changes at the end of the last batch, if that batch was
        # clean (None: the next batch's tasks fence all of their slot's ids, docs/architecture.md §3.4).
        self._clean_at: int | None = None

    # -- set-up -----------------------------------------------------------------------------------

    def _admin_client(self) -> AdminClient:
        from txstream.kafka.offsets import admin_client

        return admin_client(self.settings.clients)

    def _frame(self, plans: list[PartitionPlan], accounts: Any = None, layout: SlotLayout | None = None,
               per_slot: bool = False, tagged: bool = False):
        assert self.spark is not None
        spec = (self.specs.for_reading(self.batch_id, plans) if layout is None
                else self.specs.for_reading(self.batch_id, plans, layout.layout, layout.width))
        return range_frame(self.spark, spec, accounts, per_slot, tagged)

    def output_frame(self, plans: list[PartitionPlan], accounts: Any = None, layout: SlotLayout | None = None,
                     per_slot: bool = False, tagged: bool = False):
        """The processor's transform over the planned ranges, its columns checked and reduced to
        the sink's (the plan's narrowness is checked by `check_narrow` on what is collected)."""
        return self._to_sink(self.settings.processor.transform(self._frame(plans, accounts, layout, per_slot, tagged)))

    def _to_sink(self, out):
        """The transform's output, checked and reduced to the sink's columns."""
        check_output(out, self.settings)
        return out.select(*[c for c in SINK_COLUMNS if c in out.columns])

    def check_topics(self) -> None:
        """Inputs, the output and the dead-letter topic must exist: txstream never creates them."""
        s = self.settings
        from txstream.kafka.offsets import cluster_topics

        known = cluster_topics(self.admin, timeout=30)  # also the reachability check: one clear line
        wanted = [("input", t) for t in s.input_topics]
        wanted += [("output", s.output_topic)] if s.output_topic else []
        wanted += [("dead-letter", s.dead_letter_topic)] if s.dead_letter_topic else []
        missing = [(role, name) for role, name in wanted if name not in known]
        if missing:
            raise TransformError(topic_missing(*missing[0], s.bootstrap_servers, missing[1:]))
        self.input_topic_partitions = {t: known[t] for t in s.input_topics}
        self.input_partitions = sum(self.input_topic_partitions.values())

    def validate(self) -> None:
        """Refuse an unpublishable output before anything is read, and choose the protocol from
        the physical plan: narrow (one transaction per slot of input partitions) or wide (units, or one
        transaction per batch: driver/wide.py), said in the run's first lines."""
        s = self.settings
        s.processor.batch_timestamp = datetime.now(timezone.utc)
        first = self._first_batch_output()
        if first is not None:
            frame = first[-1]
        else:
            topic = s.input_topics[0]
            # Two (empty, never run) ranges: over a single partition Spark plans no shuffle even
            # for groupBy, and the check below would miss a wide transform.
            dry = [PartitionPlan(topic, p, 0, 0, None, transactional_id(s.app_id, topic, p)) for p in (0, 1)]
            frame = self.output_frame(dry)
        parts = wide_parts(frame)
        if not parts:
            if first is not None:
                self._build_first_job(*first)
            self.echo("protocol: narrow (each slot's output and input offsets in one transaction)")
            return
        from txstream.driver.determinism import check_deterministic
        from txstream.driver.wide import WideBatches

        self.echo(f"the transform is wide ({parts[0]})")
        loose = check_deterministic(frame.drop("offset") if "offset" in frame.columns else frame,
                                    s.allow_nondeterministic)
        for part in loose:
            self.echo(f"warning: not deterministic (allowed): {part}")
        self.wide = WideBatches(self, s.wide_mode, s.output_units or self.input_partitions or 1,
                                s.allow_nondeterministic)
        self.echo(self.wide.describe())

    def _first_batch_output(self) -> tuple[Slots, list[PartitionPlan], SlotLayout, bool, Any] | None:
        """The first batch's slots, plans, layout, reading mode and transform output, for `validate` to
        choose the protocol on: the transform is then applied once before the first output, not
        twice (a dry frame to choose, then the batch's job; ~0.2-0.4 s of driver time here). For
        the batch this driver has when it owns every input partition (one instance: the usual
        start); a batch of another shape builds its own job (`_batch_frame`).

        None where the dry frame decides: a single input partition or a single slot (its source
        is then one Spark partition, where even a groupBy plans no shuffle), a transform applied
        every batch (`transform_each_batch`: its job is built each batch anyway), and any failure
        here, which the dry frame meets again and reports as it always did."""
        s = self.settings
        if s.processor.transform_each_batch or self.input_partitions < 2:
            return None
        owned = [(t, p) for t, count in self.input_topic_partitions.items() for p in range(count)]
        slots = self._new_slots()
        try:
            plans = slots.assign([PartitionPlan(t, p, 0, 0, None, transactional_id(s.app_id, t, p))
                                  for t, p in owned], owned)
            layout = Slots.layout(plans, self._fixed_shape(slots))
            per_slot = layout.width > 1 and self._per_slot_reading
            if (len(layout.layout) // layout.width if per_slot else len(layout.layout)) < 2:
                return None
            return slots, plans, layout, per_slot, self._batch_output(plans, layout, per_slot)
        except Exception:
            return None

    def _build_first_job(self, slots: Slots, plans: list[PartitionPlan], layout: SlotLayout, per_slot: bool,
                         out) -> None:
        """The first batch's slots and job, from the output `validate` chose narrow on; if the job
        cannot be built, the first batch builds it and meets the cause there, as before."""
        self.slots = slots
        try:
            self._batch_frame(plans, layout, per_slot, out)
        except Exception:
            self._job, self._per_slot_reading = None, True

    def _start_spark(self) -> None:
        """The session (spark/setup.py decides master and settings). Locally the Python workers are
        warmed up meanwhile; on a cluster the processor's code is shipped and every executor core
        passes the preflight (driver/preflight.py) before anything is read."""
        s = self.settings
        faults.remember_driver()
        self.spark = build_spark(s.master, s.app_id, s.spark_conf, ui_port=s.spark_ui_port,
                                 cores_hint=self.input_partitions or None, echo=self.echo)
        if is_local(self.spark.sparkContext.master):
            threading.Thread(target=warm_python_workers, args=(self.spark,), name="txstream-warm-up",
                             daemon=True).start()
            return
        from txstream.driver.preflight import check_executors, describe, loopback_hosts
        from txstream.spark.shipping import ship_processor_code

        for host in loopback_hosts(s.bootstrap_servers):
            self.echo(f"warning: the bootstrap address {host} is a loopback address; each executor on another "
                      "host would reach its own (the preflight checks which cluster they reach)")

        archive, module = ship_processor_code(self.spark, type(s.processor))
        if archive is not None:
            self.echo(f"shipping the processor's code to the executors: {archive.name} ({module})")
        self.echo(describe(check_executors(self.spark, s.clients.admin(), module)))

    # -- the loop ---------------------------------------------------------------------------------

    @property
    def fence_all_next(self) -> bool:
        """The next batch's tasks fence all of their slot's ids: the first batch, after a failed or
        unclean batch, after a rebalance (docs/architecture.md §3.4)."""
        return self.membership is None or self._clean_at != self.membership.generation_changes

    def _group_is_empty(self) -> bool:
        """The app's group has no member now. Then the driver joins it before Spark starts, so
        that the join (its round trips, and on a broker with Kafka's default
        group.initial.rebalance.delay.ms the 3 s a first member waits) happens while Spark starts
        rather than before the first batch. Into a group with members it joins after the
        transform's check, as before: one of them may be a wide app's only instance, which must
        keep its partitions while this driver finds that out and refuses (driver/wide.py). Unknown
        (the group cannot be described, e.g. no ACL for it): not empty."""
        from txstream.kafka.offsets import describe_group

        try:
            return not describe_group(self.admin, self.settings.app_id, timeout=10).members
        except Exception as exc:
            log.debug("describing the group %s: %s", self.settings.app_id, exc)
            return False

    def _join_group(self) -> GroupMembership:
        s = self.settings
        return GroupMembership(s.clients, s.app_id, s.input_topics, self._wait_for_batch, self._on_group_change)

    def _wait_for_batch(self) -> None:
        thread = self._batch_thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join()

    def _on_group_change(self, what: str, partitions: list[TopicPartition]) -> None:
        names = [f"{p.topic}[{p.partition}]" for p in partitions]
        self.telemetry.event(what, f"partitions {what}: {', '.join(names)}", partitions=names)

    def _install_signals(self) -> None:
        def handler(signum, _frame) -> None:
            if self.stop_requested.is_set() and self.spark is not None:
                self.echo("second signal: cancelling the in-flight batch (its transactions abort)")
                self.spark.sparkContext.cancelAllJobs()
                return
            self.echo(f"{signal.Signals(signum).name}: finishing the in-flight batch, then stopping")
            self.stop_requested.set()

        if threading.current_thread() is threading.main_thread():
            self._previous_handlers = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}

    def run(self) -> int:
        s = self.settings
        self._install_signals()
        try:
            # Kafka reachable and the topics there before Spark's seconds of start-up: an
            # unreachable cluster or a missing topic is reported at once.
            self.telemetry.start()
            self.check_topics()
            if self._group_is_empty():
                self.membership = self._join_group()
        except Exception as exc:
            self.telemetry.event("fatal", None, error_type=type(understand(exc)).__name__, error=one_line(exc))
            self.close()
            raise
        try:
            if self.spark is None:
                self._start_spark()
            s.processor.setup(self.spark)
            self.arrow = ArrowBatches(self.spark)
            self.validate()
            if self.wide is not None:
                if self.membership is not None:
                    self._wait_for_assignment()   # its own member id known: wide.start looks for others
                self.wide.start()
            else:
                if self.slots is None:   # (validate's, when it built the first batch's job)
                    self.slots = self._new_slots()
                self.echo(f"{self.slots.count} task slots: a batch's ranges are published by one task per slot, "
                          "through the slot's producer, in one transaction (driver/slots.py)")
            if self.membership is None:
                self.membership = self._join_group()
            self.membership.remembers = self.wide is None
            self.commits = DriverCommits(s.guarantee, self.membership)
            planner = Planner(self.admin, s.app_id, s.auto_offset_reset, s.max_records_per_partition)
            self._wait_for_assignment()
            idle = 0.05
            while not self.stop_requested.is_set():
                started = self._planning_started = time.monotonic()
                self.membership.poll(0)
                owned = self.membership.owned()
                marks_before = planner.marks
                try:
                    committed = self.membership.committed(owned)
                    self._remember_targets(owned)
                    if s.until_caught_up and self._caught_up(owned, committed):
                        self.telemetry.event("caught_up", self.summary("caught up"), **self.totals)
                        return 0
                    if self.wide is not None:
                        plans = self.wide.next_plans(owned, planner, self.cap(len(owned))) if owned else []
                    else:
                        plans = planner.plan(owned, committed, self.cap(len(owned))) if owned else []
                        plans = self.slots.assign(plans, [(t.topic, t.partition) for t in owned])
                except Exception as exc:
                    # A broker restarting or a coordinator moving: plan again shortly.
                    self._failed("planning", exc)
                    # The admin client's metadata (leader epochs) may be stale after a broker
                    # bounce, and it does not refresh on FENCED_LEADER_EPOCH: start a new one.
                    self.admin = self._admin_client()
                    planner.admin = self.admin
                    continue
                for warning in planner.warnings:
                    self.echo(warning)
                planner.warnings.clear()
                if not plans:
                    self.telemetry.idle(planner.marks)
                    # Planned from fresh watermarks and found nothing: wake on the next record.
                    # (A wide driver that waits for all the input partitions did not plan.)
                    looked = planner.marks is not marks_before
                    self._idle(idle, watch=[TopicPartition(t, p, mark.last_stable)
                                            for (t, p), mark in planner.marks.items()] if looked else None)
                    idle = min(idle * 2, s.idle_backoff_max_s)
                    continue
                idle = 0.05
                try:
                    self.arrow.before_batch()
                    report = self.run_batch(plans, self.commits)
                    self.arrow.after_batch(report.rows)
                    self._failures = 0
                    self._first_batch_done()
                except Exception as exc:
                    self.arrow.after_batch(None)
                    self._batch_failed(plans, exc)
                    continue
                self.telemetry.batch(report, planner.marks, report.line(self._lag(owned, report)))
                faults.maybe_fail("driver.between_batches")
                if s.max_batches is not None and self.totals["batches"] >= s.max_batches:
                    break
                wait = s.trigger_interval - (time.monotonic() - started)
                if wait > 0:
                    self._idle(wait)
            self.telemetry.event("stopped", self.summary("stopped"), **self.totals)
            return 0
        except Exception as exc:
            self.telemetry.event("fatal", None, error_type=type(understand(exc)).__name__, error=one_line(exc))
            raise
        finally:
            self.close()

    # -- failures: decided by type (txstream.errors.decide), nowhere else ------------------------

    def _batch_failed(self, plans: list[PartitionPlan], exc: BaseException) -> None:
        """Stop, isolate a poison record, or retry the batch, as the error's type says."""
        self._job = None   # the next batch builds its job afresh
        if self.membership is not None:
            self.membership.forget()   # what the batch committed is unknown: read it
        error = understand(exc)
        if decide(error) is Decision.ISOLATE:
            try:
                if self.wide is not None:
                    self.wide.abandon(plans)
                if self.poison.isolate(plans):
                    self._failures = 0
                    return
            except Exception as during:
                error = understand(during)  # the machinery failed while isolating: retry or stop
        self._failed(f"batch {self.batch_id}", error)

    def _failed(self, what: str, exc: BaseException) -> None:
        """Count a failure; stop on a user error, a fatal one or too many in a row; else back off."""
        error = understand(exc)
        if decide(error) is Decision.STOP:
            raise error from exc if error is not exc else None
        self._failures += 1
        if self._failures > self.settings.max_consecutive_failures:
            kind = "" if isinstance(error, DataError) else ", not because of the data (nothing was dead-lettered)"
            raise InfrastructureError(f"{what} failed {self._failures} times in a row{kind}; the last failure: "
                                      f"{one_line(error)}") from exc
        delay = min(0.5 * 2 ** self._failures, 10.0)
        self.telemetry.event("retry", f"{what} failed ({one_line(error)}); retrying in {delay:.1f}s", what=what,
                             error_type=type(error).__name__, error=one_line(error), delay_s=delay,
                             failures=self._failures)
        self._idle(delay)

    # -- what the poison isolator may do (driver/poison.py IsolationTarget) -----------------------

    def dry_run(self, plans: list[PartitionPlan]) -> TxstreamError | None:
        """The transform over `plans`, computed and counted, nothing published."""
        from txstream.task.dry_run import count_rows

        sc = self.spark.sparkContext
        sc.setJobGroup(f"txstream-{self.settings.app_id}-dry-run",
                       f"txstream {self.settings.app_id}: dry run of {len(plans)} range(s) (isolating a record)",
                       interruptOnCancel=True)
        try:
            count = functools.partial(count_rows, self.specs.for_reading(self.batch_id, plans))
            self.output_frame(plans).mapInArrow(count, "rows long").collect()
            return None
        except Exception as exc:
            return understand(exc)
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)
            sc.setLocalProperty("spark.job.description", None)

    def publish(self, plans: list[PartitionPlan]) -> None:
        """Publish `plans` as a normal batch (the good records before a poison record)."""
        report = self.run_batch(plans, self.commits)
        self.telemetry.batch(report, None, report.line())

    def dead_letter(self, plan: PartitionPlan, offset: int, message: str) -> None:
        """The record at `offset` to the dead-letter topic, its offset committed past (one
        transaction under exactly-once)."""
        s = self.settings
        if not s.dead_letter_topic:
            raise PoisonRecordError(
                f"record {plan.topic}[{plan.partition}]@{offset} failed in the transform: {message}. "
                "Declare a dead_letter_topic on the processor (or --dead-letter-topic) to set such "
                "records aside; nothing from this record on was published.")
        record = self._raw_record(plan, offset, message)
        if self.wide is not None:
            self.wide.dead_letter(plan, record)
            self.telemetry.event("dead_letter", None, topic=plan.topic, partition=plan.partition, offset=offset,
                                 stage="transform", count=1, error=message)
            return
        current = self.membership.committed([TopicPartition(plan.topic, plan.partition)], fresh=True)
        spec = self.specs.for_publishing(self.batch_id, [plan], self.membership.group_metadata())
        self.membership.forget()   # the dead letter commits past its offset
        status = publish_dead_letter(spec, replace(plan, committed=current.get((plan.topic, plan.partition))),
                                     record, self.membership)
        if status == STALE_PLAN:
            raise InfrastructureError(f"{plan.topic}[{plan.partition}] moved on while isolating offset {offset}")
        self.telemetry.event("dead_letter", None, topic=plan.topic, partition=plan.partition, offset=offset,
                             stage="transform", count=1, error=message)

    def _raw_record(self, plan: PartitionPlan, offset: int, message: str, timeout: float = 30) -> tuple:
        from txstream.kafka.scan import read_one

        msg = read_one(self.settings.clients, plan.topic, plan.partition, offset, timeout,
                       group_id=f"{self.settings.app_id}-poison")
        if msg is None:
            raise InfrastructureError(f"could not read {plan.topic}[{plan.partition}]@{offset} to dead-letter it")
        return (msg.key(), msg.value(), msg.headers(), msg.timestamp()[1], offset, "transform", message)

    def _wait_for_assignment(self, timeout: float = 60.0) -> None:
        assert self.membership is not None
        deadline = time.monotonic() + timeout
        while not self.membership.owned() and not self.stop_requested.is_set():
            if time.monotonic() > deadline:
                if self.settings.until_caught_up:
                    raise InfrastructureError(f"no partition of {', '.join(self.settings.input_topics)} was assigned "
                                       f"to this instance within {timeout:.0f}s (do the topics exist?)")
                deadline = float("inf")
            self.membership.poll(ASSIGNMENT_POLL_S)

    def _idle(self, seconds: float, watch: list[TopicPartition] | None = None) -> None:
        """Wait `seconds`, heartbeating; with `watch` (the owned partitions' last stable
        offsets, nothing to plan) a record committed there ends the wait (membership.watch)."""
        assert self.membership is not None
        deadline = time.monotonic() + seconds
        if watch:
            self.membership.watch(watch)
        try:
            while not self.stop_requested.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                if self.membership.poll(min(left, 0.2)):
                    break
        finally:
            if watch:
                self.membership.unwatch()

    def run_batch(self, plans: list[PartitionPlan], commits: DriverCommits) -> BatchReport:
        assert self.membership is not None
        if self.wide is not None:
            return self.wide.run_batch(plans)
        self.batch_id += 1
        started = time.monotonic()
        commits.before_batch(plans)
        # One publishing task per slot (driver/slots.py): its ranges are read one after another
        # and published in one transaction.
        layout = Slots.layout(plans, self._fixed_shape())
        fence_all, changes = self.fence_all_next, self.membership.generation_changes
        self._clean_at = None   # until this batch is known clean
        spec = self.specs.for_publishing(self.batch_id, plans, self.membership.group_metadata(),
                                         layout.layout, layout.width, fence_all)
        # A slot's ranges are read in one Python hand-off instead of one each (task/reading.py
        # range_frame) where the plan keeps every row in the partition it was read in
        # (checks.single_chain) and, with lineage, can carry each row's range tag to the
        # publisher (driver/range_tag.py).
        frame = self._batch_frame(plans, layout, layout.width > 1 and self._per_slot_reading)
        # What the Spark UI lists for the job: the batch a user finds in the batch lines.
        description = (f"txstream {self.settings.app_id} batch {self.batch_id} ({len(plans)} partitions in "
                       f"{layout.publishing_tasks} slots, {sum(p.size for p in plans)} records)")
        driver_s = time.monotonic() - (self._planning_started or started)
        rows = self.run_job(lambda: self._collect(frame, spec), description)
        commits.after_batch(plans, rows)
        if self.slots is not None:
            self.slots.note(rows)
        # Clean: every range published by one attempt's producer, nothing left open or racing;
        # and every plan's end is committed (by its transaction, or by the driver after the acks).
        if all(row["status"] in (COMMITTED, ALREADY_DONE, ACKED) for row in rows):
            self._clean_at = changes
            self.membership.remember({(p.topic, p.partition): p.end for p in plans}, changes)
        else:
            self.membership.forget()
        self._learn_rate(plans, rows)
        self._planning_started = None
        return self.count_batch(BatchReport(self.batch_id, plans, rows, time.monotonic() - started, driver_s=driver_s))

    def _new_slots(self) -> Slots:
        """The run's slots: --task-slots of them, else one per Spark core (driver/slots.py)."""
        s = self.settings
        return Slots(s.app_id, s.task_slots or self.spark.sparkContext.defaultParallelism, s.producers_per_slot)

    def _fixed_shape(self, slots: Slots | None = None) -> dict[str, int] | None:
        """Every slot of the owned partitions (of `slots`, else the run's), for a layout of the
        same size in every batch (driver/slots.py Slots.layout), where padding is free: a slot read
        in one partition, or slots of one partition each. A transform that needs a Spark partition
        per range pays a Python hand-off per padded range, so its layout follows the batch's plans."""
        slots = slots or self.slots
        shape = slots.shape if slots is not None else None
        if not shape or not (self._per_slot_reading or max(shape.values()) == 1):
            return None
        return shape

    def _batch_frame(self, plans: list[PartitionPlan], layout: SlotLayout, per_slot: bool, out=None):
        """The batch's job: built once, run again for every batch of the same shape (the ranges
        travel with each job: task/job_spec.py; the Arrow batch settings, which change after the
        first batch, are read by Spark each time the job runs: spark/arrow_batches.py). With the
        processor's `transform_each_batch`, built every batch: `transform` runs again, and so
        does what its plan computes once per execution (the broadcast side of a join re-reads
        its table). `out`: the transform's output for this reading mode, built already (validate)."""
        tagged = per_slot and self.settings.lineage
        key = (len(layout.layout) or len(plans), layout.width, per_slot, tagged)
        if self._job is not None and self._job.key == key and not self.settings.processor.transform_each_batch:
            return self._job.frame
        if out is None:
            out = self._batch_output(plans, layout, per_slot)
        frame = self._publishing_frame(out, layout, per_slot, tagged)
        if per_slot and (frame is None or not single_chain(frame)):
            self._per_slot_reading = False   # the transform's shape does not change within a run
            return self._batch_frame(plans, layout, False)
        check_narrow(frame, own_coalesce=layout.width > 1 and not per_slot)
        self._job = _BatchJob(key, frame)
        self.jobs_built += 1
        return frame

    def _batch_output(self, plans: list[PartitionPlan], layout: SlotLayout, per_slot: bool):
        """The transform's output over a batch job's source (its ranges come with each job)."""
        source = range_frame(self.spark, self.specs.for_reading(self.batch_id, plans, layout.layout, layout.width),
                             None, per_slot, per_slot and self.settings.lineage, from_job=True)
        return self._to_sink(self.settings.processor.transform(source))

    def _publishing_frame(self, out, layout: SlotLayout, per_slot: bool, tagged: bool):
        """The transform's output `out`, grouped by slot, into the publishing tasks (None: read
        per slot, the plan cannot carry the rows' range tag the lineage needs)."""
        from pyspark.sql import functions as F

        if tagged:
            out = carry_range_tag(out)
            if out is None:
                return None
        elif not per_slot:
            out = out.withColumn(RANGE_COLUMN, F.spark_partition_id())
            if layout.width > 1:
                out = out.coalesce(layout.publishing_tasks)
        return out.mapInArrow(functools.partial(publish_slot, FromJob("publish")), result_schema())

    def _collect(self, frame, spec: PublishSpec) -> list[dict]:
        """Run the batch's job with its spec (task/job_spec.py), on the job's own thread."""
        sc = self.spark.sparkContext
        sc.setLocalProperty(JOB_SPEC_PROPERTY, encode_job_spec(spec))
        try:
            return [row.asDict() for row in frame.collect()]
        finally:
            sc.setLocalProperty(JOB_SPEC_PROPERTY, None)

    def count_batch(self, report: BatchReport) -> BatchReport:
        """Add a finished batch (narrow or wide) to the run's totals."""
        self.totals["batches"] += 1
        for key in ("records_in", "records_out", "dead_letters"):
            self.totals[key] += report.total(key)
        return report

    def run_job(self, action: Callable[[], Any], description: str) -> Any:
        """Run a batch's Spark job (`action`) in its own job group, watched: a "still running" line
        now and then, and cancelled after batch_timeout_s (a hung task must not stall the run)."""
        outcome: dict[str, Any] = {}
        started = time.monotonic()
        job_group = f"txstream-{self.settings.app_id}-batch-{self.batch_id}"
        sc = self.spark.sparkContext

        def work() -> None:
            try:
                # Per-thread job group (Spark pins Python threads to JVM threads), so the
                # watchdog below can cancel exactly this batch's job.
                sc.setJobGroup(job_group, description, interruptOnCancel=True)
                outcome["rows"] = action()
            except BaseException as exc:
                outcome["error"] = exc

        self._batch_thread = threading.Thread(target=work, name=f"txstream-batch-{self.batch_id}", daemon=True)
        self._batch_thread.start()
        limit = self.settings.batch_timeout_s
        every = min(BATCH_PROGRESS_EVERY_S, limit / 2)
        next_report = started + every
        cancelled = False
        while self._batch_thread.is_alive():
            # Wake the moment the job ends (a poll that waits would add up to its timeout to
            # every batch's latency); librdkafka heartbeats on its own thread, the poll serves
            # the group's callbacks, and a revocation waits for this batch.
            self._batch_thread.join(0.1)
            self.membership.poll(0)
            now = time.monotonic()
            if now >= next_report and self._batch_thread.is_alive():
                next_report = now + every
                self.echo(f"batch {self.batch_id} still running after {now - started:.0f}s: {self._job_progress()}")
            if not cancelled and now - started > limit:
                # A hung task (a broker that never answers, a stuck worker) must not stall the
                # run for ever. Whatever was not committed is aborted or fenced on re-plan.
                self.echo(f"batch {self.batch_id} exceeded {limit:.0f}s; cancelling it")
                sc.cancelJobGroup(job_group)
                cancelled = True
        if "error" in outcome:
            if cancelled:
                raise BatchTimeout(f"batch {self.batch_id} cancelled after {limit:.0f}s "
                                   f"(batch_timeout_s); its transactions are aborted or fenced on re-plan") \
                    from outcome["error"]
            raise outcome["error"]
        return outcome["rows"]

    def _job_progress(self) -> str:
        """What the batch's Spark job is doing, for the 'still running' line."""
        tracker = self.spark.sparkContext.statusTracker()
        parts = []
        for stage_id in tracker.getActiveStageIds():
            info = tracker.getStageInfo(stage_id)
            if info is not None:
                parts.append(f"stage {stage_id}: {info.numCompletedTasks}/{info.numTasks} tasks done, "
                             f"{info.numActiveTasks} running, {info.numFailedTasks} failed")
        return "; ".join(parts) or "no active stage"

    # -- pacing -----------------------------------------------------------------------------------

    def _learn_rate(self, plans: list[PartitionPlan], rows: list[dict]) -> None:
        for row in rows:
            busy = float(row["read_s"]) + float(row["produce_s"]) + float(row["commit_s"])
            if row["status"] in (COMMITTED, ACKED) and int(row["records_in"]) > 1000 and busy > 0:
                rate = int(row["records_in"]) / busy
                self._rate = rate if self._rate is None else 0.7 * self._rate + 0.3 * rate

    def cap(self, partitions: int) -> int:
        """Records per partition per batch: in the run's first batch, its share of
        first_batch_records; always so that a transaction stays well inside its timeout."""
        cap = self.settings.max_records_per_partition
        if self._first_batch_budget is not None:
            cap = min(cap, max(1, self._first_batch_budget // max(1, partitions)))
        if self._rate is None:
            return cap
        safe = max(1000, int(self._rate * self.settings.transaction_timeout_s / 3))
        if safe < cap and not self._cap_warned:
            self._cap_warned = True
            self.echo(f"note: {cap} records per partition would take ~{cap / self._rate:.0f}s at the measured "
                      f"{self._rate:.0f} records/s, too close to transaction.timeout.ms="
                      f"{self.settings.transaction_timeout_s * 1000:.0f}; batches are capped at {safe}")
        return min(cap, safe)

    def _first_batch_done(self) -> None:
        """After the run's first batch (kept small, so that the first output comes soon after the
        start even over a backlog): batches as big as the cap allows. Measured over 200,000
        orders: one small batch and then full ones cost 1 batch more than no ramp; ramping 4x
        per batch cost 2 more, and ~20% of the run's records/s."""
        self._first_batch_budget = None

    def _remember_targets(self, owned: list[TopicPartition]) -> None:
        from txstream.driver.planning import watermarks

        new = [tp for tp in owned if (tp.topic, tp.partition) not in self.targets]
        if new:
            for key, mark in watermarks(self.admin, new).items():
                self.targets[key] = mark.last_stable

    def _caught_up(self, owned: list[TopicPartition], committed: dict[tuple[str, int], int | None]) -> bool:
        if not owned:
            return False
        for tp in owned:
            key = (tp.topic, tp.partition)
            target = self.targets.get(key, 0)
            done = committed.get(key)
            if done is None and self.settings.auto_offset_reset == "latest":
                continue  # starts at the end: nothing to catch up on until something arrives
            if target > 0 and (done is None or done < target):
                return False
        return True

    def _lag(self, owned: list[TopicPartition], report: BatchReport) -> int | None:
        if not self.settings.until_caught_up:
            return None
        done = {(p.topic, p.partition): p.end for p in report.plans}
        return sum(max(0, self.targets.get((tp.topic, tp.partition), 0) -
                       done.get((tp.topic, tp.partition), self.targets.get((tp.topic, tp.partition), 0)))
                   for tp in owned)

    def summary(self, what: str) -> str:
        t = self.totals
        return (f"{what}: {t['batches']} batches, {t['records_in']} records in, {t['records_out']} out, "
                f"{t['dead_letters']} dead-lettered")

    def close(self) -> None:
        # The signal handlers stay until everything is closed: a SIGTERM that arrives while
        # the driver leaves the group or stops Spark is the stop already under way, not a kill.
        try:
            if self.wide is not None:
                self.wide.close()
            if self.membership is not None:
                self.stable_reads = self.membership.stable_reads
                self.membership.close()
                self.membership = None
            if self.spark is not None and self._own_spark:
                stop_spark(self.spark)
                self.spark = None
            self.telemetry.close()
        finally:
            for sig, previous in getattr(self, "_previous_handlers", {}).items():
                signal.signal(sig, previous)
            self._previous_handlers = {}


__all__ = ["Driver", "TransformError", "BatchReport", "build_spark", "ALREADY_DONE", "FENCED", "STALE_PLAN"]
