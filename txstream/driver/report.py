"""What a finished batch reports: its plans, the tasks' result rows, its timings, and its line."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from txstream.constants import ACKED, COMMITTED, EMPTY
from txstream.task.spec import PartitionPlan


@dataclass
class BatchReport:
    batch_id: int
    plans: list[PartitionPlan]
    rows: list[dict]
    seconds: float
    # A wide batch's rows are per output unit, not per range: what was read from each input
    # partition, (records, undecodable records), comes separately.
    reads: dict[tuple[str, int], tuple[int, int]] | None = None
    # The driver's own time before Spark ran the batch: committed and end offsets, planning, and
    # building and checking the job's DataFrame (None: not measured).
    driver_s: float | None = None
    # A stateful batch's watermark (epoch ms; None: none).
    watermark_ms: int | None = None
    # Where its late rows went: the dead-letter topic, or None (dropped, as Spark drops them).
    dead_letter_topic: str | None = None
    # The version of each of the processor's tables it joined against (task/tables.py TableVersion).
    tables: tuple = ()

    @property
    def table_ends(self) -> dict[str, list[int]]:
        """Each table's version: its partitions' end offsets."""
        return {v.name: list(v.ends) for v in self.tables}

    @property
    def late(self) -> int:
        """Rows behind the watermark, over the units."""
        return sum(int(r.get("late") or 0) for r in self.rows)

    @property
    def statuses(self) -> dict[str, int]:
        """How many ranges ended how (committed, already-done, stale-plan, ...)."""
        return dict(Counter(row["status"] for row in self.rows))

    def total(self, column: str) -> int:
        return sum(int(r[column]) for r in self.rows)

    def line(self, lag: int | None = None) -> str:
        parts = [f"batch {self.batch_id}", f"partitions {len(self.plans)}",
                 f"in {self.total('records_in')}", f"out {self.total('records_out')}",
                 f"dead-lettered {self.total('dead_letters')}", f"{self.seconds:.2f}s"]
        # Max over the tasks: reading+decoding, encoding+producing, send_offsets+commit (or the
        # acknowledgements), init_transactions; then how long publishers waited for their input
        # (reading, the JVM hops and the transform together).
        timing = {k: max((float(r[k]) for r in self.rows), default=0.0)
                  for k in ("read_s", "upstream_s", "produce_s", "commit_s", "init_s")}
        parts.append("(read {read_s:.2f} produce {produce_s:.2f} commit {commit_s:.2f} init {init_s:.2f})"
                     .format(**timing))
        parts.append(f"upstream {timing['upstream_s']:.2f}")
        if self.driver_s is not None:
            parts.append(f"driver {self.driver_s:.2f}")
        # Empty: a wide unit the batch gave no rows, the usual case of a small batch.
        others = {s: n for s, n in self.statuses.items() if s not in (COMMITTED, ACKED, EMPTY)}
        if others:
            parts.append(" ".join(f"{s}={n}" for s, n in sorted(others.items())))
        late = self.late
        if late or self.watermark_ms is not None:
            parts.append(f"late {late}" + (f" ({late_destination(self.dead_letter_topic)})" if late else ""))
        if self.watermark_ms is not None:
            from datetime import datetime, timezone

            at = datetime.fromtimestamp(self.watermark_ms / 1000, tz=timezone.utc)
            parts.append(f"watermark {at.isoformat(timespec='seconds').replace('+00:00', 'Z')}")
        for version in self.tables:
            parts.append(f"table {version.name} at {'/'.join(map(str, version.ends))}")
        if lag is not None:
            parts.append(f"lag {lag}")
        return "  ".join(parts)


def late_destination(dead_letter_topic: str | None) -> str:
    """Where late rows go, in a batch line's and a summary's words."""
    return f"dead-lettered to {dead_letter_topic}" if dead_letter_topic else "dropped: no dead_letter_topic"
