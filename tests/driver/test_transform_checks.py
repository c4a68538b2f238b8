"""What txstream refuses before reading anything, with errors that name the problem."""
from __future__ import annotations

import uuid

import pytest
from pyspark.sql import functions as F

from processors.enrich_orders import EnrichOrders
from processors.passthrough import PassThrough
from tests.support.kafka import produce
from txstream.driver.loop import TransformError
from txstream.serde.avro import SchemaError


class NoValue(PassThrough):
    def transform(self, batch):
        return batch.select("key", F.col("value").alias("payload"))


class WrongType(EnrichOrders):
    def transform(self, batch):
        out = super().transform(batch)
        return out.withColumn("value", F.col("value").withField("amount_cents", F.lit("lots")))


class NothingEver(PassThrough):
    def transform(self, batch):
        return batch.select("key", "value").where(F.lit(False))


class MissingField(EnrichOrders):
    def transform(self, batch):
        return batch.select("key", F.struct(F.col("value.id").alias("id")).alias("value"))


@pytest.fixture
def topics(bootstrap_servers, make_topic):
    source, sink = make_topic("in"), make_topic("out")
    produce(bootstrap_servers, source, [(b"k", b"v")] * 5)
    return source, sink, make_topic("dlq")


def test_a_plan_that_turns_wide_in_a_narrow_run_is_refused(spark) -> None:
    """The protocol is chosen at start (docs/wide-transforms.md); a narrow run whose plan later
    grows a shuffle (a join's static side outgrew the broadcast threshold) stops, saying why."""
    from txstream.driver.checks import check_narrow

    frame = spark.range(0, 10, 1, 2).groupBy(F.col("id") % 2).count()
    with pytest.raises(TransformError, match=r"turned wide.*Exchange.*restart it"):
        check_narrow(frame)
    check_narrow(spark.range(0, 10, 1, 2).select((F.col("id") * 2).alias("value")))


def test_output_without_value_names_the_columns(topics, run_processor) -> None:
    source, sink, _ = topics
    with pytest.raises(TransformError, match=r"no `value` column \(it has: key, payload\)"):
        run_processor(NoValue, inputs=[source], output=sink)


def test_struct_not_matching_the_avro_schema_names_the_field(topics, run_processor) -> None:
    source, sink, dlq = topics
    with pytest.raises(SchemaError, match=r"`value.amount_cents` is string, the schema wants long"):
        run_processor(WrongType, inputs=[source], output=sink, dead_letter=dlq)
    with pytest.raises(SchemaError, match=r"`value.customer_id` is required"):
        run_processor(MissingField, inputs=[source], output=sink, dead_letter=dlq)


def test_missing_output_topic_is_a_clear_error(topics, run_processor) -> None:
    source, _, _ = topics
    with pytest.raises(TransformError, match=r"output topic 'no-such-topic' does not exist.*`txstream topics ensure"):
        run_processor(PassThrough, inputs=[source], output="no-such-topic")


def test_a_transform_spark_optimises_to_reading_nothing_is_refused(topics, run_processor, admin) -> None:
    """`where(lit(False))`: Spark drops the input from the plan, so no task reads, publishes or
    commits anything. The run must stop saying so, not claim it caught up with nothing committed."""
    from txstream.kafka.lookups import committed_offsets

    source, sink, dlq = topics
    app_id = f"nothing-ever-{uuid.uuid4().hex[:8]}"
    with pytest.raises(TransformError, match=r"reads none of the batch's input"):
        run_processor(NothingEver, inputs=[source], output=sink, dead_letter=dlq, app_id=app_id)
    assert not any(committed_offsets(admin, app_id, None, stable=True, timeout=30).values())


def test_a_transform_that_fails_its_check_leaves_a_running_group_alone(bootstrap_servers, make_topic, topics,
                                                                        run_processor) -> None:
    """Issue 51: a newcomer's bad transform is refused before it joins a group with members, so a
    running instance (here a consumer with the driver's assignment strategy, holding both
    partitions; any rebalance calls its on_assign, a join takes a partition away) sees none. The
    processor's setup, where Spark's start-up would be, gives a join the driver made 5 s (ten of
    the member's heartbeats) to reach the member; a driver that joins early fails the test."""
    import threading

    from confluent_kafka import Consumer

    from tests.support.waiting import wait_until

    _, sink, dlq = topics
    source = make_topic("in2", 2)
    group = f"running-{uuid.uuid4().hex[:8]}"
    changes: list[str] = []
    rebalanced = threading.Event()

    def revoked(_consumer, partitions) -> None:  # noqa: ANN001
        changes.append(f"revoked {len(partitions)}")
        rebalanced.set()

    class SlowToFail(MissingField):
        def setup(self, spark) -> None:  # noqa: ANN001
            rebalanced.wait(5)

    member = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": group, "enable.auto.commit": False,
                       "heartbeat.interval.ms": 500, "partition.assignment.strategy": "cooperative-sticky"})
    member.subscribe([source], on_assign=lambda _c, ps: changes.append(f"assigned {len(ps)}"), on_revoke=revoked)
    stop = threading.Event()

    def poll() -> None:   # a live member heartbeats and takes part in any rebalance
        while not stop.is_set():
            member.poll(0.1)

    poller = threading.Thread(target=poll, daemon=True)
    try:
        poller.start()
        wait_until(lambda: changes == ["assigned 2"], 60, "the running member's assignment")
        with pytest.raises(SchemaError, match=r"`value.customer_id` is required"):
            run_processor(SlowToFail, inputs=[source], output=sink, dead_letter=dlq, app_id=group)
        assert changes == ["assigned 2"], changes
    finally:
        stop.set()
        poller.join(10)
        member.close()
