"""How state is encoded: a state row (one key's value) as schemaless Avro, and a snapshot chunk
(many keys with their encoded values) as one Arrow IPC stream.

A row is Avro because a changelog record holds one key (compaction keeps the latest per key),
so the encoding must be small and quick for a single row: fastavro writes (count, sum) in 10
bytes where Arrow IPC needs hundreds for its framing; and the schema is derived from the
aggregate's state, which Avro describes and evolves. A snapshot chunk holds thousands of rows,
where Arrow's columnar framing is cheap and one `to_pylist` per column reads them back. The store
and the changelog hold the encoded bytes as they are: a restore copies bytes, never decodes.
"""
from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import fastavro
import pyarrow as pa

from txstream.state.errors import StateDecodeError

_CHUNK_SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary())])


class StateCodec:
    """One state schema (an Avro record schema, parsed or not): encode and decode its rows."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = fastavro.parse_schema(schema)

    def encode(self, row: dict[str, Any]) -> bytes:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, self.schema, row)
        return out.getvalue()

    def decode(self, value: bytes) -> dict[str, Any]:
        try:
            return fastavro.schemaless_reader(io.BytesIO(value), self.schema, None)
        except (EOFError, ValueError, TypeError, IndexError, UnicodeDecodeError) as exc:
            raise StateDecodeError(f"a state value ({len(value)} bytes) does not read with the state schema "
                                   f"{self.schema.get('name', '')!r}: {exc}") from exc


def snapshot_chunk(keys: Sequence[bytes], values: Sequence[bytes]) -> bytes:
    """Keys and their encoded values as one Arrow IPC stream (a snapshot record's value)."""
    batch = pa.record_batch([pa.array(keys, pa.binary()), pa.array(values, pa.binary())], schema=_CHUNK_SCHEMA)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, _CHUNK_SCHEMA) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def snapshot_rows(chunk: bytes) -> tuple[list[bytes], list[bytes]]:
    """The keys and values of a chunk written by `snapshot_chunk`."""
    try:
        table = pa.ipc.open_stream(chunk).read_all()
    except pa.ArrowInvalid as exc:
        raise StateDecodeError(f"a snapshot chunk ({len(chunk)} bytes) is not an Arrow stream: {exc}") from exc
    if table.schema != _CHUNK_SCHEMA:
        raise StateDecodeError(f"a snapshot chunk has columns {table.schema.names}, not key and value")
    return table.column("key").to_pylist(), table.column("value").to_pylist()
