"""`txstream verify` against every output shape txstream writes (issue 50): each processor runs
once, for real (the session's Spark, the real broker), and verify must pass its output; then each
duplicate shape is injected into a copy of that output (the copy keeps every record's key, value,
headers and partition) and verify must fail (exit 1) naming the duplicate.

Processors: narrow keeping `offset`, narrow dropping it, a Python UDF, an explode (1:n), a filter
to nothing, a fan-out to two topics, a wide groupBy (which filters: --count-field says so), a wide
keyless distinct, and stateful ones (docs/state.md): running totals in update mode, windows in
append mode, a deduplication, each over batches of 10 records per partition so that state crosses
batches. Each input holds one undecodable record, so each app has a dead letter.

Duplicate shapes: a verbatim copy of one record committed by another transactional producer; a
whole publication replayed by another producer (a second commit of the same range or unit: a new
publication id); a record copied into another partition; a dead letter copied into the output.
"""
from __future__ import annotations

import functools
import json
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from processors.sample_orders import EPOCH, orders
from tests.support.kafka import Record, avro_bytes, produce, read_all
from tests.support.waiting import wait_until
from txstream import Processor
from txstream.cli import main as cli
from txstream.kafka import headers as hdr
from txstream.serde.avro import load_schema
from txstream.tools.verify_wide import WideAudit, WideLineage

ORDER_SCHEMA = "schemas/order.avsc"
ORDER = load_schema(ORDER_SCHEMA)
COUNT = 60
GARBAGE = b"\xff\xff not avro"
SECOND = "second"   # the fan-out's other topic, set per run


class _Orders(Processor):
    value_schema = ORDER_SCHEMA


class KeepsOffset(_Orders):
    def transform(self, batch: DataFrame) -> DataFrame:
        return batch.select("key", "offset", F.to_json("value").alias("value"))


class DropsOffset(_Orders):
    def transform(self, batch: DataFrame) -> DataFrame:
        return batch.select("key", F.to_json("value").alias("value"))


def _shout(text: str) -> str:
    return text.upper()


class PythonUdf(_Orders):
    def transform(self, batch: DataFrame) -> DataFrame:
        return batch.select("key", F.udf(_shout, "string")(F.to_json("value")).alias("value"))


class Explodes(_Orders):
    def transform(self, batch: DataFrame) -> DataFrame:
        return batch.select("key", F.explode(F.array(F.col("value.id"), F.col("value.customer_id"))).alias("value"))


class FiltersAll(_Orders):
    def transform(self, batch: DataFrame) -> DataFrame:
        return batch.filter(F.col("value.amount") > 1e12).select("key", F.to_json("value").alias("value"))


class FansOut(_Orders):
    def transform(self, batch: DataFrame) -> DataFrame:
        topic = F.when(F.col("value.currency") == "EUR", F.lit(self.output_topic)).otherwise(F.lit(self.second))
        return batch.select("key", F.col("value.id").alias("value"), topic.alias("topic"))


class GroupsBy(_Orders):
    """Counts the orders with a positive amount per currency: a wide transform that filters."""

    output_mode = "per-batch"

    def transform(self, batch: DataFrame) -> DataFrame:
        return (batch.filter(F.col("value.amount") > 0).groupBy(F.col("value.currency").alias("currency"))
                .agg(F.count("*").alias("n"))
                .select(F.col("currency").cast("binary").alias("key"), F.to_json(F.struct("n")).alias("value")))


class Distinct(_Orders):
    def transform(self, batch: DataFrame) -> DataFrame:
        return batch.select(F.to_json(F.struct(F.col("value.currency").alias("c"))).alias("value")).distinct()


class RunningTotals(_Orders):
    """Per currency (4 keys, each in every batch): the total so far, each batch's changed ones."""

    output_mode = "update"

    def transform(self, batch: DataFrame) -> DataFrame:
        totals = batch.groupBy(F.col("value.currency").alias("currency")).agg(F.sum("value.amount").alias("amount"))
        return totals.select(F.col("currency").cast("binary").alias("key"), F.to_json(F.struct("amount")).alias("value"))


class Windows(_Orders):
    """Orders per currency in 500 ms windows of event time (the 60 orders span 2.2 s), emitted once
    when the watermark (1 s behind: no order is late) passes their end."""

    output_mode = "append"

    def transform(self, batch: DataFrame) -> DataFrame:
        w = (batch.select("value.created_at", "value.currency").withWatermark("created_at", "1 second")
             .groupBy(F.window("created_at", "500 milliseconds"), "currency").agg(F.count("*").alias("n")))
        return w.select(F.col("currency").cast("binary").alias("key"),
                        F.to_json(F.struct(F.col("window.start").alias("start"), "n")).alias("value"))


class Deduplicates(_Orders):
    """The first order of each currency: the later batches' orders are dropped by the state."""

    output_mode = "append"

    def transform(self, batch: DataFrame) -> DataFrame:
        orders = batch.select("key", "value", "value.currency", "value.created_at")
        first = orders.withWatermark("created_at", "1 hour").dropDuplicatesWithinWatermark(["currency"])
        return first.select("key", F.to_json("value").alias("value"))


PROCESSORS = {"keeps-offset": KeepsOffset, "drops-offset": DropsOffset, "udf": PythonUdf, "explode": Explodes,
              "filters-all": FiltersAll, "fan-out": FansOut, "group-by": GroupsBy, "distinct": Distinct,
              "running-totals": RunningTotals, "windows": Windows, "dedup": Deduplicates}
STATEFUL = {"running-totals", "windows", "dedup"}
WIDE = {"group-by", "distinct"} | STATEFUL
SHAPES = ["verbatim-copy", "publication-replayed", "other-partition", "dead-letter-in-output"]


@dataclass
class AppRun:
    """One processor's real run: its topics and what it published."""

    name: str
    app_id: str
    source: str
    outputs: list[str]
    dead_letter: str
    records: dict[str, list[Record]] = field(default_factory=dict)   # topic -> its records

    def verify(self, outputs: list[str], dead_letter: str, *extra: str, bootstrap: str) -> tuple[int, str]:
        args = ["verify", "--input", self.source, "--dead-letter-topic", dead_letter, "--app-id", self.app_id,
                "--bootstrap-servers", bootstrap, *extra]
        for topic in outputs:
            args += ["--output", topic]
        result = CliRunner().invoke(cli, args, catch_exceptions=False)
        return result.exit_code, result.output


def _has_leaders(admin, name: str, partitions: int) -> bool:
    meta = admin.list_topics(name, timeout=10).topics.get(name)
    return (meta is not None and meta.error is None and len(meta.partitions) == partitions
            and all(p.leader >= 0 for p in meta.partitions.values()))


@pytest.fixture(scope="module")
def topics(admin):
    created: list[str] = []

    def create(prefix: str, partitions: int = 2) -> str:
        name = f"vm-{prefix}-{uuid.uuid4().hex[:8]}"
        admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
        created.append(name)
        # The broker's metadata lags the controller's answer a little: the run checks its topics.
        wait_until(lambda: _has_leaders(admin, name, partitions), 30, f"topic {name}'s leaders")
        return name

    yield create
    if created:
        admin.delete_topics(created)


@pytest.fixture(scope="module")
def source(bootstrap_servers, topics) -> str:
    """COUNT orders over 2 partitions and one undecodable record."""
    name = topics("in")
    records = [(o["customer_id"].encode(), avro_bytes(ORDER, o)) for o in orders(COUNT)]
    records.insert(COUNT // 2, (b"garbage", GARBAGE))
    produce(bootstrap_servers, name, records)
    return name


def _run(bootstrap: str, spark, cls: type[Processor], app_id: str, source: str, outputs: list[str],
         dead_letter: str, dead_letters: int | None = 1, **options) -> Any:
    """Run `cls` as app `app_id` in the session's Spark until it has caught up; returns the driver."""
    from txstream.driver.loop import Driver
    from txstream.settings import resolve

    settings = resolve(cls, bootstrap_servers=bootstrap, master="local[2]", app_id=app_id,
                       inputs=[source], output=outputs[0], dead_letter=dead_letter, until_caught_up=True, **options)
    lines: list[str] = []
    driver = Driver(settings, echo=lines.append, spark=spark)
    assert driver.run() == 0, lines
    if dead_letters is not None:
        assert driver.totals["dead_letters"] == dead_letters, lines
    return driver


@pytest.fixture(scope="module")
def runs(bootstrap_servers, spark, topics, source):
    """Each processor run once, lazily, for every test of the module."""
    done: dict[str, AppRun] = {}

    def run(name: str) -> AppRun:
        if name in done:
            return done[name]
        cls = PROCESSORS[name]
        outputs = [topics(f"{name}-out")] + ([topics(f"{name}-out2")] if name == "fan-out" else [])
        app = AppRun(name, f"vm-{name}-{uuid.uuid4().hex[:8]}", source, outputs, topics(f"{name}-dlq"))
        if name == "fan-out":
            cls = type("FansOutHere", (FansOut,), {"second": outputs[1]})
        # Stateful: 10 records per partition per batch, so that the state crosses batches.
        options = {"max_records_per_partition": 10} if name in STATEFUL else {}
        driver = _run(bootstrap_servers, spark, cls, app.app_id, source, outputs, app.dead_letter, **options)
        if name in STATEFUL:
            assert driver.totals["batches"] >= 3, driver.totals
        for topic in [*outputs, app.dead_letter]:
            app.records[topic] = read_all(bootstrap_servers, topic)
        assert len(app.records[app.dead_letter]) == 1
        done[name] = app
        return app

    return run


# -- the duplicate shapes, each on a copy of the run's topics ------------------------------------

def _copy(bootstrap: str, topics, app: AppRun) -> dict[str, str]:
    """A copy of the app's output and dead-letter topics, record for record and partition for
    partition; returns each topic's copy."""
    copies = {topic: topics(f"{app.name}-copy") for topic in [*app.outputs, app.dead_letter]}
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for topic, records in app.records.items():
        for r in records:
            producer.produce(copies[topic], r.value, r.key, partition=r.partition, headers=list(r.headers.items()))
    assert producer.flush(30) == 0
    return copies


def _commit(bootstrap: str, records: list[tuple[str, int, Record, list]]) -> list[str]:
    """Produce (topic, partition, record, headers) in one transaction of another transactional
    producer; returns where each landed, as verify names a record: topic[partition]@offset."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"vm-intruder-{uuid.uuid4().hex}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    landed: list[str] = []

    def delivered(err, msg) -> None:
        assert err is None, err
        landed.append(f"{msg.topic()}[{msg.partition()}]@{msg.offset()}")

    for topic, partition, r, headers in records:
        producer.produce(topic, r.value, r.key, partition=partition, headers=headers, on_delivery=delivered)
    assert producer.flush(30) == 0
    producer.commit_transaction(30)
    return landed


def _publication(r: Record) -> bytes:
    lineage = r.lineage
    return lineage.publication if lineage is not None else r.headers[hdr.PUBLICATION]


def _with_publication(r: Record, publication: bytes) -> list:
    """`r`'s headers naming another publication (what a second commit of its range or unit writes)."""
    old = _publication(r)
    return [(k, v.replace(old, publication)) for k, v in r.headers.items()]


def _inject(bootstrap: str, app: AppRun, copies: dict[str, str], shape: str) -> tuple[list[str], Record]:
    """The duplicate `shape` in the copies; returns where the intruding records landed and the
    record they copy."""
    out = [(t, r) for t in app.outputs for r in app.records[t]]
    dead = [(app.dead_letter, r) for r in app.records[app.dead_letter]]
    topic, record = (out or dead)[0]
    if shape == "verbatim-copy":
        return _commit(bootstrap, [(copies[topic], record.partition, record, list(record.headers.items()))]), record
    if shape == "other-partition":
        return _commit(bootstrap, [(copies[topic], 1 - record.partition, record, list(record.headers.items()))]), record
    if shape == "dead-letter-in-output":
        (_, letter), = dead
        return _commit(bootstrap, [(copies[app.outputs[0]], 0, letter, list(letter.headers.items()))]), letter
    assert shape == "publication-replayed"
    publication = _publication(record)
    replay = uuid.uuid4().hex.encode()
    same = [(copies[t], r.partition, r, _with_publication(r, replay)) for t, r in [*out, *dead]
            if _publication(r) == publication]
    return _commit(bootstrap, same), record


# -- the matrix ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(PROCESSORS))
def test_verify_passes_the_real_output(name, runs, bootstrap_servers) -> None:
    app = runs(name)
    extra = ["--count-field", "n"] if name == "group-by" else []
    code, output = app.verify(app.outputs, app.dead_letter, *extra, bootstrap=bootstrap_servers)
    assert code == 0, output
    assert "CLEAN" in output and "no txstream lineage" not in output, output
    # Every narrow output names its input record, whether or not the transform kept `offset`.
    assert "not the offset" not in output, output
    assert "pending" not in output, output
    code, as_json = app.verify(app.outputs, app.dead_letter, *extra, "--format", "json", bootstrap=bootstrap_servers)
    data = json.loads(as_json)
    assert code == 0 and data["clean"] and data["totals"]["without_offset"] == 0, data
    assert data["totals"]["dead_lettered"] == 1 and data["totals"]["consumed"] == COUNT + 1, data
    if name in WIDE:
        assert data["totals"]["wide_outputs"] == sum(len(app.records[t]) for t in app.outputs) > 0, data
        # Wide output names its batch, not a source partition: no "0 outputs" per source partition.
        for line in output.splitlines():
            if line.startswith(f"{app.source}["):
                assert line.split()[3] == "-", output
    if name == "group-by":
        assert "filters them out" in output and data["wide"]["filtered_records"] > 0, output
    if name in STATEFUL:
        # Every record named its state key, and every batch's rows were accounted for.
        wide = data["wide"]
        assert wide["state_emissions"] == wide["records"] and wide["state_batches"] >= 3, output
        # (A deduplication merges each batch's first row per key: fewer rows than the batch read.)
        assert wide["state_reconciled"] == wide["state_batches"] or name == "dedup", output
        # The state crossed batches: each currency once, each closed window once (2 per currency).
        assert name != "dedup" or wide["records"] == 4, output
        assert name != "windows" or wide["records"] == 8, output
    if name in WIDE:
        # Without --app-id the output's own lineage names the app whose batch records close it.
        code, output = CliRunner().invoke(cli, [
            "verify", "--input", app.source, "--output", app.outputs[0], "--dead-letter-topic", app.dead_letter,
            "--bootstrap-servers", bootstrap_servers]).exit_code, None
        assert code == 0
        data = json.loads(CliRunner().invoke(cli, [
            "verify", "--input", app.source, "--output", app.outputs[0], "--dead-letter-topic", app.dead_letter,
            "--bootstrap-servers", bootstrap_servers, "--format", "json"]).output)
        assert data["clean"] and data["wide"]["pending_batches"] == [] and data["wide"]["closed_batches"] > 0, data


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", sorted(PROCESSORS))
def test_verify_catches_an_injected_duplicate(name, shape, runs, topics, bootstrap_servers) -> None:
    app = runs(name)
    copies = _copy(bootstrap_servers, topics, app)
    landed, copied = _inject(bootstrap_servers, app, copies, shape)
    outputs = [copies[t] for t in app.outputs]
    code, output = app.verify(outputs, copies[app.dead_letter], bootstrap=bootstrap_servers)
    assert code == 1, output
    assert "NOT CLEAN" in output, output
    if shape == "publication-replayed":
        # A second publication of what one already published: named by its source offset, or
        # for wide output by its batch and unit.
        lineage = copied.lineage
        if lineage is not None and lineage.offset is not None:
            assert f"duplicate {lineage.topic}[{lineage.partition}] at offsets" in output, output
            assert str(lineage.offset) in output.split(f"duplicate {lineage.topic}[{lineage.partition}] at offsets")[1]
        else:
            batch, unit = int(copied.headers[hdr.BATCH]), int(copied.headers[hdr.UNIT])
            assert f"batch {batch} unit {unit}: published by 2 publications" in output, output
    else:
        # The copy and its original are named (which one verify read first depends on the topics' order).
        where, = landed
        assert any(line.startswith("duplicate: ") and "repeats publication" in line and where in line
                   for line in output.splitlines()), output


# -- wide output: two apps, and a replay ---------------------------------------------------------

def test_two_wide_apps_writing_one_topic_are_told_apart(bootstrap_servers, spark, topics, source) -> None:
    shared, dlq = topics("shared-out"), topics("shared-dlq")
    apps = [f"vm-twin-{i}-{uuid.uuid4().hex[:6]}" for i in range(2)]
    for app_id in apps:
        _run(bootstrap_servers, spark, GroupsBy, app_id, source, [shared], dlq)
    result = CliRunner().invoke(cli, ["verify", "--input", source, "--output", shared, "--dead-letter-topic", dlq,
                                      "--bootstrap-servers", bootstrap_servers, "--count-field", "n"])
    # Both apps' batch 1 are in the topic: each is its own app's, closed by its own batch record.
    assert result.exit_code == 0, result.output
    assert "pending" not in result.output and "published by 2" not in result.output, result.output


def test_a_wide_replay_after_an_offsets_reset_is_not_a_duplicate(bootstrap_servers, spark, topics, source) -> None:
    out, dlq = topics("replay-out"), topics("replay-dlq")
    app_id = f"vm-replay-{uuid.uuid4().hex[:6]}"
    _run(bootstrap_servers, spark, GroupsBy, app_id, source, [out], dlq)
    reset = CliRunner().invoke(cli, ["offsets", "reset", "--app-id", app_id, "--to-earliest", "--execute",
                                     "--bootstrap-servers", bootstrap_servers])
    assert reset.exit_code == 0, reset.output
    _run(bootstrap_servers, spark, GroupsBy, app_id, source, [out], dlq)
    result = CliRunner().invoke(cli, ["verify", "--input", source, "--output", out, "--dead-letter-topic", dlq,
                                      "--app-id", app_id, "--bootstrap-servers", bootstrap_servers])
    assert "replayed batch" in result.output, result.output
    assert "published by 2" not in result.output, result.output
    # The dead letter was written twice, by two publications of its offset: that one is a duplicate
    # for the narrow audit, as every re-read of a dead letter after a reset would be.


# -- deduplication with expiry: an id emitted again after it expired ----------------------------

class ForgetfulDedup(_Orders):
    """Orders deduplicated by id within 2 seconds of event time."""

    output_mode = "append"

    def transform(self, batch: DataFrame) -> DataFrame:
        orders = batch.select("key", "value", "value.id", "value.created_at")
        return (orders.withWatermark("created_at", "2 seconds").dropDuplicatesWithinWatermark(["id"])
                .select("key", F.to_json("value").alias("value")))


def test_an_id_emitted_again_after_its_expiry_is_not_a_duplicate(bootstrap_servers, spark, topics) -> None:
    """dropDuplicatesWithinWatermark forgets an id once the watermark passes its event time plus
    the delay; the same id seen after that is emitted again, legitimately (docs/state.md). verify
    must pass that, and still catch a copy of the second emission."""
    source, out, dlq = topics("dx-in", 1), topics("dx-out"), topics("dx-dlq")
    early = list(orders(10))                                                     # event time 0 - 0.33 s
    later = [dict(o, created_at=EPOCH + timedelta(seconds=5)) for o in orders(10, first=10)]
    produce(bootstrap_servers, source, [(o["id"].encode(), avro_bytes(ORDER, o)) for o in early + later])
    app_id = f"vm-expiry-{uuid.uuid4().hex[:6]}"
    run = functools.partial(_run, bootstrap_servers, spark, ForgetfulDedup, app_id, source, [out], dlq,
                            dead_letters=0, max_records_per_partition=10)
    run()   # its last batch's watermark is 5 s - 2 s: the early ids (expiring by 2.33 s) are forgotten
    retried = [dict(o, created_at=EPOCH + timedelta(seconds=6)) for o in early[:3] + later[:2]]
    produce(bootstrap_servers, source, [(o["id"].encode(), avro_bytes(ORDER, o)) for o in retried])
    run()
    emitted = Counter(json.loads(r.value)["id"] for r in read_all(bootstrap_servers, out))
    # The expired ids twice (their retry kept), the held ones once (their retry dropped).
    assert emitted == Counter([o["id"] for o in early + later] + [o["id"] for o in early[:3]]), emitted
    verify = AppRun("expiry", app_id, source, [out], dlq).verify
    code, output = verify([out], dlq, bootstrap=bootstrap_servers)
    assert code == 0 and "CLEAN" in output, output
    assert "emitted again after it expired" in output, output
    # A copy of a second emission, committed by another producer, is still a duplicate.
    again = [r for r in read_all(bootstrap_servers, out) if json.loads(r.value)["id"] == early[0]["id"]][-1]
    where, = _commit(bootstrap_servers, [(out, again.partition, again, list(again.headers.items()))])
    code, output = verify([out], dlq, bootstrap=bootstrap_servers)
    assert code == 1 and f"duplicate: {where} repeats publication" in output, output


def _dedup_audit(batches: list[tuple[int | None, str]], emitted_in: tuple[int, ...],
                 expires: bytes | None) -> WideAudit:
    """verify's wide audit of a deduplication's batches 1.. (each its watermark and the state's
    epoch) whose output emits key ["a"] in the batches `emitted_in`, each naming `expires`."""
    wide = WideAudit()
    for batch, (watermark, epoch) in enumerate(batches, 1):
        wide.add_batch("app", json.dumps({"batch": batch, "ranges": [], "unit_records": {"0": int(batch in emitted_in)},
                                          "state": {"operator": "dedup", "kind": "dedup", "output_mode": "append",
                                                    "epoch": epoch, "watermark_ms": watermark, "unit_merged": {},
                                                    "unit_late": {}}}).encode())
    for batch in emitted_in:
        wide.add(WideLineage("app", batch, 0, f"p{batch}".encode(), b"0"), b"{}", b'["a"]', expires)
    wide.finish({}, {}, {}, "app")
    return wide


def test_a_key_emitted_again_before_its_expiry_is_still_a_duplicate() -> None:
    """The rule the test above relies on, at its edges (no broker): a deduplicated key emitted in
    batch 1 (expiring at 5000 ms) and again in batch 3 is legitimate only if batch 1 or 2 ran with a
    watermark at or past 5000 (batch 3's own watermark comes too late: it forgets after merging)."""

    def audit(watermarks: list[int | None], expires: bytes | None) -> WideAudit:
        return _dedup_audit([(w, "e") for w in watermarks], (1, 3), expires)

    assert audit([None, 5000, 5000], b"5000").clean                     # forgotten in batch 2
    assert audit([4000, 4999, 5000], b"5000").problems == [              # batch 3 still held it
        "app batch 1: state key b'[\"a\"]' emitted 2 times (batches [1, 3])"]
    assert not audit([None, 5000, 5000], None).clean                   # no expiry: never forgotten
    assert audit([None, 5000, 5000], b"5000").expired_again == 1


def test_a_key_emitted_again_after_a_state_reset_is_not_a_duplicate(bootstrap_servers, spark, topics) -> None:
    """`txstream state reset --to-earliest` starts the state and the offsets over: every id is
    emitted again, legitimately. verify tells the two lives of the state apart by their epochs."""
    source, out, dlq = topics("dr-in", 1), topics("dr-out"), topics("dr-dlq")
    data = list(orders(20))
    produce(bootstrap_servers, source, [(o["id"].encode(), avro_bytes(ORDER, o)) for o in data])
    app_id = f"vm-reset-{uuid.uuid4().hex[:6]}"
    run = functools.partial(_run, bootstrap_servers, spark, Deduplicates, app_id, source, [out], dlq,
                            dead_letters=0, max_records_per_partition=10)
    run()
    reset = CliRunner().invoke(cli, ["state", "reset", "--app-id", app_id, "--to-earliest", "--execute",
                                     "-b", bootstrap_servers])
    assert reset.exit_code == 0, reset.output
    run()
    emitted = Counter(json.loads(r.value)["currency"] for r in read_all(bootstrap_servers, out))
    assert set(emitted.values()) == {2}, emitted   # each currency once per life of the state
    code, output = AppRun("reset", app_id, source, [out], dlq).verify([out], dlq, bootstrap=bootstrap_servers)
    assert code == 0 and "CLEAN" in output, output


def test_a_key_emitted_twice_in_one_life_of_the_state_is_a_duplicate() -> None:
    """The epoch rule at its edges (no broker): the same key in batches of two epochs is clean, in
    two batches of one epoch a duplicate."""

    def audit(epochs: list[str]) -> WideAudit:
        return _dedup_audit([(None, e) for e in epochs], (1, 2), None)

    assert audit(["e1", "e2"]).clean
    assert audit(["e1", "e1"]).problems == ["app batch 1: state key b'[\"a\"]' emitted 2 times (batches [1, 2])"]


def test_count_field_of_a_windowed_app_is_reconciled_over_its_state_not_per_batch() -> None:
    """Issue 60 #16 (no broker): batch 1 reads 4 rows, merges 3 into an open window and
    dead-letters 1 as late in its unit's transaction; batch 2 (no records) emits the window, n=3.
    Per batch, 3 outputs counted in a batch that read nothing were 'duplicates' and the late dead
    letter an output; over the state's life 3 counted <= 3 merged is clean, and 4 counted is not."""

    def audit(n: int) -> WideAudit:
        wide = WideAudit(count_field="n")
        state = {"operator": "agg", "kind": "window", "output_mode": "append", "epoch": "e", "rows_once": True}
        for batch, ranges, merged, late in ((1, [["in", 0, 0, 4]], 3, 1), (2, [["in", 0, 4, 4]], 0, 0)):
            wide.add_batch("app", json.dumps({"batch": batch, "ranges": ranges, "unit_records": {"0": 1},
                                              "state": dict(state, watermark_ms=10_000 * batch,
                                                            unit_merged={"0": merged}, unit_late={"0": late})}).encode())
        wide.add(WideLineage("app", 1, 0, b"p1", b"0"), b'{"id": "late", "ts": 1}', dead_letter=True)
        wide.add(WideLineage("app", 2, 0, b"p2", b"0"), json.dumps({"n": n}).encode())
        wide.finish({("in", 0): {0, 1, 2, 3}}, {}, {("in", 0): 4}, "app")
        return wide

    clean = audit(3)
    assert clean.clean, clean.problems
    assert (clean.records, clean.dead_letters, clean.reconciled_states, clean.unreadable_counts) == (1, 1, 1, 0)
    assert audit(4).problems == ["app's state (epoch e): the output's n add up to 4, more than the 3 row(s) its "
                                 "batches merged: duplicates"]
