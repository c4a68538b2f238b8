"""The state side of a wide batch: a wide batch whose output units are the state partitions
(docs/state.md, docs/wide-transforms.md). `WideBatches` runs the protocol (plan log, K units,
close) and hands what differs to its `StatefulUnits`:
- The **watermark**: the latest event time any unit has seen (each unit's marker carries its
  own, `x=`) minus the watermark's delay, never moving back; logged with the plan, so a re-run of
  the batch filters the same late rows and closes the same windows.
- The **units**: the transform's stateful operator is replaced by partials Spark computes, routed
  to the units and merged into each unit's state (driver/stateful_query.py, txstream/operators/,
  task/state_unit.py);
  each unit's transaction holds its output, its state changes (the changelog), its late records
  and its marker.
- **Batches with no records**: when the watermark would close windows (or forget keys) that no
  new record will close, a batch over empty ranges runs to emit them, as Structured Streaming's
  no-data batches do. It needs no pending plan: its units' work depends only on the state and
  the watermark, both the same on a re-run.
- The operator's **description** in `<app>.state`, checked at start: a transform whose stateful
  operator changed (keys, aggregates, window, K) is refused instead of reading state it cannot
  understand.
"""
from __future__ import annotations

import functools
import time
import uuid
from dataclasses import replace
from typing import Any, Callable

from txstream.constants import EXACTLY_ONCE, UNITS
from txstream.driver.jobs import SparkJobs
from txstream.driver.specs import TaskSpecs
from txstream.driver.stateful_query import BatchContext, recording
from txstream.driver.wide_batch import WideBatch
from txstream.errors import InfrastructureError, TransformError, UserError
from txstream.operators import plan as plan_reading
from txstream.operators.base import MergeSpec, next_watermark
from txstream.operators.join import join_watermark
from txstream.operators.kinds import operator_for
from txstream.records import LoggedPartition, StateFacts, last_watermark
from txstream.settings import RunSettings
from txstream.state.changelog import CHANGELOG_CONFIG, SNAPSHOT_CONFIG, changelog_topic, snapshot_topic
from txstream.state.operator import STATE_TOPIC_CONFIG, OperatorDescription, state_topic
from txstream.task.spec import PartitionPlan
from txstream.task.units import StateUnit


class StateChangedError(UserError):
    """The transform's stateful operator differs from the one whose state is kept."""


def describe_operator(settings: RunSettings, units: int, build: Callable[[], Any]) -> tuple[OperatorDescription | None, Any]:
    """The transform's stateful operator, recorded while `build()` applies the transform at start
    (the run's first job or a dry frame: the transform is applied no more often than without
    state), and what `build()` returned (its frame is what Spark alone would compute, for the
    determinism check); None when it has none and no output mode was asked for."""
    context = BatchContext(settings.app_id, units, settings.output_mode or "append")
    with recording(context) as recorded:
        built = build(recorded)
    joined = plan_reading.stream_stream_join(built[1])   # built: (first job, output frame)
    if joined is not None and (recorded.description is None or recorded.description.join is None):
        raise TransformError(joined)
    if recorded.description is None and settings.output_mode is None:
        return None, built
    if recorded.description is None:
        raise TransformError(
            f"output_mode is {settings.output_mode!r} but the transform has no stateful operator (groupBy().agg(), "
            "dropDuplicates or dropDuplicatesWithinWatermark): remove output_mode for a per-batch transform")
    return recorded.description, built


class StatefulUnits:
    """What a stateful run's wide batches add (composed into `WideBatches` as its `state`)."""

    def __init__(self, settings: RunSettings, specs: TaskSpecs, jobs: SparkJobs, admin: Any,
                 echo: Callable[[str], None], description: OperatorDescription) -> None:
        self.settings = settings
        self.specs = specs
        self.jobs = jobs
        self.admin = admin
        self.echo = echo
        self.description = description
        self.store_kind = "rocksdb"
        self._checked_shape = False
        self._idle_since: float | None = None   # monotonic: when planning last found no input

    @property
    def units(self) -> int:
        return self.description.units

    @property
    def operator(self) -> str:
        return self.description.operator

    @property
    def watermarked(self) -> bool:
        return self.description.watermark is not None

    def describe(self) -> str:
        d = self.description
        what = {"aggregate": "running aggregates", "window": "windowed aggregates", "session": "session windows",
                "dedup": "deduplication", "join": f"a stream-stream {(d.join or {}).get('type')} join"}[d.kind]
        watermark = f", watermark {d.watermark['column']} - {d.watermark['delay_ms']} ms" if d.watermark else ""
        return (f"protocol: stateful, {what} in {d.output_mode} mode{watermark}, {self.units} state units "
                f"(changelog {changelog_topic(self.settings.app_id, self.operator)}; docs/state.md)")

    # -- start ------------------------------------------------------------------------------------

    def check_start(self, wide_mode: str) -> None:
        """Before the wide protocol starts: the stored operator is this one (K kept from it)."""
        if self.settings.guarantee != EXACTLY_ONCE or wide_mode != UNITS:
            raise TransformError("state across batches runs exactly-once in units mode only (the state's changes "
                                 "commit in each unit's transaction): remove --guarantee/--wide-mode or output_mode")
        stored = self._stored_description()
        if stored is not None and self.settings.output_units is None and stored.units != self.units:
            self.description = replace(self.description, units=stored.units)   # K is fixed for the state's lifetime
        if stored is not None and stored.fingerprint() != self.description.fingerprint():
            changes = "; ".join(stored.differences(self.description))
            raise StateChangedError(
                f"the transform's stateful operator {self.operator!r} differs from the one whose state "
                f"{self.settings.app_id} keeps ({changes}). Restore the transform, or start its state over with "
                f"`txstream state reset --app-id {self.settings.app_id} --execute` (docs/state.md)")
        self.description = replace(self.description, epoch=stored.epoch if stored is not None and stored.epoch
                                   else uuid.uuid4().hex[:12])
        self._new = stored is None

    def started(self) -> None:
        """After the wide protocol started: the state topics, the description of a new state."""
        self._ensure_state_topics(self._new)
        keep_empty_units(self.jobs.spark)

    def _stored_description(self) -> OperatorDescription | None:
        from txstream.kafka.lookups import cluster_topics
        from txstream.state import partition

        topic = state_topic(self.settings.app_id)
        if topic not in cluster_topics(self.admin, timeout=30):
            return None
        found: list[bytes | None] = [None]

        def take(records: list) -> None:
            for record in records:
                if record.key() == self.operator.encode():
                    found[0] = record.value()

        # Read to the end or fail (RestoreIncomplete): a part read as whole would miss the
        # fingerprint and write a new epoch.
        with partition.reader(self.settings.clients, self.settings.app_id) as reader:
            partition.read_to_end(reader, topic, 0, None, take, 30)
        return OperatorDescription.from_json(found[0]) if found[0] else None

    def _ensure_state_topics(self, describe: bool) -> None:
        from confluent_kafka import Producer

        from txstream.kafka.acls import check_internal_access
        from txstream.kafka.internal_topics import ensure_topic

        app = self.settings.app_id
        wanted = [(changelog_topic(app, self.operator), self.units, CHANGELOG_CONFIG),
                  (snapshot_topic(app, self.operator), self.units, SNAPSHOT_CONFIG),
                  (state_topic(app), 1, STATE_TOPIC_CONFIG)]
        for name, partitions, config in wanted:
            if ensure_topic(self.admin, name, partitions, config, app_id=app, what="state topic"):
                self.echo(f"created the state topic {name} ({partitions} partition{'s' if partitions != 1 else ''})")
        check_internal_access(self.admin, self.settings.clients, app, [name for name, _, _ in wanted],
                              [f"{app}.state-reader"], timeout=30)
        if describe:
            producer = Producer(self.settings.clients.producer(**{"enable.idempotence": True}))
            producer.produce(state_topic(app), self.description.to_json(), self.operator.encode())
            if producer.flush(30):
                raise InfrastructureError(f"could not write the operator's description to {state_topic(app)}")

    # -- planning ---------------------------------------------------------------------------------

    def next_watermark(self, log: dict[tuple[str, int], LoggedPartition], markers: dict,
                       clock: bool = True) -> int | None:
        """The watermark a new batch is planned with."""
        watermark = self.description.watermark
        if watermark is None:
            return None
        last = last_watermark(log)
        if self.description.join is not None:   # the least of its sides' (Spark's "min" policy)
            return join_watermark(last, ([m.events for m in markers.values()],
                                         [m.events_right for m in markers.values()]), self.description.join["watermarks"])
        computed = next_watermark(last, [m.events for m in markers.values()], watermark["delay_ms"])
        known = [computed] if computed is not None else []
        idle_s = self.settings.watermark_idle_s
        if clock and idle_s is not None and self._idle_since is not None and time.monotonic() - self._idle_since >= idle_s:
            # Opt-in: an idle stream's watermark follows wall-clock time, so quiet windows close.
            known.append(int(time.time() * 1000) - watermark["delay_ms"])
        return max(known) if known else None

    def planned(self, plans: list[PartitionPlan]) -> None:
        """What planning found: input, or none since when (the idle clock)."""
        if plans and any(p.size for p in plans):
            self._idle_since = None
        elif self._idle_since is None:
            self._idle_since = time.monotonic()

    def owes_batch(self, log: dict[tuple[str, int], LoggedPartition], markers: dict) -> bool:
        """The watermark has moved past the last batch's: a batch with no records closes what it
        passed (windows in append mode, expired state)."""
        operator = operator_for(self.description.kind)
        last = last_watermark(log)
        by_events = self.next_watermark(log, markers, clock=False)
        if operator.owes_batch(self.description, last, by_events):
            return True
        # Wall-clock time (opt-in, idle stream): a batch with no records each watermark_idle_s at most.
        by_clock = self.next_watermark(log, markers)
        step = (self.settings.watermark_idle_s or 0) * 1000
        return (by_clock is not None and by_clock != by_events and operator.owes_batch(self.description, last, by_clock)
                and (last is None or by_clock >= last + step))

    # -- running ----------------------------------------------------------------------------------

    def _merge_spec(self, batch: WideBatch, description: OperatorDescription, group_names: tuple[str, ...],
                    partial_names: tuple[str, ...], out_schema: Any, event_column: str | None,
                    join: Any = None) -> MergeSpec:
        spec = self.specs.publish
        description = replace(description, epoch=self.description.epoch)
        batch.merge = MergeSpec(self.settings.app_id, spec.clients, spec.read.side_dir, batch.batch_id, description,
                                group_names, partial_names, out_schema, batch.watermark_ms, self.store_kind,
                                spec.timeout_s, event_column, self.settings.state_snapshot_every, join)
        return batch.merge

    def output(self, batch: WideBatch, accounts: Any) -> Any:
        """The transform's output over the batch's ranges, its stateful operator merged by the units."""
        context = BatchContext(self.settings.app_id, batch.units, self.description.output_mode, batch.batch_id,
                               batch.watermark_ms, functools.partial(self._merge_spec, batch), late_ms=batch.late_ms)
        with recording(context) as recorded:
            out = self.jobs.output_frame(batch.batch_id, batch.plans, accounts=accounts)
        if recorded.description is None or recorded.description.fingerprint() != self.description.fingerprint():
            raise TransformError(f"batch {batch.batch_id}: the transform's stateful operator is not the one it "
                                 "described at start (a transform must build the same plan for every batch)")
        if not self._checked_shape:
            _check_no_shuffle_after_merge(out)
            self._checked_shape = True
        return out

    def unit(self, batch: WideBatch) -> StateUnit:
        """What each unit task of the batch is told about its state."""
        return StateUnit(self.operator, batch.late_ms)

    def facts(self, batch: WideBatch, markers: dict) -> StateFacts:
        """The batch's state facts, for `txstream verify`: the operator, its mode, the watermark,
        and per unit that published the batch the rows it merged and the rows that were late."""
        done = {i: m for i, m in markers.items() if m.done_through == batch.batch_id and m.merged >= 0}
        d = self.description
        # A hopping window counts a row in each window that holds it, a join each side's row (one record can
        # be read by both sides): their rows merged exceed the rows read.
        hopping = bool(d.window and d.window.get("slide_ms", 0) < d.window.get("size_ms", 0))
        rows_once = not hopping and d.join is None
        # The epoch: after a `txstream state reset` keys start over, and their second emission is no duplicate.
        return StateFacts(d.operator, d.kind, d.output_mode, d.epoch, batch.watermark_ms, rows_once,
                          {i: m.merged for i, m in done.items()}, {i: m.late for i, m in done.items()})


# Spark's adaptive execution replaces a plan whose input stage came out empty by an empty relation
# of no partitions (through a join, say): the units' merge tasks would not run, and a batch with
# no records would emit nothing (issue 60 #19). Every unit must run, whatever its input.
EMPTY_RELATION_RULE = "org.apache.spark.sql.execution.adaptive.AQEPropagateEmptyRelation"
EXCLUDED_RULES = "spark.sql.adaptive.optimizer.excludedRules"


def keep_empty_units(spark: Any) -> None:
    """Exclude the adaptive empty-relation rule for this run's jobs (added to the excluded ones)."""
    rules = [r for r in (spark.conf.get(EXCLUDED_RULES, "") or "").split(",") if r.strip()]
    if EMPTY_RELATION_RULE not in rules:
        spark.conf.set(EXCLUDED_RULES, ",".join([*rules, EMPTY_RELATION_RULE]))


def _check_no_shuffle_after_merge(out: Any) -> None:
    """The unit that merged a key's state must publish its output in the same task: nothing but
    selects and filters may follow the merge (an orderBy, a coalesce, a second groupBy would move
    rows to another task, whose partition id names another unit)."""
    moved = plan_reading.after_merge(out._jdf.queryExecution().executedPlan())
    if moved:
        raise TransformError(f"the transform moves rows after its stateful operator ({', '.join(moved[:3])}: an "
                             "orderBy, repartition, coalesce, limit, join or second aggregation after it): a state "
                             "unit must publish what it merged; keep what follows the aggregation to selects and "
                             "filters")
