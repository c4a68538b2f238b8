"""The room of stream-stream joins (Spark's StreamingSymmetricHashJoinExec): not supported yet,
refused at start by operators/plan.py `stream_stream_join`, which names the reason.

A processor reads several input streams (`Processor.inputs`), so a join has its two sides; what
it lacks is each side's rows kept in state until the other side's watermark passes the join's
time bound. The operator will go here, its `late`, `merge` and `owes_batch` following Spark's
per-side watermark predicates (StreamingJoinHelper's state watermarks derived from the
condition), each side's rows in the units' stores and changelogs as every other kind's state.
"""
from __future__ import annotations

from typing import Any

from txstream.errors import TransformError
from txstream.operators.base import StatefulOperator

REASON = ("a stream-stream join keeps each side's rows in state until the other side's watermark passes the "
          "join's time bound, and txstream keeps no join state yet: join a stream with a table (Processor.tables) "
          "or a frame built in setup() instead (docs/joins.md)")


class StreamStreamJoin(StatefulOperator):
    kind = "join"

    def partials(self, *_args: Any, **_kwargs: Any) -> Any:
        raise TransformError(REASON)

    def merge(self, *_args: Any, **_kwargs: Any) -> Any:
        raise TransformError(REASON)
