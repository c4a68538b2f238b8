"""Spark Structured Streaming itself as the reference (issue 60): a query run by Spark's own
engine over the same rows and the same batch cuts as txstream.

The cuts are parquet files (one per micro-batch: `maxFilesPerTrigger=1`, files ordered by their
modification time, which the file source sorts by); parquet keeps what JSON would not (binary,
decimals, NaN, microseconds). `foreachBatch` records what every batch emits, no-data batches
(the ones Spark runs to close windows) included; `processAllAvailable()` runs them all.

Which input rows Spark dropped as late: Spark reports only counts (`numRowsDroppedByWatermark`,
of partial aggregates for an aggregation), so the rows are derived from each batch's watermark by
Spark's own predicate (WatermarkSupport: the state's event time <= the previous batch's
watermark), per kind: `Late`. The counts check the derivation where they count rows
(deduplication).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq

# Spark's kinds of stateful operator, as txstream names them (state/operator.py).
AGGREGATE, WINDOW, SESSION, DEDUP, JOIN = "aggregate", "window", "session", "dedup", "join"


@dataclass
class Batch:
    """One micro-batch: what it emitted (Arrow rows as dicts), its watermark, its input rows."""

    batch_id: int
    rows: list[dict]
    watermark_ms: int | None
    input_rows: int
    dropped: int = 0                  # Spark's numRowsDroppedByWatermark (every stateful operator)
    cut: int | None = None            # the cut it read (None: a no-data batch)
    late_ids: set[int] = field(default_factory=set)


@dataclass
class Late:
    """Spark's late predicate for a kind (WatermarkSupport.watermarkExpression): the state a row
    would update is already closed. µs against the watermark's ms, as Spark compares them."""

    kind: str
    event: str | None = None          # the event-time column
    size_us: int = 0                  # window
    slide_us: int = 0
    gap_us: int = 0                   # session
    keep: Any = None                  # the query's own filter before the operator: rows it removes are never late

    def is_late(self, row: dict, watermark_ms: int | None) -> bool:
        if self.event is None or watermark_ms is None or self.kind == AGGREGATE:
            return False
        if self.keep is not None and not self.keep(row):
            return False
        ts = row.get(self.event)
        if ts is None:
            return False   # null <= w is null: Spark's predicate keeps the row
        us, w = _micros(ts), watermark_ms * 1000
        if self.kind == WINDOW:   # the last window holding it ends at floor(ts / slide) * slide + size
            return (us // self.slide_us) * self.slide_us + self.size_us <= w
        if self.kind == SESSION:  # a row's own session ends at ts + gap
            return us + self.gap_us <= w
        return us <= w            # deduplication, a join's side: the row's event time


def _micros(ts: datetime) -> int:
    epoch = datetime(1970, 1, 1, tzinfo=ts.tzinfo)
    delta = ts - epoch
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _watermark_ms(progress: dict) -> int | None:
    text = (progress.get("eventTime") or {}).get("watermark")
    if not text:
        return None
    return _micros(datetime.fromisoformat(text.replace("Z", "+00:00"))) // 1000


_lock = threading.Lock()


def run_spark(spark: Any, query: Callable[[Any], Any], mode: str, cuts: list[pa.Table], late: Late | None,
              timeout_s: float = 120.0, reads: int = 1) -> list[Batch]:
    """Every micro-batch Spark runs for `query` over `cuts` (one batch per cut, and the no-data
    batches between), in order. `reads`: how often the query reads its source (a join of the
    stream with itself reads it once per side, and Spark counts each read's rows)."""
    root = tempfile.mkdtemp(prefix="txs-oracle-")
    source, checkpoint = os.path.join(root, "in"), os.path.join(root, "chk")
    os.makedirs(source)
    now = time.time() - 10 * len(cuts) - 100
    for i, cut in enumerate(cuts):
        path = os.path.join(source, f"cut-{i:04d}.parquet")
        pq.write_table(cut, path)
        os.utime(path, (now + 10 * i, now + 10 * i))   # the file source orders the files by this
    emitted: dict[int, list[dict]] = {}

    def collect(frame: Any, batch_id: int) -> None:
        emitted[batch_id] = frame.toArrow().to_pylist()

    schema = _spark_schema(cuts[0].schema)
    stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(source)
    name = f"oracle_{uuid.uuid4().hex[:8]}"
    with _lock:
        handle = (query(stream).writeStream.outputMode(mode).foreachBatch(collect)
                  .option("checkpointLocation", checkpoint).queryName(name).start())
    try:
        handle.processAllAvailable()
        progress = list(handle.recentProgress)
        error = handle.exception()
    finally:
        handle.stop()
        shutil.rmtree(root, ignore_errors=True)
    if error is not None:
        raise RuntimeError(f"Spark's query failed: {error}")
    batches, cut = [], 0
    for p in progress:
        if p["batchId"] in {b.batch_id for b in batches}:
            continue
        inputs = int(p.get("numInputRows") or 0)
        b = Batch(p["batchId"], emitted.get(p["batchId"], []), _watermark_ms(p), inputs,
                  sum(int(op.get("numRowsDroppedByWatermark") or 0) for op in p.get("stateOperators") or []))
        if inputs:
            if inputs not in (cuts[cut].num_rows, cuts[cut].num_rows * reads):   # a reused read counts once
                raise AssertionError(f"Spark's batch {b.batch_id} read {inputs} rows, cut {cut} has {cuts[cut].num_rows}")
            b.cut = cut
            if late is not None:
                # Spark (3.4 on) filters late rows by the previous batch's watermark
                # (eventTimeWatermarkForLateEvents) and evicts by the current one's.
                before = batches[-1].watermark_ms if batches else None
                b.late_ids = {r["id"] for r in cuts[cut].to_pylist() if late.is_late(r, before)}
            cut += 1
        batches.append(b)
    if cut != len(cuts):
        raise AssertionError(f"Spark ran {cut} batches with data for {len(cuts)} cuts: {progress}")
    for b in batches:
        if late is not None and late.kind in (DEDUP, JOIN) and b.cut is not None and b.dropped != len(b.late_ids):
            raise AssertionError(f"batch {b.batch_id}: Spark dropped {b.dropped} rows, the late rule says "
                                 f"{sorted(b.late_ids)}")
        if late is not None and b.late_ids and not b.dropped and late.kind in (WINDOW, SESSION):
            # Spark counts the partial aggregates it drops: a late row leaves at least one.
            raise AssertionError(f"batch {b.batch_id}: Spark dropped nothing, the late rule says {sorted(b.late_ids)}")
        if late is not None and bool(b.dropped) != bool(b.late_ids) and late.kind == AGGREGATE:
            raise AssertionError(f"batch {b.batch_id}: Spark dropped {b.dropped} rows, the late rule says "
                                 f"{sorted(b.late_ids)}")
    return batches


def _spark_schema(schema: pa.Schema) -> Any:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)
