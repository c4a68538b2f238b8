"""The plan log of wide batches (docs/wide-transforms.md §1), kept in the app group's own offsets.

Each input partition's committed offset carries, in its commit metadata, that partition's share
of the newest plan: `txs1;b=<batch>;e=<end>;k=<units>;t=<batch time, ms>`. The committed offset
is where the batch starts; `e` is where it ends. A share with `e` beyond the committed offset is
*pending*: batch `b` was planned (durably, before any of it ran) and is not closed, so a driver
that starts runs exactly that range again, never a new one. Closing the batch commits `e` with
`e` again in the metadata (nothing pending). Kafka's `offset.metadata.max.bytes` (4,096 by default)
is per partition, and a share is ~40 bytes: the log grows with the partitions, never past the cap.

Written only by the driver's transactional producer (driver/wide.py) under the member's group
metadata, so a driver that another instance replaced cannot write it.
"""
from __future__ import annotations

from dataclasses import dataclass

VERSION = "txs1"


@dataclass(frozen=True)
class PlanShare:
    """One input partition's share of a wide batch's plan."""

    batch_id: int
    end: int
    units: int
    timestamp_ms: int
    watermark_ms: int | None = None   # a stateful batch's watermark (docs/state.md): the same on a re-run

    def encode(self) -> str:
        text = f"{VERSION};b={self.batch_id};e={self.end};k={self.units};t={self.timestamp_ms}"
        return text if self.watermark_ms is None else f"{text};w={self.watermark_ms}"

    @staticmethod
    def decode(text: str | None) -> PlanShare | None:
        """The share in a commit's metadata; None for metadata txstream did not write (a narrow
        run's, `txstream offsets reset`'s, another tool's)."""
        if not text or not text.startswith(VERSION + ";"):
            return None
        try:
            fields = dict(part.split("=", 1) for part in text.split(";")[1:])
            return PlanShare(int(fields["b"]), int(fields["e"]), int(fields["k"]), int(fields["t"]),
                             int(fields["w"]) if "w" in fields else None)
        except (KeyError, ValueError):
            return None


@dataclass(frozen=True)
class LoggedPartition:
    """What the log says of one input partition: its committed offset and its plan share."""

    committed: int | None
    share: PlanShare | None

    @property
    def pending(self) -> bool:
        return (self.share is not None and self.committed is not None and self.share.end > self.committed)


@dataclass(frozen=True)
class PendingBatch:
    """A logged batch that is not closed: its id, units, time and the range of every partition."""

    batch_id: int
    units: int
    timestamp_ms: int
    ranges: dict[tuple[str, int], tuple[int, int]]   # (topic, partition) -> [start, end)
    watermark_ms: int | None = None


def pending_batch(log: dict[tuple[str, int], LoggedPartition]) -> PendingBatch | None:
    """The batch the log says must run again, if any.

    One transaction logs a plan's shares for all its partitions, so the pending shares agree on
    the batch; a partition without a share of that batch takes part with an empty range."""
    pending = [entry for entry in log.values() if entry.pending]
    if not pending:
        return None
    newest = max(entry.share.batch_id for entry in pending)  # type: ignore[union-attr]
    first = next(e.share for e in pending if e.share.batch_id == newest)  # type: ignore[union-attr]
    ranges = {}
    for key, entry in log.items():
        if entry.committed is None:
            continue
        in_batch = entry.share is not None and entry.share.batch_id == newest
        ranges[key] = (entry.committed, entry.share.end if in_batch else entry.committed)  # type: ignore[union-attr]
    return PendingBatch(newest, first.units, first.timestamp_ms, ranges, first.watermark_ms)


def last_batch_id(log: dict[tuple[str, int], LoggedPartition]) -> int:
    """The highest batch id the log mentions (0 when it mentions none)."""
    return max((e.share.batch_id for e in log.values() if e.share is not None), default=0)


def last_watermark(log: dict[tuple[str, int], LoggedPartition]) -> int | None:
    """The newest watermark the log mentions (None: no stateful batch logged one)."""
    return max((e.share.watermark_ms for e in log.values() if e.share is not None and e.share.watermark_ms is not None),
               default=None)
