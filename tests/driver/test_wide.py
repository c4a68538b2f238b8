"""Wide transforms (docs/wide-transforms.md): real broker, real Spark.

The aggregated output must reconcile exactly with the input (per bucket, the counts and sums over
every output record equal the input's), `verify` must be clean per batch and unit, and what breaks
exactly-once is refused: a non-deterministic transform, a second instance."""
from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from processors.customer_totals import CustomerTotals
from processors.dedupe_orders import DedupeOrders
from processors.orders_with_customers import OrdersWithCustomers
from tests.support.kafka import avro_bytes, committed, produce, read_all
from tests.support.running import App
from tests.support.seeding import ORDER, seed_numbered, seed_orders
from tests.support.waiting import wait_until
from tests.support.wide_processors import BucketTotals, RandomBuckets, expected_totals, output_totals
from txstream.errors import TransformError
from txstream.records import LoggedPartition, PlanShare, pending_batch
from txstream.serde.avro import AvroCodec, load_schema
from txstream.tools.verify import audit

TOTALS = load_schema("schemas/customer_totals.avsc")
WIDE = "tests/support/wide_processors.py"


# -- the plan log (no broker) ---------------------------------------------------------------------

def test_plan_share_round_trips_and_ignores_foreign_metadata() -> None:
    share = PlanShare(12, 3456, 4, 1_700_000_000_000)
    assert PlanShare.decode(share.encode()) == share
    assert len(share.encode()) < 64   # per partition, far below offset.metadata.max.bytes
    for foreign in (None, "", "hello", "txs1;b=x;e=1;k=1;t=1", "txs1;b=1"):
        assert PlanShare.decode(foreign) is None


def test_pending_batch_is_the_logged_one_with_every_partition() -> None:
    log = {("t", 0): LoggedPartition(100, PlanShare(5, 150, 3, 9)),      # pending: 100..150
           ("t", 1): LoggedPartition(80, PlanShare(5, 80, 3, 9)),        # in batch 5, nothing to read
           ("t", 2): LoggedPartition(40, PlanShare(4, 40, 3, 8)),        # closed by batch 4
           ("t", 3): LoggedPartition(None, None)}                        # never committed
    pending = pending_batch(log)
    assert pending is not None and (pending.batch_id, pending.units, pending.timestamp_ms) == (5, 3, 9)
    assert pending.ranges == {("t", 0): (100, 150), ("t", 1): (80, 80), ("t", 2): (40, 40)}
    closed = {k: LoggedPartition(v.committed, PlanShare(5, v.committed, 3, 9) if v.committed else None)
              for k, v in log.items()}
    assert pending_batch(closed) is None


# -- determinism, on the analyzed plan ----------------------------------------------------------------

@pytest.mark.parametrize("build, expected", [
    (lambda df, F: df.groupBy(F.floor(F.rand() * 3)).count(), "rand"),
    (lambda df, F: df.groupBy("k").agg(F.max(F.current_timestamp())), "current_timestamp"),
    (lambda df, F: df.groupBy("k").agg(F.first("v")), "first"),
    (lambda df, F: df.groupBy("k").agg(F.collect_list("v")), "collect_list"),
    (lambda df, F: df.dropDuplicates(["k"]), "dropDuplicates(subset)"),
    (lambda df, F: df.groupBy(F.udf(lambda v: v % 2, "long").asNondeterministic()("v")).count(), "asNondeterministic"),
])
def test_nondeterministic_wide_transforms_are_refused_saying_why(spark, build, expected) -> None:
    from pyspark.sql import functions as F

    from txstream.driver.determinism import check_deterministic

    frame = build(spark.range(10).select((F.col("id") % 3).alias("k"), F.col("id").alias("v")), F)
    with pytest.raises(TransformError, match=re.escape(expected)) as caught:
        check_deterministic(frame, allowed=False)
    assert "allow_nondeterministic" in str(caught.value)
    assert check_deterministic(frame, allowed=True)   # allowed: named, not refused


def test_deterministic_wide_transforms_pass(spark) -> None:
    from pyspark.sql import functions as F

    from txstream.driver.determinism import check_deterministic

    df = spark.range(10).select((F.col("id") % 3).alias("k"), F.col("id").alias("v"))
    for frame in (df.groupBy("k").agg(F.count("*"), F.sum("v"), F.max("v")), df.dropDuplicates(),
                  df.dropDuplicates(["k", "v"]), df.join(df.withColumnRenamed("v", "w").hint("shuffle_hash"), "k")):
        assert check_deterministic(frame, allowed=False) == []


# -- runs ---------------------------------------------------------------------------------------------

def _bucket_run(bootstrap, make_topic, run_processor, count: int, **overrides):
    source, sink = make_topic("w-in", partitions=4), make_topic("w-out", partitions=3)
    seed_numbered(bootstrap, source, 4, count)
    driver = run_processor(BucketTotals, inputs=[source], output=sink, max_records_per_partition=700, **overrides)
    return driver, source, sink


@pytest.mark.parametrize("mode", ["units", "single-transaction"])
def test_group_by_reconciles_exactly_and_verify_is_clean(bootstrap_servers, make_topic, run_processor, mode) -> None:
    driver, source, sink = _bucket_run(bootstrap_servers, make_topic, run_processor, 8000, wide_mode=mode,
                                       output_units=3)
    assert driver.exit_code == 0
    assert any(m.startswith("protocol: wide") and (mode.split("-")[0] in m) for m in driver.events.messages()), driver.lines
    assert driver.totals["batches"] >= 3 and driver.totals["records_in"] == 8000
    out = read_all(bootstrap_servers, sink)
    assert output_totals(out) == expected_totals(range(8000))
    assert committed(bootstrap_servers, driver.settings.app_id, source, 4) == {p: 2000 for p in range(4)}
    report = audit(bootstrap_servers, source, sink, app_id=driver.settings.app_id, count_field="count")
    assert report.clean and report.wide is not None, report.table()
    assert report.wide.reconciled_batches == driver.totals["batches"]
    units = {(int(r.headers["txstream.batch"]), int(r.headers["txstream.unit"])) for r in out}
    assert {u for _, u in units} <= ({0, 1, 2} if mode == "units" else {0})


def test_more_output_units_than_input_partitions(bootstrap_servers, make_topic, run_processor) -> None:
    """6 units for 4 input partitions: a wide batch's rows are per unit, so the metrics count its
    input per input partition from what the readers read and its output under no source
    partition (a row per unit taken for a range crashed the driver after each commit)."""
    driver, source, sink = _bucket_run(bootstrap_servers, make_topic, run_processor, 2000, output_units=6)
    assert driver.exit_code == 0, driver.lines
    out = read_all(bootstrap_servers, sink)
    assert output_totals(out) == expected_totals(range(2000))
    assert committed(bootstrap_servers, driver.settings.app_id, source, 4) == {p: 500 for p in range(4)}
    registry, app = driver.telemetry.registry, driver.settings.app_id
    for p in range(4):
        assert registry.get_sample_value("txstream_records_in_total", {
            "app": app, "guarantee": "exactly-once", "topic": source, "partition": str(p)}) == 500
    assert registry.get_sample_value("txstream_records_out_total", {
        "app": app, "guarantee": "exactly-once", "topic": "", "partition": ""}) == len(out)


def test_a_narrow_transform_keeps_the_narrow_protocol(bootstrap_servers, make_topic, run_processor) -> None:
    from processors.passthrough import PassThrough

    source, sink = make_topic("n-in", partitions=2), make_topic("n-out", partitions=2)
    produce(bootstrap_servers, source, [(b"k", b"v")] * 10)
    driver = run_processor(PassThrough, inputs=[source], output=sink)
    assert any(m.startswith("protocol: narrow") for m in driver.events.messages()), driver.lines


def test_verify_catches_a_unit_published_twice(bootstrap_servers, make_topic, run_processor) -> None:
    driver, source, sink = _bucket_run(bootstrap_servers, make_topic, run_processor, 2000, output_units=2)
    out = read_all(bootstrap_servers, sink)
    copied = [r for r in out if r.headers["txstream.unit"] == b"1"][:3]
    # The same records again under another publication id: what a second commit of the unit would leave.
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap_servers})
    for r in copied:
        producer.produce(sink, r.value, r.key, headers=[(k, v if k != "txstream.publication" else b"another")
                                                        for k, v in r.headers.items()])
    assert producer.flush(30) == 0
    report = audit(bootstrap_servers, source, sink, app_id=driver.settings.app_id, count_field="count")
    assert not report.clean
    assert any("publications" in p for p in report.wide.problems), report.wide.problems
    assert any("add up to" in p for p in report.wide.problems), report.wide.problems


def test_a_nondeterministic_transform_is_refused_before_anything_is_read(bootstrap_servers, make_topic,
                                                                         run_processor) -> None:
    source, sink = make_topic("r-in", partitions=2), make_topic("r-out", partitions=2)
    produce(bootstrap_servers, source, [(b"k1", b"v")] * 10)
    with pytest.raises(TransformError, match=r"not deterministic.*rand"):
        run_processor(RandomBuckets, inputs=[source], output=sink)
    assert committed(bootstrap_servers, "none", source, 2) == {0: None, 1: None}
    assert read_all(bootstrap_servers, sink, timeout=5) == []


def test_customer_totals_example_with_a_dead_letter(bootstrap_servers, make_topic, run_processor) -> None:
    source, sink, dlq = make_topic("o-in", partitions=2), make_topic("ct-out", partitions=2), make_topic("ct-dlq")
    data = seed_orders(bootstrap_servers, source, 1500, garbage_at=(700,))
    driver = run_processor(CustomerTotals, inputs=[source], output=sink, dead_letter=dlq,
                           max_records_per_partition=300)
    assert driver.exit_code == 0
    codec = AvroCodec(TOTALS)
    got_orders: Counter = Counter()
    got_items: Counter = Counter()
    times = set()
    for r in read_all(bootstrap_servers, sink):
        value = codec.decode(r.value)
        assert r.key.decode() == value["customer_id"]
        got_orders[value["customer_id"]] += value["orders"]
        got_items[value["customer_id"]] += value["items"]
        times.add((r.headers["txstream.batch"], value["batch_time"]))
    valid = [o for o in data if o["amount"] > 0]
    assert got_orders == Counter(o["customer_id"] for o in valid)
    assert got_items == Counter({c: sum(o["items"] for o in valid if o["customer_id"] == c) for c in got_orders})
    assert len({b for b, _ in times}) == len(times)   # one batch time per batch
    dead = read_all(bootstrap_servers, dlq)
    assert [r.value for r in dead] == [b"\xff\xff not avro"] and dead[0].headers["txstream.dlq.stage"] == b"decode"
    assert sum(committed(bootstrap_servers, driver.settings.app_id, source, 2).values()) == 1501


def test_shuffled_join_and_dedupe_examples(bootstrap_servers, make_topic, run_processor) -> None:
    source = make_topic("o-in", partitions=2)
    data = seed_orders(bootstrap_servers, source, 600)
    produce(bootstrap_servers, source, [(o["customer_id"].encode(), avro_bytes(ORDER, o)) for o in data[:50]])
    joined = make_topic("j-out", partitions=2)
    driver = run_processor(OrdersWithCustomers, inputs=[source], output=joined, dead_letter=make_topic("dlq"))
    said = [m for m in driver.events.messages() if m.startswith("the transform is wide: it brings rows together by")]
    assert said and "customer_id" in said[0] and "#" not in said[0] and "Exchange" not in said[0], driver.lines
    values = [json.loads(r.value) for r in read_all(bootstrap_servers, joined)]
    assert Counter(v["id"] for v in values) == Counter([o["id"] for o in data] + [o["id"] for o in data[:50]])
    assert all(v["segment"] in ("retail", "business", "staff", "partner") for v in values)
    deduped = make_topic("d-out", partitions=2)
    run_processor(DedupeOrders, inputs=[source], output=deduped, dead_letter=make_topic("dlq"),
                  max_records_per_partition=10_000)
    keys = [r.key.decode() for r in read_all(bootstrap_servers, deduped)]
    assert sorted(keys) == sorted(o["id"] for o in data)   # one batch: the 50 repeats dropped


def test_a_second_instance_of_a_wide_app_is_refused(bootstrap_servers, make_topic) -> None:
    source, sink = make_topic("s-in", partitions=2), make_topic("s-out", partitions=2)
    seed_numbered(bootstrap_servers, source, 2, 1000)
    app = App(bootstrap_servers, source, sink, 2, processor=f"{WIDE}:BucketTotals",
                extra=["-X", "consumer.session.timeout.ms=6000"])
    try:
        first = app.start(until_caught_up=False)
        wait_until(lambda: (app.committed_total() or 0) >= 1000, 180, "the first instance to catch up", run=first)
        second = app.start(until_caught_up=False)
        code = second.wait(120)
        assert code != 0
        assert re.search(r"is a wide app and already runs .*one instance", second.tail(20).replace("\n", " ")), \
            second.tail(20)
        assert first.poll() is None, "the first instance must keep running"
        seed_numbered(bootstrap_servers, source, 2, 500, first=1000)
        wait_until(lambda: (app.committed_total() or 0) >= 1500, 120, "the first instance to go on", run=first)
        assert first.terminate() == 0
        # A clean stop leaves the group: the next start is not refused.
        assert app.start(until_caught_up=True).wait(180) == 0
        assert output_totals(read_all(bootstrap_servers, sink)) == expected_totals(range(1500))
    finally:
        app.destroy_all()


def test_a_replay_that_differs_is_caught_by_the_markers(bootstrap_servers, make_topic) -> None:
    """Allowed knowingly, a random transform is re-run after a kill between the units and the
    close: the replayed units see the markers and say that their rows differ."""
    source, sink = make_topic("x-in", partitions=2), make_topic("x-out", partitions=2)
    seed_numbered(bootstrap_servers, source, 2, 3000)
    app = App(bootstrap_servers, source, sink, 2, processor=f"{WIDE}:SlyRandomBuckets",
                extra=["--output-units", "2", "-X", "consumer.session.timeout.ms=6000"],
                faults="driver.before_close=kill@1")
    try:
        assert app.start().wait(300) != 0
        assert app.start().wait(300) == 0, app.log_text()[-3000:]
        messages = app.events().messages()
        assert any("re-running its logged plan" in m for m in messages), app.log_text()[-3000:]
        assert any(re.search(r"warning: batch 1: unit \d of batch 1 replayed with", m)
                   or re.search(r"note: batch 1: unit \d of batch 1 replayed with different values", m)
                   for m in messages), app.log_text()[-3000:]
    finally:
        app.destroy_all()


def test_a_plan_run_again_from_the_log_has_the_first_attempts_plan_id() -> None:
    """The log lists every partition of a re-run, with an empty range where the first attempt
    read nothing (an exhausted partition): the units' markers must still match its plan id."""
    from txstream.driver.wide_batch import WideBatch
    from txstream.task.spec import PartitionPlan

    first = WideBatch(7, 3, 1_000, [PartitionPlan("t", 0, 10, 20, 10, ""), PartitionPlan("t", 2, 5, 9, 5, "")], False)
    again = WideBatch(7, 3, 1_000, [PartitionPlan("t", 0, 10, 20, 10, ""), PartitionPlan("t", 1, 30, 30, 30, ""),
                                    PartitionPlan("t", 2, 5, 9, 5, "")], True)
    assert again.plan_id == first.plan_id
    assert WideBatch(7, 3, 1_000, [PartitionPlan("t", 0, 10, 21, 10, "")], True).plan_id != first.plan_id
