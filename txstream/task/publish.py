"""One publishing task (a `mapInArrow` body): the protocol of docs/architecture.md §3.4.

The task's output and its input offset are committed in one Kafka transaction through the
partition's `TransactionalPublisher` (publisher.py); `RecordCollector` (collector.py) turns the
rows into records. The weaker guarantees produce with an idempotent producer and leave offsets
to the driver (driver/commits.py).
"""
from __future__ import annotations

import threading
import time
import uuid
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa

from txstream import faults
from txstream.errors import AbortableError, FencedError, InfrastructureError, PoisonRecordError, TaskError
from txstream.protocol import ACKED, ALREADY_DONE, COMMITTED, EXACTLY_ONCE, FENCED, RANGE_COLUMN, STALE_PLAN
from txstream.serde.avro import AvroCodec
from txstream.task import worker_heap
from txstream.task.collector import RecordCollector, add_runs, encoded_batch
from txstream.task.publisher import TransactionalPublisher
from txstream.task.result import TaskResult, results_batch
from txstream.task.sidefile import read_side_files
from txstream.task.spec import FromJob, PartitionPlan, PublishSpec
from txstream.task.spec import resolve as resolve_job_spec

_PUBLISHERS: dict[str, TransactionalPublisher] = {}   # per Python worker, across batches
_GROUP_READERS: dict[str, Any] = {}


def _group_reader(spec: PublishSpec) -> Any:
    """A non-member consumer of the app's group, for stable reads of committed offsets."""
    from confluent_kafka import Consumer

    # read_committed makes librdkafka ask for stable offsets (KIP-447): a commit still pending
    # in an open transaction is resolved before the answer.
    config = spec.clients.stable_reader(spec.app_id)
    key = repr(sorted((k, str(v)) for k, v in config.items()))
    if key not in _GROUP_READERS:
        _GROUP_READERS[key] = Consumer(config)
    return _GROUP_READERS[key]


def _new_publisher(spec: PublishSpec, tid: str) -> TransactionalPublisher:
    return TransactionalPublisher(spec.producer_config(transactional=True), tid, spec.owner_dir, spec.timeout_s)


def partition_publisher(spec: PublishSpec, plan: PartitionPlan) -> tuple[TransactionalPublisher, bool]:
    """The cached publisher for this partition, or a new initialised one. (publisher, fresh)."""
    return cached_publisher(spec, plan.transactional_id)


def _drop_stale(spec: PublishSpec, keep: tuple[str, ...]) -> None:
    """Close the producers that another worker fenced since, or that no task of this worker used
    for a while (their slots' tasks run elsewhere now): dead weight (threads, sockets)."""
    now = time.monotonic()
    for stale in [t for t, p in _PUBLISHERS.items()
                  if not p.still_owner() or (t not in keep and now - p.last_used > spec.producer_idle_s)]:
        drop_publisher(stale)


def cached_publisher(spec: PublishSpec, tid: str) -> tuple[TransactionalPublisher, bool]:
    """This worker's publisher for `tid` (a slot's, or a wide output unit's), or a new
    initialised one. (publisher, fresh)."""
    now = time.monotonic()
    _drop_stale(spec, (tid,))
    publisher = _PUBLISHERS.get(tid)
    if publisher is not None:
        publisher.last_used = now
        return publisher, False
    publisher = _new_publisher(spec, tid)
    publisher.init()
    _PUBLISHERS[tid] = publisher
    return publisher, True


def slot_publisher(spec: PublishSpec, plan: PartitionPlan, fence_all: bool) -> tuple[TransactionalPublisher, bool]:
    """The producer a slot's task publishes through (docs/architecture.md §3.4). (publisher, fresh)

    - `fence_all` (the first batch of a run, after a failed batch or a rebalance, and every
      retried or speculative attempt): initialise every transactional.id of the slot, keep the
      batch's claim id (`plan.transactional_id`);
    - else a producer this worker already holds for any of the slot's ids, without
      `init_transactions` (Spark hands a slot's task to whichever Python worker is idle: with
      one id per slot, a task paid `init_transactions` whenever its slot moved, in some runs every batch);
    - else initialise the batch's claim id, which the driver picks among the slot's ids as the
      one used least recently (driver/slots.py)."""
    if fence_all:
        for tid in plan.transactional_ids:
            drop_publisher(tid)
        publisher = fence_pool(spec, plan.transactional_ids, plan.transactional_id)
        _PUBLISHERS[publisher.transactional_id] = publisher
        return publisher, True
    _drop_stale(spec, plan.transactional_ids)
    for tid in (plan.transactional_id, *plan.transactional_ids):
        publisher = _PUBLISHERS.get(tid)
        if publisher is not None:
            publisher.last_used = time.monotonic()
            return publisher, False
    return cached_publisher(spec, plan.transactional_id)


def fence_pool(spec: PublishSpec, pool: tuple[str, ...], keep: str) -> TransactionalPublisher:
    """`init_transactions` on every id of `pool`, in parallel (each call waits on the broker): once
    this returns, no earlier producer of any of them can commit, whichever attempt or batch it
    served. Returns `keep`'s producer; the others are closed."""
    publishers = {tid: _new_publisher(spec, tid) for tid in pool}
    errors: list[BaseException] = []

    def init(publisher: TransactionalPublisher) -> None:
        try:
            publisher.init()
        except BaseException as exc:   # handed to the calling thread
            errors.append(exc)

    started = time.perf_counter()
    threads = [threading.Thread(target=init, args=(p,), name=f"fence-{p.transactional_id}", daemon=True)
               for p in publishers.values()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for tid, publisher in publishers.items():
        if errors or tid != keep:
            publisher.close()
    if errors:
        raise errors[0]
    kept = publishers[keep]
    kept.init_seconds = time.perf_counter() - started
    return kept


def drop_publisher(tid: str) -> None:
    publisher = _PUBLISHERS.pop(tid, None)
    if publisher is not None:
        publisher.close()


def cached_publishers() -> list[str]:
    """The transactional.ids this Python worker keeps a producer for (tests, diagnostics)."""
    return sorted(_PUBLISHERS)


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


def _codec(schema: dict | None) -> AvroCodec | None:
    return AvroCodec(schema) if schema else None


def _collector(spec: PublishSpec, plan: PartitionPlan, producer: Any,
               codecs: tuple[AvroCodec | None, AvroCodec | None] | None = None) -> RecordCollector:
    """`codecs`: (value, key) codecs to share (a slot's collectors); else built for this one."""
    value_codec, key_codec = codecs or (_codec(spec.output_value_schema), _codec(spec.output_key_schema))
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
            # The slot's codecs, not a pair per range: building them was 7% of a publishing
            # worker's samples at 256 partitions (128 ranges a slot).
            collector = self.collectors[pos] = _collector(self.spec, self.plans[pos], self.producer, self.codecs)
        return collector

    @property
    def codecs(self) -> tuple[AvroCodec | None, AvroCodec | None]:
        """The output's (value, key) codecs, built once for the slot."""
        if self._codecs is None:
            self._codecs = (_codec(self.spec.output_value_schema), _codec(self.spec.output_key_schema))
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
        faults.maybe_fail("publish.mid_produce", output.plans[pos])

    if len(runs) > 1:
        # Keys and values encoded once per batch, not once per run: the columnar encoder's
        # fixed cost per call (~0.5 ms) was most of a slot's produce time at 128 ranges.
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
    produce: a round trip that needs no output, and that used to sit between the task's start
    and its first record. It starts after the slot's init (so nothing older can still commit);
    the transaction commits only after it passed. (The offsets themselves go into the
    transaction only after the output: once a transaction holds them, every stable read of them,
    a monitoring tool's included, waits until it ends.)"""

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
            self.current = committed_offsets(self.spec, self.plans)
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


def publish_ranges(spec: PublishSpec, plans: list[PartitionPlan], pieces: Iterator[Piece],
                   results: list[TaskResult]) -> None:
    """docs/architecture.md §3.4: a slot's ranges, one producer (the slot's transactional.id),
    one transaction with every range's end offset. The records are kept (collector.py), so
    that a new transaction after an abort or a fence replays them and goes on with the rest."""
    from confluent_kafka import TopicPartition

    tid = plans[0].transactional_id
    if any((p.transactional_id, p.transactional_ids) != (tid, plans[0].transactional_ids) for p in plans):
        raise InfrastructureError(f"one slot's ranges name several transactional.ids: {plans}")
    publisher, fresh = slot_publisher(spec, plans[0], spec.fence_all or _is_retry())
    results[0].init_s = publisher.init_seconds if fresh else 0.0
    for result in results:
        result.transactional_id = publisher.transactional_id
    output: _SlotOutput | None = None
    input_done = False
    dead: list[list[tuple[Any, ...]]] | None = None   # the side files' records, once the input is done
    dead_added = [0] * len(plans)
    for attempt in range(1, 4):
        for result in results:
            result.attempts = attempt
        recheck: _Recheck | None = None
        try:
            try:
                publisher.begin()
                recheck = _Recheck(spec, plans, publisher.transactional_id)
                faults.maybe_fail("publish.before_produce", plans[0])
                with publisher.producing():
                    if output is None:
                        output = _SlotOutput(spec, plans, publisher.producer)
                    else:
                        started = time.perf_counter()
                        output.replay(publisher.producer)
                        results[0].produce_s += time.perf_counter() - started
                    if not input_done:
                        input_done = _produce_all(output, pieces, results, stop=recheck.refused)
                refused = recheck.outcome()
                if refused is not None:
                    publisher.abort()   # what this attempt produced is never committed
                    _set(results, refused, recheck.current, recheck.message)
                    return
                with publisher.producing():
                    if dead is None:
                        dead = _dead_letters_of_ranges(spec, plans, results)
                    for pos, records in enumerate(dead):
                        while dead_added[pos] < len(records):
                            dead_added[pos] += 1   # kept by the collector before it is produced: replayed if need be
                            output.of(pos).add_dead_letter(spec.dead_letter_topic, records[dead_added[pos] - 1], spec.app_id)
                        results[pos].dead_letters = len(records)
                started = time.perf_counter()
                publisher.send_offsets([TopicPartition(p.topic, p.partition, p.end) for p in plans],
                                       spec.group_metadata)
                faults.maybe_fail("publish.before_commit", plans[0])
                publisher.commit()
                results[0].commit_s += time.perf_counter() - started
            finally:
                if recheck is not None:
                    recheck.settle()
            faults.maybe_fail("publish.after_commit", plans[0])
            _set(results, COMMITTED, [p.end for p in plans])
            return
        except AbortableError as exc:
            publisher.abort()   # robust: a producer that cannot abort is replaced (publisher.py)
            _set(results, results[0].status, message=str(exc))
            if exc.code in _group_moved_codes():
                # The group rebalanced since planning: this plan's metadata is stale.
                _set(results, STALE_PLAN)
                return
            continue  # publish the ranges again in a new transaction
        except FencedError as exc:
            drop_publisher(publisher.transactional_id)
            if fresh:
                # Fenced during this task: another attempt of this slot (a speculative copy, a
                # retry on another host) initialised the id after us and owns the ranges now.
                status, committed, message = _outcome_of_other_attempt(spec, plans, exc)
                _set(results, status, committed, message)
                return
            # Our cached producer was fenced by a producer elsewhere (another worker, another
            # host) since this worker's last batch: start afresh under the batch's claim id
            # (which fences whoever holds it, a racing attempt of this slot included: every
            # attempt that initialises anything initialises that id) and publish the kept
            # records, then the rest.
            publisher, fresh = cached_publisher(spec, tid)
            results[0].init_s += publisher.init_seconds
            for result in results:
                result.transactional_id = publisher.transactional_id
            continue
        except BaseException:
            try:
                publisher.abort()
            except Exception:   # the original error is the one to report
                drop_publisher(publisher.transactional_id)
            raise
    raise AbortableError(f"{tid}: gave up after {results[0].attempts} aborted attempts: {results[0].message}")


def _is_retry() -> bool:
    """This task is a Spark retry or speculative copy. (A narrow batch is one stage without a
    shuffle (driver/checks.py checks its plan), so its tasks are never re-run by a new
    attempt of the stage, where attempt numbers start again at 0.)"""
    from pyspark import TaskContext

    context = TaskContext.get()
    return context is not None and context.attemptNumber() > 0


def committed_offsets(spec: PublishSpec, plans: list[PartitionPlan]) -> list[int | None]:
    """The group's committed offsets of the plans' partitions, read stably."""
    from confluent_kafka import TopicPartition

    from txstream.kafka.retry import retriable

    timeout = spec.timeout_s
    wanted = [TopicPartition(p.topic, p.partition) for p in plans]
    found = retriable(lambda: _group_reader(spec).committed(wanted, timeout=timeout), timeout)
    by_key = {(tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None) for tp in found}
    return [by_key.get((p.topic, p.partition)) for p in plans]


def _outcome_of_other_attempt(spec: PublishSpec, plans: list[PartitionPlan],
                              fence: FencedError) -> tuple[str, list[int | None], str]:
    """What became of the slot's ranges after another attempt fenced this one: wait (up to the
    transaction timeout, the longest its transaction can stay open) until it committed them
    (ALREADY_DONE) or something else moved an offset (STALE_PLAN); else FENCED.

    Reporting at once would let Spark take this attempt's result as the task's and kill the
    attempt that owns the ranges, perhaps before its commit (speculation): the ranges would then
    be re-planned and read again. Waiting, the first result Spark sees is a finished slot."""
    deadline = time.monotonic() + spec.transaction_timeout_s
    current: list[int | None] = [p.committed for p in plans]
    while time.monotonic() < deadline:
        current = committed_offsets(spec, plans)
        status, _moved = _verdict(plans, current)
        if status == ALREADY_DONE:
            return ALREADY_DONE, current, f"fenced by another attempt, which committed the ranges: {fence}"
        if status == STALE_PLAN:
            return STALE_PLAN, current, f"fenced; the offsets moved to {current}"
        time.sleep(0.2)
    return FENCED, current, str(fence)


def _group_moved_codes() -> set[int]:
    """send_offsets_to_transaction refused because the group rebalanced since planning."""
    from confluent_kafka import KafkaError

    return {KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID, KafkaError.FENCED_INSTANCE_ID,
            KafkaError.REBALANCE_IN_PROGRESS}


_PLAIN_PRODUCERS: dict[str, Any] = {}
_PLAIN_ERRORS: list[str] = []


def _plain_delivery(err, _msg) -> None:
    if err is not None:
        _PLAIN_ERRORS.append(str(err))


def _publish_plain(spec: PublishSpec, plans: list[PartitionPlan], pieces: Iterator[Piece],
                   results: list[TaskResult]) -> None:
    """at-least-once / at-most-once: idempotent producer, offsets are the driver's business."""
    from confluent_kafka import Producer

    config = spec.producer_config(transactional=False)
    key = repr(sorted((k, str(v)) for k, v in config.items()))
    if key not in _PLAIN_PRODUCERS:
        _PLAIN_PRODUCERS[key] = Producer({**config, "on_delivery": _plain_delivery})
    producer = _PLAIN_PRODUCERS[key]
    _PLAIN_ERRORS.clear()
    output = _SlotOutput(spec, plans, producer)
    _produce_all(output, pieces, results)
    for pos, (dead, result) in enumerate(zip(_dead_letters_of_ranges(spec, plans, results), results, strict=True)):
        for record in dead:
            output.of(pos).add_dead_letter(spec.dead_letter_topic, record, spec.app_id)
        result.dead_letters = len(dead)
    started = time.perf_counter()
    remaining = producer.flush(spec.timeout_s)
    results[0].commit_s = time.perf_counter() - started  # waiting for the acknowledgements
    if remaining or _PLAIN_ERRORS:
        names = ", ".join(f"{p.topic}[{p.partition}]" for p in plans)
        raise TaskError(f"output of {names} was not acknowledged "
                        f"({remaining} still queued after {spec.timeout_s:.0f}s; delivery "
                        f"errors: {_PLAIN_ERRORS[:3]}); its offsets are not committed")
    _set(results, ACKED)
    for result in results:
        result.attempts = 1
    faults.maybe_fail("publish.after_commit", plans[0])   # acknowledged; the driver has not heard of it


def publish_dead_letter(spec: PublishSpec, plan: PartitionPlan, record: tuple, membership: Any) -> str:
    """Send one record to the dead-letter topic and move the partition's offset past it.

    Runs on the driver (poison isolation), with a task's protocol: under exactly-once the
    partition's transactional.id (fencing any zombie), the committed-offset re-check, the dead
    letter and the offset in one transaction. The weaker guarantees produce, then let the
    member commit.
    """
    from confluent_kafka import Producer, TopicPartition

    offset = record[4]
    next_offset = [TopicPartition(plan.topic, plan.partition, offset + 1)]
    if spec.guarantee != EXACTLY_ONCE:
        producer = Producer(spec.producer_config(transactional=False))
        collector = _collector(spec, plan, producer)
        collector.add_dead_letter(spec.dead_letter_topic, record, spec.app_id)
        if producer.flush(spec.timeout_s):
            raise TaskError("the dead letter was not acknowledged; its offset is not committed")
        membership.commit(next_offset)
        return COMMITTED
    publisher = fence_pool(spec, plan.transactional_ids, plan.transactional_id)
    try:
        if committed_offsets(spec, [plan])[0] != offset:
            return STALE_PLAN
        publisher.begin()
        _collector(spec, plan, publisher.producer).add_dead_letter(spec.dead_letter_topic, record, spec.app_id)
        publisher.send_offsets(next_offset, spec.group_metadata)
        publisher.commit()
        return COMMITTED
    finally:
        publisher.close()
