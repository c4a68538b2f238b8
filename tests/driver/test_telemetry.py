"""driver/metrics.py without a broker: what one batch's result rows become (transactions aborted
and fenced, dead letters by stage, lag, revocation), and the JSON lines (issue 16). The
integration test (test_metrics.py) checks the same figures against a real run."""
from __future__ import annotations

import json

from processors.enrich_orders import EnrichOrders
from txstream.driver.metrics import Telemetry
from txstream.driver.report import BatchReport
from txstream.kafka.lookups import Watermarks
from txstream.settings import resolve
from txstream.task.spec import PartitionPlan


def telemetry(log_format: str = "human") -> tuple[Telemetry, list[str]]:
    settings = resolve(EnrichOrders, bootstrap_servers="localhost:1", app_id="app", log_format=log_format)
    lines: list[str] = []
    return Telemetry(settings, lines.append), lines


def row(index: int, status: str, attempts: int = 1, records: int = 100, dead: int = 0) -> dict:
    return dict(index=index, status=status, records_in=records, records_out=records - dead, dead_letters=dead,
                committed=-1, read_s=0.1, upstream_s=0.2, produce_s=0.05, commit_s=0.02, init_s=0.5,
                attempts=attempts, message="")


def value(t: Telemetry, name: str, **labels: str) -> float | None:
    return t.registry.get_sample_value(name, {"app": "app", **labels})


def test_one_batch_of_rows_becomes_the_metrics_and_a_json_line() -> None:
    t, lines = telemetry("json")
    plans = [PartitionPlan("orders", p, 1000, 1100, 1000, f"app-orders-{p}") for p in range(3)]
    rows = [row(0, "committed", attempts=2, dead=3),   # one abortable error, published again
            row(1, "fenced"),                           # a newer producer took over
            row(2, "stale-plan", records=0)]            # the group moved: publish nothing
    # Partition 2's input has an open transaction: 20 offsets past its last stable offset.
    marks = {("orders", p): Watermarks(0, 1250 + 20 * (p == 2), 1250) for p in range(3)}
    report = BatchReport(7, plans, rows, 1.5, driver_s=0.0625)
    t.batch(report, marks, "human line", cap=500, totals={"records_in": 0})
    part = {"guarantee": "exactly-once", "topic": "orders"}
    assert value(t, "txstream_records_in_total", partition="0", **part) == 100
    assert value(t, "txstream_records_out_total", partition="0", **part) == 97
    assert value(t, "txstream_dead_letters_total", topic="orders", partition="0", stage="decode") == 3
    assert value(t, "txstream_transactions_total", outcome="committed") == 1
    assert value(t, "txstream_transactions_total", outcome="aborted") == 2   # the retried one and the fenced one
    assert value(t, "txstream_fenced_producers_total") == 1
    assert value(t, "txstream_task_results_total", status="stale-plan") == 1
    # Where the group is now: the committed range's end; the others stay at their start.
    lag = {p: value(t, "txstream_partition_lag_records", topic="orders", partition=str(p)) for p in range(3)}
    assert lag == {0: 150, 1: 250, 2: 250}
    assert value(t, "txstream_partition_log_end_lag_records", topic="orders", partition="2") == 270
    assert value(t, "txstream_stage_duration_seconds_count", stage="read") == 1   # committed tasks only
    assert value(t, "txstream_batch_cap_records") == 500
    events = [json.loads(line) for line in lines]
    assert [e["event"] for e in events] == ["batch", "dead_letter"]
    batch = events[0]
    assert (batch["batch"], batch["records_in"], batch["dead_letters"], batch["transactions_aborted"],
            batch["fenced_producers"], batch["lag"]) == (7, 200, 3, 2, 1, 650)
    assert batch["driver_seconds"] == 0.0625
    assert batch["statuses"] == {"committed": 1, "fenced": 1, "stale-plan": 1}
    assert batch["log_end_lag_by_partition"] == {"orders[0]": 150, "orders[1]": 250, "orders[2]": 270}
    assert events[1] == {**events[1], "topic": "orders", "partition": 0, "stage": "decode", "count": 3}

    # Revoked: its series go (another instance reports them now); the counters stay.
    t.event("revoked", "partitions revoked: orders[1]", partitions=["orders[1]"])
    assert value(t, "txstream_partition_lag_records", topic="orders", partition="1") is None
    assert value(t, "txstream_partition_lag_records", topic="orders", partition="0") == 150
    assert value(t, "txstream_records_in_total", partition="1", **part) == 100
    assert json.loads(lines[-1])["partitions"] == ["orders[1]"]


def test_human_format_prints_the_lines_as_they_are() -> None:
    t, lines = telemetry()
    plans = [PartitionPlan("orders", 0, 0, 10, None, "app-orders-0")]
    t.batch(BatchReport(1, plans, [row(0, "committed", records=10)], 0.2),
            {("orders", 0): Watermarks(0, 10, 10)}, "batch 1  partitions 1 ...", cap=500, totals={})
    t.event("retry", "batch 2 failed (x); retrying in 1.0s", error_type="BatchTimeout")
    t.event("dead_letter", None, topic="orders", partition=0, offset=4, stage="transform", count=1)
    t.echo("a note")
    assert lines == ["batch 1  partitions 1 ...", "batch 2 failed (x); retrying in 1.0s", "a note"]
    assert value(t, "txstream_batch_retries_total", error="BatchTimeout") == 1
    assert value(t, "txstream_dead_letters_total", topic="orders", partition="0", stage="transform") == 1
    assert value(t, "txstream_partition_lag_records", topic="orders", partition="0") == 0


def test_a_port_in_use_is_a_settings_error() -> None:
    import socket

    import pytest

    from txstream.errors import SettingsError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        settings = resolve(EnrichOrders, bootstrap_servers="localhost:1", app_id="app",
                           metrics_port=taken.getsockname()[1], metrics_address="127.0.0.1")
        t = Telemetry(settings, print)
        with pytest.raises(SettingsError, match="choose another --metrics-port"):
            t.start()


def test_late_rows_without_a_dead_letter_topic_are_counted_as_dropped() -> None:
    """Issue 60 #15: a stateful batch's late rows, dropped for want of a dead-letter topic, are
    said in its line, its JSON event, the metric (outcome "dropped") and the run's summary."""
    from types import SimpleNamespace

    from txstream.driver.loop import Driver

    t, lines = telemetry("json")
    plans = [PartitionPlan("orders", 0, 0, 100, 0, "")]
    units = [dict(row(0, "committed", records=60), late=44, rows_merged=56), dict(row(1, "empty", records=0), late=0)]
    report = BatchReport(3, plans, units, 0.5, reads={("orders", 0): (100, 0)}, watermark_ms=60_000)
    assert "late 44 (dropped: no dead_letter_topic)" in report.line()
    t.batch(report, None, report.line(), cap=100, totals={"records_in": 100})
    event = json.loads(lines[-1])
    assert (event["late"], event["late_outcome"]) == (44, "dropped")
    assert value(t, "txstream_late_records_total", outcome="dropped") == 44
    report.dead_letter_topic = "orders-dlq"
    assert "late 44 (dead-lettered to orders-dlq)" in report.line()
    t.batch(report, None, report.line(), cap=100, totals={"records_in": 100})
    assert value(t, "txstream_late_records_total", outcome="dead-lettered") == 44

    run = SimpleNamespace(totals={"batches": 2, "records_in": 100, "records_out": 60, "dead_letters": 0, "late": 44},
                          settings=SimpleNamespace(dead_letter_topic=None))
    assert Driver.summary(run, "caught up") == ("caught up: 2 batches, 100 records in, 60 out, 0 dead-lettered, "
                                                "44 late (dropped: no dead_letter_topic)")
