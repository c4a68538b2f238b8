"""Header names txstream writes, shared by the publisher, the dead-letter path, `verify` and
`status`; and the one reader of a record's lineage, for both formats (docs/architecture.md,
"Lineage").

Lineage: every output record names where it came from, so anyone can audit exactly-once from the
topics alone. One header carries it, `txstream.lineage:
<topic>/<partition>/<offset>/<publication>/<position>` (UTF-8; Kafka topic names cannot hold `/`):
one header rather than one per field, because each header costs the client and the broker per
record. Output written in the older five-header format still reads.
"""
from __future__ import annotations

from typing import NamedTuple

LINEAGE = "txstream.lineage"

# The five-header format, still read; dead letters and wide output keep the publication and
# position names.
SOURCE_TOPIC = "txstream.source.topic"
SOURCE_PARTITION = "txstream.source.partition"
SOURCE_OFFSET = "txstream.source.offset"

# Dead-letter records carry the lineage header plus these.
DLQ_STAGE = "txstream.dlq.stage"      # decode | transform | encode
DLQ_ERROR = "txstream.dlq.error"      # the error, one line
DLQ_APP_ID = "txstream.dlq.app.id"
STATE_KEY = "txstream.state.key"       # a stateful output record's state key (docs/state.md)
# A deduplicated key's expiry (epoch ms, ASCII): its first row's event time plus the watermark's delay.
STATE_EXPIRES = "txstream.state.expires"
DLQ_WATERMARK = "txstream.dlq.watermark"   # a late record's: the watermark it missed (ISO 8601, UTC)
# A late record's input record, `<topic>/<partition>/<offset>` (UTF-8): its dead letter is published by
# the unit whose state it missed, with that unit's lineage, and is the input record as read.
DLQ_SOURCE = "txstream.dlq.source"

# One id per published range attempt (one Kafka transaction under exactly-once): `verify`
# tells two committed publications of the same source offset apart from a 1:n fan-out.
PUBLICATION = "txstream.publication"

# The record's position in its publication (0, 1, 2 ... in the order produced; dead letters
# included): (publication, position) is unique by construction, so `verify` catches any repeat,
# a verbatim copy of a committed record included, whether or not the offset is known.
PUBLICATION_SEQ = "txstream.publication.seq"

# Wide batches (docs/wide-transforms.md): an output record has no single source record; it
# names the app, the batch and the output unit that published it. The app tells two apps
# writing one topic apart: batch ids are per app.
BATCH = "txstream.batch"
UNIT = "txstream.unit"
APP = "txstream.app"

_FIVE = frozenset((SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET, PUBLICATION, PUBLICATION_SEQ))


class Lineage(NamedTuple):
    """What a record's lineage names. `offset` is None when the plan could not carry the source
    offset (docs/guarantees.md): the record names its source partition, publication and position."""

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


def wide_lineage(batch_id: int, unit: int | str, publication: str, app_id: str | None = None) -> list[tuple[str, bytes]]:
    """A wide publication's headers (each record adds its position)."""
    named = [(APP, app_id.encode())] if app_id else []
    return [*named, (BATCH, str(batch_id).encode()), (UNIT, str(unit).encode()), (PUBLICATION, publication.encode())]


def iso_ms(ms: int) -> str:
    """Epoch milliseconds as ISO 8601 UTC, as the dead-letter headers carry times."""
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
