"""The transactional producer of one input partition (Kafka Streams' StreamsProducer).

`TransactionalPublisher` is the only place that begins, commits and aborts transactions and the
place their errors are classified (txstream.errors): retriable (retry the same call; aborting
after an unknown commit outcome would duplicate), abortable (abort, publish the range again),
fenced or fatal (a newer attempt owns the transactional.id: stop, publish nothing more).

Producers are kept per Python worker across batches. A shared "owner" marker per
transactional.id tells a worker that another worker on the same host has initialised that id
since (and so fenced it), so it starts afresh instead of discovering the fence at commit time. A
producer fenced from another host is found out by the broker's answer, at produce, send_offsets or
commit: `producing()` and the calls below turn that into FencedError like any other fence.
"""
from __future__ import annotations

import os
import tempfile
import threading
import time
import uuid
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from txstream.errors import AbortableError, FatalKafkaError, FencedError
from txstream.kafka.errors import classify_kafka, kafka_error_of

LOCAL_FATAL = -150   # librdkafka's RD_KAFKA_RESP_ERR__FATAL (KafkaError._FATAL)
SEND_OFFSETS_GRACE_S = 10.0   # beyond its own timeout, before a send_offsets call counts as hung


class TransactionalPublisher:
    """Owns one producer for one transactional.id (one input partition of one app)."""

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
        # A fresh producer has no broker connection yet: librdkafka's coordinator lookup then
        # finds "no brokers available" and retries on a 500 ms timer. A metadata request first
        # brings a connection up, so init_transactions finds its coordinator at once (measured:
        # ~0.5 s -> ~0.05 s per new producer).
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
        """Around produce() calls (collector.py): a Kafka error they raise (the producer was fenced
        and is now in a fatal state) is classified like the transactional calls' errors."""
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

    def send_offsets(self, offsets: list, group_metadata: bytes) -> None:
        """send_offsets_to_transaction, bounded by our own clock: librdkafka can block in it past
        its timeout, for ever, when the group coordinator goes away (librdkafka#5456, #5511; seen
        here when a broker was SIGKILLed under a wide run's driver). A call that does not return
        is abandoned with its producer; a fresh producer's init_transactions aborts the open
        transaction, and the caller publishes again (AbortableError)."""
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
            self._renew()
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
        while produce requests are in flight (confluentinc/librdkafka#4849; reproduced here in 1
        of 2 runs of 300 transactions of 1,000 records). Waiting for them first avoids it. Should
        the abort still fail fatally, this producer is finished: a fresh one under the same
        transactional.id is started, and its init_transactions aborts what was left open. A fence
        (another producer owns the id now) is not renewed: that one must keep the id.
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
            self._renew()
        finally:
            self.in_transaction = False

    def _renew(self) -> None:
        """A fresh producer for this transactional.id; init_transactions settles the old one's."""
        from confluent_kafka import Producer

        old, self.producer = self.producer, Producer(self._config)
        self.renewals += 1
        try:
            old.purge(in_queue=True, in_flight=False)
        except Exception:  # a fatal producer may refuse even that; it is dropped either way
            pass
        self.init()

    def close(self) -> None:
        """Abort what is open, then destroy the producer now. Its delivery callback (a bound
        method) is a reference cycle, so a dropped publisher used to keep its producer, the
        producer's threads and its broker connections until Python's next cyclic collection
        (measured: 5 closed publishers held 20 threads until gc.collect())."""
        try:
            self.abort()
        except Exception:
            pass
        try:
            self.producer.flush(5)
            self.producer.purge(in_queue=True, in_flight=True)   # what is left was never to be committed
            with warnings.catch_warnings():
                # close() tries an abort first; a fenced producer's fails, is said in a
                # RuntimeWarning and an exception, and the producer is destroyed all the same.
                warnings.simplefilter("ignore", RuntimeWarning)
                self.producer.close()
        except Exception:   # that exception
            pass

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
