"""What a txstream run's log says about its batches.

`txstream run` prints one line per batch (BatchReport.line):

    batch 3  partitions 4  in 20000  out 20000  dead-lettered 0  4.52s  (read 0.79 produce 0.33 commit 0.12 init 0.16)  upstream 0.90  lag 20000

seconds = the whole batch (driver planning + Spark job); read / produce / commit / init are the
maximum over the batch's tasks of reading and decoding, encoding and producing, send_offsets +
commit (or waiting for acknowledgements), and init_transactions (0 when the task reused a cached
producer); upstream is the publisher's wait for its input (reading, the JVM hops and the
transform together); driver is the driver's own time before the Spark job: offsets, planning,
building and checking the job's DataFrame. Lines without upstream or driver are read too, so
that older result files can be re-summarised.

The per-batch line only has the maximum over tasks, so the benchmark starts txstream through
`benchmarks/contenders/txstream_run.py`, which adds one line per batch with every task's
figures (from the same rows the driver summarises):

    bench-tasks batch 3  init 0.00,0.16,0.00,0.00  read ...  upstream ...  produce ...  commit ...  in ...

With those lines, the count of tasks that paid init_transactions and its median are per task;
without them (an older or plain `txstream run` log) they fall back to per-batch maxima.
"""  # noqa: E501 - a batch line quoted whole
from __future__ import annotations

import re
import statistics

BATCH = re.compile(
    r"^\s*batch (?P<batch>\d+)\s+partitions (?P<partitions>\d+)\s+in (?P<in>\d+)\s+out (?P<out>\d+)\s+"
    r"dead-lettered (?P<dead>\d+)\s+(?P<seconds>[\d.]+)s\s+\(read (?P<read>[\d.]+) produce (?P<produce>[\d.]+) "
    r"commit (?P<commit>[\d.]+) init (?P<init>[\d.]+)\)(?P<rest>.*)$")
TASKS = re.compile(r"^\s*bench-tasks batch (?P<batch>\d+)\s+(?P<rest>.*)$")
FAILED = re.compile(r"^\s*batch \d+ failed")
SPLIT = ("read", "upstream", "produce", "commit", "init", "driver")


def parse(text: str) -> dict:
    """Batches (dicts of the line's figures, plus `tasks` when the wrapper printed them)."""
    batches: list[dict] = []
    pending_tasks: dict[int, dict] = {}
    failed = 0
    for line in text.splitlines():
        m = TASKS.match(line)
        if m:
            fields = {}
            for part in re.split(r"\s{2,}", m.group("rest").strip()):
                name, _, values = part.partition(" ")
                try:
                    fields[name] = [float(v) for v in values.split(",") if v]
                except ValueError:
                    continue
            pending_tasks[int(m.group("batch"))] = fields
            continue
        m = BATCH.match(line)
        if m:
            b = {"batch": int(m.group("batch")), "partitions": int(m.group("partitions")),
                 "records_in": int(m.group("in")), "records_out": int(m.group("out")),
                 "dead_lettered": int(m.group("dead")), "seconds": float(m.group("seconds")),
                 "read_s": float(m.group("read")), "produce_s": float(m.group("produce")),
                 "commit_s": float(m.group("commit")), "init_s": float(m.group("init"))}
            rest = m.group("rest").strip()
            lag = re.search(r"lag (\d+)", rest)
            if lag:
                b["lag"] = int(lag.group(1))
            upstream = re.search(r"upstream ([\d.]+)", rest)
            if upstream:
                b["upstream_s"] = float(upstream.group(1))
            driver = re.search(r"driver ([\d.]+)", rest)
            if driver:
                b["driver_s"] = float(driver.group(1))
            others = re.sub(r"\s*(lag|upstream|driver) [\d.]+", "", rest).strip()
            if others:
                b["statuses"] = others
            tasks = pending_tasks.pop(b["batch"], None)
            if tasks:
                b["tasks"] = tasks
            batches.append(b)
            continue
        if FAILED.match(line):
            failed += 1
    return {"batches": batches, "failed_attempts": failed}


def _med(values: list[float]):
    return statistics.median(values) if values else None


def summarize(text: str) -> dict | None:
    """Per-run figures from the log; None when it has no batch line (not a txstream log)."""
    parsed = parse(text)
    batches = parsed["batches"]
    if not batches:
        return None
    seconds = [b["seconds"] for b in batches]
    total_in = sum(b["records_in"] for b in batches)
    out: dict = {
        "batches": len(batches),
        "failed_attempts": parsed["failed_attempts"],
        "records_in": total_in,
        "records_out": sum(b["records_out"] for b in batches),
        "records_per_batch_median": _med([b["records_in"] for b in batches]),
        "batch_s_median": _med(seconds),
        "batch_s_max": max(seconds),
        "batch_s_sum": sum(seconds),
        # Records / time spent inside batches: txstream's rate without the Spark session's start-up.
        "in_batch_records_per_s": total_in / sum(seconds) if sum(seconds) > 0 else None,
        # The same without the first batch, which also pays what a run pays once: building the
        # Spark job, starting Python workers, and under exactly-once fencing every id of each slot.
        "later_in_batch_records_per_s": (sum(b["records_in"] for b in batches[1:]) / sum(seconds[1:])
                                         if len(batches) > 1 and sum(seconds[1:]) > 0 else None),
        # Median over batches of the per-batch maxima the line shows.
        "split_median": {k: _med([b[f"{k}_s"] for b in batches if f"{k}_s" in b]) for k in SPLIT},
        "split_max": {k: max((b[f"{k}_s"] for b in batches if f"{k}_s" in b), default=None) for k in SPLIT},
        "batches_with_init": sum(1 for b in batches if b["init_s"] > 0),
        "first_batch_s": batches[0]["seconds"],
    }
    paid = [b["init_s"] for b in batches if b["init_s"] > 0]
    if all("tasks" in b and b["tasks"].get("init") is not None for b in batches):
        inits = [x for b in batches for x in b["tasks"]["init"]]
        paid_tasks = [x for x in inits if x > 0]
        out["init"] = {"source": "per task", "tasks": len(inits), "tasks_paid": len(paid_tasks),
                       "median_s": _med(paid_tasks), "max_s": max(paid_tasks) if paid_tasks else None,
                       "total_s": sum(paid_tasks)}
        for key in ("read", "upstream", "produce", "commit"):
            vals = [x for b in batches for x in b["tasks"].get(key, [])]
            if vals:
                out.setdefault("task_split_median", {})[key] = _med(vals)
        out["task_split_median"] = {**out.get("task_split_median", {}), "init": _med(inits)}
    else:
        # Only per-batch maxima: at least one task per such batch paid init_transactions.
        out["init"] = {"source": "per-batch maximum (no per-task lines in the log)", "tasks": None,
                       "tasks_paid": None, "batches_paid": len(paid), "median_s": _med(paid),
                       "max_s": max(paid) if paid else None}
    statuses = [b["statuses"] for b in batches if b.get("statuses")]
    if statuses:
        out["other_statuses"] = statuses[:10]
    return out
