"""Header names txstream writes, shared by the publisher, the dead-letter path, `verify` and
`status`; and the one reader of a record's lineage, for both formats (docs/architecture.md,
"Lineage").

Lineage: every output record names the input record it came from, so anyone can audit
exactly-once from the topics alone. Since the compact format one header carries it all,
`txstream.lineage: <topic>/<partition>/<offset>/<publication>/<position>` (UTF-8; Kafka topic
names cannot hold `/`). It was five headers before, one per field; each header is a separate
allocation in the client and a name in every record the broker stores: five cost 4.0 µs of the
client's CPU and 2.2 µs of the broker's per record, the one 2.0 / 1.3, none 1.4 / 0.9
(`benchmarks/lineage_cost.py`, one run). Output written in the five-header format still reads.
"""
from __future__ import annotations

from typing import NamedTuple

LINEAGE = "txstream.lineage"

# The five-header format (before the compact one), still read; dead letters and wide output
# keep the publication and position names.
SOURCE_TOPIC = "txstream.source.topic"
SOURCE_PARTITION = "txstream.source.partition"
SOURCE_OFFSET = "txstream.source.offset"

# Dead-letter records carry the lineage header plus these.
DLQ_STAGE = "txstream.dlq.stage"      # decode | transform | encode
DLQ_ERROR = "txstream.dlq.error"      # the error, one line
DLQ_APP_ID = "txstream.dlq.app.id"

# One id per published range attempt (one Kafka transaction under exactly-once): `verify`
# tells two committed publications of the same source offset apart from a 1:n fan-out.
PUBLICATION = "txstream.publication"

# The record's position in its publication (0, 1, 2 ... in the order produced; dead letters
# included): (publication, source offset, position) is unique by construction, so `verify`
# catches any repeat, a verbatim copy of a committed record included.
PUBLICATION_SEQ = "txstream.publication.seq"

# Wide batches (docs/wide-transforms.md): an output record has no single source record; it
# names the batch and the output unit that published it, which `verify` checks were published
# once (one publication per batch and unit).
BATCH = "txstream.batch"
UNIT = "txstream.unit"

_FIVE = frozenset((SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET, PUBLICATION, PUBLICATION_SEQ))


class Lineage(NamedTuple):
    """What a record's lineage names. `offset` is None for a row whose transform dropped (or
    nulled) the input's `offset` column: it names its source partition only."""

    topic: str
    partition: int
    offset: int | None
    publication: bytes | None
    position: bytes | None

    @property
    def source(self) -> tuple[str, int, int] | None:
        return None if self.offset is None else (self.topic, self.partition, self.offset)


def lineage_prefix(topic: str, partition: int) -> str:
    """The part of a lineage value every record of a source partition shares."""
    return f"{topic}/{partition}/"


def lineage_value(topic: str, partition: int, offset: int | None, publication: str, position: int) -> bytes:
    """One record's `txstream.lineage` value (task/collector.py builds a batch's at once)."""
    return f"{lineage_prefix(topic, partition)}{'' if offset is None else offset}/{publication}/{position}".encode()


def lineage_of(headers: list[tuple[str, bytes]] | None) -> Lineage | None:
    """A record's lineage, or None when it has none.

    The last one wins: a dead letter keeps its input's own headers (an upstream app's lineage
    among them) before txstream's. Either format: the compact header, or the five."""
    if not headers:
        return None
    compact = None
    compact_at = five_at = -1
    five: dict[str, bytes] = {}
    for i, (k, v) in enumerate(headers):
        if k == LINEAGE:
            compact, compact_at = v, i
        elif k in _FIVE:
            five[k] = v
            five_at = i
    if compact is not None and compact_at > five_at:
        try:
            topic, partition, offset, publication, position = compact.split(b"/")
            return Lineage(topic.decode(), int(partition), int(offset) if offset else None,
                           publication or None, position or None)
        except ValueError:
            return None   # not ours (a header of that name someone else wrote)
    if SOURCE_TOPIC not in five or SOURCE_PARTITION not in five:
        return None
    try:
        partition = int(five[SOURCE_PARTITION])
    except ValueError:
        return None
    return Lineage(five[SOURCE_TOPIC].decode(), partition, _offset(five.get(SOURCE_OFFSET)),
                   five.get(PUBLICATION), five.get(PUBLICATION_SEQ))


def _offset(value: bytes | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None   # the five-header format wrote `None` for a nulled offset


def wide_lineage(batch_id: int, unit: int | str, publication: str) -> list[tuple[str, bytes]]:
    return [(BATCH, str(batch_id).encode()), (UNIT, str(unit).encode()), (PUBLICATION, publication.encode())]
