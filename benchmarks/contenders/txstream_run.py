"""`txstream run`, as `python -m txstream.cli run ...` starts it, plus one log line per batch with
each task's timings (the batch line has only the maximum over tasks).

    python -m benchmarks.contenders.txstream_run run PROCESSOR [txstream run options]

Before handing over to txstream's own CLI, this wraps `BatchReport.line` (driver side: it
formats the line after the batch has finished) so that it also prints

    bench-tasks batch N  init a,b,c  read ...  upstream ...  produce ...  commit ...  in ...

from the task rows the driver already has. Nothing in the tasks, the Spark job or the
transactions changes. If txstream's internals moved and the wrap cannot be applied, the run goes
on without the extra lines (benchmarks/batchlog.py then falls back to per-batch maxima).
"""
from __future__ import annotations

import sys

FIELDS = (("init", "init_s"), ("read", "read_s"), ("upstream", "upstream_s"), ("produce", "produce_s"),
          ("commit", "commit_s"), ("in", "records_in"))


# Where BatchReport may live: its own leaf module, or beside the loop that builds it.
REPORT_MODULES = ("txstream.driver.report", "txstream.driver.loop")


def _batch_report_class():
    import importlib

    for name in REPORT_MODULES:
        try:
            return importlib.import_module(name).BatchReport
        except (ImportError, AttributeError):
            continue
    raise LookupError(f"BatchReport is in none of {', '.join(REPORT_MODULES)}")


def _wrap_batch_report() -> None:
    try:
        report_class = _batch_report_class()
        original = report_class.line
    except Exception as exc:  # the run itself must not depend on this
        print(f"bench-tasks unavailable: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return

    def line(self, *args, **kwargs):
        text = original(self, *args, **kwargs)
        try:
            rows = list(self.rows)
            parts = [f"bench-tasks batch {self.batch_id}"]
            for name, column in FIELDS:
                if rows and column not in rows[0]:
                    continue  # a column this txstream's rows lack
                parts.append(f"{name} " + ",".join(format(float(r[column]), ".3f" if column.endswith("_s") else ".0f")
                                                   for r in rows))
            print("  ".join(parts), file=sys.stderr, flush=True)
        except Exception:
            pass
        return text

    report_class.line = line


def main() -> int:
    _wrap_batch_report()
    from txstream.cli import main as txstream_main

    return txstream_main(args=sys.argv[1:], prog_name="txstream")


if __name__ == "__main__":
    sys.exit(main())
