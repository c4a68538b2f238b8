"""A stream joined to a table kept from a compacted topic (Processor.tables, issue 61): the latest
value per key, tombstones deleting, each batch joined against the version it was planned with,
and a wide batch's re-run against the version its plan logged."""
from __future__ import annotations

import uuid

import pytest

from tests.support.kafka import produce, read_all
from tests.support.running import App
from tests.support.table_processors import EnrichFromTable, RunningNames
from txstream import Table
from txstream.errors import SettingsError, TableRecordError, TransformError

pytestmark = pytest.mark.integration


def _table(make_topic, partitions: int = 2) -> str:
    return make_topic("customers", partitions=partitions, **{"cleanup.policy": "compact"})


def _enricher(topic: str, how: str = "left") -> type:
    return type(f"Enrich{uuid.uuid4().hex[:6]}", (EnrichFromTable,), {"tables": {"customers": Table(topic)}, "how": how})


def _values(bootstrap: str, topic: str) -> list[bytes]:
    return sorted(r.value for r in read_all(bootstrap, topic))


def test_each_batch_joins_the_table_as_of_its_version(bootstrap_servers, make_topic, run_processor) -> None:
    table, orders, out = _table(make_topic), make_topic("orders", partitions=2), make_topic("enriched", partitions=2)
    # The latest value per key wins, a tombstone deletes its key.
    produce(bootstrap_servers, table, [(b"c1", b"Ann"), (b"c2", b"Bob"), (b"c3", b"Cy"), (b"c2", b"Bobby")])
    produce(bootstrap_servers, table, [(b"c3", None)])
    produce(bootstrap_servers, orders, [(b"c1", b"o1"), (b"c2", b"o2"), (b"c3", b"o3"), (b"c4", b"o4")])
    driver = run_processor(_enricher(table), inputs=[orders], output=out)
    assert driver.exit_code == 0, "\n".join(driver.lines)
    assert _values(bootstrap_servers, out) == [b"o1=Ann", b"o2=Bobby", b"o3=-", b"o4=-"], driver.lines
    # Each batch's event names the version it joined: the table's 5 records, over its 2 partitions.
    assert driver.events.batches and all(sum(b["tables"]["customers"]) == 5 for b in driver.events.batches)

    # The table changes while nothing is read; the next run's batches see the new version, and
    # what was published stays as it was.
    produce(bootstrap_servers, table, [(b"c1", b"Annie"), (b"c4", b"Dee"), (b"c2", None)])
    produce(bootstrap_servers, orders, [(b"c1", b"o5"), (b"c4", b"o6"), (b"c2", b"o7")])
    again = run_processor(_enricher(table), inputs=[orders], output=out, app_id=driver.settings.app_id)
    assert again.exit_code == 0, "\n".join(again.lines)
    assert _values(bootstrap_servers, out) == [b"o1=Ann", b"o2=Bobby", b"o3=-", b"o4=-", b"o5=Annie", b"o6=Dee",
                                               b"o7=-"]


def test_an_inner_join_drops_the_rows_without_a_partner(bootstrap_servers, make_topic, run_processor) -> None:
    table, orders, out = _table(make_topic, 1), make_topic("orders"), make_topic("enriched")
    produce(bootstrap_servers, table, [(b"c1", b"Ann"), (b"c2", b"Bob")])
    produce(bootstrap_servers, table, [(b"c2", None)])
    produce(bootstrap_servers, orders, [(b"c1", b"o1"), (b"c2", b"o2"), (b"c9", b"o3")])
    driver = run_processor(_enricher(table, "inner"), inputs=[orders], output=out)
    assert driver.exit_code == 0, "\n".join(driver.lines)
    assert _values(bootstrap_servers, out) == [b"o1=Ann"]


def test_a_table_topic_that_is_an_input_or_missing_is_refused(bootstrap_servers, make_topic, run_processor) -> None:
    orders, out = make_topic("orders"), make_topic("enriched")
    with pytest.raises(SettingsError, match="also an input topic"):
        run_processor(_enricher(orders), inputs=[orders], output=out)
    with pytest.raises(TransformError, match="table topic 'no-such-table-.*' does not exist"):
        run_processor(_enricher(f"no-such-table-{uuid.uuid4().hex[:6]}"), inputs=[orders], output=out)


def test_a_wide_batch_run_again_joins_the_version_its_plan_logged(bootstrap_servers, make_topic) -> None:
    table, orders, out = _table(make_topic), make_topic("orders", partitions=2), make_topic("names", partitions=2)
    produce(bootstrap_servers, table, [(b"c1", b"Ann"), (b"c2", b"Bob")])
    produce(bootstrap_servers, orders, [(b"c1", b"o1"), (b"c1", b"o2"), (b"c2", b"o3")])
    app = App(bootstrap_servers, orders, out, 2, processor="tests.support.table_processors:NamesPerBatch",
              faults="driver.after_plan_log=kill@1", extra=["--table", f"customers={table}"])
    try:
        first = app.start().wait(240)
        assert first in (-9, 137), app.runs[-1].tail()   # killed once its first batch's plan was logged
        # Changed after the plan was logged: the batch's re-run must not see it.
        produce(bootstrap_servers, table, [(b"c1", b"Annie"), (b"c2", None)])
        assert app.start().wait(240) == 0, app.runs[-1].tail()
        assert app.runs[-1].events().said("re-running its logged plan")
        assert _values(bootstrap_servers, out) == [b"Ann=2", b"Bob=1"]
    finally:
        app.destroy_all()


def test_a_stateful_operator_after_the_join_counts_by_the_tables_values(bootstrap_servers, make_topic,
                                                                        run_processor) -> None:
    table, orders, out = _table(make_topic), make_topic("orders", partitions=2), make_topic("names", partitions=2)
    produce(bootstrap_servers, table, [(b"c1", b"Ann"), (b"c2", b"Bob")])
    produce(bootstrap_servers, orders, [(b"c1", b"o1"), (b"c1", b"o2"), (b"c2", b"o3"), (b"c3", b"o4")])
    cls = type("Names", (RunningNames,), {"tables": {"customers": Table(table)}})
    driver = run_processor(cls, inputs=[orders], output=out)
    assert driver.exit_code == 0, "\n".join(driver.lines)
    produce(bootstrap_servers, table, [(b"c2", b"Ann"), (b"c1", None)])
    produce(bootstrap_servers, orders, [(b"c1", b"o5"), (b"c2", b"o6")])
    again = run_processor(cls, inputs=[orders], output=out, app_id=driver.settings.app_id)
    assert again.exit_code == 0, "\n".join(again.lines)
    # Update mode: each batch's changed counts; the state carries across runs.
    assert _values(bootstrap_servers, out) == [b"-=1", b"-=2", b"Ann=2", b"Ann=3", b"Bob=1"]


def test_the_command_line_names_a_tables_topic(bootstrap_servers) -> None:
    from tests.support.running import resolve_settings

    settings = resolve_settings(EnrichFromTable, bootstrap_servers, inputs=["orders"],
                                table_topics={"customers": "customers-v2"})
    assert [(t.name, t.topic) for t in settings.tables] == [("customers", "customers-v2")]
    with pytest.raises(SettingsError, match="declares no table 'people'"):
        resolve_settings(EnrichFromTable, bootstrap_servers, inputs=["orders"], table_topics={"people": "p"})


def test_a_table_record_that_does_not_decode_stops_the_run_naming_it(bootstrap_servers, make_topic,
                                                                     run_processor) -> None:
    from tests.support.kafka import avro_bytes
    from tests.support.table_processors import EnrichFromAvroTable
    from txstream.serde.avro import load_schema

    customer = load_schema("schemas/customer.avsc")
    table, orders, out = _table(make_topic, 1), make_topic("orders"), make_topic("enriched")
    produce(bootstrap_servers, table, [(b"c1", avro_bytes(customer, {"customer_id": "c1", "name": "Ann", "tier": "x"})),
                                       (b"c2", b"\xff\xff not avro")])
    produce(bootstrap_servers, orders, [(b"c1", b"o1")])
    cls = type("AvroTable", (EnrichFromAvroTable,), {"tables": {"customers": Table(table, value_schema=
                                                                                   "schemas/customer.avsc")}})
    with pytest.raises(TableRecordError, match=rf"table 'customers' cannot decode its record {table}\[0\] at offset 1"):
        run_processor(cls, inputs=[orders], output=out, dead_letter=make_topic("dlq"))
    assert read_all(bootstrap_servers, out) == []   # nothing joined against a table missing a key


def test_a_table_given_partitions_during_the_run_stops_it_saying_so(bootstrap_servers, make_topic, spark,
                                                                    admin) -> None:
    from confluent_kafka.admin import NewPartitions

    from tests.support.running import DriverThread, resolve_settings
    from tests.support.waiting import wait_until
    from txstream.errors import TableChangedError

    table, orders, out = _table(make_topic, 1), make_topic("orders"), make_topic("enriched")
    produce(bootstrap_servers, table, [(b"c1", b"Ann")])
    produce(bootstrap_servers, orders, [(b"c1", b"o1")])
    run = DriverThread(resolve_settings(_enricher(table), bootstrap_servers, inputs=[orders], output=out,
                                        trigger_interval=0.2), spark).start()
    try:
        assert wait_until(lambda: run.events.batches, 120, "the first batch", every=0.2), run.lines
        admin.create_partitions([NewPartitions(table, 2)])[table].result(30)
        produce(bootstrap_servers, orders, [(b"c1", b"o2")])   # the next batch would miss the new partition
        assert wait_until(lambda: not run.alive(), 120, "the run to stop", every=0.2), run.lines[-5:]
        assert isinstance(run.outcome.get("error"), TableChangedError), run.outcome
        assert "has 2 partitions now, 1 when the run started" in str(run.outcome["error"])
    finally:
        if run.alive():
            run.stop()
