"""The room of arbitrary per-key state (Spark's FlatMapGroupsWithStateExec behind
applyInPandasWithState, TransformWithStateInPandasExec behind transformWithStateInPandas): not
supported yet, refused with this reason when the transform calls it (driver/stateful_query.py).

Its state is the user's own per key (values, lists, maps, timers), which a merge of partials
cannot express: the operator will hand each key's rows and state to the user's function in the
unit's task, with event-time timers firing as the watermark passes them (its `owes_batch`).
"""
from __future__ import annotations

from typing import Any

from txstream.errors import TransformError
from txstream.operators.base import StatefulOperator

REASON = "arbitrary per-key state comes next, on this foundation"


class ArbitraryState(StatefulOperator):
    kind = "arbitrary"

    @staticmethod
    def refusal(what: str) -> str:
        return (f"{what} is not supported with state across batches yet: {REASON} "
                "(docs/state.md, 'What is refused')")

    def partials(self, *_args: Any, **_kwargs: Any) -> Any:
        raise TransformError(self.refusal("applyInPandasWithState"))

    def merge(self, *_args: Any, **_kwargs: Any) -> Any:
        raise TransformError(self.refusal("applyInPandasWithState"))
