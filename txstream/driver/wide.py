"""The wide batch protocol: the plan log, the output units, closing a batch (docs/wide-transforms.md).

A batch b, in `units` mode:
1. **Log the plan.** One transaction of the driver's producer (`<app>-driver`) commits, for each
   input partition, its start offset with its share of b in the metadata (records.py PlanShare).
   A pending logged plan is re-run as it is, never re-planned.
2. **Units.** The transform's output is repartitioned into K units by the hash of its key (or of
   all its columns); unit i is published by `<app>-unit-i` with its marker (task/units.py).
3. **Close.** When every unit reports its marker at b, one transaction of the driver's producer
   publishes the batch's undecodable records to the dead-letter topic and commits the input end
   offsets (nothing pending in the metadata), under the member's group metadata.

`single-transaction` mode: the driver collects the output (Arrow) and publishes it, the dead
letters and the input end offsets in one transaction of its own producer: no units, no
determinism needed, as fast as one producer; the oracle the units mode is tested against.

Every write of the driver goes through one producer whose `init_transactions` fences an older
driver of the same app: a driver another instance replaced can write neither log nor output.
"""
from __future__ import annotations

import functools
import time
from dataclasses import replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable

from confluent_kafka import TopicPartition

from txstream import fault_injection
from txstream.constants import (
    ACKED,
    ALREADY_DONE,
    AT_MOST_ONCE,
    COMMITTED,
    EMPTY,
    EXACTLY_ONCE,
    SINGLE_TRANSACTION,
    UNITS,
)
from txstream.driver.jobs import SparkJobs
from txstream.driver.membership import GroupMembership
from txstream.driver.planning import Planner
from txstream.driver.report import BatchReport
from txstream.driver.specs import TaskSpecs
from txstream.driver.wide_batch import WideBatch
from txstream.errors import (
    AbortableError,
    FencedError,
    InfrastructureError,
    KafkaFailure,
    PoisonRecordError,
    UserError,
)
from txstream.kafka import transactions
from txstream.kafka.transactions import CallableTransaction, TransactionalPublisher, publish_plain
from txstream.records import (
    BatchRecord,
    DeadLetter,
    LoggedPartition,
    PendingBatch,
    PlanShare,
    last_batch_id,
    last_watermark,
    markers_name,
    pending_batch,
    read_markers,
)
from txstream.settings import RunSettings
from txstream.task.reading import ReadAccounts
from txstream.task.result import TaskResult, result_schema
from txstream.task.spec import FromJob, JobSpec, PartitionPlan
from txstream.task.tables import decode_versions
from txstream.task.units import (
    NONDETERMINISTIC,
    VALUES_DIFFER,
    UnitSpec,
    publish_unit,
    unit_transactional_id,
    wide_collector,
)

if TYPE_CHECKING:
    from txstream.driver.stateful import StatefulUnits


class WideAppRunningError(UserError):
    """A second instance of a wide app was started while the first runs."""


class InstanceReplacedError(UserError):
    """This instance's driver producer was fenced: a newer instance of the wide app took over."""


class NondeterministicTransformError(UserError):
    """A unit's replay published rows that differ from the committed attempt's."""


class WideBatches:
    """The wide protocol for one run (a `BatchProtocol`)."""

    remembers = False   # committed offsets carry the plan log: always read from Kafka

    def __init__(self, settings: RunSettings, specs: TaskSpecs, jobs: SparkJobs, admin: Any,
                 input_partitions: int, echo: Callable[[str], None], state: StatefulUnits | None = None) -> None:
        self.settings = settings
        # A stateful run's: its units are the state's partitions (driver/stateful.py).
        self.state = state
        self.specs = specs
        self.jobs = jobs
        self.admin = admin
        self.input_partitions = input_partitions
        self.mode = settings.wide_mode
        self.units = state.units if state is not None else settings.output_units or input_partitions or 1
        self.allow_nondeterministic = settings.allow_nondeterministic
        self.echo = echo
        self.membership: GroupMembership | None = None
        self.last_reads: dict[tuple[str, int], tuple[int, int]] = {}   # the last batch's, per input partition
        self.current: WideBatch | None = None
        self._batch_id = 0
        self._publisher: TransactionalPublisher | None = None
        self._markers_metadata: Any = None
        self._waiting_noted = False

    @property
    def batch_id(self) -> int:
        return self._batch_id

    # -- start ------------------------------------------------------------------------------------

    def describe(self) -> str:
        if self.state is not None:
            return self.state.describe()
        if self.mode == SINGLE_TRANSACTION:
            return ("protocol: wide, single transaction (the driver publishes each batch's output and "
                    "its input offsets in one transaction)")
        return (f"protocol: wide, {self.units} output units (<app>-unit-0..{self.units - 1}, markers in "
                f"{markers_name(self.settings.app_id)}; docs/wide-transforms.md)")

    def start(self, membership: GroupMembership | None) -> None:
        """Refuse a second live instance; create the markers topic; fence an older driver (and
        check and create the state's)."""
        s = self.settings
        if self.state is not None:
            self.state.check_start(self.mode)
            self.units = self.state.units
        self._refuse_second_instance(membership.member_id() if membership is not None else None)
        if s.guarantee != EXACTLY_ONCE:
            return
        self._ensure_markers_topic()
        if self.mode == UNITS:
            from confluent_kafka import Consumer

            # A consumer of the markers group that never subscribes: its metadata has generation
            # -1 and no member id, which the broker accepts for the group nobody joins.
            consumer = Consumer(s.clients.consumer(markers_name(s.app_id), **{"enable.auto.commit": False}))
            self._markers_metadata = consumer.consumer_group_metadata()
            consumer.close()
        self._publisher = TransactionalPublisher(self.specs.publish.producer_config(transactional=True),
                                                 f"{s.app_id}-driver", None, self.specs.publish.timeout_s)
        self._publisher.init()
        if self.state is not None:
            self.state.started()

    def joined(self, membership: GroupMembership) -> None:
        self.membership = membership
        membership.remembers = self.remembers

    def _refuse_second_instance(self, own: str | None) -> None:
        """A wide app runs as one instance. Members of its group that do not go away within a
        session timeout (a crashed instance's do) belong to a live instance: refuse."""
        from confluent_kafka.admin import AdminClient

        from txstream.kafka.retry import retriable

        s = self.settings
        session_s = int(s.consumer_config.get("session.timeout.ms", 10_000)) / 1000
        admin: AdminClient = self.admin
        deadline = time.monotonic() + session_s + 5
        noted = False
        # `own`: this driver's member id, when it joined already (an empty group).
        while True:
            description = retriable(lambda: admin.describe_consumer_groups([s.app_id])[s.app_id].result(30), 60)
            members = [m for m in description.members or [] if m.member_id != own]
            if not members:
                return
            if time.monotonic() > deadline:
                who = ", ".join(f"{m.client_id or m.member_id} on {m.host}" for m in members[:3])
                raise WideAppRunningError(
                    f"{s.app_id} is a wide app and already runs ({who}). A wide app runs as one instance: "
                    "its batches span all input partitions. Stop that instance first (a crashed one drops "
                    "out of the group within its session timeout).")
            if not noted:
                self.echo(f"the group {s.app_id} has {len(members)} member(s); waiting up to {session_s:.0f}s "
                          "for them to leave (a wide app runs as one instance)")
                noted = True
            time.sleep(1.0)

    def _ensure_markers_topic(self) -> None:
        from txstream.kafka.acls import check_internal_access
        from txstream.kafka.internal_topics import ensure_topic

        name = markers_name(self.settings.app_id)
        admin = self.admin
        if ensure_topic(admin, name, self.units, {}, app_id=self.settings.app_id, what="markers topic", grow=True):
            self.echo(f"created the markers topic {name} ({self.units} partitions: the units' markers are "
                      "committed offsets of its partitions; it holds one record per closed batch)")
        check_internal_access(admin, self.settings.clients, self.settings.app_id, [name], [name], timeout=30)

    # -- planning ---------------------------------------------------------------------------------

    def read_log(self, owned: list[TopicPartition]) -> dict[tuple[str, int], LoggedPartition]:
        from txstream.kafka.retry import retriable

        consumer = self.membership.consumer
        wanted = [TopicPartition(p.topic, p.partition) for p in owned]
        answer = retriable(lambda: consumer.committed(wanted, timeout=30), 30)
        return {(tp.topic, tp.partition): LoggedPartition(tp.offset if tp.offset >= 0 else None,
                                                          PlanShare.decode(tp.metadata)) for tp in answer}

    def next_plans(self, planner: Planner, owned: list[TopicPartition],
                   committed: dict[tuple[str, int], int | None], cap: int) -> list[PartitionPlan]:
        """The logged batch that is not closed, else a new one (logged before it runs); [] when
        there is nothing to do or not every input partition is this instance's. (`committed`:
        the group's offsets, which the log carries too, with the pending plan.)"""
        total = self.input_partitions
        if len(owned) < total:
            if not self._waiting_noted:
                self.echo(f"waiting to own all {total} input partitions (this instance has {len(owned)}): "
                          "a wide batch spans them all")
                self._waiting_noted = True
            return []
        self._waiting_noted = False
        log = self.read_log(owned)
        pending = pending_batch(log)
        if pending is not None:
            self.current = self._from_log(pending)
            if self.state is not None:
                self.state.planned(self.current.plans)
            return self.current.plans
        committed = {key: entry.committed for key, entry in log.items()}
        plans = planner.plan(owned, committed, cap)
        if self.state is not None:
            self.state.planned(plans)
            if not plans and self.state.watermarked and self._owes(log):
                # A batch with no records: the watermark closes what no new record will.
                plans = [PartitionPlan(t, p, entry.committed, entry.committed, entry.committed, "")
                         for (t, p), entry in sorted(log.items()) if entry.committed is not None]
        if not plans:
            return []
        self.current = self._log_new_batch(log, plans)
        return self.current.plans

    @property
    def plan_units(self) -> int:
        return self.units if self.mode == UNITS else 1

    @property
    def _logs_plans(self) -> bool:
        """Only the units mode under exactly-once re-runs a batch's plan (and so logs it)."""
        return self.mode == UNITS and self.settings.guarantee == EXACTLY_ONCE

    def _log_new_batch(self, log: dict[tuple[str, int], LoggedPartition], plans: list[PartitionPlan]) -> WideBatch:
        """A new batch over `plans`: an id above every logged one and every unit's marker (so
        markers left by an earlier life of the app never make it skip), logged before it runs."""
        batch_id = last_batch_id(log) + 1
        markers = read_markers(self.settings.clients, self.settings.app_id, self.plan_units) if self._logs_plans else {}
        batch_id = max([batch_id] + [m.done_through + 1 for m in markers.values()])
        batch = WideBatch(batch_id, self.plan_units, int(time.time() * 1000), _wide_plans(plans), recovered=False,
                          watermark_ms=self.state.next_watermark(log, markers) if self.state is not None else None,
                          late_ms=last_watermark(log),
                          tables=self.jobs.tables.current() if self.jobs.tables else None)
        if self._logs_plans:
            # Logged before it runs: after any crash, exactly this batch runs again.
            self._commit([TopicPartition(p.topic, p.partition, p.start, metadata=batch.share(p.end).encode())
                          for p in batch.plans], "log the plan")
            fault_injection.maybe_fail("driver.after_plan_log", batch_id)
        return batch

    def owes_batch(self, owned: list[TopicPartition]) -> bool:
        """A stateful run's watermark closes state no new record will: a batch with no records is owed."""
        if self.state is None or not self.state.watermarked or len(owned) < self.input_partitions:
            return False
        return self._owes(self.read_log(owned))

    def _owes(self, log: dict[tuple[str, int], LoggedPartition]) -> bool:
        markers = read_markers(self.settings.clients, self.settings.app_id, self.units)
        return self.state.owes_batch(log, markers)

    def _from_log(self, pending: PendingBatch) -> WideBatch:
        plans = [PartitionPlan(t, p, start, end, start, "") for (t, p), (start, end) in sorted(pending.ranges.items())]
        batch = WideBatch(pending.batch_id, pending.units, pending.timestamp_ms, plans, recovered=True,
                          watermark_ms=pending.watermark_ms,
                          late_ms=pending.late_ms if pending.late_ms is not None else pending.watermark_ms,
                          tables=decode_versions(pending.tables) if pending.tables else None)
        self.echo(f"batch {batch.batch_id}: re-running its logged plan ({sum(p.size for p in plans)} records over "
                  f"{len(plans)} partitions, {batch.units} units): a previous attempt did not close it")
        return batch

    # -- running ----------------------------------------------------------------------------------

    def run_batch(self, plans: list[PartitionPlan], planned_at: float | None = None) -> BatchReport:
        batch = self.current
        # The watermark a batch was planned with, for its batch line (not the isolator's batches').
        watermark = batch.watermark_ms if batch is not None and batch.plans == plans else None
        if batch is None or batch.plans != plans:
            # Plans from the poison isolator: a new batch of its own, logged like any other.
            batch = self._new_batch_for(plans)
        self._batch_id = batch.batch_id
        started = time.monotonic()
        s = self.settings
        s.processor.batch_timestamp = datetime.fromtimestamp(batch.timestamp_ms / 1000, tz=timezone.utc)
        accounts = self.jobs.spark.sparkContext.accumulator({}, ReadAccounts())
        out = self._output(batch, accounts)
        out = out.select(*[c for c in out.columns if c != "offset"])
        if s.guarantee == AT_MOST_ONCE:
            self._commit_plain(batch)
        driver_s = time.monotonic() - (planned_at or started)
        description = (f"txstream {s.app_id} batch {batch.batch_id} ({len(batch.plans)} partitions, "
                       f"{sum(p.size for p in batch.plans)} records, wide: {self.mode})")
        if self.mode == SINGLE_TRANSACTION:
            rows = self._run_single(batch, out, accounts, description)
        else:
            rows = self._run_units(batch, out, accounts, description)
        self.current = None
        return BatchReport(batch.batch_id, batch.plans, rows, time.monotonic() - started, reads=self.last_reads,
                           driver_s=driver_s, watermark_ms=watermark, tables=self.jobs.last_tables)

    def _output(self, batch: WideBatch, accounts: Any) -> Any:
        """The transform's output over the batch's ranges (its stateful operator merged by the units)."""
        if self.state is not None:
            return self.state.output(batch, accounts)
        return self.jobs.output_frame(batch.batch_id, batch.plans, accounts=accounts)

    def _units(self, batch: WideBatch, out: Any) -> tuple[Any, UnitSpec]:
        """The output routed to the K units, each published by its task (task/units.py), and
        the units' spec. A stateful batch's merged output is partitioned by unit already."""
        if self.state is not None:
            routing = "state key"
        else:
            routing = "key" if "key" in out.columns else "all columns"
            out = out.repartition(batch.units, *(["key"] if routing == "key" else list(out.columns)))
        spec = UnitSpec(publish=self.specs.publish, batch_id=batch.batch_id, units=batch.units, plan_id=batch.plan_id,
                        routing=routing, markers_metadata=self._markers_metadata,
                        state=self.state.unit(batch) if self.state is not None else None)
        return out.mapInArrow(self._unit_task(), result_schema()), spec

    def _unit_task(self) -> Any:
        """A unit task's body: its spec comes with the batch's job (`_job`)."""
        return functools.partial(publish_unit, FromJob("unit", self.specs.read.clients, self.specs.read.registry))

    def _job(self, batch: WideBatch, unit: UnitSpec | None = None) -> JobSpec:
        """The batch's spec, which its Spark job carries to its tasks (task/spec.py)."""
        tables = self.jobs.tables.reads(batch.tables) if self.jobs.tables and batch.tables is not None else None
        return JobSpec(self.specs.for_reading(batch.batch_id, batch.plans), self.specs.publish, unit, batch.merge,
                       tables)

    def _run_units(self, batch: WideBatch, out: Any, accounts: Any, description: str) -> list[dict]:
        s = self.settings
        frame, unit = self._units(batch, out)
        job = self._job(batch, unit)
        rows = self.jobs.run(lambda: self.jobs.collect(frame, job), batch.batch_id, description, self.membership.poll)
        by_status: dict[str, list[dict]] = {}
        for row in rows:
            by_status.setdefault(row["status"], []).append(row)
        odd = [r for r in rows if r["status"] not in (COMMITTED, ALREADY_DONE, EMPTY, ACKED, NONDETERMINISTIC, VALUES_DIFFER)]
        if odd:
            raise InfrastructureError(f"batch {batch.batch_id}: unit {odd[0]['index']} ended {odd[0]['status']} "
                                      f"({odd[0]['message']}); the logged batch runs again")
        for row in by_status.get(NONDETERMINISTIC, []):
            if not self.allow_nondeterministic:
                raise NondeterministicTransformError(
                    f"batch {batch.batch_id}: {row['message']}. The transform is not deterministic; the "
                    "units published before and after the failure may overlap or miss rows. Make the "
                    "transform deterministic (docs/wide-transforms.md §4); the batch stays open until then.")
            self.echo(f"warning: batch {batch.batch_id}: {row['message']} (allow_nondeterministic)")
        for row in by_status.get(VALUES_DIFFER, []):
            self.echo(f"note: batch {batch.batch_id}: {row['message']}")
        read = self._read_accounts(batch, accounts)
        fault_injection.maybe_fail("driver.before_close", batch.batch_id)
        started = time.perf_counter()
        if s.guarantee == EXACTLY_ONCE:
            markers = read_markers(s.clients, s.app_id, batch.units)
            published = {i: m.rows for i, m in markers.items() if m.done_through == batch.batch_id}
            batch.state = self.state.facts(batch, markers) if self.state is not None else None
            self._close(batch, read["dead"], records=None, unit_records=published)
        elif s.guarantee != AT_MOST_ONCE:
            self._publish_dead_plain(batch, read["dead"])
            self._commit_plain(batch)
        close = TaskResult(-1, status=COMMITTED, records_in=read["records"], dead_letters=len(read["dead"]),
                           read_s=read["read_s"], commit_s=time.perf_counter() - started)
        return rows + [close.__dict__]

    def _run_single(self, batch: WideBatch, out: Any, accounts: Any, description: str) -> list[dict]:
        """All of the batch's output, its dead letters and its input offsets: one transaction."""
        job = self._job(batch)
        table = self.jobs.run(lambda: self.jobs.collect(out, job, arrow=True), batch.batch_id, description,
                              self.membership.poll)
        read = self._read_accounts(batch, accounts)
        started = time.perf_counter()
        if self.settings.guarantee == EXACTLY_ONCE:
            produced = self._close(batch, read["dead"], records=table, unit_records=None)
        else:
            produced = self._publish_dead_plain(batch, read["dead"], records=table)
            self._commit_plain(batch)
        result = TaskResult(0, status=COMMITTED, records_in=read["records"], records_out=produced,
                            dead_letters=len(read["dead"]), read_s=read["read_s"],
                            commit_s=time.perf_counter() - started, attempts=1)
        return [result.__dict__]

    def _read_accounts(self, batch: WideBatch, accounts: Any) -> dict[str, Any]:
        """The readers' counts and undecodable records (a Spark accumulator: per planned range, so
        a stage Spark re-ran counts once)."""
        values = accounts.value
        dead = [(topic, partition, record) for (topic, partition, _start, _end), result in sorted(values.items())
                for record in result.dead_letters]
        if dead and not self.settings.dead_letter_topic:
            topic, partition, record = dead[0]
            raise PoisonRecordError(
                f"record {topic}[{partition}]@{record.offset} failed at {record.stage}: {record.error}. "
                f"{len(dead)} record(s) of batch "
                f"{batch.batch_id} failed; declare a dead_letter_topic on the processor (or --dead-letter-topic) "
                "to set such records aside. The batch stays open (its input offsets are not committed) until then.")
        by_partition: dict[tuple[str, int], tuple[int, int]] = {}
        for (topic, partition, _start, _end), result in values.items():
            records, undecodable = by_partition.get((topic, partition), (0, 0))
            by_partition[(topic, partition)] = (records + result.records, undecodable + len(result.dead_letters))
        self.last_reads = by_partition
        return {"records": sum(r.records for r in values.values()), "dead": dead,
                "read_s": max((r.read_seconds for r in values.values()), default=0.0)}

    # -- the driver's transactions ------------------------------------------------------------------

    def _close(self, batch: WideBatch, dead: list[tuple], records: Any, unit_records: dict[int, int] | None) -> int:
        """One transaction: `records` (single-transaction mode), the dead letters, the batch's
        record in the markers topic (what `txstream verify` reconciles), and the input end
        offsets with nothing pending in the log. Returns the records produced."""
        offsets = [TopicPartition(p.topic, p.partition, p.end, metadata=batch.share(p.end).encode())
                   for p in batch.plans]
        return self._commit(offsets, f"close batch {batch.batch_id}", dead=dead, records=records, batch=batch,
                            unit_records=unit_records)

    def _batch_record(self, batch: WideBatch, unit_records: dict[int, int], dead: int) -> bytes:
        return BatchRecord(batch.batch_id, batch.plan_id, batch.timestamp_ms, self.mode, batch.units,
                           [(p.topic, p.partition, p.start, p.end) for p in batch.plans], dict(unit_records), dead,
                           batch.state).encode()

    def _commit(self, offsets: list[TopicPartition], what: str, dead: list[tuple] = (),
                records: Any = None, batch: WideBatch | None = None, unit_records: dict[int, int] | None = None) -> int:
        """One transaction of the driver's producer (the transaction engine's loop): `records`,
        the dead letters, the batch's record in the markers topic, `offsets` under the member's
        group metadata. Returns the output records produced."""
        spec = self.specs.publish
        produced = 0

        def produce(producer: Any) -> None:
            nonlocal produced
            if records is not None or dead:
                collector = wide_collector(spec, producer, batch.batch_id if batch else 0, 0)
                produced = _produce(collector, spec, records, dead)
            if batch is not None and (unit_records is not None or records is not None):
                counts = unit_records if unit_records is not None else {0: produced}
                producer.produce(markers_name(self.settings.app_id), self._batch_record(batch, counts, len(dead)),
                                 str(batch.batch_id).encode(), partition=0)

        assert self._publisher is not None
        transaction = CallableTransaction(produce, lambda: (offsets, self.membership.group_metadata()))
        try:
            # Any Kafka failure but a fence aborts and publishes again: the driver's producer is
            # the only one of its id, so nothing else can take the transaction over.
            transactions.run(transaction, self._publisher, fresh=False, renew=None, again=(KafkaFailure,),
                             pause_s=0.5)
        except FencedError as exc:
            raise InstanceReplacedError(
                f"{self.settings.app_id}: another instance of this wide app started and fenced this one's "
                f"driver ({exc}); this instance stops (a wide app runs as one instance)") from exc
        except AbortableError as exc:   # every attempt aborted
            raise InfrastructureError(f"{what}: {exc}") from exc
        return produced

    def _commit_plain(self, batch: WideBatch) -> None:
        self.membership.commit([TopicPartition(p.topic, p.partition, p.end) for p in batch.plans])

    def _publish_dead_plain(self, batch: WideBatch, dead: list[tuple], records: Any = None) -> int:
        spec = self.specs.publish
        produced, _waited = publish_plain(
            spec.producer_config(transactional=False),
            lambda producer: _produce(wide_collector(spec, producer, batch.batch_id, 0), spec, records, dead),
            spec.timeout_s, f"the output of batch {batch.batch_id}")
        return produced

    # -- poison isolation ---------------------------------------------------------------------------

    def abandon(self, plans: list[PartitionPlan]) -> None:
        """Before the poison isolator re-plans a failed batch: fence every unit (no attempt of it
        can commit after this), check none committed it, and clear the pending plan from the log.
        If a unit did commit, the batch cannot be replaced: the run stops."""
        batch = self.current
        if batch is None or self.settings.guarantee != EXACTLY_ONCE or self.mode != UNITS:
            return
        spec = self.specs.publish
        for unit in range(batch.units):
            fence = TransactionalPublisher(spec.producer_config(transactional=True),
                                           unit_transactional_id(self.settings.app_id, unit), None, spec.timeout_s)
            try:
                fence.init()
            finally:
                fence.close()
        markers = read_markers(self.settings.clients, self.settings.app_id, batch.units)
        done = [i for i, m in markers.items() if m.done_through >= batch.batch_id]
        if done:
            raise PoisonRecordError(
                f"a record of batch {batch.batch_id} failed in the transform after unit(s) {done[:5]} of the batch "
                "were published, so the batch cannot be re-planned without it. Fix the transform (the failure is "
                "after the shuffle) and restart: the batch completes as logged.")
        self._commit([TopicPartition(p.topic, p.partition, p.start, metadata=batch.share(p.start).encode())
                      for p in batch.plans], f"abandon batch {batch.batch_id}")
        self.current = None

    def _new_batch_for(self, plans: list[PartitionPlan]) -> WideBatch:
        return self._log_new_batch(self.read_log([TopicPartition(p.topic, p.partition) for p in plans]), plans)

    def dead_letter(self, plan: PartitionPlan, record: DeadLetter) -> None:
        """The poison record to the dead-letter topic and its partition's offset past it: one
        transaction of the driver's producer (nothing pending in the log)."""
        offset = record.offset
        log = self.read_log([TopicPartition(plan.topic, plan.partition)])
        share = PlanShare(last_batch_id(log), offset + 1, self.plan_units, int(time.time() * 1000), last_watermark(log))
        tp = TopicPartition(plan.topic, plan.partition, offset + 1, metadata=share.encode())
        if self.settings.guarantee == EXACTLY_ONCE:
            self._commit([tp], "dead-letter a poison record", dead=[(plan.topic, plan.partition, record)])
        else:
            self._publish_dead_plain(WideBatch(share.batch_id, self.plan_units, 0, [plan], False),
                                     [(plan.topic, plan.partition, record)])
            self.membership.commit([tp])

    def close(self) -> None:
        if self._publisher is not None:
            self._publisher.close()
            self._publisher = None


def _wide_plans(plans: list[PartitionPlan]) -> list[PartitionPlan]:
    return [replace(p, transactional_id="") for p in plans]


def _produce(collector: Any, spec: Any, records: Any, dead: list[tuple]) -> int:
    """The batch's output (an Arrow table, or None) and its dead letters, produced; returns the
    output records produced."""
    produced = 0
    if records is not None:
        for chunk in records.to_batches():
            produced += collector.add_batch(chunk)
    for topic, partition, record in dead:
        collector.source = (topic, partition)
        collector.add_dead_letter(spec.dead_letter_topic, record, spec.app_id)
    return produced

