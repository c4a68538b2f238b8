"""A stream joined to a table that changes while the stream runs (issue 61), as a real `txstream
run` subprocess killed at the wide protocol's dangerous points and restarted until a run exits 0.

Every order must come out exactly once, and every batch must have joined one version of the
table: the rows a batch published (its units commit one by one, so a crash can leave some units'
rows published and the rest to its re-run) all agree with one cut of the table's log. A re-run
that read the table anew, rather than the version its plan logged, breaks that.
"""
from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from confluent_kafka import Producer

from tests.chaos import harness as h
from tests.support.kafka import produce, read_all
from tests.support.running import App
from txstream.tools.verify import audit

pytestmark = pytest.mark.chaos
PARTITIONS = 3
CUSTOMERS = 20
PROCESSOR = "tests.support.table_processors:EnrichWide"
EXTRA = ["--output-units", "3", "-X", "consumer.session.timeout.ms=6000"]   # and --table customers=TOPIC


class TableWriter(threading.Thread):
    """Writes `c<k>` = `v<n>` into the table's one partition, n rising, until stopped; `log`
    is what it wrote, in offset order."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(name="table-writer", daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.stop_event = threading.Event()
        self.log: list[tuple[int, bytes, int]] = []   # (offset, key, n)

    def run(self) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "linger.ms": 5})
        n = CUSTOMERS
        while not self.stop_event.is_set():
            key = f"c{n % CUSTOMERS}".encode()
            producer.produce(self.topic, f"v{n}".encode(), key, partition=0,
                             on_delivery=lambda err, msg, key=key, n=n: err is None and self.log.append(
                                 (msg.offset(), key, n)))
            producer.poll(0)
            n += 1
            time.sleep(0.02)
        assert producer.flush(60) == 0

    def finish(self) -> None:
        self.stop_event.set()
        self.join(90)


def _current(log: list[tuple[int, bytes, int]]) -> dict[tuple[bytes, int], tuple[int, int]]:
    """Per (key, n): the offsets [from, to) of the table's log during which c<k> was v<n>."""
    spans: dict[tuple[bytes, int], tuple[int, int]] = {}
    last: dict[bytes, tuple[int, int]] = {}
    for offset, key, n in sorted(log):
        if key in last:
            spans[(key, last[key][1])] = (last[key][0], offset)
        last[key] = (offset, n)
    for key, (offset, n) in last.items():
        spans[(key, n)] = (offset, 1 << 62)
    return spans


@pytest.mark.timeout(1500)
def test_kills_while_the_table_changes_each_batch_joins_one_version(bootstrap_servers, make_topic) -> None:
    records = h.scale(6_000, 100_000)
    table = make_topic("tc-table", 1, **{"cleanup.policy": "compact"})
    source, sink = make_topic("tc-in", PARTITIONS), make_topic("tc-out", 3)
    produce(bootstrap_servers, table, [(f"c{k}".encode(), f"v{k}".encode()) for k in range(CUSTOMERS)],
            partition=0)
    orders = [(f"c{i % CUSTOMERS}".encode(), f"o{i}".encode()) for i in range(records)]
    produce(bootstrap_servers, source, orders)
    writer = TableWriter(bootstrap_servers, table)
    faults = "driver.after_plan_log=kill@2,publish.after_commit=kill@4,driver.before_close=kill@7"
    app = App(bootstrap_servers, source, sink, PARTITIONS, processor=PROCESSOR, cap=h.scale(300, 3_000),
              extra=[*EXTRA, "--table", f"customers={table}"], faults=faults)
    try:
        writer.log.extend((k, f"c{k}".encode(), k) for k in range(CUSTOMERS))   # offsets 0..CUSTOMERS-1
        writer.start()
        codes = app.until_done(6)
        writer.finish()
        assert codes.count(0) == 1 and len(codes) >= 4, f"exit codes {codes}: not every kill fired"
        replays = [m for m in app.events().messages() if "re-running its logged plan" in m]
        assert replays, app.log_text()[-3000:]
        out = read_all(bootstrap_servers, sink, timeout=300)
        got = Counter(r.value.split(b"=")[0] for r in out)
        assert got == Counter(v for _, v in orders), "an order missing or published twice"
        spans = _current(writer.log)
        by_batch: dict[bytes, list[tuple[int, int]]] = {}
        for r in out:
            name = r.value.split(b"=")[1]
            assert name.startswith(b"v"), r.value
            span = spans[(r.key, int(name[1:]))]
            by_batch.setdefault(r.headers["txstream.batch"], []).append(span)
        torn = {b: s for b, s in by_batch.items() if max(f for f, _ in s) >= min(t for _, t in s)}
        assert not torn, f"batches whose rows joined different versions of the table: {sorted(torn)[:5]}"
        report = audit(bootstrap_servers, source, sink, app_id=app.app_id)
        assert report.clean, report.table()
        print(f"table crashes: {records} orders, {len(writer.log)} table writes, exits {codes}, "
              f"{len(by_batch)} batches, {len(replays)} re-runs", flush=True)
        app.passed()
    finally:
        writer.finish()
        app.destroy_all()
