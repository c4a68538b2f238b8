"""`python -m benchmarks --sweep batch|partitions|record-size`: one parameter, side by side.

- batch: records per batch. txstream exactly-once and at-least-once with
  `--max-records-per-partition` N (`--batch-sizes`, default 1000, 5000, 20000, 100000): one
  transaction per input partition per batch, so N records per transaction, N x partitions per
  batch. The hand-written loop commits every N x partitions records (the same records per offset
  commit as one txstream batch; its one transaction spans every partition), with the commit
  interval out of the way. Each point reads at least `--sweep-batches` batches of its size
  (default 5; `--records` when that is more, `--max-input-mb` the cap), so that every point has
  batches after the first to measure. Points of equal input share a topic.
- partitions: 4, 16, 64, 256 (`--partition-counts`); txstream exactly-once, Kafka Streams
  (exactly_once_v2, the reference for partitions scaling: KIP-447) and the hand-written loop,
  each point on its own input topic with that many partitions (output topics too). txstream's
  batches hold `--batch-records` at every point (default 25,000: `--max-records-per-partition`
  that / partitions), ten of them by default: the batch median is a steady batch's time, compared
  across points (a fresh topic's first transaction to many partitions takes seconds, paid once
  per topic and producer).
- record-size: order values of about 100 B, 1 KB, 10 KB (`--value-sizes`; the optional `note` is
  padded, the enriched output is the same size at every point); txstream exactly-once,
  at-least-once and the hand-written loop. A point whose input would exceed `--max-input-mb`
  gets fewer records (recorded in the point's `input`). txstream's batches hold a
  `--sweep-batches`th of each point's records (`--max-records-per-partition` that / partitions),
  so that every point has several batches after the small first one.

`--records` (default 100000), `--partitions` (default 4; not for the partitions sweep) and
`--runs` (default 1) apply to every point; `--contenders` replaces the sweep's own list.
"""
from __future__ import annotations

from benchmarks.contenders import Contender
from benchmarks.contenders.handwritten import HandWrittenLoop
from benchmarks.contenders.registry import all_contenders
from benchmarks.contenders.txstream_engine import TxStream

DEFAULTS = {
    "batch": ["txstream-exactly-once", "txstream-at-least-once", "handwritten"],
    "partitions": ["txstream-exactly-once", "txstream-exactly-once-nolineage", "kafka-streams", "handwritten"],
    "record-size": ["txstream-exactly-once", "txstream-at-least-once", "handwritten"],
}
PARAMETER = {
    "batch": "records per batch (txstream --max-records-per-partition)",
    "partitions": "partitions",
    "record-size": "order value bytes",
}
APPROX_ORDER_BYTES = 145   # an order record of ~100 B value, its key and a little (for --max-input-mb)
COUNT_ONLY_INTERVAL_MS = 3_600_000  # the hand-written loop's commit interval when the count decides


def variant(name: str, kind: str, value: int, partitions: int, batch_records: int = 0) -> Contender:
    """The contender `name` set up for one point of the sweep (`batch_records`: txstream's records
    per batch, for the partitions and record-size sweeps)."""
    base = {c.name: c for c in all_contenders()}[name]
    if kind in ("batch", "partitions", "record-size") and isinstance(base, TxStream):
        per_partition = value if kind == "batch" else -(-batch_records // partitions)
        return TxStream(base.guarantee, processor=base.processor, name=base.name, label=base.label,
                        max_records_per_partition=per_partition, extra_args=base.extra_args,
                        baseline=base.baseline)
    if kind == "batch" and isinstance(base, HandWrittenLoop):
        return HandWrittenLoop(max_batch=value * partitions, commit_interval_ms=COUNT_ONLY_INTERVAL_MS)
    return base


def points(args) -> list[dict]:
    kind = args.sweep
    if kind == "batch":
        cap = max(1000, int(args.max_input_mb * 1e6 // APPROX_ORDER_BYTES))
        return [{"value": v, "label": f"{v:,}", "partitions": args.partitions,
                 "records": min(cap, max(args.records, args.sweep_batches * v * args.partitions)),
                 "value_size": None, "shared_input": True} for v in args.batch_sizes]
    if kind == "partitions":
        return [{"value": v, "label": str(v), "partitions": v, "records": args.records, "value_size": None}
                for v in args.partition_counts]
    out = []
    for v in args.value_sizes:
        approx = v + APPROX_ORDER_BYTES - 100  # value + key (about 33 B) + a little
        cap = int(args.max_input_mb * 1e6 // approx)
        records = min(args.records, max(1000, cap))
        out.append({"value": v, "label": f"{v:,} B", "partitions": args.partitions, "records": records,
                    "value_size": v, "batch_records": -(-records // args.sweep_batches)})
    return out
