"""A table that changes while a stream is joined to it, and the check that every batch joined one
version of it (tests/chaos/test_table_crashes.py, tests/cluster): `c<k>` = `v<n>`, n rising, in
the table's one partition; an output value `o<i>=v<n>` names the version its row joined."""
from __future__ import annotations

import threading
import time

from confluent_kafka import Producer


class TableWriter(threading.Thread):
    """Writes `c<k>` = `v<k>` for every customer at once, then `c<k>` = `v<n>` with n rising
    every 20 ms once started, until finished; `log` is what it wrote: (offset, key, n)."""

    def __init__(self, bootstrap: str, topic: str, customers: int = 20) -> None:
        super().__init__(name="table-writer", daemon=True)
        self.bootstrap, self.topic, self.customers = bootstrap, topic, customers
        self.stop_event = threading.Event()
        self.log: list[tuple[int, bytes, int]] = []
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
        for k in range(customers):
            self._write(k)
        assert self.producer.flush(60) == 0

    def _write(self, n: int) -> None:
        key = f"c{n % self.customers}".encode()
        self.producer.produce(self.topic, f"v{n}".encode(), key, partition=0,
                              on_delivery=lambda err, msg: err is None and self.log.append((msg.offset(), key, n)))

    def run(self) -> None:
        n = self.customers
        while not self.stop_event.is_set():
            self._write(n)
            self.producer.poll(0)
            n += 1
            time.sleep(0.02)
        assert self.producer.flush(60) == 0

    def finish(self) -> None:
        self.stop_event.set()
        if self.is_alive():
            self.join(90)


def _spans(log: list[tuple[int, bytes, int]]) -> dict[tuple[bytes, int], tuple[int, int]]:
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


def versions_by_batch(out: list, log: list[tuple[int, bytes, int]]) -> tuple[dict, dict]:
    """(each batch's rows' spans, the batches whose rows no single cut of the table explains):
    a version ending at offset V gives c<k> the value written last before V, so one batch's rows
    must have spans that all hold a common V."""
    spans = _spans(log)
    by_batch: dict[bytes, list[tuple[int, int]]] = {}
    for r in out:
        name = r.value.split(b"=")[1]
        assert name.startswith(b"v"), r.value
        by_batch.setdefault(r.headers["txstream.batch"], []).append(spans[(r.key, int(name[1:]))])
    torn = {b: s for b, s in by_batch.items() if max(f for f, _ in s) >= min(t for _, t in s)}
    return by_batch, torn
