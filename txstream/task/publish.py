"""One publishing task (a `mapInArrow` body): the protocol of docs/architecture.md §3.4.

The task's output and its input offsets are committed in one Kafka transaction by the
transaction engine (kafka/transactions.py), through the slot's producer; `RecordCollector`
(collector.py) turns the rows into records. The weaker guarantees produce through the engine's
plain producer and leave offsets to the driver (driver/commits.py).
"""
from __future__ import annotations

import threading
import time
import uuid
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa

from txstream import fault_injection
from txstream.constants import ACKED, ALREADY_DONE, COMMITTED, EXACTLY_ONCE, FENCED, RANGE_COLUMN, STALE_PLAN
from txstream.errors import AbortableError, InfrastructureError, PoisonRecordError
from txstream.kafka import transactions
from txstream.kafka.transactions import (
    Producers,
    Transaction,
    TransactionalPublisher,
    drop_publisher,
    fence_ids,
    group_moved,
    held_publisher,
    pooled_publisher,
    publish_plain,
    stable_offsets,
)
from txstream.kafka.transactions import (
    cached_publishers as cached_publishers,  # this worker's pool, as the tests see it
)
from txstream.serde.avro import AvroCodec
from txstream.task import worker_heap
from txstream.task.collector import RecordCollector, add_runs, encoded_batch
from txstream.task.result import TaskResult, results_batch
from txstream.task.sidefile import read_side_files
from txstream.task.spec import FromJob, PartitionPlan, PublishSpec
from txstream.task.spec import resolve as resolve_job_spec


def producers(spec: PublishSpec) -> Producers:
    """How this run's transactional producers are made."""
    return Producers(spec.producer_config(transactional=True), spec.owner_dir, spec.timeout_s,
                     spec.producer_idle_s)


def fence_pool(spec: PublishSpec, pool: tuple[str, ...], keep: str) -> TransactionalPublisher:
    """`init_transactions` on every id of a slot's `pool` (transactions.fence_ids); `keep`'s producer."""
    return fence_ids(producers(spec), pool, keep)


def partition_publisher(spec: PublishSpec, plan: PartitionPlan) -> tuple[TransactionalPublisher, bool]:
    """The producer of a range published alone, without fencing its ids. (publisher, fresh)"""
    return slot_publisher(spec, plan, fence_all=False)


def slot_publisher(spec: PublishSpec, plan: PartitionPlan, fence_all: bool) -> tuple[TransactionalPublisher, bool]:
    """The producer a slot's task publishes through (docs/architecture.md §3.4). (publisher, fresh)

    - `fence_all` (the first batch of a run, after a failed batch or a rebalance, and every
      retried or speculative attempt): initialise every transactional.id of the slot, keep the
      batch's claim id (`plan.transactional_id`);
    - else a producer this worker already holds for any of the slot's ids, without
      `init_transactions` (Spark hands a slot's task to whichever Python worker is idle, so a
      slot's producer is found in whichever worker held it last);
    - else initialise the batch's claim id, which the driver picks among the slot's ids as the
      one used least recently (driver/slots.py)."""
    if fence_all:
        for tid in plan.transactional_ids:
            drop_publisher(tid)
        publisher = fence_pool(spec, plan.transactional_ids, plan.transactional_id)
        transactions.hold(publisher)
        return publisher, True
    publisher = held_publisher(producers(spec), (plan.transactional_id, *plan.transactional_ids))
    if publisher is not None:
        return publisher, False
    return pooled_publisher(producers(spec), plan.transactional_id)


def publish_slot(spec: PublishSpec | FromJob, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: docs/architecture.md §3.4 for the ranges of this task's slot (one
    producer, one transaction for all of them). Yields one result row per range. `spec`: the
    batch's, or `FromJob` (the job carries it: task/spec.py)."""
    worker_heap.settle()
    from pyspark import TaskContext

    spec = resolve_job_spec(spec)

    indexes = spec.read.slot_plans(TaskContext.get().partitionId())
    results = [TaskResult(i) for i in indexes]
    if indexes:
        plans = [spec.plans[i] for i in indexes]
        pieces = _pieces_by_range(spec, indexes, batches)
        if spec.guarantee == EXACTLY_ONCE:
            publish_ranges(spec, plans, pieces, results)
        else:
            _publish_plain(spec, plans, pieces, results)
        _take_side_files(spec, results)  # if no path above took them (an early return)
        yield results_batch(results)
    else:
        for batch in batches:  # a slot of padding only: nothing can arrive
            if batch.num_rows:
                raise InfrastructureError(
                    f"rows reached publishing task {TaskContext.get().partitionId()}, which covers no "
                    "range: the transform added partitions (a union?), which the narrow protocol "
                    "cannot publish")


# A batch of output rows and its runs: (position of the range in the slot, first row, end row).
Piece = tuple[pa.RecordBatch, list[tuple[int, int, int]]]


def _whole(batch: pa.RecordBatch) -> Piece:
    """Every row of the batch to the slot's first range."""
    return batch, [(0, 0, batch.num_rows)]


def _pieces_by_range(spec: PublishSpec, indexes: list[int], batches: Iterator[pa.RecordBatch]) -> Iterator[Piece]:
    """Each batch with its runs of rows of one range. RANGE_COLUMN names each row's reading
    task: its Spark partition (one per range), or the task its reader tagged it with (a slot
    read in one partition, whose ranges' rows may interleave: runs of one range then recur, and
    go to the same collector, in offset order). Without it (a slot read in one partition,
    lineage off) every row goes to the first range's collector: one transaction either way, and
    no header names a source."""
    position = {plan: pos for pos, plan in enumerate(indexes)}
    for batch in batches:
        names = batch.schema.names
        if RANGE_COLUMN not in names:
            yield _whole(batch)   # a slot of one range (and direct callers)
            continue
        tasks = batch.column(names.index(RANGE_COLUMN)).to_numpy(zero_copy_only=False)
        bounds = [0, *(np.flatnonzero(np.diff(tasks)) + 1).tolist(), len(tasks)]
        runs = []
        for first, last in zip(bounds, bounds[1:], strict=False):
            if last == first:
                continue
            pos = position.get(spec.read.plan_at(int(tasks[first])))
            if pos is None:
                raise InfrastructureError(
                    f"a row of reading task {int(tasks[first])} reached the publishing task of ranges "
                    f"{indexes}: the transform changed how rows map to input partitions (a union, "
                    "a coalesce?), which the narrow protocol cannot publish")
            runs.append((pos, first, last))
        yield batch.select([n for n in names if n != RANGE_COLUMN]), runs


def _codec(schema: dict | None, schema_id: int | None = None) -> AvroCodec | None:
    """`schema_id`: the registry's id of the schema, framed into every payload (serde/registry.py)."""
    return AvroCodec(schema, registry_schema_id=schema_id) if schema else None


def range_collector(spec: PublishSpec, plan: PartitionPlan, producer: Any,
                    codecs: tuple[AvroCodec | None, AvroCodec | None] | None = None) -> RecordCollector:
    """The collector of one input range's output (its records name their source). `codecs`:
    (value, key) codecs to share (a slot's collectors); else built for this one."""
    value_codec, key_codec = codecs or (_codec(spec.output_value_schema, spec.output_value_schema_id),
                                        _codec(spec.output_key_schema, spec.output_key_schema_id))
    return RecordCollector(
        producer=producer, default_topic=spec.output_topic, value_codec=value_codec, key_codec=key_codec,
        source=(plan.topic, plan.partition), publication=uuid.uuid4().hex, lineage=spec.lineage,
        refused_topics=spec.refused_topics)


class _SlotOutput:
    """The slot's collectors (one per range: each range's records name their source and form
    one publication), sharing the slot's producer."""

    def __init__(self, spec: PublishSpec, plans: list[PartitionPlan], producer: Any) -> None:
        self.spec, self.plans, self.producer = spec, plans, producer
        self.collectors: dict[int, RecordCollector] = {}
        self._codecs: tuple[AvroCodec | None, AvroCodec | None] | None = None   # for `encoded`, built once

    def of(self, pos: int) -> RecordCollector:
        collector = self.collectors.get(pos)
        if collector is None:
            # The slot's codecs, not a pair per range: building a codec is costly next to a
            # small range's records.
            collector = self.collectors[pos] = range_collector(self.spec, self.plans[pos], self.producer, self.codecs)
        return collector

    @property
    def codecs(self) -> tuple[AvroCodec | None, AvroCodec | None]:
        """The output's (value, key) codecs, built once for the slot."""
        if self._codecs is None:
            self._codecs = (_codec(self.spec.output_value_schema, self.spec.output_value_schema_id),
                            _codec(self.spec.output_key_schema, self.spec.output_key_schema_id))
        return self._codecs

    def encoded(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """`batch` with its struct key and value encoded (binary), as every collector of the slot would."""
        return encoded_batch(batch, *self.codecs)

    def replay(self, producer: Any) -> None:
        self.producer = producer
        for collector in self.collectors.values():
            collector.producer = producer
            collector.replay()


def _produce_all(output: _SlotOutput, pieces: Iterator[Piece], results: list[TaskResult],
                 stop: Callable[[], bool] = lambda: False) -> bool:
    """Produce every output batch, timing the wait for upstream apart from encode+produce (the
    slot's timings go to its first range's result). Returns False when `stop()` said to give up
    before the input ended (its output is then never committed)."""
    clock = time.perf_counter
    timing = results[0]
    iterator = iter(pieces)
    while True:
        if stop():
            return False
        started = clock()
        piece = next(iterator, None)
        got = clock()
        timing.upstream_s += got - started
        if piece is None:
            return True
        batch, runs = piece
        _produce_piece(output, batch, runs, results)
        timing.produce_s += clock() - got


def _produce_piece(output: _SlotOutput, batch: pa.RecordBatch, runs: list[tuple[int, int, int]],
                   results: list[TaskResult]) -> None:
    """One output batch to its runs' collectors, each run's records counted to its range."""
    def produced(pos: int) -> None:
        fault_injection.maybe_fail("publish.mid_produce", output.plans[pos])

    if len(runs) > 1:
        # Keys and values encoded once per batch, not once per run: the columnar encoder has a
        # fixed cost per call, which many short runs would pay again and again.
        batch = output.encoded(batch)
        # And the records of all runs built at once (collector.add_runs).
        counts = add_runs({pos: output.of(pos) for pos, _, _ in runs}, batch, runs, produced)
        if counts is not None:
            for (pos, _, _), count in zip(runs, counts, strict=True):
                results[pos].records_out += count
            return
    for pos, first, last in runs:
        part = batch if len(runs) == 1 else batch.slice(first, last - first)
        results[pos].records_out += output.of(pos).add_batch(part)
        produced(pos)


def _take_side_files(spec: PublishSpec, results: list[TaskResult]) -> list[list[tuple[Any, ...]]]:
    """Consume the reader's side file(s) of this task attempt's ranges (once, all of the slot's
    together): their counts go to `results`, their undecodable records are returned, per range."""
    found = read_side_files(spec.read.side_dir, spec.read.batch_id, [r.index for r in results])
    dead: list[list[tuple[Any, ...]]] = []
    for result in results:
        read = found.get(result.index)
        if read is None:
            dead.append([])
            continue
        result.records_in, result.read_s = read.records, read.read_seconds
        result.largest_record = read.largest_record
        dead.append(read.dead_letters)
    return dead


def _dead_letters_of_ranges(spec: PublishSpec, plans: list[PartitionPlan],
                            results: list[TaskResult]) -> list[list[tuple[Any, ...]]]:
    """The reader's undecodable records of each range (the side files, taken once)."""
    dead = _take_side_files(spec, results)
    for plan, records in zip(plans, dead, strict=True):
        if records and not spec.dead_letter_topic:
            _key, _value, _h, _ts, offset, stage, error = records[0]
            raise PoisonRecordError(
                f"record {plan.topic}[{plan.partition}]@{offset} failed at {stage}: {error}. "
                f"{len(records)} record(s) of this range failed; declare a dead_letter_topic on the processor "
                "(or --dead-letter-topic) to set such records aside. Nothing of this range was published.")
    return dead


def _set(results: list[TaskResult], status: str, committed: list[int | None] | None = None, message: str = "") -> None:
    for i, result in enumerate(results):
        result.status = status
        if committed is not None:
            result.committed = committed[i] if committed[i] is not None else -1
        if message:
            result.message = message


class _Recheck:
    """The slot's re-check of the committed offsets (docs/architecture.md §3.4), run beside the
    produce: a round trip that needs no output, so it need not delay the first record. It starts
    after the slot's init (so nothing older can still commit); the transaction commits only after
    it passed. (The offsets themselves go into the transaction only after the output: once a
    transaction holds them, every stable read of them, a monitoring tool's included, waits until
    it ends.)"""

    def __init__(self, spec: PublishSpec, plans: list[PartitionPlan], tid: str) -> None:
        self.spec, self.plans = spec, plans
        self.current: list[int | None] = [p.committed for p in plans]
        self.status: str | None = None   # ALREADY_DONE or STALE_PLAN: this attempt must not commit
        self.message = ""
        self._error: BaseException | None = None
        self._done = threading.Event()
        threading.Thread(target=self._run, name=f"recheck-{tid}", daemon=True).start()

    def _run(self) -> None:
        try:
            self.current = current_offsets(self.spec, self.plans)
            self.status, self.message = _verdict(self.plans, self.current)
        except BaseException as exc:   # handed to the task's thread
            self._error = exc
        finally:
            self._done.set()

    def refused(self) -> bool:
        """The re-check already found the ranges published or moved (stop producing)."""
        return self._done.is_set() and self.status is not None

    def outcome(self) -> str | None:
        """Wait for the re-check: None (go on), ALREADY_DONE or STALE_PLAN. Raises its error."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self.status

    def settle(self) -> None:
        """Wait until the re-check is over (its consumer is the worker's, shared with the next
        attempt's re-check)."""
        self._done.wait()


def _verdict(plans: list[PartitionPlan], current: list[int | None]) -> tuple[str | None, str]:
    """What the committed offsets say of the plans: (None, "") go on; ALREADY_DONE every range
    is published; STALE_PLAN something other than the plan moved them."""
    if all(c is not None and c == p.end for c, p in zip(current, plans, strict=True)):
        return ALREADY_DONE, ""
    moved = [f"{p.topic}[{p.partition}] {c} (planned {p.committed})"
             for c, p in zip(current, plans, strict=True) if c != p.committed]
    return (STALE_PLAN, f"committed offsets moved: {', '.join(moved)}") if moved else (None, "")


def publish_transactional(spec: PublishSpec, plan: PartitionPlan, batches: Iterator[pa.RecordBatch],
                          result: TaskResult) -> None:
    """One range alone (a slot of one): publish_ranges."""
    publish_ranges(spec, [plan], map(_whole, batches), [result])


class _SlotTransaction(Transaction):
    """A slot's ranges in one transaction: their records (kept, so that a new transaction after
    an abort or a fence replays them and goes on with the rest), the reader's dead letters, and
    every range's end offset with the group's metadata."""

    def __init__(self, spec: PublishSpec, plans: list[PartitionPlan], pieces: Iterator[Piece],
                 results: list[TaskResult]) -> None:
        self.spec, self.plans, self.pieces, self.results = spec, plans, pieces, results
        self.output: _SlotOutput | None = None
        self.input_done = False
        self.dead: list[list[tuple[Any, ...]]] | None = None   # the side files' records, once the input is done
        self.dead_added = [0] * len(plans)
        self.current: list[int | None] | None = None   # the committed offsets, when they refused the plan
        self.refusal = ""

    def produce(self, producer: Any) -> str | None:
        spec, plans, results = self.spec, self.plans, self.results
        recheck = _Recheck(spec, plans, plans[0].transactional_id)
        try:
            if self.output is None:
                self.output = _SlotOutput(spec, plans, producer)
            else:
                started = time.perf_counter()
                self.output.replay(producer)
                results[0].produce_s += time.perf_counter() - started
            if not self.input_done:
                self.input_done = _produce_all(self.output, self.pieces, results, stop=recheck.refused)
            refused = recheck.outcome()
        finally:
            recheck.settle()
        if refused is not None:
            self.current, self.refusal = recheck.current, recheck.message
            return refused
        if self.dead is None:
            self.dead = _dead_letters_of_ranges(spec, plans, results)
        for pos, records in enumerate(self.dead):
            while self.dead_added[pos] < len(records):
                self.dead_added[pos] += 1   # kept by the collector before it is produced: replayed if need be
                self.output.of(pos).add_dead_letter(spec.dead_letter_topic, records[self.dead_added[pos] - 1],
                                                    spec.app_id)
            results[pos].dead_letters = len(records)
        return None

    def offsets(self) -> tuple[list, Any]:
        from confluent_kafka import TopicPartition

        return [TopicPartition(p.topic, p.partition, p.end) for p in self.plans], self.spec.group_metadata

    def abortable(self, error: AbortableError) -> str | None:
        # The group rebalanced since planning: this plan's metadata is stale.
        return STALE_PLAN if group_moved(error) else None

    def other_attempt(self) -> str | None:
        self.current = current_offsets(self.spec, self.plans)
        return _verdict(self.plans, self.current)[0]


def publish_ranges(spec: PublishSpec, plans: list[PartitionPlan], pieces: Iterator[Piece],
                   results: list[TaskResult]) -> None:
    """docs/architecture.md §3.4: a slot's ranges, one producer (the slot's transactional.id),
    one transaction with every range's end offset (the transaction engine's attempt loop)."""
    tid = plans[0].transactional_id
    if any((p.transactional_id, p.transactional_ids) != (tid, plans[0].transactional_ids) for p in plans):
        raise InfrastructureError(f"one slot's ranges name several transactional.ids: {plans}")
    publisher, fresh = slot_publisher(spec, plans[0], spec.fence_all or _is_retry())
    for result in results:
        result.transactional_id = publisher.transactional_id
    # A cached producer fenced since this worker's last batch is replaced under the batch's claim
    # id, which fences whoever holds it (every attempt that initialises anything initialises it).
    transaction = _SlotTransaction(spec, plans, pieces, results)
    outcome = transactions.run(transaction, publisher, fresh=fresh,
                               renew=lambda: pooled_publisher(producers(spec), tid)[0],
                               other_attempt_s=spec.transaction_timeout_s, fault_detail=plans[0])
    results[0].init_s = outcome.init_s
    results[0].commit_s += outcome.commit_s
    for result in results:
        result.attempts, result.transactional_id = outcome.attempts, outcome.transactional_id
    if outcome.committed:
        _set(results, COMMITTED, [p.end for p in plans], outcome.message)
    elif outcome.fence is not None:
        current = transaction.current or [p.committed for p in plans]
        status = outcome.status or FENCED
        message = {ALREADY_DONE: f"fenced by another attempt, which committed the ranges: {outcome.fence}",
                   STALE_PLAN: f"fenced; the offsets moved to {current}"}.get(status, str(outcome.fence))
        _set(results, status, current, message)
    else:
        _set(results, outcome.status, transaction.current, transaction.refusal or outcome.message)


def _is_retry() -> bool:
    """This task is a Spark retry or speculative copy. (A narrow batch is one stage without a
    shuffle (driver/checks.py checks its plan), so its tasks are never re-run by a new
    attempt of the stage, where attempt numbers start again at 0.)"""
    from pyspark import TaskContext

    context = TaskContext.get()
    return context is not None and context.attemptNumber() > 0


def current_offsets(spec: PublishSpec, plans: list[PartitionPlan]) -> list[int | None]:
    """The group's committed offsets of the plans' partitions, read stably."""
    from confluent_kafka import TopicPartition

    found = stable_offsets(spec.clients.stable_reader(spec.app_id),
                           [TopicPartition(p.topic, p.partition) for p in plans], spec.timeout_s)
    by_key = {(tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None) for tp in found}
    return [by_key.get((p.topic, p.partition)) for p in plans]


def _publish_plain(spec: PublishSpec, plans: list[PartitionPlan], pieces: Iterator[Piece],
                   results: list[TaskResult]) -> None:
    """at-least-once / at-most-once: the engine's idempotent producer; offsets are the driver's."""
    def produce(producer: Any) -> None:
        output = _SlotOutput(spec, plans, producer)
        _produce_all(output, pieces, results)
        for pos, (dead, result) in enumerate(zip(_dead_letters_of_ranges(spec, plans, results), results, strict=True)):
            for record in dead:
                output.of(pos).add_dead_letter(spec.dead_letter_topic, record, spec.app_id)
            result.dead_letters = len(dead)

    names = ", ".join(f"{p.topic}[{p.partition}]" for p in plans)
    _, results[0].commit_s = publish_plain(spec.producer_config(transactional=False), produce, spec.timeout_s,
                                           f"output of {names}")
    _set(results, ACKED)
    for result in results:
        result.attempts = 1
    fault_injection.maybe_fail("publish.after_commit", plans[0])   # acknowledged; the driver has not heard of it
