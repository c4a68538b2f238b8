"""A stream joined to a table that changes while the stream runs (issue 61), as a real `txstream
run` subprocess killed at the wide protocol's dangerous points and restarted until a run exits 0.

Every order must come out exactly once, and every batch must have joined one version of the
table: the rows a batch published (its units commit one by one, so a crash can leave some units'
rows published and the rest to its re-run) all agree with one cut of the table's log. A re-run
that read the table anew, rather than the version its plan logged, breaks that.
"""
from __future__ import annotations

from collections import Counter

import pytest

from tests.chaos import harness as h
from tests.support.kafka import produce, read_all
from tests.support.running import App
from tests.support.table_check import TableWriter, versions_by_batch
from txstream.tools.verify import audit

pytestmark = pytest.mark.chaos
PARTITIONS = 3
PROCESSOR = "tests.support.table_processors:EnrichWide"
EXTRA = ["--output-units", "3", "-X", "consumer.session.timeout.ms=6000"]   # and --table customers=TOPIC


@pytest.mark.timeout(1500)
def test_kills_while_the_table_changes_each_batch_joins_one_version(bootstrap_servers, make_topic) -> None:
    records = h.scale(6_000, 100_000)
    table = make_topic("tc-table", 1, **{"cleanup.policy": "compact"})
    source, sink = make_topic("tc-in", PARTITIONS), make_topic("tc-out", 3)
    writer = TableWriter(bootstrap_servers, table)   # c<k> = v<k> written first, then updates
    orders = [(f"c{i % writer.customers}".encode(), f"o{i}".encode()) for i in range(records)]
    produce(bootstrap_servers, source, orders)
    faults = "driver.after_plan_log=kill@2,publish.after_commit=kill@4,driver.before_close=kill@7"
    app = App(bootstrap_servers, source, sink, PARTITIONS, processor=PROCESSOR, cap=h.scale(300, 3_000),
              extra=[*EXTRA, "--table", f"customers={table}"], faults=faults)
    try:
        writer.start()
        codes = app.until_done(6)
        writer.finish()
        assert codes.count(0) == 1 and len(codes) >= 4, f"exit codes {codes}: not every kill fired"
        replays = [m for m in app.events().messages() if "re-running its logged plan" in m]
        assert replays, app.log_text()[-3000:]
        out = read_all(bootstrap_servers, sink, timeout=300)
        got = Counter(r.value.split(b"=")[0] for r in out)
        assert got == Counter(v for _, v in orders), "an order missing or published twice"
        by_batch, torn = versions_by_batch(out, writer.log)
        assert not torn, f"batches whose rows joined different versions of the table: {sorted(torn)[:5]}"
        report = audit(bootstrap_servers, source, sink, app_id=app.app_id)
        assert report.clean, report.table()
        print(f"table crashes: {records} orders, {len(writer.log)} table writes, exits {codes}, "
              f"{len(by_batch)} batches, {len(replays)} re-runs", flush=True)
        app.passed()
    finally:
        writer.finish()
        app.destroy_all()
