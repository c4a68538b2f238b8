"""The operator class of each kind of state (state/operator.py's kinds)."""
from __future__ import annotations

from txstream.operators.aggregate import RunningAggregate
from txstream.operators.base import StatefulOperator
from txstream.operators.dedup import Deduplicate
from txstream.operators.join import StreamStreamJoin
from txstream.operators.session import SessionWindow
from txstream.operators.window import WindowAggregate

OPERATORS: dict[str, StatefulOperator] = {op.kind: op for op in (RunningAggregate(), WindowAggregate(),
                                                                   SessionWindow(), Deduplicate(),
                                                                   StreamStreamJoin())}


def operator_for(kind: str) -> StatefulOperator:
    return OPERATORS[kind]
