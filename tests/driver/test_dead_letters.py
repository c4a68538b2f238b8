"""Poison records (issue 5): bad input goes to the dead-letter topic inside the same transaction,
never blocks its partition and never drops a neighbour. Without a dead-letter topic the run stops
with an error naming the record, and nothing of that range is published.

Runs the real order enricher (processors/enrich_orders.py) in the session's Spark against the
real broker.
"""
from __future__ import annotations

import io
from collections import Counter
from pathlib import Path

import fastavro
import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from processors.enrich_orders import EnrichOrders
from processors.sample_orders import enriched, orders
from tests.support.kafka import avro_bytes, committed, produce, read_all
from txstream import Processor
from txstream.kafka import headers as hdr
from txstream.serde.avro import load_schema
from txstream.tools.topic_io import end_offsets

REPO = Path(__file__).resolve().parents[2]
ORDER = load_schema(str(REPO / "schemas/order.avsc"))
ENRICHED = load_schema(str(REPO / "schemas/order_enriched.avsc"))
WRONG = {"type": "record", "name": "Customer", "fields": [
    {"name": "name", "type": "string"}, {"name": "age", "type": "int"},
    {"name": "tags", "type": {"type": "array", "items": "string"}}]}


def _decode(schema: dict, payload: bytes) -> dict:
    return fastavro.schemaless_reader(io.BytesIO(payload), schema, None)


def _poison() -> dict[str, bytes | None]:
    good = avro_bytes(ORDER, next(orders(1, seed=99)))
    return {
        "bad-avro": b"\xff" * 12,
        "truncated": good[: len(good) // 2],
        "trailing-bytes": good + b"\x00\x00",          # a whole order, then 2 bytes of something else
        "wrong-schema": avro_bytes(WRONG, {"name": "Alice", "age": 41, "tags": ["a", "b", "c"]}),
        "empty": b"",
        "null": None,
    }


def _seed_with_poison(bootstrap: str, topic: str, partitions: int, count: int = 400):
    """Good orders on every partition, with the poison records between them on partition 1.
    Returns (good orders by id, {kind: (partition, offset)})."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    good: dict[str, dict] = {}
    where: dict[str, tuple[int, int]] = {}
    poison = list(_poison().items())
    delivered: dict[str, tuple[int, int]] = {}

    def remember(name: str):
        def cb(err, msg) -> None:
            assert err is None, err
            delivered[name] = (msg.partition(), msg.offset())
        return cb

    on_one = 0
    for i, o in enumerate(orders(count, seed=5)):
        partition = i % partitions
        on_one += partition == 1
        producer.produce(topic, avro_bytes(ORDER, o), o["id"].encode(), partition=partition,
                         headers=[("origin", b"good")])
        good[o["id"]] = o
        # After every 10th good record of partition 1, a poison record (key names the kind).
        if partition == 1 and on_one % 10 == 0 and poison:
            kind, payload = poison.pop(0)
            producer.produce(topic, payload, f"poison-{kind}".encode(), partition=1,
                             headers=[("origin", kind.encode()), ("trace", b"\x00\x01")],
                             on_delivery=remember(kind))
    assert producer.flush(60) == 0
    assert not poison, "not every poison record was placed"
    where.update(delivered)
    return good, where


def _check_outputs(bootstrap: str, output: str, good: dict[str, dict]) -> None:
    out = read_all(bootstrap, output)
    ids = Counter(_decode(ENRICHED, r.value)["id"] for r in out)
    dup = {k: n for k, n in ids.items() if n > 1}
    assert not dup, f"neighbours published more than once: {list(dup.items())[:5]}"
    expected = {oid: enriched(o) for oid, o in good.items() if enriched(o) is not None}
    assert set(ids) == set(expected), (f"missing neighbours: {sorted(set(expected) - set(ids))[:5]}, "
                                       f"unexpected: {sorted(set(ids) - set(expected))[:5]}")
    for r in out:
        value = _decode(ENRICHED, r.value)
        want = expected[value["id"]]
        assert value["amount_cents"] == want["amount_cents"] and value["is_large"] == want["is_large"]
        assert r.key == value["id"].encode()


@pytest.mark.parametrize("lineage", [True, False], ids=["lineage", "no-lineage"])
def test_poison_records_go_to_the_dead_letter_topic(lineage, bootstrap_servers, make_topic, run_processor):
    """Without lineage the 3 partitions share one slot whose ranges are read together
    (task/reading.py read_ranges): each dead letter still names its own partition."""
    partitions = 3
    source = make_topic("orders", partitions)
    output = make_topic("orders-enriched", partitions)
    dead = make_topic("orders-dlq", 1)
    good, where = _seed_with_poison(bootstrap_servers, source, partitions)
    poison = _poison()

    driver = run_processor(EnrichOrders, inputs=[source], output=output, dead_letter=dead,
                           max_records_per_partition=60,  # several batches; poison in the middle ones
                           lineage=lineage, **({} if lineage else {"task_slots": 1}))
    assert driver.exit_code == 0, driver.lines
    assert driver.totals["dead_letters"] == len(poison), driver.lines

    letters = read_all(bootstrap_servers, dead)
    by_kind = {r.key.decode().removeprefix("poison-"): r for r in letters}
    assert len(letters) == len(poison), f"dead letters: {[(r.key, r.headers) for r in letters]}"
    assert set(by_kind) == set(poison)
    for kind, payload in poison.items():
        r = by_kind[kind]
        partition, offset = where[kind]
        # The original record: key, value (None stays None; b"" stays empty) and headers.
        assert r.value == payload or (payload == b"" and r.value in (b"", None)), (kind, r.value)
        assert r.headers.get("origin") == kind.encode() and r.headers.get("trace") == b"\x00\x01", (kind, r.headers)
        # Where it came from, at which stage, and why.
        assert r.lineage.source == (source, partition, offset), (kind, r.headers)
        assert r.headers[hdr.DLQ_STAGE] == b"decode", (kind, r.headers)
        assert r.headers.get(hdr.DLQ_ERROR), (kind, r.headers)
    assert b"2 bytes left after the record ends" in by_kind["trailing-bytes"].headers[hdr.DLQ_ERROR]

    _check_outputs(bootstrap_servers, output, good)
    # Committed offsets advanced past the poison records: to the end of every partition.
    ends = {p: end for p, (_low, end) in end_offsets(bootstrap_servers, source, "read_committed").items()}
    assert committed(bootstrap_servers, driver.settings.app_id, source, partitions) == ends

    # The readers' side files (raw undecodable records among them) were in the executors' local
    # directory, and the publishers that took them removed them: nothing is left there.
    assert _side_files_left(driver) == [], "side files left in the executor's local directory"
    if not lineage:
        return   # verify audits from the lineage headers
    from txstream.tools.verify import audit

    report = audit(bootstrap_servers, source, output, dead_letter=dead, app_id=driver.settings.app_id)
    assert report.clean and report.totals["dead_lettered"] == len(poison), report.table()
    print(f"\n[dead letters] records in {report.totals['consumed']}  out {report.totals['outputs']}  "
          f"dead-lettered {report.totals['dead_lettered']}  duplicates {report.totals['duplicates']}  "
          f"missing 0")


def _side_files_left(driver) -> list[str]:
    name = driver.specs.side_dir

    def listing(_):
        import os

        from txstream.task.sidefile import run_directory

        where = run_directory(name)
        return sorted(os.listdir(where)) if where.is_dir() else []

    return driver.spark.sparkContext.range(0, 1, 1, 1).flatMap(listing).collect()


class EnrichOrdersNoDeadLetters(EnrichOrders):
    dead_letter_topic = None


def test_without_a_dead_letter_topic_the_run_stops_naming_the_record(bootstrap_servers, make_topic, run_processor):
    partitions = 2
    source = make_topic("orders", partitions)
    output = make_topic("orders-enriched", partitions)
    good, where = _seed_with_poison(bootstrap_servers, source, partitions, count=120)
    # the first poison record on partition 1 (its range is the first batch: no cap hit)
    kind, (partition, offset) = min(where.items(), key=lambda kv: kv[1][1])
    app_id = "test-no-dlq-" + source[-8:]
    with pytest.raises(Exception) as failure:
        run_processor(EnrichOrdersNoDeadLetters, inputs=[source], output=output, app_id=app_id)
    message = str(failure.value)
    assert f"{source}[{partition}]@{offset}" in message, message[:2000]
    assert "dead" in message.lower(), message[:2000]

    # Nothing of the poisoned range is published and its offset did not move.
    out = read_all(bootstrap_servers, output)
    from_poisoned = [r for r in out if r.lineage.partition == partition]
    assert not from_poisoned, f"{len(from_poisoned)} records of the failed range were published"
    assert committed(bootstrap_servers, app_id, source, partitions)[partition] is None


# ---------------------------------------------------------------------------------------------
# Transform-stage errors (being designed by the lead engineer; may fail until supported)
# ---------------------------------------------------------------------------------------------

POISON_VALUE = b"poison-value-for-the-udf"


@F.udf(returnType=T.BinaryType())
def _checked(value):
    if bytes(value) == POISON_VALUE:
        raise ValueError(f"cannot handle {bytes(value)!r}")
    return bytes(value)


class RaisingUdf(Processor):
    one_to_one = True

    def transform(self, batch: DataFrame) -> DataFrame:
        return batch.select("key", _checked(F.col("value")).alias("value"), "headers", "offset")


@pytest.mark.transform_errors
def test_a_raising_udf_dead_letters_one_record(bootstrap_servers, make_topic, run_processor):
    partitions = 2
    source, output, dead = make_topic("in", partitions), make_topic("out", partitions), make_topic("dlq")
    # Small: isolating the failing row costs a few failing Spark jobs, each retried by Spark.
    records = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(60)]
    records.insert(31, (b"bad", POISON_VALUE))
    produce(bootstrap_servers, source, records)
    try:
        driver = run_processor(RaisingUdf, inputs=[source], output=output, dead_letter=dead,
                               max_consecutive_failures=1)
    except Exception as exc:
        pytest.fail("a UDF that raises for one record stopped the run instead of dead-lettering it "
                    f"(transform-stage errors are not isolated yet): {str(exc)[:600]}")
    assert driver.exit_code == 0, driver.lines
    out = Counter((r.key, r.value) for r in read_all(bootstrap_servers, output))
    neighbours = Counter(r for r in records if r[1] != POISON_VALUE)
    assert out == neighbours, (f"neighbours missing {list((neighbours - out).items())[:5]}, "
                               f"extra {list((out - neighbours).items())[:5]}")
    letters = read_all(bootstrap_servers, dead)
    assert [(r.key, r.value) for r in letters] == [(b"bad", POISON_VALUE)], letters
    h = letters[0].headers
    assert h[hdr.DLQ_STAGE] == b"transform", h
    assert b"ValueError" in h[hdr.DLQ_ERROR], h
    assert letters[0].lineage.topic == source and letters[0].lineage.offset is not None, h


class CastsToInt(Processor):
    """Spark's own row-level error: under ANSI mode (Spark 4's default) a cast of 'x' to int
    fails the task with CAST_INVALID_INPUT."""

    def transform(self, batch: DataFrame) -> DataFrame:
        number = F.col("value").cast("string").cast("int")
        return batch.select("key", (number * 2).cast("string").alias("value"), "offset")


@pytest.mark.transform_errors
def test_a_spark_row_level_error_dead_letters_one_record(bootstrap_servers, make_topic, run_processor, spark):
    assert spark.conf.get("spark.sql.ansi.enabled") == "true"
    source, output, dead = make_topic("in"), make_topic("out"), make_topic("dlq")
    records = [(f"k{i}".encode(), str(i).encode()) for i in range(20)]
    records.insert(7, (b"bad", b"not-a-number"))
    produce(bootstrap_servers, source, records)
    driver = run_processor(CastsToInt, inputs=[source], output=output, dead_letter=dead, max_consecutive_failures=1)
    assert driver.exit_code == 0, driver.lines
    assert sorted(int(r.value) for r in read_all(bootstrap_servers, output)) == [2 * i for i in range(20)]
    letters = read_all(bootstrap_servers, dead)
    assert [(r.key, r.value) for r in letters] == [(b"bad", b"not-a-number")], letters
    assert b"CAST_INVALID_INPUT" in letters[0].headers[hdr.DLQ_ERROR], letters[0].headers
