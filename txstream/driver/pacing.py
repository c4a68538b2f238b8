"""How many records a batch may read: the cap per partition, learned from the tasks' rates, and
the run's first batch kept small so the first output comes soon after the start."""
from __future__ import annotations

from typing import Callable

from txstream.constants import ACKED, COMMITTED


class Pacing:
    def __init__(self, max_records_per_partition: int, transaction_timeout_s: float,
                 first_batch_records: int | None, echo: Callable[[str], None]) -> None:
        self.max_records_per_partition = max_records_per_partition
        self.transaction_timeout_s = transaction_timeout_s
        self.echo = echo
        self.rate: float | None = None   # records/s per partition, measured
        # Records the run's first batch may read in all (None: the cap alone, from the second on).
        self.first_batch_budget: int | None = first_batch_records or None
        self._warned = False

    def learn(self, rows: list[dict]) -> None:
        """A finished narrow batch's rows: each busy range's records per second, smoothed."""
        for row in rows:
            busy = float(row["read_s"]) + float(row["produce_s"]) + float(row["commit_s"])
            if row["status"] in (COMMITTED, ACKED) and int(row["records_in"]) > 1000 and busy > 0:
                rate = int(row["records_in"]) / busy
                self.rate = rate if self.rate is None else 0.7 * self.rate + 0.3 * rate

    def cap(self, partitions: int) -> int:
        """Records per partition per batch: in the run's first batch, its share of
        first_batch_records; always so that a transaction stays well inside its timeout."""
        cap = self.max_records_per_partition
        if self.first_batch_budget is not None:
            cap = min(cap, max(1, self.first_batch_budget // max(1, partitions)))
        if self.rate is None:
            return cap
        safe = max(1000, int(self.rate * self.transaction_timeout_s / 3))
        if safe < cap and not self._warned:
            self._warned = True
            self.echo(f"note: {cap} records per partition would take ~{cap / self.rate:.0f}s at the measured "
                      f"{self.rate:.0f} records/s, too close to transaction.timeout.ms="
                      f"{self.transaction_timeout_s * 1000:.0f}; batches are capped at {safe}")
        return min(cap, safe)

    def first_batch_done(self) -> None:
        """After the run's first batch: batches as big as the cap allows. One small batch, then
        full ones: a ramp over several batches would cost batches and records/s over a backlog."""
        self.first_batch_budget = None
