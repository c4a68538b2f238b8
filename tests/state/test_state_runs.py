"""State across batches (docs/state.md), run for real: a broker, Spark, the example processors.

Running totals in update mode: per customer, the updates a read_committed reader sees strictly
increase and the last equals the exact total, across batches and across a restart. Windows in
append mode: every window the watermark closed is emitted once with the exact count and sum,
none early, and the late orders are in the dead-letter topic. Deduplication: every id once."""
from __future__ import annotations

import functools
import json
from collections import Counter, defaultdict
from datetime import datetime, timedelta, timezone

import pytest

from processors.orders_per_currency import OrdersPerCurrency
from processors.running_totals import RunningTotals
from processors.sample_orders import EPOCH, orders
from processors.sliding_orders import SlidingOrders
from processors.unique_orders import UniqueOrders
from tests.support.kafka import avro_bytes, produce, read_all
from tests.support.seeding import ORDER
from txstream.errors import TransformError
from txstream.serde.avro import AvroCodec, load_schema
from txstream.state import aggregates as aggs
from txstream.state.keys import encode_key
from txstream.tools.verify import audit

TOTAL = AvroCodec(load_schema("schemas/customer_running_total.avsc"))
WINDOW = AvroCodec(load_schema("schemas/currency_window.avsc"))


def _seed(bootstrap: str, topic: str, data: list[dict]) -> None:
    produce(bootstrap, topic, [(o["customer_id"].encode(), avro_bytes(ORDER, o)) for o in data])


def _check_running_totals(records, data) -> dict[str, tuple]:
    """Per customer the updates strictly increase; returns the last one of each."""
    last: dict[str, tuple] = {}
    for r in records:
        v = TOTAL.decode(r.value)
        assert r.key.decode() == v["customer_id"]
        now = (v["orders"], v["amount"], v["largest"])
        before = last.get(v["customer_id"])
        assert before is None or now[0] > before[0], (v["customer_id"], before, now)
        last[v["customer_id"]] = now
    return last


def _expected_totals(data) -> dict[str, tuple]:
    out: dict[str, list] = {}
    for o in data:
        if o["amount"] > 0:
            t = out.setdefault(o["customer_id"], [0, 0.0, 0.0])
            t[0] += 1
            t[1] += o["amount"]
            t[2] = max(t[2], o["amount"])
    return {k: tuple(v) for k, v in out.items()}


def _same_totals(got: dict[str, tuple], want: dict[str, tuple]) -> None:
    assert got.keys() == want.keys()
    for customer, (n, amount, largest) in want.items():
        g = got[customer]
        assert g[0] == n and g[2] == largest and abs(g[1] - amount) < 1e-6, (customer, g, (n, amount, largest))


def test_running_totals_across_batches_and_a_restart(bootstrap_servers, make_topic, run_processor) -> None:
    source, sink, dlq = make_topic("rt-in", partitions=2), make_topic("rt-out", partitions=2), make_topic("rt-dlq")
    first = [dict(o, customer_id=f"c{i % 40}") for i, o in enumerate(orders(1200))]
    _seed(bootstrap_servers, source, first)
    app = "test-running-totals-" + source[-8:]
    driver = run_processor(RunningTotals, inputs=[source], output=sink, dead_letter=dlq, app_id=app,
                           max_records_per_partition=200, output_units=3)
    assert driver.exit_code == 0, driver.lines
    assert any(m.startswith("protocol: stateful, running aggregates in update mode") for m in driver.events.messages())
    assert driver.totals["batches"] >= 3
    # The executor's copy of each unit takes its own committed batch: nothing is read back from
    # the changelog (a new Spark application's executors have no copy and restore: the crash suite).
    assert sum(b["restored_records"] for b in driver.events.batches) == 0
    _same_totals(_check_running_totals(read_all(bootstrap_servers, sink), first), _expected_totals(first))

    second = [dict(o, customer_id=f"c{i % 50}") for i, o in enumerate(orders(600, first=1200))]
    _seed(bootstrap_servers, source, second)
    again = run_processor(RunningTotals, inputs=[source], output=sink, dead_letter=dlq, app_id=app,
                          max_records_per_partition=200)
    assert again.exit_code == 0, again.lines
    assert sum(b["restored_records"] for b in again.events.batches) == 0   # the same Spark session: its copy
    _same_totals(_check_running_totals(read_all(bootstrap_servers, sink), first + second),
                 _expected_totals(first + second))
    report = audit(bootstrap_servers, source, sink, dead_letter=dlq, app_id=app)
    assert report.clean and report.wide.state_batches == driver.totals["batches"] + again.totals["batches"], \
        report.table()


def _window_expectation(data, delay_s: int, size_s: int = 60):
    """{(window start, currency): (orders, amount)} of the windows the final watermark closed,
    and the orders that were late at some batch cannot be known here: see the test."""
    out: dict[tuple, list] = defaultdict(lambda: [0, 0.0])
    for o in data:
        start = EPOCH + timedelta(seconds=(o["created_at"] - EPOCH).total_seconds() // size_s * size_s)
        out[(start, o["currency"])][0] += 1
        out[(start, o["currency"])][1] += o["amount"]
    return out


def test_windows_in_append_mode_emit_each_closed_window_once_and_route_late_orders(
        bootstrap_servers, make_topic, run_processor) -> None:
    source, sink, dlq = make_topic("w-in", partitions=2), make_topic("w-out", partitions=2), make_topic("w-dlq")
    data = list(orders(6000))            # 37 ms apart: about 3.7 minutes of event time
    late = [dict(o, id=f"late-{i}", created_at=EPOCH + timedelta(seconds=5)) for i, o in enumerate(orders(30))]
    _seed(bootstrap_servers, source, data)
    app = "test-windows-" + source[-8:]
    driver = run_processor(OrdersPerCurrency, inputs=[source], output=sink, dead_letter=dlq, app_id=app,
                           max_records_per_partition=1000)
    assert driver.exit_code == 0, driver.lines
    _seed(bootstrap_servers, source, late)  # all behind the watermark now: a minute of event time has passed
    again = run_processor(OrdersPerCurrency, inputs=[source], output=sink, dead_letter=dlq, app_id=app)
    assert again.exit_code == 0, again.lines
    # The final watermark is the newest event time less the delay: every window it closes was closed.
    newest_ms = round(max(o["created_at"] for o in data).timestamp() * 1000)
    assert max(b.get("watermark_ms") or 0 for b in again.events.batches) == newest_ms - 30_000
    assert sum(b.get("late", 0) for b in again.events.batches) == len(late)
    registry = again.telemetry.registry
    assert registry.get_sample_value("txstream_late_records_total", {"app": app, "outcome": "dead-lettered"}) == len(late)
    assert registry.get_sample_value("txstream_watermark_timestamp_seconds", {"app": app}) > EPOCH.timestamp()
    emitted = Counter()
    got = {}
    for r in read_all(bootstrap_servers, sink):
        v = WINDOW.decode(r.value)
        emitted[(v["start"], v["currency"])] += 1
        got[(v["start"], v["currency"])] = (v["orders"], v["amount"])
        assert v["end"] - v["start"] == timedelta(minutes=1) and r.key.decode() == v["currency"]
    assert emitted and max(emitted.values()) == 1, [k for k, n in emitted.items() if n > 1]
    want = _window_expectation(data, 30)
    newest = max(o["created_at"] for o in data)
    watermark = newest - timedelta(seconds=30)
    closed = {k for k in want if k[0] + timedelta(minutes=1) <= watermark}
    assert set(got) == closed, (sorted(set(got) ^ closed))
    for k in closed:
        assert got[k][0] == want[k][0] and abs(got[k][1] - want[k][1]) < 1e-6, (k, got[k], want[k])
    dead = read_all(bootstrap_servers, dlq)
    assert len(dead) == len(late)
    assert {r.headers["txstream.dlq.stage"] for r in dead} == {b"late"}
    # Each late dead letter is its input record as read (issue 60 #21), naming where it was read.
    assert sorted((r.key, r.value) for r in dead) == sorted((o["customer_id"].encode(), avro_bytes(ORDER, o))
                                                            for o in late)
    sources = {r.headers["txstream.dlq.source"].decode().rpartition("/")[0] for r in dead}
    assert sources <= {f"{source}/0", f"{source}/1"}, sources

    # The audit: each window once, none early, rows merged + late = rows read in every batch.
    report = audit(bootstrap_servers, source, sink, dead_letter=dlq, app_id=app)
    assert report.clean, report.table()
    assert len(report.wide.emissions) == len(got) and report.wide.state_batches >= 3
    assert report.wide.state_reconciled == report.wide.state_batches, report.table()
    assert report.wide.changelogs_checked == 1
    # A window published again (what a second commit of its unit would leave) is caught.
    from confluent_kafka import Producer

    copy = read_all(bootstrap_servers, sink)[0]
    producer = Producer({"bootstrap.servers": bootstrap_servers})
    producer.produce(sink, copy.value, copy.key, headers=[
        (k, v if k != "txstream.publication" else b"another") for k, v in copy.headers.items()])
    assert producer.flush(30) == 0
    report = audit(bootstrap_servers, source, sink, dead_letter=dlq, app_id=app)
    assert not report.clean and any("emitted 2 times" in p for p in report.wide.problems), report.table()


def test_deduplication_keeps_each_id_once_across_batches(bootstrap_servers, make_topic, run_processor) -> None:
    source, sink = make_topic("d-in", partitions=2), make_topic("d-out", partitions=2)
    data = list(orders(1500))
    _seed(bootstrap_servers, source, data)
    _seed(bootstrap_servers, source, data[200:900])   # retried checkouts: the same orders again
    driver = run_processor(UniqueOrders, inputs=[source], output=sink, dead_letter=make_topic("d-dlq"),
                           max_records_per_partition=400)
    assert driver.exit_code == 0, driver.lines
    ids = Counter(AvroCodec(ORDER).decode(r.value)["id"] for r in read_all(bootstrap_servers, sink))
    assert ids == Counter(o["id"] for o in data)
    # The state's key count (metric and batch event) counts ids, not their expiry index entries.
    keys = [e["state_keys"] for e in driver.events if e.get("event") == "batch" and "state_keys" in e][-1]
    assert 0.8 * len(data) <= keys <= 1.2 * len(data), keys


class _ForgetfulUniqueOrders(UniqueOrders):
    """UniqueOrders with a 2-second watermark: ids are forgotten within a short run."""

    def transform(self, batch):
        orders = batch.select("key", "value", "value.id", "value.created_at")
        return orders.withWatermark("created_at", "2 seconds").dropDuplicatesWithinWatermark(["id"]).select(
            "key", "value")


def _restored_state(bootstrap: str, app: str, operator: str) -> tuple[dict[bytes, bytes], set[bytes], list[str]]:
    """The state each unit of `operator` restores from Kafka (snapshot + changelog, as a new
    executor would): its keys and values, its expiry index keys, and the restores' sources."""
    from txstream.kafka.config import KafkaClients
    from txstream.records import read_markers
    from txstream.state.keys import is_index_key
    from txstream.state.memory import MemoryStore
    from txstream.state.restore import restore
    from txstream.tools.state_view import read_descriptions

    clients = KafkaClients.from_properties(bootstrap)
    units = read_descriptions(clients, app, 30)[operator].units
    markers = read_markers(clients, app, units)
    keys, index, sources = {}, set(), []
    for unit in range(units):
        store = MemoryStore(unit)
        sources.append(restore(clients, app, operator, unit, store, markers[unit]).source)
        for key, value in store.items():
            if is_index_key(key):
                index.add(key)
            else:
                keys[key] = value
    return keys, index, sources


def test_deduplication_forgets_exactly_the_expired_ids_across_batches_and_a_restore(
        bootstrap_servers, make_topic, run_processor) -> None:
    """Expiry by the index deletes the keys whose first event + delay the watermark reached, and
    only those: the state restored from Kafka (a snapshot every 50 changelog records, and its tail)
    holds exactly the others, each with its index entry; after the executors' copies are deleted,
    a second run restores, emits again the retried ids it forgot and drops those it still holds."""
    import glob
    import shutil
    import tempfile

    from txstream.kafka.config import KafkaClients
    from txstream.state.codec import StateCodec
    from txstream.state.keys import decode_key, expiry_key
    from txstream.tools.state_view import show_state

    source, sink, dlq = make_topic("dx-in", partitions=2), make_topic("dx-out", partitions=2), make_topic("dx-dlq")
    first = list(orders(800))
    _seed(bootstrap_servers, source, first)
    app = "test-dedup-expiry-" + source[-8:]
    run = functools.partial(run_processor, _ForgetfulUniqueOrders, inputs=[source], output=sink, dead_letter=dlq,
                            app_id=app, max_records_per_partition=100, output_units=2, state_snapshot_every=50)
    driver = run()
    assert driver.exit_code == 0, driver.lines
    emitted = {AvroCodec(ORDER).decode(r.value)["id"] for r in read_all(bootstrap_servers, sink)}
    late = len(read_all(bootstrap_servers, dlq))
    assert len(emitted) + late == len(first) and len(emitted) > 700
    watermark = show_state(KafkaClients.from_properties(bootstrap_servers), app).watermark_ms
    event_ms = {o["id"]: int(o["created_at"].timestamp() * 1000) for o in first}
    expires = {i: event_ms[i] + 2000 for i in emitted}
    live = {i for i, t in expires.items() if t > watermark}
    assert 0 < len(live) < len(emitted) - 100, (len(live), watermark)   # the watermark forgot most ids
    stored, index, sources = _restored_state(bootstrap_servers, app, "dedup")
    codec = StateCodec(aggs.state_schema([], event_time=True))
    keys = {decode_key(k, False)[0][0]: codec.decode(v)["t"] for k, v in stored.items()}
    assert keys == {i: expires[i] for i in live}
    assert index == {expiry_key(t, encode_key([i])) for i, t in keys.items()}
    assert any(s.startswith("snapshot") for s in sources), sources   # the snapshot carried the index too

    # The executors' copies gone: the next run's units restore from Kafka.
    copies = glob.glob(f"{tempfile.gettempdir()}/blockmgr-*/txstream-state-{app}")
    assert copies
    for copy in copies:
        shutil.rmtree(copy)
    forgotten, held = sorted(emitted - live)[:10], sorted(live)[:10]
    later = EPOCH + timedelta(seconds=60)   # retried sends, on time
    retried = [dict(o, created_at=later) for o in first if o["id"] in set(forgotten) | set(held)]
    _seed(bootstrap_servers, source, retried + list(orders(200, first=800)))
    again = run()
    assert again.exit_code == 0, again.lines
    assert sum(b["restored_records"] for b in again.events.batches) > 0
    ids = Counter(AvroCodec(ORDER).decode(r.value)["id"] for r in read_all(bootstrap_servers, sink))
    # Over both runs: a forgotten id twice (its retry kept), a held one once (its retry dropped).
    assert {i: ids[i] for i in forgotten + held} == {**{i: 2 for i in forgotten}, **{i: 1 for i in held}}


def test_what_cannot_be_kept_across_batches_is_refused_at_start(bootstrap_servers, make_topic, run_processor) -> None:
    from pyspark.sql import functions as F

    class FirstPerCustomer(RunningTotals):
        output_value_schema = None

        def transform(self, batch):
            return (batch.groupBy(F.col("value.customer_id").alias("key"))
                    .agg(F.first("value.amount").alias("amount"))
                    .select("key", F.struct("amount").alias("value")))

    source = make_topic("x-in", partitions=1)
    _seed(bootstrap_servers, source, list(orders(10)))
    with pytest.raises(TransformError, match=r"first\(.*cannot be kept across batches"):
        run_processor(FirstPerCustomer, inputs=[source], output=make_topic("x-out"),
                       dead_letter=make_topic("x-dlq"))


def test_state_show_and_reset_on_the_engines_own_state(bootstrap_servers, make_topic, run_processor) -> None:
    from click.testing import CliRunner

    from txstream.cli.main import main

    source, sink, dlq = make_topic("sr-in", partitions=2), make_topic("sr-out", partitions=2), make_topic("sr-dlq")
    first = [dict(o, customer_id=f"c{i % 7}") for i, o in enumerate(orders(300))]
    _seed(bootstrap_servers, source, first)
    app = "test-state-tools-" + source[-8:]
    assert run_processor(RunningTotals, inputs=[source], output=sink, dead_letter=dlq, app_id=app).exit_code == 0
    shown = CliRunner().invoke(main, ["state", "show", "--app-id", app, "-b", bootstrap_servers, "--format", "json",
                                      "--limit", "0"])
    assert shown.exit_code == 0, shown.output
    entries = json.loads(shown.output)["operators"][0]["entries"]
    want = _expected_totals(first)
    assert {e["key"][0]: e["value"]["a0"] for e in entries} == {c: t[0] for c, t in want.items()}

    reset = CliRunner().invoke(main, ["state", "reset", "--app-id", app, "-b", bootstrap_servers, "--execute"])
    assert reset.exit_code == 0, reset.output
    second = [dict(o, customer_id=f"c{i % 7}") for i, o in enumerate(orders(200, first=300))]
    _seed(bootstrap_servers, source, second)
    sink = make_topic("sr-out2", partitions=2)   # what the app emits after the reset
    assert run_processor(RunningTotals, inputs=[source], output=sink, dead_letter=dlq, app_id=app).exit_code == 0
    after_reset = read_all(bootstrap_servers, sink)
    _same_totals(_check_running_totals(after_reset, second), _expected_totals(second))


def test_sliding_windows_close_in_a_batch_with_no_records(bootstrap_servers, make_topic, run_processor) -> None:
    """5-minute windows sliding every minute: each order counts in five windows. The last batch
    with records advances the watermark; a batch with no records follows and emits what it closed."""
    source, sink, dlq = make_topic("sl-in", partitions=1), make_topic("sl-out", partitions=2), make_topic("sl-dlq")
    data = list(orders(12_000))          # 37 ms apart: 7.4 minutes of event time
    _seed(bootstrap_servers, source, data)
    driver = run_processor(SlidingOrders, inputs=[source], output=sink, dead_letter=dlq,
                           max_records_per_partition=4000)
    assert driver.exit_code == 0, driver.lines
    batches = driver.events.batches
    newest_ms = round(max(o["created_at"] for o in data).timestamp() * 1000)
    assert batches[-1]["records_in"] == 0 and batches[-1]["watermark_ms"] == newest_ms - 30_000, batches[-1]
    assert batches[-1]["records_out"] > 0   # the windows the last records' watermark closed
    watermark = EPOCH + timedelta(milliseconds=newest_ms - 30_000 - EPOCH.timestamp() * 1000)
    want: Counter = Counter()
    for o in data:
        first = int((o["created_at"] - EPOCH).total_seconds() // 60)
        for start in range(first - 4, first + 1):
            window_start = EPOCH + timedelta(minutes=start)
            if window_start + timedelta(minutes=5) <= watermark:
                want[(window_start, o["currency"])] += 1
    got = Counter()
    for r in read_all(bootstrap_servers, sink):
        v = WINDOW.decode(r.value)
        assert v["end"] - v["start"] == timedelta(minutes=5)
        assert (v["start"], v["currency"]) not in got, "a window emitted twice"
        got[(v["start"], v["currency"])] = v["orders"]
    assert got == want
    report = audit(bootstrap_servers, source, sink, dead_letter=dlq, app_id=driver.settings.app_id)
    assert report.clean, report.table()


def test_session_windows_merge_across_batches(bootstrap_servers, make_topic, run_processor) -> None:
    """Orders no more than 30 s apart are one session, also when batches cut a session in two;
    each session is emitted once, when the watermark (10 s behind) passes its end."""
    from processors.customer_sessions import CustomerSessions
    from txstream.state.keys import expiry_key

    source, sink, dlq = make_topic("cs-in", partitions=1), make_topic("cs-out", partitions=2), make_topic("cs-dlq")
    seconds = {"a": [0, 10, 20, 35, 100, 110], "b": [5, 60, 70, 200], "c": [1, 29, 58, 87, 116]}
    base = list(orders(1))[0]
    data = sorted(({**base, "id": f"{c}-{t}", "customer_id": c, "amount": 1.0 + t,
                    "created_at": EPOCH + timedelta(seconds=t)} for c, ts in seconds.items() for t in ts),
                  key=lambda o: o["created_at"])
    data.append({**base, "id": "z", "customer_id": "z", "amount": 1.0, "created_at": EPOCH + timedelta(seconds=400)})
    _seed(bootstrap_servers, source, data)
    driver = run_processor(CustomerSessions, inputs=[source], output=sink, dead_letter=dlq,
                           max_records_per_partition=3)   # batches of 3 orders: sessions span batches
    assert driver.exit_code == 0, driver.lines
    assert any("sessions" in m or "session" in m for m in driver.events.messages() if m.startswith("protocol"))
    want = set()
    for c, ts in seconds.items():
        start = prev = ts[0]
        count, amount = 1, 1.0 + ts[0]
        for t in ts[1:] + [None]:
            if t is not None and t < prev + 30:
                prev, count, amount = t, count + 1, amount + 1.0 + t
                continue
            want.add((c, start * 1000, (prev + 30) * 1000, count, amount))
            if t is not None:
                start = prev = t
                count, amount = 1, 1.0 + t
    epoch_ms = round(EPOCH.timestamp() * 1000)
    got = []
    for r in read_all(bootstrap_servers, sink):
        v = json.loads(r.value)
        start = round(datetime.fromisoformat(v["start"]).timestamp() * 1000) - epoch_ms
        end = round(datetime.fromisoformat(v["end"]).timestamp() * 1000) - epoch_ms
        got.append((v["customer_id"], start, end, v["orders"], v["amount"]))
    assert sorted(got) == sorted(want)    # the last order's session ("z") is still open
    # Closed sessions left the state with their index entries: z's alone stays, indexed at its end.
    stored, index, _sources = _restored_state(bootstrap_servers, driver.settings.app_id, "agg")
    assert list(stored) == [encode_key(["z"])]
    assert index == {expiry_key(epoch_ms + 430_000, encode_key(["z"]))}
    report = audit(bootstrap_servers, source, sink, dead_letter=dlq, app_id=driver.settings.app_id)
    assert report.clean, report.table()


def test_an_idle_streams_watermark_follows_the_clock_when_asked(bootstrap_servers, make_topic, spark) -> None:
    """watermark_idle_s: once the input is quiet that long, the watermark follows wall-clock time
    less the delay, and the window the last orders were in closes without a newer order."""
    from tests.support.running import DriverThread, resolve_settings
    from tests.support.waiting import wait_until

    source, sink, dlq = make_topic("id-in", partitions=1), make_topic("id-out", partitions=1), make_topic("id-dlq")
    now = datetime.now(timezone.utc) - timedelta(seconds=8)
    data = [dict(o, created_at=now) for o in orders(20)]
    _seed(bootstrap_servers, source, data)
    from pyspark.sql import functions as F

    class FiveSecondWindows(OrdersPerCurrency):
        def transform(self, batch):
            w = (batch.select("value.created_at", "value.currency", "value.amount")
                 .withWatermark("created_at", "1 second")
                 .groupBy(F.window("created_at", "5 seconds"), "currency")
                 .agg(F.count("*").alias("orders"), F.sum("amount").alias("amount")))
            return w.select(F.col("currency").cast("binary").alias("key"), F.struct(
                F.col("window.start").alias("start"), F.col("window.end").alias("end"), "currency", "orders",
                "amount").alias("value"))

    settings = resolve_settings(FiveSecondWindows, bootstrap_servers, inputs=[source], output=sink, dead_letter=dlq,
                                watermark_idle_s=1.0)
    thread = DriverThread(settings, spark).start()
    try:
        # `now`'s 5-second window has ended (5 s ago); the clock's watermark passes it 1 s later.
        assert wait_until(lambda: read_all(bootstrap_servers, sink, timeout=10, settle=0.5), 90,
                          "the quiet window emitted", every=1.0), thread.lines[-5:]
    finally:
        assert thread.stop() == 0, thread.outcome
    got = [WINDOW.decode(r.value) for r in read_all(bootstrap_servers, sink)]
    assert sum(v["orders"] for v in got) == len(data) and all(v["end"] <= datetime.now(timezone.utc) for v in got)


def test_distinct_customers_exact_and_approximate(bootstrap_servers, make_topic, run_processor) -> None:
    """count(DISTINCT) keeps the values seen; approx_count_distinct keeps a mergeable sketch: both
    over all batches, in update mode."""
    from pyspark.sql import functions as F

    class DistinctCustomers(RunningTotals):
        output_value_schema = None

        def transform(self, batch):
            per_currency = (batch.groupBy(F.col("value.currency").alias("currency"))
                            .agg(F.countDistinct("value.customer_id").alias("exact"),
                                 F.approx_count_distinct("value.customer_id").alias("approx")))
            return per_currency.select(F.col("currency").cast("binary").alias("key"),
                                       F.to_json(F.struct("exact", "approx")).alias("value"))

    source, sink, dlq = make_topic("dc-in", partitions=2), make_topic("dc-out", partitions=1), make_topic("dc-dlq")
    data = list(orders(3000))
    _seed(bootstrap_servers, source, data)
    driver = run_processor(DistinctCustomers, inputs=[source], output=sink, dead_letter=dlq,
                           max_records_per_partition=400)
    assert driver.exit_code == 0, driver.lines
    last = {r.key.decode(): json.loads(r.value) for r in read_all(bootstrap_servers, sink)}
    for currency in {o["currency"] for o in data}:
        exact = len({o["customer_id"] for o in data if o["currency"] == currency})
        assert last[currency]["exact"] == exact
        assert last[currency]["approx"] == pytest.approx(exact, rel=0.05)
