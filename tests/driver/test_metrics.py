"""Operations (issue 16): `/metrics` scraped during a run agrees with what the run did, and the
JSON log lines carry the same counts; `txstream status` shows the same offsets, the last
publications (from the output's lineage headers) and the live figures, and, once the run has
stopped, the offsets and publications from Kafka alone.

Runs the order enricher in the session's Spark against the real broker, the driver on a thread
of its own (as `txstream run` would, minus the process), its endpoint on a free port.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections import defaultdict
from pathlib import Path

from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from processors.enrich_orders import EnrichOrders
from processors.sample_orders import enriched, orders
from tests.support.kafka import avro_bytes, committed, read_all
from tests.support.running import DriverThread
from tests.support.seeding import seed_numbered
from tests.support.waiting import wait_until
from txstream.cli.main import main
from txstream.serde.avro import load_schema
from txstream.tools.topic_io import end_offsets

REPO = Path(__file__).resolve().parents[2]
ORDER = load_schema(str(REPO / "schemas/order.avsc"))


def scrape(port: int) -> dict[str, list]:
    """name -> [(labels, value)] of every sample the endpoint serves."""
    with urllib.request.urlopen(f"http://localhost:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples: dict[str, list] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name].append((sample.labels, sample.value))
    return samples


def total(samples: dict[str, list], name: str, **labels: str) -> float:
    return sum(v for found, v in samples.get(name, []) if all(found.get(k) == w for k, w in labels.items()))


def status(bootstrap: str, app: str, output: str, metrics_url: str | None) -> dict:
    """`txstream status --json`, parsed."""
    args = ["status", "--app-id", app, "--bootstrap-servers", bootstrap, "--output", output, "--json"]
    result = CliRunner().invoke(main, args + (["--metrics-url", metrics_url] if metrics_url else []))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def check_offsets(shown: dict, source: str, ends: dict[int, int], published: list) -> None:
    """Status rows agree with the group's offsets and with the output's lineage headers."""
    rows = {p["partition"]: p for p in shown["partitions"] if p["topic"] == source}
    assert sorted(rows) == sorted(ends)
    for p, end in ends.items():
        assert (rows[p]["committed"], rows[p]["last_stable"], rows[p]["lag"]) == (end, end, 0), rows[p]
        newest = max((r for r in published if r.lineage.partition == p), key=lambda r: r.lineage.offset)
        last = rows[p]["last_publication"]
        assert last["source_offset"] == newest.lineage.offset, last
        assert last["publication"] == newest.lineage.publication.decode(), last
        assert last["output"].endswith(f"[{newest.partition}]@{newest.offset}"), last


def kafka_consumer_groups(bootstrap: str, group: str) -> dict[tuple[str, int], dict[str, str]]:
    """`kafka-consumer-groups --describe --group G`: Kafka's own ConsumerGroupCommand, run from the
    broker jars the project resolves; its table by (topic, partition)."""
    from txstream.local.cluster import kafka_libs
    from txstream.local.processes import require_java

    proc = subprocess.run([require_java(), "-cp", str(kafka_libs() / "*"),
                           "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
                           "--bootstrap-server", bootstrap, "--describe", "--group", group],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line.split() for line in proc.stdout.splitlines() if line.strip()]
    header = next(i for i, cells in enumerate(lines) if cells[:2] == ["GROUP", "TOPIC"])
    names = lines[header]
    rows = [dict(zip(names, cells, strict=False)) for cells in lines[header + 1:] if cells and cells[0] == group]
    return {(r["TOPIC"], int(r["PARTITION"])): r for r in rows}


def agree_with_kafka_tools(bootstrap: str, app: str, source: str, shown: dict, running: bool) -> None:
    """Kafka's tool, `txstream offsets show` and `txstream status` show the same offsets and lag.
    (Kafka's LAG is to the log end, txstream's to the last stable offset: equal here, where no
    input transaction is open.)"""
    kafka = kafka_consumer_groups(bootstrap, app)
    ours = {(p["topic"], p["partition"]): p for p in shown["partitions"]}
    assert set(kafka) == set(ours), (kafka, ours)
    result = CliRunner().invoke(main, ["offsets", "show", "--app-id", app, "--bootstrap-servers", bootstrap])
    assert result.exit_code == 0, result.output
    table = [line.split() for line in result.stdout.splitlines() if line.startswith(source)]
    show = {(cells[0], int(cells[1])): cells for cells in table}
    assert set(show) == set(kafka), result.stdout
    for key, row in kafka.items():
        mine = ours[key]
        assert int(row["CURRENT-OFFSET"]) == mine["committed"] == int(show[key][2]), (row, mine, show[key])
        assert int(row["LOG-END-OFFSET"]) == mine["log_end"] == int(show[key][3]), (row, mine, show[key])
        assert int(row["LAG"]) == mine["lag"] == int(show[key][5]), (row, mine, show[key])
        # Kafka names the member that owns the partition while the instance runs, '-' after.
        assert (row["CONSUMER-ID"] == mine["owner"]) if running else row["CONSUMER-ID"] == "-", (row, mine)


def seed(bootstrap: str, topic: str, partitions: int, count: int, bad: int) -> tuple[int, int]:
    """`count` orders over the partitions and `bad` undecodable records on partition 0.
    Returns (records the transform gets, records EnrichOrders publishes)."""
    good = list(orders(count, seed=16))
    seed_numbered(bootstrap, topic, partitions, count, record=lambda n: (good[n]["id"].encode(), avro_bytes(ORDER, good[n])))
    seed_numbered(bootstrap, topic, partitions, bad, only=0, record=lambda n: (f"bad-{n}".encode(), b"\xff" * 12))
    return count, sum(enriched(o) is not None for o in good)


def test_metrics_scraped_during_a_run_match_what_it_did(bootstrap_servers, make_topic, spark) -> None:
    from txstream.settings import resolve

    partitions, bad = 3, 2
    source = make_topic("orders", partitions)
    output = make_topic("orders-enriched", partitions)
    dead = make_topic("orders-dlq", 1)
    decoded, expected_out = seed(bootstrap_servers, source, partitions, 900, bad)
    app = f"test-metrics-{source[-8:]}"
    settings = resolve(EnrichOrders, bootstrap_servers=bootstrap_servers, master="local[2]", app_id=app,
                       inputs=[source], output=output, dead_letter=dead, max_records_per_partition=120,
                       metrics_port=0, metrics_address="127.0.0.1", log_format="json")
    run = DriverThread(settings, spark).start()
    driver, lines = run.driver, run.lines
    try:
        wait_until(lambda: driver.telemetry.port, 120, "the metrics endpoint", every=0.5)
        port = driver.telemetry.port

        def caught_up():  # noqa: ANN202
            s = scrape(port)
            lags = s.get("txstream_partition_lag_records", [])
            done = (total(s, "txstream_records_in_total", app=app) >= decoded and len(lags) == partitions
                    and all(v == 0 for _l, v in lags))
            return s if done else None

        def state() -> str:
            s = scrape(port)
            return (f"in {total(s, 'txstream_records_in_total')}, lag {s.get('txstream_partition_lag_records')}; "
                    f"last lines: {lines[-6:]}")

        s = wait_until(caught_up, 300, "every record in and the lag at 0", every=0.5, state=state)
        # Scraped while the run goes on (idle, caught up).
        assert run.alive(), run.outcome
        assert total(s, "txstream_records_in_total", app=app, guarantee="exactly-once") == decoded
        assert total(s, "txstream_records_out_total", app=app) == expected_out
        assert total(s, "txstream_dead_letters_total", app=app, stage="decode") == bad
        assert total(s, "txstream_dead_letters_total", app=app, topic=source, partition="0") == bad
        assert total(s, "txstream_records_in_total", app=app, topic=source, partition="1") == 300
        batches = total(s, "txstream_batches_total", app=app)
        assert batches >= 900 / partitions / 120  # capped: several batches
        assert total(s, "txstream_batch_duration_seconds_count", app=app) == batches
        committed_tx = total(s, "txstream_transactions_total", app=app, outcome="committed")
        assert committed_tx >= batches and total(s, "txstream_transactions_total", outcome="aborted") == 0
        # One transaction per slot (2 on local[2]), one reading per range (partition).
        ranges = total(s, "txstream_task_results_total", app=app, status="committed")
        assert total(s, "txstream_stage_duration_seconds_count", stage="read") == ranges
        assert total(s, "txstream_stage_duration_seconds_count", stage="commit") == committed_tx <= ranges
        assert total(s, "txstream_fenced_producers_total", app=app) == 0
        assert total(s, "txstream_assigned_partitions", app=app) == partitions
        assert total(s, "txstream_rebalances_total", app=app) >= 1
        assert total(s, "txstream_batch_cap_records", app=app) == 120
        assert total(s, "txstream_transaction_timeout_seconds", app=app) == 60
        # The partition offsets the endpoint shows are the group's.
        ends = {p: end for p, (_low, end) in end_offsets(bootstrap_servers, source, "read_committed").items()}
        assert committed(bootstrap_servers, app, source, partitions) == ends
        for p, end in ends.items():
            assert total(s, "txstream_partition_committed_offset", topic=source, partition=str(p)) == end
            assert total(s, "txstream_partition_last_stable_offset", topic=source, partition=str(p)) == end
        wait_until(lambda: len(scrape(port).get("txstream_partition_log_end_lag_records", [])) == partitions
                   and total(scrape(port), "txstream_partition_log_end_lag_records") == 0, 30,
                   "the log-end lag at 0", every=0.5)
        # Idle, the loop keeps planning: the lag it shows is current, not the last batch's.
        planned = total(s, "txstream_last_plan_timestamp_seconds", app=app)
        wait_until(lambda: total(scrape(port), "txstream_last_plan_timestamp_seconds", app=app) > planned, 30,
                   "an idle turn to plan again", every=0.5)
        assert total(scrape(port), "txstream_batches_total", app=app) == batches
        # ... and with what reached Kafka.
        published = read_all(bootstrap_servers, output)
        assert len(published) == expected_out
        assert len(read_all(bootstrap_servers, dead)) == bad
        # `txstream status` while it runs: the group, the offsets, the last publications, live figures.
        live = status(bootstrap_servers, app, output, f"http://localhost:{port}/metrics")
        assert live["state"] == "Stable" and len(live["members"]) == 1
        assert sorted(live["members"][0]["partitions"]) == sorted(f"{source}[{p}]" for p in range(partitions))
        check_offsets(live, source, ends, published)
        assert all(p["owner"] == live["members"][0]["member_id"] and p["live_lag"] == 0 for p in live["partitions"])
        figures = live["live"]
        assert (figures["records_in"], figures["records_out"], figures["dead_letters"]) == (decoded, expected_out, bad)
        assert (figures["lag"], figures["assigned_partitions"], figures["batches"]) == (0, partitions, batches)
        # Kafka's own kafka-consumer-groups --describe and `txstream offsets show` agree with it.
        agree_with_kafka_tools(bootstrap_servers, app, source, live, running=True)
    finally:
        code = run.stop()
    assert code == 0, (run.outcome, lines[-5:])

    # The JSON lines: every line parses, and the batch objects carry the same counts.
    events = [json.loads(line) for line in lines]
    assert all(e["app"] == app and "time" in e for e in events)
    kinds = {e["event"] for e in events}
    assert {"metrics", "assigned", "batch", "dead_letter", "stopped"} <= kinds, kinds
    per_batch = [e for e in events if e["event"] == "batch"]
    assert len(per_batch) == batches
    assert sum(e["records_in"] for e in per_batch) == decoded
    assert sum(e["records_out"] for e in per_batch) == expected_out
    assert sum(e["dead_letters"] for e in per_batch) == bad
    assert sum(e["transactions_committed"] for e in per_batch) == committed_tx
    assert sum(e["count"] for e in events if e["event"] == "dead_letter") == bad
    assert per_batch[-1]["lag"] == 0 and per_batch[-1]["totals"]["records_in"] == decoded
    stopped = next(e for e in events if e["event"] == "stopped")
    assert (stopped["records_in"], stopped["records_out"], stopped["dead_letters"]) == (decoded, expected_out, bad)
    assigned = [p for e in events if e["event"] == "assigned" for p in e["partitions"]]
    assert sorted(assigned) == sorted(f"{source}[{p}]" for p in range(partitions))
    # The Spark UI lists each batch's job as the batch lines name it.
    store = spark.sparkContext._jsc.sc().statusStore()
    [job] = spark.sparkContext.statusTracker().getJobIdsForGroup(f"txstream-{app}-batch-1")
    assert store.job(job).description().get() == f"txstream {app} batch 1 ({partitions} partitions in 2 slots, 360 records)"
    # `txstream status` with no instance running: the same offsets and publications, from Kafka.
    after = status(bootstrap_servers, app, output, None)
    assert after["state"] == "Empty" and after["members"] == [] and after["live"] is None
    check_offsets(after, source, ends, published)
    agree_with_kafka_tools(bootstrap_servers, app, source, after, running=False)
    text = CliRunner().invoke(main, ["status", "--app-id", app, "--bootstrap-servers", bootstrap_servers,
                                     "--output", output])
    assert text.exit_code == 0, text.output
    assert f"App {app}: group Empty, 0 member(s)" in text.stdout
    assert f"Lineage: read the last 1000 offsets of each of the {partitions} partitions of {output}" in text.stdout
    # The endpoint is gone with the run.
    try:
        scrape(port)
        raise AssertionError("the metrics endpoint outlived the run")
    except OSError:
        pass


def test_txstream_run_json_lines_and_the_missing_topic_error(bootstrap_servers, make_topic) -> None:
    """`txstream run --log-format json --metrics-port 0`: txstream's lines are JSON objects (the
    endpoint's URL first, the fatal error last; Spark's own log lines are not txstream's), and the
    error names `txstream topics ensure`."""
    source = make_topic("in", 1)
    missing = f"no-such-output-{source[-8:]}"
    proc = subprocess.run(
        [sys.executable, "-m", "txstream.cli", "run", "processors.passthrough:PassThrough", "--bootstrap-servers",
         bootstrap_servers, "--input", source, "--output", missing, "--master", "local[1]",
         "--log-format", "json", "--metrics-port", "0", "--metrics-address", "127.0.0.1"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines and all(line.startswith("{") for line in lines), proc.stdout[-3000:]
    events = [json.loads(line) for line in lines]
    assert [e["event"] for e in events][0] == "metrics" and events[-1]["event"] == "fatal", events
    assert events[0]["url"].startswith("http://127.0.0.1:")
    assert events[-1]["error_type"] == "TransformError"
    assert f"output topic '{missing}' does not exist" in events[-1]["error"]
    assert "txstream topics ensure PROCESSOR" in proc.stderr.splitlines()[-1]
