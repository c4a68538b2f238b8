"""Names the driver and the Spark tasks share: guarantees, wide modes, task outcomes, the range
column, the Spark job groups. Plain values only: both sides import this module."""
from __future__ import annotations

# Delivery guarantees (docs/guarantees.md): only exactly-once uses transactions.
EXACTLY_ONCE, AT_LEAST_ONCE, AT_MOST_ONCE = "exactly-once", "at-least-once", "at-most-once"
GUARANTEES = (EXACTLY_ONCE, AT_LEAST_ONCE, AT_MOST_ONCE)

# How a wide batch is published (docs/wide-transforms.md).
UNITS, SINGLE_TRANSACTION = "units", "single-transaction"
WIDE_MODES = (UNITS, SINGLE_TRANSACTION)

# What a task reports for its range or unit (task/result.py), and what the driver acts on.
COMMITTED, ALREADY_DONE, STALE_PLAN, FENCED, ACKED, EMPTY = (
    "committed", "already-done", "stale-plan", "fenced", "acked", "empty")

# The column a reader adds when a publishing task must learn each row's range (its reading
# task, Spark partition or slot position).
RANGE_COLUMN = "_txstream_range"


def batch_job_group(app_id: str, batch_id: int) -> str:
    """The Spark job group of a batch's job: cancelled by the watchdog, read by the metrics."""
    return f"txstream-{app_id}-batch-{batch_id}"


def dry_run_job_group(app_id: str) -> str:
    """The Spark job group of the poison isolator's dry runs."""
    return f"txstream-{app_id}-dry-run"
