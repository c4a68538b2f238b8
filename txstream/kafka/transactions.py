"""The transaction engine: the one place that begins, commits and aborts transactions (Kafka
Streams' StreamsProducer), the one attempt loop every exactly-once writer runs, and the one
plain (idempotent, non-transactional) producer path of the weaker guarantees.

Its users: a narrow slot's task (task/publish.py), a wide output unit's task (task/units.py),
the wide driver's closing transaction (driver/wide.py), the driver's dead letters
(driver/dead_letters.py) and a state unit's snapshot (state/snapshot.py, no offsets). Each says what to produce and which offsets to send (a `Transaction`);
`run` does the rest:

    begin -> produce -> send offsets -> commit
    abortable  -> abort, then again with the kept records (bounded)
    fenced     -> a fresh producer, or (when ours was initialised for this very attempt) the
                  outcome of the attempt that fenced it, decided once

Kafka's errors become txstream's outcome types here (txstream.errors): retriable (retry the same
call; aborting after an unknown commit outcome would duplicate), abortable (abort, publish again),
fenced or fatal (a newer producer owns the transactional.id: publish nothing more).

Transactional producers are kept per process (a Spark Python worker) across batches, by
transactional.id. A shared "owner" marker per id tells a worker that another worker on the same
host has initialised that id since (and so fenced it), so it starts afresh instead of finding
out at commit time. A producer fenced from another host is found out by the broker's answer, at
produce, send_offsets or commit: each becomes FencedError like any other fence.
"""
from __future__ import annotations

import os
import tempfile
import threading
import time
import uuid
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from txstream import fault_injection
from txstream.errors import AbortableError, FatalKafkaError, FencedError, TaskError
from txstream.kafka.errors import classify_kafka, kafka_error_of

LOCAL_FATAL = -150   # librdkafka's RD_KAFKA_RESP_ERR__FATAL (KafkaError._FATAL)
SEND_OFFSETS_GRACE_S = 10.0   # beyond its own timeout, before a send_offsets call counts as hung

T = TypeVar("T")


class TransactionalPublisher:
    """Owns one producer for one transactional.id."""

    def __init__(self, config: dict[str, Any], transactional_id: str, owner_dir: str | None,
                 timeout_s: float = 60.0) -> None:
        from confluent_kafka import Producer

        self.transactional_id = transactional_id
        self.timeout_s = timeout_s
        self.delivery_errors: list[str] = []
        self._config = {**config, "transactional.id": transactional_id, "on_delivery": self._on_delivery}
        self.producer = Producer(self._config)
        self.renewals = 0   # producers replaced because they could not abort
        self.init_seconds = 0.0
        # A relative owner_dir is under this host's temporary directory (the driver's may not
        # exist here).
        self._owner_path = Path(tempfile.gettempdir(), owner_dir, transactional_id) if owner_dir else None
        self._token = f"{os.getpid()}-{uuid.uuid4().hex}"
        self.in_transaction = False
        self.last_used = time.monotonic()

    def _on_delivery(self, err, _msg) -> None:
        if err is not None:
            self.delivery_errors.append(str(err))

    def init(self) -> None:
        """init_transactions: fences older producers of this id, aborts their open transaction."""
        started = time.perf_counter()
        # A fresh producer has no broker connection yet, and librdkafka's coordinator lookup
        # then retries on a 500 ms timer; a metadata request first brings a connection up.
        try:
            self.producer.list_topics(timeout=min(5.0, self.timeout_s))
        except Exception:
            pass
        self._retry(lambda: self.producer.init_transactions(self.timeout_s), "init_transactions")
        self.init_seconds = time.perf_counter() - started
        if self._owner_path is not None:
            try:
                self._owner_path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self._owner_path.with_suffix(f".{self._token}")
                tmp.write_text(self._token)
                os.replace(tmp, self._owner_path)
            except OSError:
                # The markers only spare a fenced producer's discovery at commit time (which
                # the protocol handles): no marker, no harm.
                self._owner_path = None

    def still_owner(self) -> bool:
        """False when another worker on this machine initialised this id after us."""
        if self._owner_path is None:
            return True
        try:
            return self._owner_path.read_text() == self._token
        except OSError:
            return False

    @contextmanager
    def producing(self) -> Iterator[None]:
        """Around produce() calls: a Kafka error they raise (the producer was fenced and is now
        in a fatal state) is classified like the transactional calls' errors."""
        try:
            yield
        except Exception as exc:
            if kafka_error_of(exc) is None:
                raise
            raise self._classify(exc, "produce") from exc

    def begin(self) -> None:
        self.delivery_errors.clear()
        self._call(self.producer.begin_transaction, "begin_transaction")
        self.in_transaction = True

    def send_offsets(self, offsets: list, group_metadata: Any) -> None:
        """send_offsets_to_transaction, bounded by our own clock: librdkafka can block in it past
        its timeout, for ever, when the group coordinator goes away (librdkafka#5456, #5511). A
        call that does not return is abandoned with its producer; a fresh producer's
        init_transactions aborts the open transaction, and the caller publishes again."""
        outcome: dict[str, Any] = {}
        done = threading.Event()
        producer = self.producer

        def call() -> None:
            try:
                producer.send_offsets_to_transaction(offsets, group_metadata, self.timeout_s)
            except BaseException as exc:  # handed to the caller's thread
                outcome["error"] = exc
            finally:
                done.set()

        threading.Thread(target=call, name=f"send-offsets-{self.transactional_id}", daemon=True).start()
        if not done.wait(self.timeout_s + SEND_OFFSETS_GRACE_S):
            self.in_transaction = False
            # The hung thread still uses the old producer: it is not closed under it (the
            # thread holds the last reference, and the producer goes when the call returns).
            self._renew(close_old=False)
            raise AbortableError(f"{self.transactional_id}: send_offsets_to_transaction did not return within "
                                 f"{self.timeout_s + SEND_OFFSETS_GRACE_S:.0f}s (a librdkafka hang when the group "
                                 "coordinator moves); the producer was replaced, its transaction aborted")
        if "error" in outcome:
            raise self._classify(outcome["error"], "send_offsets_to_transaction") from outcome["error"]

    def commit(self) -> None:
        """Commit; a retriable error retries the commit itself (its outcome is unknown)."""
        self._retry(lambda: self.producer.commit_transaction(self.timeout_s), "commit_transaction",
                    abort_on_abortable=True)
        self.in_transaction = False

    def abort(self) -> None:
        """Abort the open transaction, whatever state the producer is in.

        librdkafka can fail an abort issued right after produce() fatally with INVALID_TXN_STATE
        while produce requests are in flight (confluentinc/librdkafka#4849): waiting for them
        first avoids it. Should the abort still fail fatally, this producer is finished: a fresh
        one under the same transactional.id is started, and its init_transactions aborts what was
        left open. A fence (another producer owns the id now) is not renewed: that one keeps it.
        """
        if not self.in_transaction:
            return
        try:
            self.producer.flush(self.timeout_s)
            self._retry(lambda: self.producer.abort_transaction(self.timeout_s), "abort_transaction")
        except FencedError as exc:
            from confluent_kafka import KafkaError

            if exc.code in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH):
                raise
            self._renew(close_old=True)
        finally:
            self.in_transaction = False

    def _renew(self, close_old: bool) -> None:
        """A fresh producer for this transactional.id; init_transactions settles the old one's."""
        from confluent_kafka import Producer

        old, self.producer = self.producer, Producer(self._config)
        self.renewals += 1
        try:
            old.purge(in_queue=True, in_flight=False)
        except Exception:  # a fatal producer may refuse even that; it is dropped either way
            pass
        if close_old:
            _destroy(old)
        self.init()

    def close(self) -> None:
        """Abort what is open, then destroy the producer now, not at Python's next cyclic
        collection (its delivery callback, a bound method, is a reference cycle that would keep
        the producer's threads and connections)."""
        try:
            self.abort()
        except Exception:
            pass
        try:
            self.producer.flush(5)
        except Exception:
            pass
        _destroy(self.producer)

    # -- error classification -------------------------------------------------------------

    def _call(self, fn: Callable[[], Any], what: str) -> Any:
        try:
            return fn()
        except Exception as exc:
            raise self._classify(exc, what) from exc

    def _retry(self, fn: Callable[[], Any], what: str, attempts: int = 10,
               abort_on_abortable: bool = False) -> Any:
        # Each call may block up to timeout_s; the retries together get twice that, after which
        # the task fails and a new attempt starts from init_transactions and the offset re-check.
        deadline = time.monotonic() + 2 * self.timeout_s
        for attempt in range(attempts):
            try:
                return fn()
            except Exception as exc:
                err = kafka_error_of(exc)
                if (err is not None and err.retriable() and not err.fatal() and attempt < attempts - 1
                        and time.monotonic() < deadline):
                    time.sleep(min(0.1 * 2 ** attempt, 2.0))
                    continue
                classified = self._classify(exc, what)
                if abort_on_abortable and isinstance(classified, AbortableError):
                    self.abort()
                raise classified from exc
        raise AssertionError("unreachable")

    def _classify(self, exc: BaseException, what: str) -> BaseException:
        """Kafka's errors as txstream's outcome types. A fatal error is treated as a fence:
        this producer is done, and a fresh one's init_transactions settles what was open."""
        err = kafka_error_of(exc)
        if err is None:
            return exc
        classified = classify_kafka(err, f"{self.transactional_id}: {what}")
        # produce() on a producer already in a fatal state (fenced by the broker meanwhile)
        # raises the local _FATAL code, not the fatal error itself.
        if isinstance(classified, FatalKafkaError) or err.code() == LOCAL_FATAL:
            return FencedError(str(classified), err)
        return classified


def _destroy(producer: Any) -> None:
    """Drop what is queued (it was never to be committed) and destroy the producer now."""
    try:
        producer.purge(in_queue=True, in_flight=True)
        with warnings.catch_warnings():
            # close() tries an abort first; a fenced producer's fails, is said in a
            # RuntimeWarning and an exception, and the producer is destroyed all the same.
            warnings.simplefilter("ignore", RuntimeWarning)
            producer.close()
    except Exception:   # that exception
        pass


# -- this process's transactional producers ------------------------------------------------------

@dataclass(frozen=True)
class Producers:
    """How a run's transactional producers are made: their configuration, the owner markers'
    directory, how long one call may block, and how long an unused one is kept."""

    config: dict[str, Any]
    owner_dir: str | None
    timeout_s: float
    idle_s: float = 120.0

    def new(self, transactional_id: str) -> TransactionalPublisher:
        return TransactionalPublisher(self.config, transactional_id, self.owner_dir, self.timeout_s)


_PUBLISHERS: dict[str, TransactionalPublisher] = {}   # per process (Python worker), across batches


def held_publisher(producers: Producers, ids: tuple[str, ...]) -> TransactionalPublisher | None:
    """The producer this process holds for the first of `ids` it has one for, without
    init_transactions; first the stale ones are closed (`_drop_stale`)."""
    _drop_stale(producers, ids)
    for tid in ids:
        publisher = _PUBLISHERS.get(tid)
        if publisher is not None:
            publisher.last_used = time.monotonic()
            return publisher
    return None


def pooled_publisher(producers: Producers, tid: str) -> tuple[TransactionalPublisher, bool]:
    """This process's producer for `tid`, or a new initialised one. (publisher, fresh)"""
    publisher = held_publisher(producers, (tid,))
    if publisher is not None:
        return publisher, False
    publisher = producers.new(tid)
    publisher.init()
    _PUBLISHERS[tid] = publisher
    return publisher, True


def fence_ids(producers: Producers, pool: tuple[str, ...], keep: str) -> TransactionalPublisher:
    """`init_transactions` on every id of `pool`, in parallel (each call waits on the broker): once
    this returns, no earlier producer of any of them can commit. Returns `keep`'s producer (not
    kept by this process: `hold` it); the others are closed."""
    publishers = {tid: producers.new(tid) for tid in pool}
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


def hold(publisher: TransactionalPublisher) -> None:
    """Keep `publisher` in this process's pool (closing the one it replaces)."""
    drop_publisher(publisher.transactional_id)
    _PUBLISHERS[publisher.transactional_id] = publisher


def drop_publisher(tid: str) -> None:
    publisher = _PUBLISHERS.pop(tid, None)
    if publisher is not None:
        publisher.close()


def _drop_if_pooled(publisher: TransactionalPublisher) -> None:
    """Close `publisher` if it is this process's pooled one (else its owner closes it)."""
    if _PUBLISHERS.get(publisher.transactional_id) is publisher:
        drop_publisher(publisher.transactional_id)


def cached_publishers() -> list[str]:
    """The transactional.ids this process keeps a producer for (tests, diagnostics)."""
    return sorted(_PUBLISHERS)


def _drop_stale(producers: Producers, keep: tuple[str, ...]) -> None:
    """Close the producers that another worker fenced since, or that nothing here used for a
    while (their tasks run elsewhere now): dead weight (threads, sockets)."""
    now = time.monotonic()
    for stale in [t for t, p in _PUBLISHERS.items()
                  if not p.still_owner() or (t not in keep and now - p.last_used > producers.idle_s)]:
        drop_publisher(stale)


# -- the attempt loop ------------------------------------------------------------------------------

class Transaction:
    """What one transaction publishes. `run` calls these, in order, in every attempt."""

    def settled(self) -> str | None:
        """Before the transaction begins: an outcome that makes it needless (the work is
        published already), or None."""
        return None

    def produce(self, producer: Any) -> str | None:
        """Produce into the open transaction, to any topics. After an abort it is called again
        with the (possibly new) producer: produce what was kept again, then the rest. Returns an
        outcome that forbids the commit (the transaction is aborted), or None."""
        raise NotImplementedError

    def offsets(self) -> tuple[list, Any]:
        """The offsets the transaction commits (TopicPartitions) and the group's metadata; an
        empty list sends none."""
        raise NotImplementedError

    def abortable(self, error: AbortableError) -> str | None:
        """After an abortable error (the transaction is aborted): an outcome to stop with, None
        to go again; or raise."""
        return None

    def other_attempt(self) -> str | None:
        """Once another attempt of the same work fenced this one: what it did (an outcome), or
        None while that is not known yet."""
        return None


class CallableTransaction(Transaction):
    """A transaction given as two callables: `produce(producer)` and `offsets()`."""

    def __init__(self, produce: Callable[[Any], None], offsets: Callable[[], tuple[list, Any]]) -> None:
        self._produce, self._offsets = produce, offsets

    def produce(self, producer: Any) -> None:
        self._produce(producer)

    def offsets(self) -> tuple[list, Any]:
        return self._offsets()


@dataclass
class Outcome:
    committed: bool
    status: str | None = None      # the Transaction's answer when not committed
    attempts: int = 0
    commit_s: float = 0.0          # send offsets and commit
    init_s: float = 0.0            # init_transactions of the producers this call used
    transactional_id: str = ""
    message: str = ""              # the last abortable error, if any
    fence: FencedError | None = None   # set when another attempt fenced this one


def run(transaction: Transaction, publisher: TransactionalPublisher, *, fresh: bool,
        renew: Callable[[], TransactionalPublisher] | None, attempts: int = 3,
        again: tuple[type[BaseException], ...] = (AbortableError,), pause_s: float = 0.0,
        other_attempt_s: float = 0.0, fault_detail: object = None) -> Outcome:
    """Publish `transaction` through `publisher` (`fresh`: initialised for this call).

    `again`: the errors after which the transaction is aborted and published again, up to
    `attempts` times, `pause_s` apart; then AbortableError. A fence, with `renew`: the producer
    is dropped from this process's pool; if it was fresh, the attempt that fenced it owns the
    work, and the outcome is what `transaction.other_attempt` says within `other_attempt_s`
    (`status` None if nothing, `fence` set); if not, `renew()` gives the next producer. Without
    `renew` the FencedError is the caller's. `fault_detail`: the test-only fault points
    (txstream.fault_injection) fire with it; None, not at all. The commit flushes what is in flight
    (commit_transaction does), so the offsets' requests need not wait for the output's acks."""
    outcome = Outcome(False, init_s=publisher.init_seconds if fresh else 0.0,
                      transactional_id=publisher.transactional_id)

    def fault(point: str) -> None:
        if fault_detail is not None:
            fault_injection.maybe_fail(point, fault_detail)

    for attempt in range(1, attempts + 1):
        outcome.attempts = attempt
        done = transaction.settled()
        if done is not None:
            outcome.status = done
            return outcome
        try:
            try:
                publisher.begin()
                fault("publish.before_produce")
                with publisher.producing():
                    refused = transaction.produce(publisher.producer)
                if refused is not None:
                    publisher.abort()   # what this attempt produced is never committed
                    outcome.status = refused
                    return outcome
                started = time.perf_counter()
                offsets, group_metadata = transaction.offsets()
                if offsets:   # a snapshot's transaction commits records only
                    publisher.send_offsets(offsets, group_metadata)
                fault("publish.before_commit")
                publisher.commit()
                outcome.commit_s += time.perf_counter() - started
                fault("publish.after_commit")
                outcome.committed = True
                return outcome
            except FencedError:
                raise
            except again as exc:
                outcome.message = str(exc)
                publisher.abort()   # a producer that cannot abort is replaced; a fence is raised
                stop = transaction.abortable(exc) if isinstance(exc, AbortableError) else None
                if stop is not None:
                    outcome.status = stop
                    return outcome
                if attempt < attempts:
                    time.sleep(pause_s)
                continue
            except BaseException:
                try:
                    publisher.abort()
                except Exception:   # the original error is the one to report
                    _drop_if_pooled(publisher)
                raise
        except FencedError as fence:
            if renew is None:
                raise
            _drop_if_pooled(publisher)
            if fresh:
                # Fenced during this call: another attempt of the same work (a speculative copy,
                # a retry elsewhere) initialised the id after us, and owns the work now.
                # Reporting at once would let Spark take this attempt's result as the task's and
                # kill the one that owns the work, perhaps before its commit (speculation); so
                # wait, up to the longest its transaction can stay open, for what it did.
                outcome.fence = fence
                outcome.status = _wait_for(transaction.other_attempt, other_attempt_s)
                return outcome
            # Our cached producer was fenced by a producer elsewhere since this process last
            # used it: start afresh and publish the kept records, then the rest.
            publisher, fresh = renew(), True
            outcome.init_s += publisher.init_seconds
            outcome.transactional_id = publisher.transactional_id
    raise AbortableError(f"{outcome.transactional_id}: gave up after {outcome.attempts} aborted attempts: "
                         f"{outcome.message}")


def _wait_for(check: Callable[[], str | None], timeout_s: float) -> str | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        answer = check()
        if answer is not None:
            return answer
        time.sleep(0.2)
    return None


def group_moved(error: AbortableError) -> bool:
    """send_offsets_to_transaction was refused because the group rebalanced since the offsets'
    metadata was taken."""
    from confluent_kafka import KafkaError

    return error.code in (KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID,
                          KafkaError.FENCED_INSTANCE_ID, KafkaError.REBALANCE_IN_PROGRESS)


# -- stable reads of a group's committed offsets ----------------------------------------------------

_READERS: dict[str, Any] = {}   # per process, by configuration


def stable_offsets(config: dict[str, Any], partitions: list, timeout_s: float) -> list:
    """The committed offsets (TopicPartitions, with their metadata) of `partitions` in the group
    of `config` (KafkaClients.stable_reader), read stably: a commit still pending in an open
    transaction is resolved first, as read_committed makes librdkafka ask for stable offsets
    (KIP-447). The re-checks before a commit read here, through a consumer that never joins.
    (kafka/lookups.py `committed_offsets` answers the commands, with the AdminClient.)"""
    from confluent_kafka import Consumer

    from txstream.kafka.retry import retriable

    key = repr(sorted((k, str(v)) for k, v in config.items()))
    if key not in _READERS:
        _READERS[key] = Consumer(config)
    reader = _READERS[key]
    return retriable(lambda: reader.committed(partitions, timeout=timeout_s), timeout_s)


# -- the weaker guarantees: one idempotent producer per configuration -------------------------------

_PLAIN: dict[str, Any] = {}
_PLAIN_ERRORS: list[str] = []


def _plain_delivery(err: Any, _msg: Any) -> None:
    if err is not None:
        _PLAIN_ERRORS.append(str(err))


def publish_plain(config: dict[str, Any], produce: Callable[[Any], T], timeout_s: float,
                  what: str) -> tuple[T, float]:
    """at-least-once / at-most-once: `produce(producer)` through this process's idempotent
    producer of `config`, then wait for every acknowledgement. Returns what `produce` returned
    and the seconds the wait took; raises TaskError if anything was not acknowledged (its
    offsets must not be committed). `what` names the output in that message."""
    from confluent_kafka import Producer

    key = repr(sorted((k, str(v)) for k, v in config.items()))
    if key not in _PLAIN:
        _PLAIN[key] = Producer({**config, "on_delivery": _plain_delivery})
    producer = _PLAIN[key]
    _PLAIN_ERRORS.clear()
    produced = produce(producer)
    started = time.perf_counter()
    remaining = producer.flush(timeout_s)
    waited = time.perf_counter() - started
    if remaining or _PLAIN_ERRORS:
        raise TaskError(f"{what} was not acknowledged ({remaining} still queued after {timeout_s:.0f}s; delivery "
                        f"errors: {_PLAIN_ERRORS[:3]}); its offsets are not committed")
    return produced, waited
