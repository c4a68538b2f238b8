"""The publishing protocol's edges: zombies fenced, stale plans publish nothing, read_committed input."""
from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from processors.passthrough import PassThrough
from tests.support.kafka import committed, produce, read_all
from tests.support.waiting import wait_until
from txstream.constants import ALREADY_DONE, COMMITTED, STALE_PLAN, batch_job_group
from txstream.driver.jobs import SparkJobs
from txstream.driver.membership import GroupMembership
from txstream.driver.narrow import NarrowBatches
from txstream.driver.pacing import Pacing
from txstream.driver.planning import transactional_id
from txstream.driver.specs import TaskSpecs
from txstream.errors import FencedError
from txstream.kafka.transactions import TransactionalPublisher
from txstream.settings import resolve
from txstream.task.spec import PartitionPlan


def test_a_zombie_publisher_cannot_commit_after_it_is_fenced(bootstrap_servers, make_topic) -> None:
    source, sink = make_topic("in"), make_topic("out")
    produce(bootstrap_servers, source, [(b"k", b"v")] * 10)
    group = f"zombie-{uuid.uuid4().hex[:6]}"
    member = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": group})
    config = {"bootstrap.servers": bootstrap_servers}
    tid = transactional_id(group, source, 0)
    zombie = TransactionalPublisher(config, tid, owner_dir=None, timeout_s=30)
    zombie.init()
    zombie.begin()
    zombie.producer.produce(sink, b"from the zombie")
    zombie.producer.flush(10)
    successor = TransactionalPublisher(config, tid, owner_dir=None, timeout_s=30)
    successor.init()  # fences the zombie and aborts its open transaction
    with pytest.raises(FencedError):
        zombie.send_offsets([TopicPartition(source, 0, 10)], member.consumer_group_metadata())
        zombie.commit()
    successor.begin()
    successor.producer.produce(sink, b"from the successor")
    successor.send_offsets([TopicPartition(source, 0, 10)], member.consumer_group_metadata())
    successor.commit()
    successor.close()
    member.close()
    assert [r.value for r in read_all(bootstrap_servers, sink)] == [b"from the successor"]
    assert committed(bootstrap_servers, group, source, 1) == {0: 10}


@pytest.fixture
def narrow_with_membership(bootstrap_servers, spark, make_topic):
    """The narrow protocol with a live group membership, for running single batches by hand."""
    source, sink = make_topic("in", partitions=2), make_topic("out")
    produce(bootstrap_servers, source, [(f"k{i}".encode(), f"v{i}".encode()) for i in range(200)])
    settings = resolve(PassThrough, bootstrap_servers=bootstrap_servers, app_id=f"plans-{uuid.uuid4().hex[:6]}",
                       inputs=[source], output=sink, master="local[2]")
    specs = TaskSpecs(settings)
    pacing = Pacing(settings.max_records_per_partition, settings.transaction_timeout_s, None, print)
    narrow = NarrowBatches(settings, specs, SparkJobs(spark, settings, specs, print), pacing, print)
    membership = GroupMembership(bootstrap_servers, settings.app_id, [source], lambda: None)
    try:
        wait_until(lambda: membership.poll(0.01) or membership.owned(), 30, "the assignment")
        narrow.start(membership)
        narrow.joined(membership)
        yield narrow, source, sink
    finally:
        membership.close()


def _plans(narrow: NarrowBatches, source: str, committed_as: dict[int, int | None],
           ends: dict[int, int]) -> list[PartitionPlan]:
    starts = {p: (c or 0) for p, c in committed_as.items()}
    return [PartitionPlan(source, p, starts[p], ends[p], committed_as[p],
                          transactional_id(narrow.settings.app_id, source, p)) for p in sorted(ends)]


def test_a_stale_plan_publishes_nothing_and_a_done_range_is_skipped(narrow_with_membership, bootstrap_servers) -> None:
    narrow, source, sink = narrow_with_membership
    ends = {p: hi for p, (_lo, hi) in
            {p: Consumer({"bootstrap.servers": bootstrap_servers, "group.id": "x"}).get_watermark_offsets(
                TopicPartition(source, p)) for p in (0, 1)}.items()}
    first = narrow.run_batch(_plans(narrow, source, {0: None, 1: None}, {0: 50, 1: 50}))
    assert [r["status"] for r in first.rows] == [COMMITTED, COMMITTED]
    published = len(read_all(bootstrap_servers, sink))
    assert published == 100
    # A plan made before that batch committed (it still believes nothing is committed) is stale.
    stale = narrow.run_batch(_plans(narrow, source, {0: None, 1: None}, ends))
    assert [r["status"] for r in stale.rows] == [STALE_PLAN, STALE_PLAN]
    # A retried plan whose range is already committed is recognised and skipped.
    again = narrow.run_batch(_plans(narrow, source, {0: None, 1: None}, {0: 50, 1: 50}))
    assert [r["status"] for r in again.rows] == [ALREADY_DONE, ALREADY_DONE]
    assert len(read_all(bootstrap_servers, sink)) == published
    assert committed(bootstrap_servers, narrow.settings.app_id, source, 2) == {0: 50, 1: 50}


@pytest.mark.parametrize("partitions", [1, 3], ids=["one-range", "a-slot-of-3-read-together"])
def test_aborted_transactions_and_control_records_in_the_input(partitions, bootstrap_servers, make_topic,
                                                               run_processor) -> None:
    """Also with the ranges of one slot read together (no lineage, task/reading.py
    read_ranges): every range ends at its planned end, over control records and
    aborted data alike."""
    source, sink = make_topic("in", partitions), make_topic("out")
    producer = Producer({"bootstrap.servers": bootstrap_servers, "transactional.id": f"mixed-{uuid.uuid4().hex}"})
    producer.init_transactions(30)
    expected = []
    for round_ in range(6):
        producer.begin_transaction()
        values = [f"r{round_}-{i}".encode() for i in range(40)]
        for n, value in enumerate(values):
            producer.produce(source, value, b"k", partition=(n + round_) % partitions)
        if round_ % 2:
            producer.flush(30)
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
            expected += values
    producer.begin_transaction()  # the ranges end in aborted data: the reader must not wait for it
    for p in range(partitions):
        producer.produce(source, b"aborted tail", b"k", partition=p)
    producer.flush(30)
    producer.abort_transaction(30)
    driver = run_processor(PassThrough, inputs=[source], output=sink, max_records_per_partition=70 // partitions,
                           **({} if partitions == 1 else {"lineage": False, "task_slots": 1}))
    outputs = [r.value for r in read_all(bootstrap_servers, sink)]
    assert outputs == expected if partitions == 1 else sorted(outputs) == sorted(expected)
    assert driver.totals["records_in"] == len(expected) == 120
    # Offsets include the aborted records and the control records: the group is at the very end.
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": "x"})
    highs = {p: consumer.get_watermark_offsets(TopicPartition(source, p))[1] for p in range(partitions)}
    assert committed(bootstrap_servers, driver.settings.app_id, source, partitions) == highs
    assert sum(highs.values()) > 6 * 40 + partitions


def test_a_slot_publishes_its_ranges_in_one_transaction_each_range_naming_its_source(
        narrow_with_membership, bootstrap_servers) -> None:
    """Two partitions in one slot (--task-slots 1): one producer, one transaction with both end
    offsets; each output record still names the partition and offset its input came from, and
    each range is its own publication."""
    from txstream.driver.slots import Slots

    narrow, source, sink = narrow_with_membership
    ends = {p: hi for p, (_lo, hi) in
            {p: Consumer({"bootstrap.servers": bootstrap_servers, "group.id": "x"}).get_watermark_offsets(
                TopicPartition(source, p)) for p in (0, 1)}.items()}
    plans = Slots(narrow.settings.app_id, 1).assign(_plans(narrow, source, {0: None, 1: None}, ends),
                                                     [(source, 0), (source, 1)])
    assert {p.transactional_id for p in plans} == {transactional_id(narrow.settings.app_id, source, 0)}
    report = narrow.run_batch(plans)
    assert [r["status"] for r in report.rows] == [COMMITTED, COMMITTED]
    assert [r["records_in"] for r in report.rows] == [ends[0], ends[1]]
    inputs = {(r.partition, r.offset): r.value for r in read_all(bootstrap_servers, source)}
    outputs = read_all(bootstrap_servers, sink)
    assert len(outputs) == sum(ends.values())
    publications: dict[int, set[bytes]] = {0: set(), 1: set()}
    for record in outputs:
        _topic, partition, offset, publication, _position = record.lineage
        assert inputs[(partition, offset)] == record.value, "an output names another input as its source"
        publications[partition].add(publication)
    assert all(len(p) == 1 for p in publications.values()) and publications[0] != publications[1]
    assert committed(bootstrap_servers, narrow.settings.app_id, source, 2) == ends


def test_slots_name_their_producer_after_a_partition_the_instance_owns() -> None:
    """The slot of a partition depends only on what the instance owns (fixed within a group
    generation); two instances owning disjoint partitions never share a transactional.id."""
    from txstream.driver.slots import Slots

    def plan(p: int) -> PartitionPlan:
        return PartitionPlan("t", p, 0, 10, None, "")

    slots = Slots("app", 2)
    everything = [("t", p) for p in range(5)]
    tids = [p.transactional_id for p in slots.assign([plan(p) for p in range(5)], everything)]
    assert tids == ["app-t-0", "app-t-1", "app-t-0", "app-t-1", "app-t-0"]
    # Only some partitions have data this batch: the others keep their slots all the same.
    assert [p.transactional_id for p in slots.assign([plan(3), plan(4)], everything)] == ["app-t-1", "app-t-0"]
    first = {p.transactional_id for p in slots.assign([plan(p) for p in (0, 1)], [("t", 0), ("t", 1)])}
    second = {p.transactional_id for p in slots.assign([plan(p) for p in (2, 3, 4)], [("t", 2), ("t", 3), ("t", 4)])}
    assert not first & second
    layout = Slots.layout(slots.assign([plan(p) for p in range(5)], everything))
    assert layout.width == 3 and layout.publishing_tasks == 2
    assert sorted(i for i in layout.layout if i >= 0) == list(range(5)) and layout.layout.count(-1) == 1


def test_with_the_owned_shape_every_batch_has_the_same_layout_size() -> None:
    """Slots.shape (every slot of the owned partitions): a batch with records in some partitions
    only is laid out as wide as one with records in all, each plan once, in its own slot's run."""
    from txstream.driver.slots import Slots

    def plan(p: int) -> PartitionPlan:
        return PartitionPlan("t", p, 0, 10, None, "")

    slots = Slots("app", 2)
    owned = [("t", p) for p in range(7)]
    sizes = set()
    for some in ([0, 1, 2, 3, 4, 5, 6], [3], [1, 5], [0, 2, 4, 6], [6, 1, 2]):
        plans = slots.assign([plan(p) for p in some], owned)
        assert slots.shape == {"app-t-0": 4, "app-t-1": 3}
        layout = Slots.layout(plans, slots.shape)
        sizes.add((len(layout.layout), layout.width))
        assert sorted(i for i in layout.layout if i >= 0) == list(range(len(plans)))
        for task, index in enumerate(layout.layout):
            if index >= 0:   # the slot's run holds only that slot's partitions
                assert plans[index].transactional_ids[0] == ["app-t-0", "app-t-1"][task // layout.width]
    assert sizes == {(8, 4)}
    # A plan outside the shape (not owned): the layout follows the plans.
    assert Slots.layout(slots.assign([plan(9)], owned), slots.shape).layout == (0,)


def test_a_slot_has_several_ids_and_claims_the_one_used_least_recently() -> None:
    """--producers-per-slot 3: a slot's ids are its first partition's and `~1`, `~2`; the id a
    task without a held producer initialises (the claim) is the one no batch used for longest."""
    from txstream.driver.slots import Slots

    def plan(p: int) -> PartitionPlan:
        return PartitionPlan("t", p, 0, 10, None, "")

    slots = Slots("app", 2, producers=3)
    owned = [("t", p) for p in range(4)]
    first = slots.assign([plan(p) for p in range(4)], owned)
    assert [p.pool for p in first[:2]] == [("app-t-0", "app-t-0~1", "app-t-0~2"), ("app-t-1", "app-t-1~1", "app-t-1~2")]
    assert [p.transactional_id for p in first] == ["app-t-0", "app-t-1", "app-t-0", "app-t-1"]
    assert Slots.layout(first).publishing_tasks == 2
    # Slot 0 published through its claim, slot 1 through a producer a worker held (`~2`).
    slots.note([{"transactional_id": "app-t-0"}, {"transactional_id": "app-t-1~2"}])
    assert [p.transactional_id for p in slots.assign([plan(0), plan(1)], owned)] == ["app-t-0~1", "app-t-1"]
    slots.note([{"transactional_id": "app-t-0~1"}, {"transactional_id": "app-t-1"}])
    assert [p.transactional_id for p in slots.assign([plan(0), plan(1)], owned)] == ["app-t-0~2", "app-t-1~1"]
    with pytest.raises(ValueError):
        Slots("app", 2, producers=0)


def test_clean_batches_publish_through_held_producers_with_no_task_failing(narrow_with_membership,
                                                                           bootstrap_servers) -> None:
    """Five batches by hand with 4 ids per slot: only the first fences all; no Spark task of any
    batch fails (a task that raised would be retried as a copy that fences all, hiding the
    failure behind a correct result); each range once, through the slot's ids only."""
    from txstream.driver.slots import Slots, slot_pool

    narrow, source, sink = narrow_with_membership
    probe = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": "x"})
    ends = {p: probe.get_watermark_offsets(TopicPartition(source, p))[1] for p in (0, 1)}
    probe.close()
    owned = [(source, 0), (source, 1)]
    narrow.slots = slots = Slots(narrow.settings.app_id, 2, producers=4)
    used: set[str] = set()
    for step in range(5):
        bounds = {p: (ends[p] * step // 5, ends[p] * (step + 1) // 5) for p in (0, 1)}
        plans = slots.assign([PartitionPlan(source, p, lo, hi, lo or None, "") for p, (lo, hi) in bounds.items()],
                             owned)
        fence_all = narrow.fence_all_next   # what the batch's tasks are told
        assert fence_all == (step == 0), f"batch {step + 1}: fence all {fence_all}"
        report = narrow.run_batch(plans)
        assert [r["status"] for r in report.rows] == [COMMITTED, COMMITTED], report.rows
        used |= {r["transactional_id"] for r in report.rows}
        tracker = narrow.jobs.spark.sparkContext.statusTracker()
        for job in tracker.getJobIdsForGroup(batch_job_group(narrow.settings.app_id, narrow.batch_id)):
            for stage in tracker.getJobInfo(job).stageIds:
                info = tracker.getStageInfo(stage)
                assert info is not None and info.numFailedTasks == 0, f"batch {step + 1}: a task failed"
    pools = set(slot_pool(transactional_id(narrow.settings.app_id, source, 0), 4)) | set(
        slot_pool(transactional_id(narrow.settings.app_id, source, 1), 4))
    assert used <= pools, used
    assert len(read_all(bootstrap_servers, sink)) == sum(ends.values())
    assert committed(bootstrap_servers, narrow.settings.app_id, source, 2) == ends


class _TagsReadingPartition(PassThrough):
    """Each output value says which Spark partition its input row was read in."""

    def transform(self, batch):
        from pyspark.sql import functions as F

        return batch.select("key", F.concat(F.col("value"), F.lit(b"|"), F.spark_partition_id().cast("string")
                                            .cast("binary")).alias("value"), "offset")


class _TagsReadingPartitionThroughAJoin(PassThrough):
    def transform(self, batch):
        from pyspark.sql import functions as F

        static = batch.sparkSession.createDataFrame([(b"k", b"|")], "key binary, sep binary")
        return batch.join(F.broadcast(static), "key").select(
            "key", F.concat("value", "sep", F.spark_partition_id().cast("string").cast("binary")).alias("value"))


@pytest.mark.parametrize("lineage", [True, False], ids=["lineage", "no-lineage"])
def test_a_slot_reads_its_ranges_in_one_spark_partition(lineage, bootstrap_servers, make_topic,
                                                        run_processor) -> None:
    """8 partitions on 2 slots: a slot's 4 ranges are read in one Spark partition (one Python
    hand-off instead of 4: task/reading.py range_frame). With lineage the rows carry their range
    through the transform, which drops every other input column but `offset` (driver/range_tag.py):
    each record names the partition and offset it came from, and each range is its own
    publication. Either way every record is published once and the offsets end at the end of
    every partition."""

    source, sink = make_topic("in", partitions=8), make_topic("out", partitions=3)
    values = {f"v{p}-{i}".encode(): (p, i) for p in range(8) for i in range(30)}
    for p in range(8):
        produce(bootstrap_servers, source, [(b"k", v) for v, (vp, _) in values.items() if vp == p], partition=p)
    driver = run_processor(_TagsReadingPartition, inputs=[source], output=sink, lineage=lineage,
                           max_records_per_partition=20)
    assert driver.exit_code == 0, driver.lines
    outputs = read_all(bootstrap_servers, sink)
    read_in: dict[int, set[int]] = {}
    publications: dict[bytes, set[int]] = {}
    for record in outputs:
        value, _, spark_partition = record.value.rpartition(b"|")
        source_partition, source_offset = values[value]
        read_in.setdefault(source_partition, set()).add(int(spark_partition))
        if lineage:
            assert record.lineage.source == (source, source_partition, source_offset)
            publications.setdefault(record.lineage.publication, set()).add(source_partition)
        else:
            assert not record.headers
    assert sorted(r.value.rpartition(b"|")[0] for r in outputs) == sorted(values), "lost or repeated records"
    assert set().union(*read_in.values()) == {0, 1}, read_in
    if lineage:   # one publication per range and batch: never two source partitions in one
        assert all(len(p) == 1 for p in publications.values()), publications
        assert len(publications) >= 16, publications   # at least 2 batches (20 records per partition each)
    assert committed(bootstrap_servers, driver.settings.app_id, source, 8) == {p: 30 for p in range(8)}


def _unchanged(batches):
    yield from batches


class _TagsReadingPartitionAfterItsOwnMapInArrow(_TagsReadingPartition):
    def transform(self, batch):
        return super().transform(batch.select("key", "value", "offset").mapInArrow(
            _unchanged, "key binary, value binary, offset long"))


@pytest.mark.parametrize("lineage", [True, False], ids=["lineage", "no-lineage"])
@pytest.mark.parametrize("processor", ["join", "mapInArrow"])
def test_a_join_or_a_partition_map_reads_one_partition_per_range(
        processor, lineage, bootstrap_servers, make_topic, run_processor) -> None:
    """A plan with a second input (here a broadcast table) could mix other partitions' rows into
    a slot's, and a transform's own mapInArrow may count on a Spark partition holding one Kafka
    partition's range (nor can either carry a row's range tag): such runs read one Spark
    partition per range (the rows are then checked by the range they name), and publish every
    record once."""
    source, sink = make_topic("in", partitions=8), make_topic("out")
    values = [f"v{p}-{i}".encode() for p in range(8) for i in range(10)]
    for p in range(8):
        produce(bootstrap_servers, source, [(b"k", v) for v in values[p * 10:(p + 1) * 10]], partition=p)
    cls = _TagsReadingPartitionThroughAJoin if processor == "join" else _TagsReadingPartitionAfterItsOwnMapInArrow
    driver = run_processor(cls, inputs=[source], output=sink, lineage=lineage)
    assert driver.exit_code == 0, driver.lines
    outputs = read_all(bootstrap_servers, sink)
    assert sorted(r.value.rpartition(b"|")[0] for r in outputs) == sorted(values)
    assert {int(r.value.rpartition(b"|")[2]) for r in outputs} == set(range(8))
    assert committed(bootstrap_servers, driver.settings.app_id, source, 8) == {p: 10 for p in range(8)}


class _StampsEachCall(PassThrough):
    """A transform whose plan differs at every call: the value ends with the call's number."""

    calls = 0
    transform_each_batch = True

    def transform(self, batch):
        from pyspark.sql import functions as F

        type(self).calls += 1
        return super().transform(batch).withColumn(
            "value", F.concat(F.col("value"), F.lit(f"|{type(self).calls}").cast("binary")))


class _StampsWhenBuilt(_StampsEachCall):
    calls = 0
    transform_each_batch = False


@pytest.mark.parametrize("processor", [PassThrough, _StampsWhenBuilt, _StampsEachCall],
                         ids=["same-plan", "stamps-per-job", "plan-per-call"])
def test_a_batch_job_is_built_once_and_run_for_the_next_batches(processor, bootstrap_servers,
                                                                make_topic, run_processor) -> None:
    """The ranges travel with each batch's Spark job (task/spec.py), so the driver builds the
    job once, calling the transform, and runs it batch after batch (driver/jobs.py narrow_job).
    With `transform_each_batch` every batch gets its own job and transform call: no batch runs an
    older batch's plan. Either way each record is published once, its lineage naming its own
    partition and offset, and the offsets end at the end."""

    source, sink = make_topic("in", partitions=4), make_topic("out", partitions=2)
    values = {f"v{p}-{i}".encode(): (p, i) for p in range(4) for i in range(60)}
    for p in range(4):
        produce(bootstrap_servers, source, [(b"k", v) for v, (vp, _) in values.items() if vp == p], partition=p)
    driver = run_processor(processor, inputs=[source], output=sink, max_records_per_partition=10,
                           first_batch_records=0)
    assert driver.exit_code == 0, driver.lines
    batches = driver.totals["batches"]
    assert batches >= 6, driver.lines
    outputs = read_all(bootstrap_servers, sink)
    stamps: set[bytes] = set()
    for record in outputs:
        value = record.value
        if processor is not PassThrough:
            value, _, stamp = value.rpartition(b"|")
            stamps.add(stamp)
        assert record.lineage.source == (source, *values[value])
    assert len(outputs) == len(values), "lost or repeated records\n" + "\n".join(driver.lines)
    assert {r.lineage.source[1:] for r in outputs} == set(values.values())
    if processor is not _StampsEachCall:
        # One job for the run: the Arrow batch settings that change after the first batch
        # (spark/arrow_batches.py) are read by Spark each time the job runs.
        assert driver.jobs_built == 1, (driver.jobs_built, batches)
        assert len(stamps) == (1 if processor is _StampsWhenBuilt else 0), stamps   # one call per job built
    else:
        assert driver.jobs_built == batches and len(stamps) == batches, (driver.jobs_built, batches, stamps)
    assert committed(bootstrap_servers, driver.settings.app_id, source, 4) == {p: 60 for p in range(4)}


class _CountsCalls(PassThrough):
    calls = 0

    def transform(self, batch):
        type(self).calls += 1
        return super().transform(batch)


@pytest.mark.parametrize("partitions, calls", [(4, 1), (1, 2)], ids=["four-partitions", "one-partition"])
def test_the_transform_is_applied_once_before_the_first_output(partitions, calls, bootstrap_servers, make_topic,
                                                               run_processor) -> None:
    """Choosing the protocol needs the transform's plan, and so does the first batch's job: with
    two slots over the owned partitions the driver builds the job first and chooses on its plan
    (driver/choice.py choose_protocol, driver/narrow.py first_job), so the transform is applied once in
    the run. Over one partition the job's source is a single Spark partition, where even a groupBy plans no shuffle, so a
    dry frame of two ranges chooses, and the job applies the transform again. Either way one
    job serves every batch and every record is published once."""
    source, sink = make_topic("once-in", partitions=partitions), make_topic("once-out", partitions=2)
    values = [f"v{p}-{i}".encode() for p in range(partitions) for i in range(40)]
    for p in range(partitions):
        produce(bootstrap_servers, source, [(b"k", v) for v in values[40 * p:40 * (p + 1)]], partition=p)
    _CountsCalls.calls = 0
    driver = run_processor(_CountsCalls, inputs=[source], output=sink, max_records_per_partition=10,
                           first_batch_records=0)
    assert driver.exit_code == 0, driver.lines
    assert driver.totals["batches"] >= 4, driver.lines
    assert any(m.startswith("protocol: narrow") for m in driver.events.messages()), driver.lines
    assert (_CountsCalls.calls, driver.jobs_built) == (calls, 1), (_CountsCalls.calls, driver.jobs_built)
    assert sorted(r.value for r in read_all(bootstrap_servers, sink)) == sorted(values)
    assert committed(bootstrap_servers, driver.settings.app_id, source, partitions) == {
        p: 40 for p in range(partitions)}


def test_batches_with_records_in_different_partitions_keep_one_job(bootstrap_servers, make_topic,
                                                                   run_processor) -> None:
    """A sparse stream's batches each have records in another set of partitions; the layout
    keeps the owned partitions' shape (driver/slots.py), so they run one job after the first
    batch's, and every record is published once, its lineage naming its own partition and offset."""
    source, sink = make_topic("sparse-in", partitions=8), make_topic("sparse-out", partitions=2)
    values = {}
    for p in range(8):
        records = [f"v{p}-{i}".encode() for i in range(10 * (p + 1))]   # partition p has p+1 batches
        values.update({v: (p, i) for i, v in enumerate(records)})
        produce(bootstrap_servers, source, [(b"k", v) for v in records], partition=p)
    driver = run_processor(PassThrough, inputs=[source], output=sink, max_records_per_partition=10,
                           first_batch_records=0)
    assert driver.exit_code == 0, driver.lines
    assert driver.totals["batches"] == 8, driver.lines
    assert driver.jobs_built == 1, (driver.jobs_built, driver.lines)
    outputs = read_all(bootstrap_servers, sink)
    assert len(outputs) == len(values), "lost or repeated records\n" + "\n".join(driver.lines)
    assert {r.value: r.lineage.source for r in outputs} == {v: (source, *pi) for v, pi in values.items()}
    assert committed(bootstrap_servers, driver.settings.app_id, source, 8) == {p: 10 * (p + 1) for p in range(8)}


def test_records_that_vary_in_size_between_batches_keep_one_job(bootstrap_servers, make_topic,
                                                                run_processor) -> None:
    """The Arrow batch size after a batch follows its largest record (spark/arrow_batches.py),
    and is not part of the batch's job: after a first batch whose largest record is 7.8 KB,
    batches whose largest are 5.9 to 7.4 KB, each a different one, run one job, and every record
    is published once."""
    source, sink = make_topic("sizes-in", partitions=4), make_topic("sizes-out", partitions=2)
    values = {}
    for p in range(4):
        sizes = [7_800] + [5_200 + (i * 37 + p * 11) % 2_600 for i in range(1, 60)]
        records = [f"{p}-{i}-".encode() + b"x" * size for i, size in enumerate(sizes)]
        values.update({v: (p, i) for i, v in enumerate(records)})
        produce(bootstrap_servers, source, [(b"k", v) for v in records], partition=p)
    driver = run_processor(PassThrough, inputs=[source], output=sink, max_records_per_partition=10,
                           first_batch_records=0)
    assert driver.exit_code == 0, driver.lines
    assert driver.totals["batches"] >= 6, driver.lines
    assert driver.jobs_built == 1, (driver.jobs_built, driver.totals["batches"])
    outputs = read_all(bootstrap_servers, sink)
    assert sorted(r.value for r in outputs) == sorted(values)
    assert committed(bootstrap_servers, driver.settings.app_id, source, 4) == {p: 60 for p in range(4)}


def _stamp_batch_rows(batches):
    """Each value ends with the number of rows of the Arrow batch Spark handed it over in."""
    import pyarrow as pa

    for batch in batches:
        stamp = b"|%d" % batch.num_rows
        values = [v + stamp for v in batch.column("value").to_pylist()]
        yield pa.RecordBatch.from_arrays([batch.column("key"), pa.array(values, pa.binary()), batch.column("offset")],
                                         names=["key", "value", "offset"])


class _StampsArrowBatchRows(PassThrough):
    def transform(self, batch):
        return batch.select("key", "value", "offset").mapInArrow(_stamp_batch_rows,
                                                                 "key binary, value binary, offset long")


def test_the_job_built_once_takes_the_arrow_batch_size_each_batch_learned(bootstrap_servers, make_topic,
                                                                          run_processor) -> None:
    """The driver's one job for the run (driver/jobs.py) gets the Arrow batch size the batch before
    learned (spark/arrow_batches.py) when it runs: 160 KB records, 40 per batch. The first batch
    (Spark's 64 MB check, 10,000 rows) hands the transform's own mapInArrow all 40 at once; after
    it, a batch holds 64 MB over 16 times 160 KB, 26 rows, in the same job."""
    source, sink = make_topic("big-in"), make_topic("big-out")
    values = [b"%03d-" % i + b"x" * 160_000 for i in range(80)]
    produce(bootstrap_servers, source, [(b"k", v) for v in values])
    driver = run_processor(_StampsArrowBatchRows, inputs=[source], output=sink, max_records_per_partition=40,
                           first_batch_records=0)
    assert driver.exit_code == 0, driver.lines
    assert driver.totals["batches"] == 2 and driver.jobs_built == 1, (driver.jobs_built, driver.lines)
    rows_by_batch: dict[int, set[int]] = {}
    published = []
    for record in read_all(bootstrap_servers, sink):
        value, _, rows = record.value.rpartition(b"|")
        published.append(value)
        rows_by_batch.setdefault(record.lineage.source[2] // 40, set()).add(int(rows))
    assert sorted(published) == sorted(values)
    assert rows_by_batch == {0: {40}, 1: {26, 14}}, rows_by_batch
    assert committed(bootstrap_servers, driver.settings.app_id, source, 1) == {0: 80}


@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once"])
def test_clean_batches_plan_from_the_ends_they_committed(guarantee, bootstrap_servers, make_topic,
                                                         run_processor) -> None:
    """After a clean batch the driver plans the next from the ends that batch committed, without
    reading the group's offsets again (driver/membership.py `remember`): one stable read for a
    run of batches, and every record published once, the offsets at the ends."""
    source, sink = make_topic("known-in", partitions=4), make_topic("known-out", partitions=2)
    values = [f"v{p}-{i}".encode() for p in range(4) for i in range(30)]
    for p in range(4):
        produce(bootstrap_servers, source, [(b"k", v) for v in values if v.startswith(f"v{p}-".encode())],
                partition=p)
    driver = run_processor(PassThrough, inputs=[source], output=sink, max_records_per_partition=10,
                           first_batch_records=0, guarantee=guarantee)
    assert driver.exit_code == 0, driver.lines
    assert driver.totals["batches"] == 3, driver.lines
    assert driver.stable_reads == 1, driver.lines
    assert sorted(r.value for r in read_all(bootstrap_servers, sink)) == sorted(values)
    assert committed(bootstrap_servers, driver.settings.app_id, source, 4) == {p: 30 for p in range(4)}


def test_remembered_offsets_hold_only_while_the_assignment_is_unchanged(bootstrap_servers, make_topic) -> None:
    """GroupMembership answers with offsets it read or was told are committed only until its
    assignment changes (a rebalance), a batch fails (forget) or a caller asks for a fresh read;
    without `remember` (the wide driver) every call reads."""
    source = make_topic("remember-in", partitions=2)
    group = f"remember-{uuid.uuid4().hex[:6]}"
    member = GroupMembership(bootstrap_servers, group, [source], lambda: None, remember=True)
    plain = GroupMembership(bootstrap_servers, f"{group}-plain", [source], lambda: None)
    other = None
    try:
        for m in (member, plain):
            wait_until(lambda m=m: (m.poll(0.1), len(m.owned()) == 2)[1], 60, "the assignment", every=0)
        owned = member.owned()
        member.commit([TopicPartition(source, 0, 5), TopicPartition(source, 1, 7)])
        assert member.committed(owned) == {(source, 0): 5, (source, 1): 7}
        assert member.stable_reads == 1
        member.commit([TopicPartition(source, 0, 9), TopicPartition(source, 1, 11)])
        member.remember({(source, 0): 9, (source, 1): 11}, member.generation_changes)
        assert member.committed(owned) == {(source, 0): 9, (source, 1): 11}
        assert member.stable_reads == 1   # answered from what it was told
        assert member.committed(owned, fresh=True) == {(source, 0): 9, (source, 1): 11}
        assert member.stable_reads == 2
        member.forget()
        assert member.committed(owned) == {(source, 0): 9, (source, 1): 11}
        assert member.stable_reads == 3
        # Told under an older assignment: not taken.
        member.remember({(source, 0): 1, (source, 1): 1}, member.generation_changes - 1)
        assert member.committed(owned) == {(source, 0): 9, (source, 1): 11}
        assert member.stable_reads == 4
        # A second member joins: the rebalance moves a partition, and the next answer is read.
        changes = member.generation_changes
        other = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": group,
                          "partition.assignment.strategy": "cooperative-sticky"})
        other.subscribe([source])

        def rebalanced() -> bool:
            member.poll(0.05)
            other.poll(0.05)
            return member.generation_changes > changes and len(member.owned()) == 1

        wait_until(rebalanced, 60, "the rebalance", every=0)
        mine = member.owned()
        assert member.committed(mine) == {(mine[0].topic, mine[0].partition): 9 if mine[0].partition == 0 else 11}
        assert member.stable_reads == 5
        for _ in range(3):
            plain.committed(plain.owned())
        assert plain.stable_reads == 3
    finally:
        if other is not None:
            other.close()
        member.close()
        plain.close()
