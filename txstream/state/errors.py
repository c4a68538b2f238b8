"""What state can get wrong, as types of txstream's taxonomy (txstream/errors.py), so `decide`
needs no new case: a disagreement between the state and the marker stops the run (no retry can
cure it, and guessing would publish wrong results); a store or a read that fails is retried."""
from __future__ import annotations

from txstream.errors import InfrastructureError, TxstreamError, UserError

START_OVER = ("the state cannot be trusted; start this app's state over (`txstream state reset`) "
              "or restore the topics it was written to")


class StateError(TxstreamError):
    """Base of every state error; each subclass also says what the driver does about it."""


class StateInconsistent(StateError, UserError):
    """The state found (in Kafka or in this worker) disagrees with the unit's marker."""


class StateAheadOfMarker(StateInconsistent):
    """A changelog record, a snapshot or the local copy belongs to a batch after the one the
    marker says is committed: a stale marker or state from another run, never a pending batch
    (read_committed hides those)."""

    def __init__(self, what: str, batch: int, marker_batch: int, operator: str, unit: int) -> None:
        super().__init__(f"state of operator {operator!r}, unit {unit}: {what} is of batch {batch}, but the "
                         f"unit's marker says batch {marker_batch} is the last committed; {START_OVER}")
        self.batch, self.marker_batch, self.operator, self.unit = batch, marker_batch, operator, unit


class ForeignStateRecord(StateInconsistent):
    """A record in this unit's partition was written by another unit or operator, or carries no
    batch at all: the topic was written by something else."""


class StateDecodeError(StateError, UserError):
    """A state value or snapshot cannot be read with the state's schema."""


class StateStoreError(StateError, InfrastructureError):
    """The local store cannot be opened, read or written, or is used out of order."""


class RestoreIncomplete(StateError, InfrastructureError):
    """A restore could not read what it needs from Kafka in time; a later attempt may."""


class MarkerMovedDuringRestore(StateError, InfrastructureError):
    """The unit's marker moved on while this worker restored: another attempt of the unit
    committed a batch meanwhile. Retried; the retry restores against the new marker."""
