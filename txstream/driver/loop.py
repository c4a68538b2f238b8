"""The driver loop (Kafka Streams' StreamThread): membership, planning, the failure policy.

The loop starts Spark, chooses how batches are published from the transform's physical plan, and
then plans and runs batch after batch through one `BatchProtocol` (driver/batches.py): narrow
(driver/narrow.py) or wide (driver/wide.py). What a failure means is decided by its type
(txstream.errors.decide), here and nowhere else.
"""
from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Callable

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from txstream import fault_injection
from txstream.classify import one_line, understand
from txstream.driver.batches import BatchProtocol
from txstream.driver.choice import choose_protocol
from txstream.driver.jobs import SparkJobs
from txstream.driver.membership import GroupMembership
from txstream.driver.metrics import Telemetry
from txstream.driver.pacing import Pacing
from txstream.driver.planning import Planner
from txstream.driver.poison import PoisonIsolator
from txstream.driver.report import BatchReport, late_destination
from txstream.driver.specs import TaskSpecs
from txstream.driver.stopping import StopSignals
from txstream.driver.tables import Tables
from txstream.errors import (
    DataError,
    Decision,
    InfrastructureError,
    PoisonRecordError,
    TransformError,
    TxstreamError,
    decide,
    topic_missing,
)
from txstream.records import DeadLetter
from txstream.serde.registry import CLIENT_MODULES as REGISTRY_CLIENT_MODULES
from txstream.settings import RunSettings
from txstream.spark.arrow_batches import ArrowBatches
from txstream.spark.session import build_spark, stop_spark, warm_python_workers
from txstream.spark.setup import is_local
from txstream.task.spec import PartitionPlan

log = logging.getLogger("txstream")

# The step of the wait for an assignment. The consumer's poll() serves the rebalance callback and
# then waits out the rest of its timeout (no record comes: every partition is paused), so a
# longer step delays every start by that much after the assignment has arrived.
ASSIGNMENT_POLL_S = 0.01


class Driver:
    def __init__(self, settings: RunSettings, echo: Callable[[str], None] = print, spark=None) -> None:
        self.settings = settings
        self.spark = spark
        self._own_spark = spark is None
        self.telemetry = Telemetry(settings, echo)   # metrics and log lines (driver/metrics.py)
        self.echo = self.telemetry.echo
        self.admin = self._admin_client()
        self.stop_requested = threading.Event()
        self.stopping: StopSignals | None = None   # installed by run()
        self.specs = TaskSpecs(settings)
        self.pacing = Pacing(settings.max_records_per_partition, settings.transaction_timeout_s,
                             settings.first_batch_records, self.echo)
        self.jobs: SparkJobs | None = None           # once Spark runs
        self.protocol: BatchProtocol | None = None   # narrow or wide, chosen by `validate`
        self.membership: GroupMembership | None = None
        self.targets: dict[tuple[str, int], int] = {}
        # late: rows behind a stateful batch's watermark, dead-lettered or (no dead-letter topic) dropped.
        self.totals = {"records_in": 0, "records_out": 0, "dead_letters": 0, "batches": 0, "late": 0}
        self.stable_reads = 0   # the group's committed offsets read from Kafka (membership.py), at close
        self._failures = 0                  # batches or plans failed in a row
        self.poison = PoisonIsolator(self, self.echo, settings.dead_letter_topic)
        self.input_partitions = 0
        self.input_topic_partitions: dict[str, int] = {}   # each input topic's partition count (check_topics)
        self.arrow: ArrowBatches | None = None   # the Arrow batch size, per batch (spark/arrow_batches.py)

    @property
    def batch_id(self) -> int:
        """The batch last started (0: none yet)."""
        return self.protocol.batch_id if self.protocol is not None else 0

    @property
    def jobs_built(self) -> int:
        """Narrow batch jobs built (tests, diagnostics)."""
        return self.jobs.built if self.jobs is not None else 0

    # -- set-up -----------------------------------------------------------------------------------

    def _admin_client(self) -> AdminClient:
        from txstream.kafka.lookups import admin_client

        return admin_client(self.settings.clients)

    def check_topics(self) -> None:
        """Inputs, tables, the output and the dead-letter topic must exist: txstream never creates them."""
        s = self.settings
        from txstream.kafka.acls import app_needs, check_access
        from txstream.kafka.lookups import cluster_topics

        known = cluster_topics(self.admin, timeout=30)  # also the reachability check: one clear line
        # Before "does not exist": a topic the principal may not describe is not listed either.
        read = s.input_topics + [t.topic for t in s.tables]
        check_access(self.admin, s.clients, app_needs(s.app_id, read, s.output_topic, s.dead_letter_topic,
                                                      s.guarantee), timeout=30)
        wanted = [("input", t) for t in s.input_topics] + [("table", t.topic) for t in s.tables]
        wanted += [("output", s.output_topic)] if s.output_topic else []
        wanted += [("dead-letter", s.dead_letter_topic)] if s.dead_letter_topic else []
        missing = [(role, name) for role, name in wanted if name not in known]
        if missing:
            raise TransformError(topic_missing(*missing[0], s.bootstrap_servers, missing[1:]))
        self.input_topic_partitions = {t: known[t] for t in s.input_topics}
        self.input_partitions = sum(self.input_topic_partitions.values())

    def validate(self) -> None:
        """Check the transform's output and choose the batch protocol (driver/choice.py)."""
        assert self.jobs is not None
        self.protocol = choose_protocol(self.settings, self.specs, self.jobs, self.pacing, self.admin,
                                        self.input_topic_partitions, self.echo)

    def _start_spark(self) -> None:
        """The session (spark/setup.py decides master and settings). Locally the Python workers are
        warmed up meanwhile; on a cluster the processor's code is shipped and every executor core
        passes the preflight (driver/preflight.py) before anything is read."""
        s = self.settings
        fault_injection.remember_driver()
        self.spark = build_spark(s.master, s.app_id, s.spark_conf, ui_port=s.spark_ui_port,
                                 cores_hint=self.input_partitions or None, echo=self.echo,
                                 worker_imports=REGISTRY_CLIENT_MODULES if s.schema_registry is not None else ())
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

    def _group_is_empty(self) -> bool:
        """The app's group has no member now. Then the driver joins it before Spark starts, so
        that the join (its round trips, and on a broker with Kafka's default
        group.initial.rebalance.delay.ms the 3 s a first member waits) happens while Spark starts
        rather than before the first batch. Into a group with members it joins after the
        transform's check: one of them may be a wide app's only instance, which must
        keep its partitions while this driver finds that out and refuses (driver/wide.py). Unknown
        (the group cannot be described, e.g. no ACL for it): not empty."""
        from txstream.kafka.lookups import describe_group

        try:
            return not describe_group(self.admin, self.settings.app_id, timeout=10).members
        except Exception as exc:
            log.debug("describing the group %s: %s", self.settings.app_id, exc)
            return False

    def _join_group(self) -> GroupMembership:
        s = self.settings
        membership = GroupMembership(s.clients, s.app_id, s.input_topics, self._wait_for_batch, self._on_group_change)
        self.telemetry.follow(membership)
        return membership

    def _wait_for_batch(self) -> None:
        if self.jobs is not None:
            self.jobs.wait()

    def _on_group_change(self, what: str, partitions: list[TopicPartition]) -> None:
        names = [f"{p.topic}[{p.partition}]" for p in partitions]
        self.telemetry.event(what, f"partitions {what}: {', '.join(names)}", partitions=names)

    def _install_signals(self) -> None:
        self.stopping = StopSignals(self.stop_requested, self.echo, self._cancel_jobs)
        self._previous_handlers = self.stopping.install()

    def _cancel_jobs(self) -> None:
        if self.spark is not None:
            self.spark.sparkContext.cancelAllJobs()

    def run(self) -> int:
        """Preflight, Spark, the protocol's start and the group, then batches until told to stop."""
        self._install_signals()
        try:
            self._preflight()
        except Exception as exc:
            self.telemetry.event("fatal", None, error_type=type(understand(exc)).__name__, error=one_line(exc))
            self.close()
            raise
        try:
            protocol, planner = self._start()
            return self._loop(protocol, planner)
        except Exception as exc:
            self.telemetry.event("fatal", None, error_type=type(understand(exc)).__name__, error=one_line(exc))
            raise
        finally:
            self.close()

    def _preflight(self) -> None:
        """Kafka reachable and the topics there before Spark's seconds of start-up: an unreachable
        cluster or a missing topic is reported at once."""
        s = self.settings
        self.telemetry.start()
        self.check_topics()
        if s.schema_registry is not None:
            # The schemas decided before Spark starts and anything is read (the specs carry them).
            from txstream.driver.preflight import check_registry

            check_registry(s, self.echo)
            self.specs = TaskSpecs(s)
        if self._group_is_empty():
            self.membership = self._join_group()

    def _start(self) -> tuple[BatchProtocol, Planner]:
        """Spark started, the transform checked, the protocol chosen and started, the group joined."""
        s = self.settings
        if self.spark is None:
            self._start_spark()
        s.processor.setup(self.spark)
        self.arrow = ArrowBatches(self.spark)
        self.jobs = SparkJobs(self.spark, s, self.specs, self.echo, Tables(s, lambda: self.admin, self.specs.read))
        self.validate()
        protocol = self.protocol
        assert protocol is not None
        if self.membership is not None:
            self._wait_for_assignment()   # its own member id known to the protocol's start
        protocol.start(self.membership)
        if self.membership is None:
            self.membership = self._join_group()
        protocol.joined(self.membership)
        planner = Planner(self.admin, s.app_id, s.auto_offset_reset, s.max_records_per_partition)
        self._wait_for_assignment()
        return protocol, planner

    def _loop(self, protocol: BatchProtocol, planner: Planner) -> int:
        """Plan, run and report batches until a stop, `--max-batches` or `--until-caught-up`."""
        s = self.settings
        idle = 0.05
        while not self.stop_requested.is_set():
            started = time.monotonic()
            self.membership.poll(0)
            owned = self.membership.owned()
            marks_before = planner.marks
            try:
                committed = self.membership.committed(owned)
                self._remember_targets(owned)
                if s.until_caught_up and self._caught_up(owned, committed) and not protocol.owes_batch(owned):
                    self.telemetry.event("caught_up", self.summary("caught up"), **self.totals)
                    return 0
                plans = protocol.next_plans(planner, owned, committed, self.pacing.cap(len(owned))) if owned else []
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
                self.telemetry.idle(planner.marks, {(tp.topic, tp.partition) for tp in owned})
                # Planned from fresh watermarks and found nothing: wake on the next record.
                # (A wide driver that waits for all the input partitions did not plan.)
                looked = planner.marks is not marks_before
                self._idle(idle, watch=[TopicPartition(t, p, mark.last_stable)
                                        for (t, p), mark in planner.marks.items()] if looked else None)
                idle = min(idle * 2, s.idle_backoff_max_s)
                continue
            idle = 0.05
            report = self._one_batch(plans, started)
            if report is None:
                continue
            self._report(report, planner.marks, report.line(self._lag(owned, report)))
            fault_injection.maybe_fail("driver.between_batches")
            if s.max_batches is not None and self.totals["batches"] >= s.max_batches:
                break
            wait = s.trigger_interval - (time.monotonic() - started)
            if wait > 0:
                self._idle(wait)
        if self.stopping.signal_name is None:
            self.telemetry.event("stopped", self.summary("stopped"), **self.totals)
            return 0
        self.telemetry.event("stopped", self.stopping.line(self.batch_id, self._committed_now()),
                             signal=self.stopping.signal_name, **self.totals)
        return self.stopping.exit_code

    def _one_batch(self, plans: list[PartitionPlan], started: float) -> BatchReport | None:
        """Run one planned batch; None when it failed (the failure policy has decided what next)."""
        try:
            self.arrow.before_batch()
            report = self._run_batch(plans, started)
        except Exception as exc:
            self.arrow.after_batch(None)
            self._batch_failed(plans, exc)
            return None
        self.arrow.after_batch(report.rows)
        self._failures = 0
        self.pacing.first_batch_done()
        return report

    def _committed_now(self) -> dict[tuple[str, int], int | None] | None:
        """The group's offsets of the owned partitions, for the stop line (None: unreadable)."""
        try:
            return self.membership.committed(self.membership.owned(), timeout=10, fresh=True) \
                if self.membership is not None else {}
        except Exception:
            return None

    # -- failures: decided by type (txstream.errors.decide), nowhere else ------------------------

    def _batch_failed(self, plans: list[PartitionPlan], exc: BaseException) -> None:
        """Stop, isolate a poison record, or retry the batch, as the error's type says."""
        if self.jobs is not None:
            self.jobs.forget()   # the next batch builds its job afresh
        if self.membership is not None:
            self.membership.forget()   # what the batch committed is unknown: read it
        if self.stopping is not None and self.stopping.aborted_by is not None:
            return   # the user's second signal cancelled the batch: a stop, not a failure to retry
        error = understand(exc)
        if decide(error) is Decision.ISOLATE:
            try:
                if self.protocol is not None:
                    self.protocol.abandon(plans)
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
        assert self.jobs is not None
        return self.jobs.dry_run(self.batch_id, plans)

    def publish(self, plans: list[PartitionPlan]) -> None:
        """Publish `plans` as a normal batch (the good records before a poison record)."""
        report = self._run_batch(plans)
        self._report(report, None, report.line())

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
        assert self.protocol is not None
        self.protocol.dead_letter(plan, record)
        self.telemetry.event("dead_letter", None, topic=plan.topic, partition=plan.partition, offset=offset,
                             stage="transform", count=1, error=message)

    def _raw_record(self, plan: PartitionPlan, offset: int, message: str, timeout: float = 30) -> DeadLetter:
        from txstream.kafka.scan import read_one

        msg = read_one(self.settings.clients, plan.topic, plan.partition, offset, timeout,
                       group_id=f"{self.settings.app_id}-poison")
        if msg is None:
            raise InfrastructureError(f"could not read {plan.topic}[{plan.partition}]@{offset} to dead-letter it")
        return DeadLetter(msg.key(), msg.value(), msg.headers(), msg.timestamp()[1], offset, "transform", message)

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

    def _run_batch(self, plans: list[PartitionPlan], planned_at: float | None = None) -> BatchReport:
        """One batch through the protocol, added to the run's totals."""
        assert self.protocol is not None
        report = self.protocol.run_batch(plans, planned_at)
        report.dead_letter_topic = self.settings.dead_letter_topic
        self.totals["batches"] += 1
        for key in ("records_in", "records_out", "dead_letters"):
            self.totals[key] += report.total(key)
        self.totals["late"] += report.late
        return report

    def _report(self, report: BatchReport, marks, line: str) -> None:
        self.telemetry.batch(report, marks, line, cap=self.pacing.cap(len(report.plans)), totals=self.totals,
                             spark=self.spark)

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
        text = (f"{what}: {t['batches']} batches, {t['records_in']} records in, {t['records_out']} out, "
                f"{t['dead_letters']} dead-lettered")
        # Late rows are not among the dead letters above (those are the undecodable records).
        return text + (f", {t['late']} late ({late_destination(self.settings.dead_letter_topic)})" if t["late"] else "")

    def close(self) -> None:
        # The signal handlers stay until everything is closed: a SIGTERM that arrives while
        # the driver leaves the group or stops Spark is the stop already under way, not a kill.
        try:
            if self.protocol is not None:
                self.protocol.close()
            if self.membership is not None:
                self.stable_reads = self.membership.stable_reads
                self.membership.close()
                self.membership = None
                self.telemetry.follow(None)
            if self.spark is not None and self._own_spark:
                stop_spark(self.spark)
                self.spark = None
            self.telemetry.close()
        finally:
            for sig, previous in getattr(self, "_previous_handlers", {}).items():
                signal.signal(sig, previous)
            self._previous_handlers = {}


__all__ = ["Driver", "TransformError", "BatchReport", "build_spark"]
