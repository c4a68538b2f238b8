"""A Python worker's copy of a table partition (task/tables.py): decoded again only where keys
changed, and always equal to a fresh decode of the same records."""
from __future__ import annotations

import random

from tests.support.kafka import avro_bytes
from txstream.serde.avro import load_schema
from txstream.task.tables import TableSource, TableVersion, _Kept, decode_kept, decode_versions, encode_versions

CUSTOMER = load_schema("schemas/customer.avsc")
SOURCE = TableSource("customers", "customers", None, CUSTOMER)


def _value(key: bytes, n: int) -> bytes:
    return avro_bytes(CUSTOMER, {"customer_id": key.decode(), "name": f"name-{n}", "tier": "gold"})


def _rows(table) -> list[tuple]:
    return sorted((r["key"], r["value"]["name"], r["offset"]) for r in table.to_pylist())


def test_a_copy_decoded_key_by_key_equals_a_fresh_decode_of_its_records() -> None:
    rng = random.Random(61)
    kept, offset = _Kept(), 0
    for _round in range(6):
        for _ in range(rng.randrange(0, 40)):
            key = f"c{rng.randrange(25)}".encode()
            kept.apply(key, None if rng.random() < 0.2 else _value(key, offset), offset, 1_000 + offset, None)
            offset += 1
        decoded = decode_kept(SOURCE, 0, kept)
        fresh = _Kept()
        for key, (value, at, ts, headers) in kept.latest.items():
            fresh.apply(key, value, at, ts, headers)
        want = decode_kept(SOURCE, 0, fresh)
        assert _rows(decoded) == (_rows(want) if want is not None else [])
        assert sorted(kept.decoded_keys.to_pylist()) == sorted(kept.latest)
    assert decode_kept(SOURCE, 0, kept) is kept.decoded   # unchanged: nothing decoded again


def test_a_version_travels_as_text() -> None:
    versions = (TableVersion("customers", (12, 0, 7)), TableVersion("rates", ()))
    assert decode_versions(encode_versions(versions)) == versions
