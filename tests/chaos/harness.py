"""The chaos suite's own machinery: a feeder, a read_committed checker thread, and the
exactly-once verdict (output multiset == input, audit clean). Running, waiting, seeding and
committed offsets are the tests' shared helpers (tests/support/).
"""
from __future__ import annotations

import os
import random
import threading
import time
import uuid
from collections import Counter

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from tests.support.running import App, Run
from tests.support.seeding import numbered, seed_numbered
from txstream.kafka import headers as hdr
from txstream.tools.topic_io import end_offsets as topic_io_end_offsets

SOAK = os.environ.get("TXSTREAM_SOAK", "") not in ("", "0")


def scale(ci: int, soak: int) -> int:
    return soak if SOAK else ci


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """Each partition's last stable offset (the Kafka layer's listing, via tools/topic_io)."""
    ends = topic_io_end_offsets(bootstrap, topic, "read_committed")
    return {p: ends[p][1] for p in range(partitions)}


# ---------------------------------------------------------------------------------------------
# Input
# ---------------------------------------------------------------------------------------------

def top_up(app: App, seeded: int, ahead: int) -> Counter:
    """Seed more records (numbered on from `seeded`) so that at least `ahead` lie beyond the app's
    committed offsets: a kill loop then always finds a run mid-input, however fast runs become.
    Returns the added (key, value) multiset (empty when enough input is left)."""
    missing = ahead - (seeded - app.baseline())
    if missing <= 0:
        return Counter()
    return seed_numbered(app.bootstrap, app.input, app.partitions, missing, first=seeded)


class Feeder(threading.Thread):
    """Keeps producing records (idempotent producer) at `rate` per second until stopped."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: float, first: int,
                 limit: int | None = None) -> None:
        super().__init__(name="feeder", daemon=True)
        self.bootstrap, self.topic, self.partitions, self.rate = bootstrap, topic, partitions, rate
        self.next = first
        self.last = first + limit if limit is not None else None  # at most `limit` records
        self.first = first
        self.stop_event = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True,
                             "linger.ms": 10, "acks": "all", "message.timeout.ms": 300_000,
                             "log_level": 0,
                             "error_cb": lambda err: None})
        began = time.monotonic()
        while not self.stop_event.is_set():
            due = self.first + int((time.monotonic() - began) * self.rate)
            if self.last is not None:
                due = min(due, self.last)
            while self.next < due and not self.stop_event.is_set():
                key, value = numbered(self.next)
                try:
                    producer.produce(self.topic, value, key, partition=self.next % self.partitions,
                                     on_delivery=self._delivered)
                    self.next += 1
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0.05)
        remaining = producer.flush(300)
        if remaining:
            self.errors.append(f"{remaining} records not delivered")

    def _delivered(self, err, _msg) -> None:
        if err is not None:
            self.errors.append(str(err))

    def finish(self) -> None:
        self.stop_event.set()
        self.join(330)
        assert not self.is_alive(), "the feeder did not finish"


# ---------------------------------------------------------------------------------------------
# The read_committed checker
# ---------------------------------------------------------------------------------------------

class Checker(threading.Thread):
    """Consumes the output with read_committed while the chaos happens.

    Every record must name its source and its publication (txstream.lineage); a source offset
    seen from two publications (or twice from one) is a duplicate, recorded as it happens."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        super().__init__(name="checker", daemon=True)
        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions
        self.stop_event = threading.Event()
        self.sources: dict[tuple[str, int, int], str] = {}
        self.pairs: Counter = Counter()
        self.duplicates: list[tuple] = []
        self.without_lineage = 0
        self.records = 0
        self.error: BaseException | None = None
        self.lock = threading.Lock()

    def run(self) -> None:
        try:
            consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"checker-{uuid.uuid4().hex}",
                                 "isolation.level": "read_committed", "enable.auto.commit": False,
                                 "auto.offset.reset": "earliest", "log_level": 0})
            consumer.assign([TopicPartition(self.topic, p, -2) for p in range(self.partitions)])
            try:
                while not self.stop_event.is_set():
                    for msg in consumer.consume(2000, 0.2):
                        if msg.error():
                            if msg.error().code() != KafkaError._PARTITION_EOF:
                                continue  # transient (a broker bouncing): keep consuming
                            continue
                        self._check(msg)
                self.position = {tp.partition: tp.offset for tp in
                                 consumer.position([TopicPartition(self.topic, p) for p in range(self.partitions)])}
            finally:
                consumer.close()
        except BaseException as exc:  # reported by finish()
            self.error = exc

    def _check(self, msg) -> None:
        headers = msg.headers() or []
        lineage = hdr.lineage_of(headers)
        source = lineage.source if lineage is not None else None
        publication = lineage.publication if lineage is not None else None
        with self.lock:
            self.records += 1
            self.pairs[(msg.key(), msg.value())] += 1
            if source is None or publication is None:
                self.without_lineage += 1
                return
            seen = self.sources.get(source)
            if seen is not None:
                self.duplicates.append((source, seen, publication.decode(), msg.partition(), msg.offset()))
            else:
                self.sources[source] = publication.decode()

    def drain(self, timeout: float = 120) -> None:
        """Read until the output's last stable offsets as they are now, then stop."""
        ends = end_offsets(self.bootstrap, self.topic, self.partitions)
        total = sum(ends.values())
        deadline = time.monotonic() + timeout
        # Offsets include control records: wait for the count of data records to stop growing
        # and the checker to have had time to pass the end (positions are checked at stop).
        last, steady = -1, 0
        while time.monotonic() < deadline:
            with self.lock:
                now = self.records
            steady = steady + 1 if now == last else 0
            last = now
            if steady >= 10:
                break
            time.sleep(0.3)
        self.stop_event.set()
        self.join(60)
        if self.error is not None:
            raise self.error
        behind = {p: (self.position.get(p, 0), ends[p]) for p in ends if self.position.get(p, 0) < ends[p]}
        assert not behind, f"the checker stopped before the output's end (position, end): {behind}; total {total}"


# ---------------------------------------------------------------------------------------------
# The verdict
# ---------------------------------------------------------------------------------------------

def read_pairs(bootstrap: str, topic: str) -> tuple[Counter, list]:
    from tests.support.kafka import read_all

    records = read_all(bootstrap, topic, timeout=300)
    return Counter((r.key, r.value) for r in records), records


def verdict(name: str, bootstrap: str, app: App, expected: Counter, checker: Checker | None = None,
            dead_letter: str | None = None, extra: str = "") -> dict:
    """Assert exactly-once: output multiset == input, audit clean, checker saw no duplicate.
    Prints one line: records in / out / dead-lettered / duplicates / missing."""
    from txstream.tools.verify import audit

    got, records = read_pairs(bootstrap, app.output)
    missing = sum((expected - got).values())
    extra_records = sum((got - expected).values())
    report = audit(bootstrap, app.input, app.output, dead_letter=dead_letter, app_id=app.app_id,
                   one_to_one=True, timeout=60)
    totals = report.totals
    checker_dups = len(checker.duplicates) if checker else 0
    duplicates = max(extra_records, totals["duplicates"], checker_dups)
    figures = {"in": sum(expected.values()), "out": len(records), "dead_lettered": totals["dead_lettered"],
               "duplicates": duplicates, "missing": max(missing, totals["gaps"]),
               "checker_seen": checker.records if checker else None}
    print(f"\n[{name}] records in {figures['in']}  out {figures['out']}  dead-lettered "
          f"{figures['dead_lettered']}  duplicates {figures['duplicates']}  missing {figures['missing']}"
          + (f"  checker saw {checker.records} (duplicates {checker_dups})" if checker else "")
          + (f"  {extra}" if extra else ""), flush=True)
    problems = []
    if missing or extra_records:
        sample_missing = list((expected - got).items())[:5]
        sample_extra = list((got - expected).items())[:5]
        problems.append(f"output != input: {missing} missing (e.g. {sample_missing}), {extra_records} extra "
                        f"(e.g. {sample_extra})")
    if not report.clean:
        problems.append("audit not clean:\n" + report.table())
    if totals["consumed"] != sum(expected.values()):
        problems.append(f"audit consumed {totals['consumed']} != {sum(expected.values())} input records "
                        "(the app's committed offsets do not cover the input)\n" + report.table())
    if checker is not None:
        if checker.duplicates:
            problems.append(f"the read_committed checker saw {len(checker.duplicates)} duplicate source offsets "
                            f"from two publications, e.g. {checker.duplicates[:5]}")
        if checker.without_lineage:
            problems.append(f"{checker.without_lineage} output records without lineage/publication headers")
        if checker.pairs != got:
            problems.append("the checker's view differs from a read_committed read after the run: "
                            f"{sum((got - checker.pairs).values())} not seen, "
                            f"{sum((checker.pairs - got).values())} extra")
    if not problems:
        app.passed()
    assert not problems, f"[{name}] exactly-once violated:\n" + "\n".join(problems) + \
        "\n--- txstream run log (tail) ---\n" + "\n".join(app.log_text().splitlines()[-60:])
    return figures


def stop_run(run: Run, action: str, rng: random.Random) -> None:
    """End a run as a bounce plan says: "kill" = SIGKILL of its whole session at a random moment
    (at once or within 3 s), "term" = SIGTERM within 2 s, which must end it cleanly."""
    if action == "kill":
        time.sleep(rng.choice([0.0, rng.uniform(0.0, 3.0)]))
        run.kill9()
    else:
        time.sleep(rng.uniform(0.0, 2.0))
        code = run.terminate()
        assert code == 0, f"SIGTERM: txstream run exited {code}\n{run.tail()}"
        assert run.events().of("stopped"), run.tail()


def random_delay(rng: random.Random, low: float, high: float) -> float:
    return rng.uniform(low, high)
