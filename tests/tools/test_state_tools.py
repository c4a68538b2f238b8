"""`txstream state show` and `txstream state reset` (txstream/cli/state.py) against the real
broker, on state fabricated as the engine writes it: operator descriptions in `<app>.state`,
changelog records with their `txstream.state` headers in each unit's transaction together with
its marker, a snapshot by state/snapshot.py, and a plan log whose shares carry a watermark."""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

import pytest
from click.testing import CliRunner, Result
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.kafka import committed, live_member
from txstream.cli.main import main
from txstream.kafka import lookups as kofs
from txstream.kafka.config import KafkaClients
from txstream.records import markers_name, read_markers
from txstream.state.changelog import (
    CHANGELOG_CONFIG,
    SNAPSHOT_CONFIG,
    ChangelogWriter,
    changelog_end,
    changelog_topic,
    snapshot_topic,
)
from txstream.state.codec import StateCodec
from txstream.state.keys import encode_key
from txstream.state.memory import MemoryStore
from txstream.state.operator import DEDUP, STATE_TOPIC_CONFIG, WINDOW, Aggregate, OperatorDescription, state_topic
from txstream.state.snapshot import write_snapshot
from txstream.state.store import StoreVersion
from txstream.tools.state_view import iso

UNITS = 2
T0 = 1_764_000_000_000                       # a minute boundary
W0, W1 = (T0, T0 + 60_000), (T0 + 60_000, T0 + 120_000)
WATERMARK = T0 + 90_000
AGG_SCHEMA = {"type": "record", "name": "agg_state",
              "fields": [{"name": "orders", "type": "long"}, {"name": "amount", "type": "double"}]}
DEDUP_SCHEMA = {"type": "record", "name": "dedup_state", "fields": [{"name": "first_seen", "type": "long"}]}
AGG = OperatorDescription("agg", WINDOW, UNITS, "append", ["currency"],
                          [Aggregate("orders", "count", "*"), Aggregate("amount", "sum", "amount")],
                          window={"column": "ts", "size_ms": 60_000, "slide_ms": 60_000},
                          watermark={"column": "ts", "delay_ms": 30_000}, state_schema=AGG_SCHEMA)
DEDUP_OP = OperatorDescription("dedup", DEDUP, UNITS, "append", ["order_id"], state_schema=DEDUP_SCHEMA)


def agg_value(orders: int, amount: float) -> bytes:
    return StateCodec(AGG_SCHEMA).encode({"orders": orders, "amount": amount})


def seen(ms: int) -> bytes:
    return StateCodec(DEDUP_SCHEMA).encode({"first_seen": ms})


class Unit:
    """One unit as the engine runs it: a store per operator, the unit's transactional producer,
    and a batch = both operators' changes and the marker in one transaction."""

    def __init__(self, bootstrap: str, app_id: str, unit: int) -> None:
        self.clients, self.app_id, self.unit = KafkaClients(bootstrap), app_id, unit
        self.producer = Producer(self.clients.producer(**{"transactional.id": f"{app_id}-unit-{unit}"}))
        self.producer.init_transactions(30)
        self.stores = {op: MemoryStore(unit) for op in ("agg", "dedup")}
        group = Consumer(self.clients.consumer(markers_name(app_id), **{"enable.auto.commit": False}))
        self.markers_metadata = group.consumer_group_metadata()
        group.close()

    def batch(self, batch: int, changes: dict[str, dict[bytes, bytes | None]], marker: bool = True) -> None:
        self.producer.begin_transaction()
        for op, writes in changes.items():
            store = self.stores[op]
            for key, value in writes.items():
                if value is None:
                    store.delete(key)
                else:
                    store.put(key, value)
            ChangelogWriter(self.app_id, op, self.unit).produce(self.producer, store.changes(), batch)
        if marker:
            self.producer.send_offsets_to_transaction(
                [TopicPartition(markers_name(self.app_id), self.unit, batch + 1)], self.markers_metadata, 30)
        self.producer.commit_transaction(30)
        for op in changes:
            store = self.stores[op]
            pending = dict(store.changes())   # the engine's pending file, applied once committed
            store.abort()
            store.load(pending.items(), StoreVersion(self.unit, batch))

    def snapshot(self, op: str) -> None:
        write_snapshot(self.clients, self.app_id, op, self.stores[op],
                       changelog_end(self.clients, self.app_id, op, self.unit))


@dataclass
class App:
    app_id: str
    input_topic: str
    topics: list[str]


def commit_plan(bootstrap: str, app_id: str, topic: str, offsets: dict[int, tuple[int, int]], batch: int) -> None:
    """The app group's offsets with plan shares (records.py PlanShare) carrying the watermark:
    partition -> (committed offset, the share's end); an end beyond the offset is a pending batch."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": app_id, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, offset, metadata=f"txs1;b={batch};e={end};k={UNITS};"
                                                                           f"t={T0};w={WATERMARK}")
                                 for p, (offset, end) in offsets.items()], asynchronous=False)
    finally:
        consumer.close()


def fabricate(bootstrap: str, admin: AdminClient) -> App:
    """Two operators over three batches. agg (windowed): unit 0 writes EUR and USD in window 0,
    then updates EUR and deletes USD, snapshots, then adds EUR in window 1; unit 1 writes GBP in
    window 0, sits batch 2 out, then moves GBP to window 1 (window 0 deleted). dedup: unit 0 sees
    o-1 in batch 1 and o-2 in batch 3. Markers: both units at batch 3."""
    app_id = f"statetools-{uuid.uuid4().hex[:8]}"
    input_topic = f"{app_id}-in"
    topics = [NewTopic(state_topic(app_id), 1, 1, config=STATE_TOPIC_CONFIG), NewTopic(input_topic, 2, 1),
              NewTopic(markers_name(app_id), UNITS, 1)]
    for op in ("agg", "dedup"):
        topics += [NewTopic(changelog_topic(app_id, op), UNITS, 1, config=CHANGELOG_CONFIG),
                   NewTopic(snapshot_topic(app_id, op), UNITS, 1, config=SNAPSHOT_CONFIG)]
    for future in admin.create_topics(topics).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": bootstrap})
    for description in (AGG, DEDUP_OP):
        producer.produce(state_topic(app_id), description.to_json(), description.operator.encode())
    assert producer.flush(30) == 0
    eur0, usd0, gbp0 = (encode_key([c], W0) for c in ("EUR", "USD", "GBP"))
    eur1, gbp1 = encode_key(["EUR"], W1), encode_key(["GBP"], W1)
    zero, one = Unit(bootstrap, app_id, 0), Unit(bootstrap, app_id, 1)
    zero.batch(1, {"agg": {eur0: agg_value(2, 10.0), usd0: agg_value(1, 5.0)},
                   "dedup": {encode_key(["o-1"]): seen(T0 + 1)}})
    one.batch(1, {"agg": {gbp0: agg_value(4, 40.0)}})
    zero.batch(2, {"agg": {eur0: agg_value(3, 12.5), usd0: None}})
    zero.snapshot("agg")
    zero.batch(3, {"agg": {eur1: agg_value(1, 1.0)}, "dedup": {encode_key(["o-2"]): seen(T0 + 61_000)}})
    one.batch(3, {"agg": {gbp1: agg_value(1, 2.0), gbp0: None}})
    commit_plan(bootstrap, app_id, input_topic, {0: (10, 10), 1: (7, 7)}, batch=3)
    return App(app_id, input_topic, [t.topic for t in topics])


@pytest.fixture(scope="module")
def app(bootstrap_servers: str, admin: AdminClient):
    fabricated = fabricate(bootstrap_servers, admin)
    yield fabricated
    admin.delete_topics(fabricated.topics)


def state_cli(bootstrap: str, *args: str) -> Result:
    result = CliRunner().invoke(main, ["state", *args, "--bootstrap-servers", bootstrap])
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def show_json(bootstrap: str, app_id: str, *args: str) -> dict:
    result = state_cli(bootstrap, "show", "--app-id", app_id, "--format", "json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def entries(view: dict, operator: str) -> list[tuple]:
    op = next(o for o in view["operators"] if o["operator"] == operator)
    return [(e["unit"], e["key"], e["window"]["start"] if e["window"] else None, e["value"]) for e in op["entries"]]


def test_show_lists_the_restored_state_of_every_operator(bootstrap_servers, app) -> None:
    view = show_json(bootstrap_servers, app.app_id)
    assert (view["watermark_ms"], view["watermark_batch"], view["last_batch"]) == (WATERMARK, 3, 3)
    # Tombstones applied (USD, GBP in window 0), snapshot plus tail, in state key order.
    assert entries(view, "agg") == [(0, ["EUR"], W0[0], {"orders": 3, "amount": 12.5}),
                                    (0, ["EUR"], W1[0], {"orders": 1, "amount": 1.0}),
                                    (1, ["GBP"], W1[0], {"orders": 1, "amount": 2.0})]
    assert entries(view, "dedup") == [(0, ["o-1"], None, {"first_seen": T0 + 1}),
                                      (0, ["o-2"], None, {"first_seen": T0 + 61_000})]
    agg = next(o for o in view["operators"] if o["operator"] == "agg")
    assert agg["windows"] == [{"start": W0[0], "end": W0[1], "keys": 1}, {"start": W1[0], "end": W1[1], "keys": 2}]
    assert agg["description"]["fingerprint"] == AGG.fingerprint() and agg["notes"] == []
    units = {u["unit"]: u for u in agg["units"]}
    assert units[0]["source"] == "snapshot of batch 2" and units[0]["snapshot_keys"] == 1
    assert units[0]["tail_records"] == 1                       # batch 3's record only
    assert units[1]["source"] == "changelog" and units[1]["tail_records"] == 3
    assert [(u["marker_batch"], u["last_written_batch"]) for u in agg["units"]] == [(3, 3), (3, 3)]
    # Offsets: records plus one commit marker per transaction that wrote the partition.
    assert [(u["changelog_start"], u["changelog_end"]) for u in agg["units"]] == [(0, 8), (0, 5)]
    assert agg["changelog_records"] == 13
    dedup = next(o for o in view["operators"] if o["operator"] == "dedup")
    assert dedup["windows"] is None
    assert [(u["marker_batch"], u["last_written_batch"], u["keys"]) for u in dedup["units"]] == [(3, 3, 2), (3, None, 0)]

    text = state_cli(bootstrap_servers, "show", "--app-id", app.app_id)
    assert text.exit_code == 0, text.output
    out = text.stdout
    assert f"App {app.app_id}: 2 stateful operators; watermark {iso(WATERMARK)} ({WATERMARK} ms, in batch 3's plan); " \
           "last batch 3" in out, out
    assert "Operator agg: window, output mode append, 2 unit(s)" in out, out
    assert "window: 60000 ms on ts (tumbling)" in out and "watermark: ts minus 30000 ms" in out, out
    assert "Open windows (2):" in out and "Keys (3):" in out, out
    rows = [line.split() for line in out.splitlines()]
    assert [iso(W0[0]), iso(W0[1]), '["EUR"]', "0", '{"orders":3,"amount":12.5}'] in rows, out
    assert ["1", "batch", "3", "batch", "3", "0..5", "changelog", "3", "1"] in rows, out
    assert "USD" not in out and "40.0" not in out, out
    assert "snapshot of batch 2 (1 keys)" in out, out


def test_show_filters_by_key_window_and_operator(bootstrap_servers, app) -> None:
    assert [e[:3] for e in entries(show_json(bootstrap_servers, app.app_id, "--key", "EUR"), "agg")] == \
        [(0, ["EUR"], W0[0]), (0, ["EUR"], W1[0])]
    gbp = show_json(bootstrap_servers, app.app_id, "--key", '["GBP"]')
    assert [e[:3] for e in entries(gbp, "agg")] == [(1, ["GBP"], W1[0])] and entries(gbp, "dedup") == []
    agg = next(o for o in gbp["operators"] if o["operator"] == "agg")
    assert (agg["keys"], agg["matched"], agg["windows"]) == (3, 1, [{"start": W1[0], "end": W1[1], "keys": 1}])
    assert [e[1] for e in entries(show_json(bootstrap_servers, app.app_id, "--key", "o-2", "--operator", "dedup"),
                                 "dedup")] == [["o-2"]]

    # --window: ISO or ms; only windowed operators are listed.
    for start in (iso(W1[0]), str(W1[0])):
        view = show_json(bootstrap_servers, app.app_id, "--window", start)
        assert [o["operator"] for o in view["operators"]] == ["agg"]
        assert [e[:3] for e in entries(view, "agg")] == [(0, ["EUR"], W1[0]), (1, ["GBP"], W1[0])]
    both = show_json(bootstrap_servers, app.app_id, "--window", iso(W0[0]), "--key", "GBP")
    assert entries(both, "agg") == []

    limited = state_cli(bootstrap_servers, "show", "--app-id", app.app_id, "--operator", "agg", "--limit", "1")
    assert "Operator dedup" not in limited.stdout and "Keys (the first 1 of 3):" in limited.stdout, limited.stdout
    assert limited.stdout.count('["EUR"]') == 1 and '["GBP"]' not in limited.stdout, limited.stdout

    for args, said in ((["--operator", "nope"], "has no operator 'nope'; its operators: agg, dedup"),
                       (["--operator", "dedup", "--window", str(W0[0])], "no operator of app"),
                       (["--window", "yesterday"], "give the window's start as milliseconds")):
        refused = state_cli(bootstrap_servers, "show", "--app-id", app.app_id, *args)
        assert refused.exit_code != 0 and said in refused.output, refused.output


def test_state_ahead_of_the_marker_is_shown_with_a_note(bootstrap_servers, admin) -> None:
    fabricated = fabricate(bootstrap_servers, admin)
    try:
        late = Unit(bootstrap_servers, fabricated.app_id, 1)
        late.batch(4, {"agg": {encode_key(["CHF"], W1): agg_value(7, 7.0)}}, marker=False)
        view = show_json(bootstrap_servers, fabricated.app_id, "--operator", "agg", "--key", "CHF")
        assert [e[:3] for e in entries(view, "agg")] == [(1, ["CHF"], W1[0])]
        notes = view["operators"][0]["notes"]
        assert len(notes) == 1 and "unit 1: the state holds batch 4, after the batch its marker names (3)" in notes[0]
        assert [(u["marker_batch"], u["last_written_batch"]) for u in view["operators"][0]["units"]] == [(3, 3), (3, 4)]
    finally:
        admin.delete_topics(fabricated.topics)


def test_an_app_without_state_is_one_line_and_exit_1(bootstrap_servers, make_topic) -> None:
    unknown = state_cli(bootstrap_servers, "show", "--app-id", f"nobody-{uuid.uuid4().hex[:6]}")
    assert unknown.exit_code == 1 and unknown.output.startswith("Error: no app 'nobody-"), unknown.output
    assert len(unknown.output.strip().splitlines()) == 1
    stateless = f"stateless-{uuid.uuid4().hex[:6]}"
    topic = make_topic("in", partitions=1)
    commit_plan(bootstrap_servers, stateless, topic, {0: (3, 3)}, batch=1)
    for command in ("show", "reset"):
        result = state_cli(bootstrap_servers, command, "--app-id", stateless)
        assert result.exit_code == 1, result.output
        assert result.output.startswith(f"Error: app '{stateless}' has no state: "), result.output


def test_reset_dry_run_then_refusals_then_execute_with_offsets(bootstrap_servers, admin) -> None:
    fabricated = fabricate(bootstrap_servers, admin)
    app_id = fabricated.app_id
    state_topics = [state_topic(app_id)] + [f"{app_id}.{op}.{kind}" for op in ("agg", "dedup")
                                             for kind in ("changelog", "snapshots")]
    try:
        dry = state_cli(bootstrap_servers, "reset", "--app-id", app_id)
        assert dry.exit_code == 0, dry.output
        assert dry.stdout.startswith(f"Dry run (nothing changed; add --execute to apply): the state of app {app_id}, "
                                     "5 topic(s) to delete"), dry.stdout
        rows = {line.split()[0]: line.split()[1:] for line in dry.stdout.splitlines() if line.startswith(app_id)}
        assert rows == {state_topic(app_id): ["descriptions", "1", "2"],
                        changelog_topic(app_id, "agg"): ["changelog", "2", "13"],
                        snapshot_topic(app_id, "agg"): ["snapshots", "2", "3"],
                        changelog_topic(app_id, "dedup"): ["changelog", "2", "4"],
                        snapshot_topic(app_id, "dedup"): ["snapshots", "2", "0"]}, dry.stdout
        assert f"Kept: the units' markers (group {app_id}.units)" in dry.stdout
        assert set(state_topics) <= set(kofs.cluster_topics(admin))

        with live_member(bootstrap_servers, app_id, fabricated.input_topic):
            running = state_cli(bootstrap_servers, "reset", "--app-id", app_id, "--execute")
            assert running.exit_code == 1 and "live member(s); stop them first" in running.output, running.output
            looking = state_cli(bootstrap_servers, "reset", "--app-id", app_id)
            assert looking.exit_code == 0 and "--execute is refused until the app is stopped" in looking.output
        assert set(state_topics) <= set(kofs.cluster_topics(admin))

        # Batch 4 planned, not closed: refused without --force, the dry run warns.
        commit_plan(bootstrap_servers, app_id, fabricated.input_topic, {0: (10, 15), 1: (7, 9)}, batch=4)
        pending = state_cli(bootstrap_servers, "reset", "--app-id", app_id, "--execute")
        assert pending.exit_code == 1 and f"batch 4 of group {app_id} is pending" in pending.output, pending.output
        assert "pass --force to reset all the same" in pending.output, pending.output
        warned = state_cli(bootstrap_servers, "reset", "--app-id", app_id)
        assert warned.exit_code == 0 and "warning: batch 4 of group" in warned.output, warned.output
        assert set(state_topics) <= set(kofs.cluster_topics(admin))

        before = read_markers(KafkaClients(bootstrap_servers), app_id, UNITS)
        done = state_cli(bootstrap_servers, "reset", "--app-id", app_id, "--execute", "--force", "--to-earliest")
        assert done.exit_code == 0, done.output
        assert done.stdout.startswith(f"Executed: the state of app {app_id}, 5 topic(s) deleted"), done.stdout
        assert f"Executed: group {app_id}, --to-earliest" in done.stdout, done.stdout
        assert not set(state_topics) & set(kofs.cluster_topics(admin))
        assert committed(bootstrap_servers, app_id, fabricated.input_topic, 2) == {0: 0, 1: 0}
        assert read_markers(KafkaClients(bootstrap_servers), app_id, UNITS) == before
        gone = state_cli(bootstrap_servers, "show", "--app-id", app_id)
        assert gone.exit_code == 1 and f"its state topic {app_id}.state does not exist" in gone.output, gone.output
    finally:
        admin.delete_topics(fabricated.topics)


def test_offsets_reset_of_a_stateful_app_refuses_to_move_the_offsets_alone(bootstrap_servers, admin) -> None:
    """`offsets reset` would leave the state counting the input up to the old offsets: refused
    with --execute (naming `state reset`), warned in a dry run, --force moves the offsets alone."""
    fabricated = fabricate(bootstrap_servers, admin)
    app_id, source = fabricated.app_id, fabricated.input_topic

    def offsets_cli(*args: str) -> Result:
        result = CliRunner().invoke(main, ["offsets", "reset", "--app-id", app_id, "--to-earliest", *args,
                                           "--bootstrap-servers", bootstrap_servers])
        assert "Traceback" not in result.output
        return result

    try:
        refused = offsets_cli("--execute")
        assert refused.exit_code == 1, refused.output
        assert f"group {app_id} is a stateful app's" in refused.output, refused.output
        assert f"`txstream state reset --app-id {app_id}` and the same target" in refused.output, refused.output
        assert committed(bootstrap_servers, app_id, source, 2) == {0: 10, 1: 7}
        dry = offsets_cli()
        assert dry.exit_code == 0 and "warning: group" in dry.output and "stateful app's" in dry.output, dry.output
        forced = offsets_cli("--execute", "--force")
        assert forced.exit_code == 0 and "--force: moving the offsets alone" in forced.output, forced.output
        assert committed(bootstrap_servers, app_id, source, 2) == {0: 0, 1: 0}
        assert state_topic(app_id) in kofs.cluster_topics(admin)
    finally:
        admin.delete_topics(fabricated.topics)
