"""Compaction must not bring deleted keys back (issue 60, item 4): once the cleaner has removed a
changelog tombstone (delete.retention.ms after its first cleaning), a restore from a local copy
or snapshot taken before the deletion would keep the deleted key. Restore refuses such a source
and reads the whole changelog instead. Run against the real broker with compaction sped up: the
changelog rolls a segment every 100 ms, is cleanable at 1 % dirty, keeps tombstones 2 s, and the
broker's cleaner looks every 100 ms (a dynamic broker config, put back afterwards)."""
from __future__ import annotations

import uuid

import pytest
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from tests.state.test_state_restore import OPERATOR, UNITS, Unit
from tests.support.waiting import wait_until
from txstream.state import partition
from txstream.state.changelog import CHANGELOG_CONFIG, SNAPSHOT_CONFIG, changelog_topic, snapshot_topic
from txstream.state.restore import restore
from txstream.state.stores import open_store
from txstream.task.units import markers_name

FAST_COMPACTION = {**CHANGELOG_CONFIG, "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01",
                   "delete.retention.ms": "2000", "min.compaction.lag.ms": "0"}
CLEANER_BACKOFF = "log.cleaner.backoff.ms"


def _cleaner_backoff(admin, value: str | None) -> None:
    """Set (or, None, drop) the cleaner's pause between passes on every broker: a per-broker
    dynamic config, so no restart."""
    op = AlterConfigOpType.SET if value is not None else AlterConfigOpType.DELETE
    for broker in admin.list_topics(timeout=30).brokers:
        resource = ConfigResource(ConfigResource.Type.BROKER, str(broker), incremental_configs=[
            ConfigEntry(CLEANER_BACKOFF, value, incremental_operation=op)])
        admin.incremental_alter_configs([resource])[resource].result(30)


@pytest.fixture
def fast_app(admin) -> str:
    """An app whose changelog compacts within seconds, on a broker whose cleaner looks often."""
    app_id = f"compact-{uuid.uuid4().hex[:8]}"
    topics = [NewTopic(changelog_topic(app_id, OPERATOR), UNITS, 1, config=FAST_COMPACTION),
              NewTopic(snapshot_topic(app_id, OPERATOR), UNITS, 1, config=SNAPSHOT_CONFIG),
              NewTopic(markers_name(app_id), UNITS, 1)]
    for future in admin.create_topics(topics).values():
        future.result(30)
    _cleaner_backoff(admin, "100")
    try:
        yield app_id
    finally:
        _cleaner_backoff(admin, None)
        admin.delete_topics([t.topic for t in topics])


def _changelog_keys(unit: Unit) -> set[bytes]:
    keys: set[bytes] = set()
    with partition.reader(unit.clients, unit.app_id) as reader:
        partition.read_to_end(reader, changelog_topic(unit.app_id, OPERATOR), unit.unit, None,
                              lambda records: keys.update(r.key() for r in records), 30)
    return keys


def test_a_source_from_before_a_compacted_away_tombstone_is_refused(bootstrap_servers, fast_app, tmp_path) -> None:
    unit = Unit(bootstrap_servers, fast_app, 0, open_store("memory", None, 0))
    unit.batch(1, {b"closed": b"window", b"open": b"1"})
    local = open_store("memory", None, 0)          # this worker's copy, restored after batch 1
    restore(unit.clients, fast_app, OPERATOR, 0, local, unit.marker())
    assert local.get(b"closed") == b"window"
    unit.snapshot()                                # and a snapshot of the same state
    unit.batch(2, {}, deletes=(b"closed",))        # the window closes: its key is deleted
    batch = [2]

    def tombstone_gone() -> bool:
        # Filler batches: each rolls the active segment (segment.ms), so the cleaner can clean
        # the one holding the tombstone, then remove it once its retention has passed.
        batch[0] += 1
        unit.batch(batch[0], {b"open": b"%d" % batch[0]})
        return b"closed" not in _changelog_keys(unit)

    wait_until(tombstone_gone, 120, "the cleaner to remove the changelog's tombstone", every=0.3)
    assert unit.store.get(b"closed") is None

    report = restore(unit.clients, fast_app, OPERATOR, 0, local, unit.marker())
    assert local.get(b"closed") is None, f"the deleted key came back from the {report.source}"
    assert report.source == "changelog" and len(report.refused) == 2, report
    assert list(local.items()) == list(unit.store.items())

    fresh = open_store("memory", None, 0)          # no local copy: the snapshot alone is too old too
    report = restore(unit.clients, fast_app, OPERATOR, 0, fresh, unit.marker())
    assert fresh.get(b"closed") is None and report.source == "changelog", report
    assert list(fresh.items()) == list(unit.store.items())
