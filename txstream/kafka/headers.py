"""Header names txstream writes, shared by the publisher, the dead-letter path and `verify`.

Lineage: every output record names the input record it came from, so anyone can audit
exactly-once from the topics alone. Values are UTF-8 text.
"""
SOURCE_TOPIC = "txstream.source.topic"
SOURCE_PARTITION = "txstream.source.partition"
SOURCE_OFFSET = "txstream.source.offset"

# Dead-letter records carry the lineage headers above plus these.
DLQ_STAGE = "txstream.dlq.stage"      # decode | transform | encode
DLQ_ERROR = "txstream.dlq.error"      # the error, one line
DLQ_APP_ID = "txstream.dlq.app.id"


def lineage(topic: str, partition: int, offset: int) -> list[tuple[str, bytes]]:
    return [(SOURCE_TOPIC, topic.encode()), (SOURCE_PARTITION, str(partition).encode()),
            (SOURCE_OFFSET, str(offset).encode())]


def source_of(headers: list[tuple[str, bytes]] | None) -> tuple[str, int, int] | None:
    """(topic, partition, offset) from a record's lineage headers, or None when it has none."""
    if not headers:
        return None
    found = {k: v for k, v in headers if k in (SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET)}
    if len(found) != 3:
        return None
    return (found[SOURCE_TOPIC].decode(), int(found[SOURCE_PARTITION]), int(found[SOURCE_OFFSET]))

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


def wide_lineage(batch_id: int, unit: int | str, publication: str) -> list[tuple[str, bytes]]:
    return [(BATCH, str(batch_id).encode()), (UNIT, str(unit).encode()), (PUBLICATION, publication.encode())]
