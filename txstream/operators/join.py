"""The room of stream-stream joins (Spark's StreamingSymmetricHashJoinExec): not supported yet.

A join of two streams keeps each side's rows in state until the other side's watermark passes
the join's time bound. txstream reads one input stream per processor, so there is no second
side to keep; a join inside a transform is a per-batch join (against a static frame, or within
the batch) and needs no state. This class is where the operator goes once a processor has two
keyed inputs: its `late`, `merge` and `owes_batch` follow Spark's per-side watermark predicates.
"""
from __future__ import annotations

from typing import Any

from txstream.errors import TransformError
from txstream.operators.base import StatefulOperator

REASON = ("a stream-stream join needs two input streams whose rows wait in state for each other; a processor "
          "reads one: join against a static frame instead (docs/state.md, 'What is refused')")


class StreamStreamJoin(StatefulOperator):
    kind = "join"

    def partials(self, *_args: Any, **_kwargs: Any) -> Any:
        raise TransformError(REASON)

    def merge(self, *_args: Any, **_kwargs: Any) -> Any:
        raise TransformError(REASON)
