"""txstream on a Spark standalone cluster whose two workers are separate (simulated) hosts.

The processor is a package written into the test's own directory (not installed, not on any
host's path: the workers' /tmp is private), with a Python UDF in a module of its own, so every
run depends on txstream shipping the code. Each scenario checks, as the chaos suite does, that
the read_committed output is exactly the input (no duplicate, nothing missing), that a
read_committed checker reading all along saw no duplicate, and that the audit (`txstream
verify`'s) is clean; the Spark event log says on which hosts the tasks really ran.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.chaos import harness as h
from tests.cluster.conftest import GOOD_ENV, SASL_PASSWORD, SPLIT_ENV
from tests.support.kafka import committed, read_all
from tests.support.running import REPO, App, Run
from tests.support.secret_scan import files_holding, wrapped
from tests.support.seeding import seed_numbered
from tests.support.spark_standalone import SparkStandalone
from tests.support.waiting import wait_until

PARTITIONS = 4

APP_FILES = {
    "clusterapp/__init__.py": "",
    "clusterapp/udfs.py": '''
import time

from pyspark.sql import functions as F, types as T


@F.udf(returnType=T.BinaryType())
def pass_slowly(value, partition, slow_partition, slow_ms):
    """The value unchanged, after slow_ms on the slow partition (-1: every partition)."""
    if slow_ms and slow_partition in (-1, partition):
        time.sleep(slow_ms / 1000.0)
    return value
''',
    "clusterapp/processor.py": '''
import os

from pyspark.sql import functions as F

from clusterapp.udfs import pass_slowly
from txstream import Processor


class SlowPass(Processor):
    def transform(self, batch):
        slow_partition = int(os.environ.get("CLUSTERAPP_SLOW_PARTITION", "-1"))
        slow_ms = int(os.environ.get("CLUSTERAPP_SLOW_MS", "0"))
        return batch.select("key", pass_slowly("value", "partition", F.lit(slow_partition),
                                               F.lit(slow_ms)).alias("value"), "offset")
''',
}
PROCESSOR = "clusterapp.processor:SlowPass"
# tests/support/state_processors.py:BucketRunningTotals, shipped from the app's directory as the
# other processors are (the hosts' Python workers import only what txstream ships).
APP_FILES["clusterapp/totals.py"] = '''
from pyspark.sql import functions as F

from txstream import Processor


class BucketRunningTotals(Processor):
    output_mode = "update"

    def transform(self, batch):
        n = F.expr("cast(substring(cast(key as string), 2) as long)")
        return (batch.select(n.alias("n")).withColumn("bucket", F.col("n") % 37)
                .groupBy("bucket").agg(F.count("*").alias("count"), F.sum("n").alias("sum"))
                .select(F.col("bucket").cast("string").alias("key"),
                        F.to_json(F.struct("count", "sum")).alias("value")))
'''
TOTALS = "clusterapp.totals:BucketRunningTotals"


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    for name, text in APP_FILES.items():
        path = tmp_path / "project" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path / "project"


def _conf_args(conf: dict[str, str]) -> list[str]:
    return [arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")]


def cluster_app(cluster: SparkStandalone, bootstrap: str, source: str, sink: str, app_dir: Path, *,
                python: str = GOOD_ENV, cap: int = 100_000, conf: dict[str, str] | None = None,
                env: dict[str, str] | None = None, dead_letter: str | None = None,
                processor: str = PROCESSOR, extra: list[str] | None = None) -> App:
    """`txstream run --master spark://...` from the project directory, its event log kept."""
    events = app_dir.parent / "events"
    events.mkdir(exist_ok=True)
    settings = {**cluster.driver_conf(cores_max=2), "spark.pyspark.python": f"{python}/bin/python",
                "spark.eventLog.enabled": "true", "spark.eventLog.dir": f"file://{events}",
                "spark.eventLog.compress": "false", **(conf or {})}
    master = settings.pop("spark.master")
    args = _conf_args(settings) + (["--dead-letter-topic", dead_letter] if dead_letter else []) + (extra or [])
    return App(bootstrap, source, sink, PARTITIONS, processor=processor, cap=cap, master=master, extra=args,
                 env_extra=env or {}, cwd=app_dir)


def task_attempts(app_dir: Path) -> list[dict]:
    """Every task attempt of the run's stages, from Spark's event log: stage, index, attempt,
    host, speculative, and how it ended ("Running" when the log has its start and no end: an
    attempt killed after the other copy won may not report its end before the app stops)."""
    attempts: dict[tuple[int, int, int], dict] = {}
    for log in (app_dir.parent / "events").rglob("*"):
        if not log.is_file() or log.name.startswith("appstatus"):
            continue
        for line in log.read_text().splitlines():
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            if event.get("Event") not in ("SparkListenerTaskStart", "SparkListenerTaskEnd"):
                continue
            info = event["Task Info"]
            key = (event["Stage ID"], info["Index"], info["Attempt"])
            ended = event["Event"] == "SparkListenerTaskEnd"
            if ended or key not in attempts:
                attempts[key] = {"stage": key[0], "index": key[1], "attempt": key[2], "host": info["Host"],
                                 "speculative": info["Speculative"],
                                 "end": event["Task End Reason"]["Reason"] if ended else "Running",
                                 "killed": info.get("Killed", False)}
    return list(attempts.values())


def _started(cluster: SparkStandalone, app: App, run: Run) -> None:
    wait_until(lambda: app.events().said("executor preflight passed"), 240, "the executor preflight", run=run)


def test_a_package_udf_runs_on_both_hosts_exactly_once(spark_standalone, hosts_kafka, hosts_kafka_cluster,
                                                       hosts_topic, app_dir):
    """The processor's package is shipped; the preflight passes on both hosts; the batches' tasks
    run on both, through the broker's SASL listener; the output is exact; and the password is in
    no file the run wrote on any host (event log, executor logs, work and local directories)."""
    source, sink = hosts_topic("cl-in", PARTITIONS), hosts_topic("cl-out", PARTITIONS)
    expected = seed_numbered(hosts_kafka, source, PARTITIONS, h.scale(4_000, 40_000))
    checker = h.Checker(hosts_kafka, sink, PARTITIONS)
    sasl = ["--bootstrap-servers", hosts_kafka_cluster.secured_bootstrap_servers,   # the last one given wins
            *(arg for k, v in hosts_kafka_cluster.client_properties().items() for arg in ("-X", f"{k}={v}"))]
    app = cluster_app(spark_standalone, hosts_kafka, source, sink, app_dir, cap=h.scale(500, 2_000), extra=sasl)
    try:
        checker.start()
        code = app.start(until_caught_up=True).wait(600)
        log = app.log_text()
        assert code == 0, log[-4000:]
        events = app.events()
        assert events.said(f"Spark master {spark_standalone.master_url} (from --master)"), log[-3000:]
        assert any("shipping the processor's code to the executors" in m and "(clusterapp.processor)" in m
                   for m in events.messages()), log[-3000:]
        preflight = next(m for m in events.messages() if "executor preflight passed" in m)
        assert "w1 (" in preflight and "w2 (" in preflight, preflight
        hosts = {a["host"] for a in task_attempts(app_dir) if a["end"] == "Success"}
        assert hosts == {spark_standalone.host(0).address, spark_standalone.host(1).address}, hosts
        checker.drain()
        h.verdict("package UDF on two hosts", hosts_kafka, app, expected, checker=checker)
        assert files_holding(app_dir.parent, SASL_PASSWORD) == {}
        assert wrapped(app.log_text().encode(), SASL_PASSWORD.encode()) is None
        for i in (0, 1):   # each host's own /tmp: the workers' work and local directories
            scan = spark_standalone.host(i).run(
                [sys.executable, "-c", "import sys; from tests.support.secret_scan import files_holding; "
                 "print(files_holding(__import__('pathlib').Path('/tmp'), sys.argv[1]))", SASL_PASSWORD],
                capture_output=True, text=True, cwd=str(REPO), env={**os.environ, "PYTHONPATH": str(REPO)})
            assert scan.returncode == 0 and scan.stdout.strip() == "{}", scan.stdout + scan.stderr
    finally:
        checker.stop_event.set()
        app.destroy_all()


@dataclass
class SubmittedApp(App):
    """The same app started by spark-submit, through `python -m txstream.submit --path`."""

    submit_conf: dict[str, str] = field(default_factory=dict)

    def command(self, until_caught_up: bool) -> list[str]:
        args = super().command(until_caught_up)
        run_args = args[args.index("run") + 1:]
        at = run_args.index("--master")
        del run_args[at:at + 2]   # spark-submit's --master is the one
        entry = subprocess.run([sys.executable, "-m", "txstream.submit", "--path"], capture_output=True,
                               text=True, check=True).stdout.strip()
        spark_submit = str(Path(sys.executable).parent / "spark-submit")
        return [spark_submit, "--master", self.master, *_conf_args(self.submit_conf), entry, "run", *run_args]


def test_spark_submit_runs_the_app_on_the_cluster(spark_standalone, hosts_kafka, hosts_topic, app_dir):
    """spark-submit's --master and --conf reach the run (txstream adds nothing over them)."""
    source, sink = hosts_topic("sub-in", PARTITIONS), hosts_topic("sub-out", PARTITIONS)
    expected = seed_numbered(hosts_kafka, source, PARTITIONS, h.scale(2_000, 20_000))
    settings = {**spark_standalone.driver_conf(cores_max=2), "spark.pyspark.python": f"{GOOD_ENV}/bin/python",
                "spark.pyspark.driver.python": sys.executable}
    master = settings.pop("spark.master")
    import pyspark

    # spark-submit as a user runs it: with SPARK_HOME (here the pip-installed pyspark's).
    app = SubmittedApp(hosts_kafka, source, sink, PARTITIONS, processor=PROCESSOR, cap=h.scale(1_000, 5_000),
                       master=master, cwd=app_dir, submit_conf=settings,
                       env_extra={"SPARK_HOME": str(Path(pyspark.__file__).parent)})
    try:
        code = app.start(until_caught_up=True).wait(600)
        log = app.log_text()
        assert code == 0, log[-4000:]
        assert app.events().said("(from spark-submit)") and app.events().said("executor preflight passed"), log[-3000:]
        h.verdict("spark-submit", hosts_kafka, app, expected)
    finally:
        app.destroy_all()


def test_a_host_without_txstream_stops_the_run_before_anything_is_read(spark_standalone, hosts_kafka,
                                                                       hosts_topic, app_dir):
    """w2's interpreter (same path, another environment) lacks txstream: the preflight names the
    host and what is missing; nothing is published, dead-lettered or committed."""
    source, sink, dead = (hosts_topic("nt-in", PARTITIONS), hosts_topic("nt-out", PARTITIONS),
                          hosts_topic("nt-dead", 1))
    seed_numbered(hosts_kafka, source, PARTITIONS, 400)
    app = cluster_app(spark_standalone, hosts_kafka, source, sink, app_dir, python=SPLIT_ENV, dead_letter=dead)
    try:
        code = app.start(until_caught_up=True).wait(300)
        log = app.log_text()
        assert code != 0, log[-3000:]
        message = next((line for line in log.splitlines() if "executor preflight found" in line), "")
        assert "1 host(s)" in message, log[-3000:]
        host_line = next(line for line in log.splitlines() if line.strip().startswith("host w2 "))
        assert spark_standalone.host(1).address in host_line and "txstream is not importable" in host_line, host_line
        assert "host w1" not in log, log[-2000:]
        assert read_all(hosts_kafka, sink, isolation="read_uncommitted", timeout=10) == []
        assert read_all(hosts_kafka, dead, isolation="read_uncommitted", timeout=10) == []
        assert set(committed(hosts_kafka, app.app_id, source, PARTITIONS).values()) == {None}
    finally:
        app.destroy_all()


def test_speculative_copies_race_on_the_other_host(spark_standalone, hosts_kafka, hosts_topic, app_dir):
    """spark.speculation with one slow (skewed) partition: Spark starts a copy of its publishing
    task on the other host (it never speculates on the host of the original), both attempts run
    under the range's transactional.id, and the range is published once."""
    source, sink = hosts_topic("spec-in", PARTITIONS), hosts_topic("spec-out", PARTITIONS)
    expected = seed_numbered(hosts_kafka, source, PARTITIONS, h.scale(800, 8_000))
    checker = h.Checker(hosts_kafka, sink, PARTITIONS)
    conf = {"spark.speculation": "true", "spark.speculation.multiplier": "1.5", "spark.speculation.quantile": "0.5",
            "spark.speculation.minTaskRuntime": "500ms", "spark.speculation.interval": "100ms",
            # Spark >= 3.4 only speculates "inefficient" tasks unless this is off.
            "spark.speculation.efficiency.enabled": "false"}
    app = cluster_app(spark_standalone, hosts_kafka, source, sink, app_dir, conf=conf,
                      # ~30 s for partition 0's 200 records: Spark speculates while the other tasks
                      # take less than 60 s, their Python workers' start on a busy machine included
                      # (at 4 s, 1 CI run in 3 saw no speculative copy; at 10 s, a run at load 40).
                      env={"CLUSTERAPP_SLOW_PARTITION": "0", "CLUSTERAPP_SLOW_MS": "150"})
    try:
        checker.start()
        code = app.start(until_caught_up=True).wait(600)
        log = app.log_text()
        assert code == 0, log[-4000:]
        attempts = task_attempts(app_dir)
        by_task: dict[tuple[int, int], list[dict]] = defaultdict(list)
        for attempt in attempts:
            by_task[(attempt["stage"], attempt["index"])].append(attempt)
        raced = [(key, tries) for key, tries in by_task.items()
                 if any(t["speculative"] for t in tries) and len({t["host"] for t in tries}) == 2]
        assert raced, f"no speculative copy ran on the other host: {attempts}"
        checker.drain()
        h.verdict("speculation across hosts", hosts_kafka, app, expected, checker=checker,
                  extra=f"{len(raced)} task(s) raced across the hosts")
    finally:
        checker.stop_event.set()
        app.destroy_all()


def _batches(app: App) -> int:
    return len(app.events().batches)


def test_executors_killed_mid_batch_and_a_host_lost(spark_standalone, hosts_kafka, hosts_topic, app_dir):
    """An executor JVM SIGKILLed mid-batch three times (alternating hosts, each time once a new
    executor has replaced the last one), then every process of w2's host killed: the run goes
    on, on w1 alone, and the output is exact. Runs last: it takes a worker down (restarted after)."""
    source, sink = hosts_topic("kill-in", PARTITIONS), hosts_topic("kill-out", PARTITIONS)
    expected = seed_numbered(hosts_kafka, source, PARTITIONS, h.scale(12_000, 120_000))
    checker = h.Checker(hosts_kafka, sink, PARTITIONS)
    # ~0.4 s of UDF per task: a kill lands inside a batch's tasks, not between batches.
    app = cluster_app(spark_standalone, hosts_kafka, source, sink, app_dir, cap=h.scale(200, 1_000),
                      env={"CLUSTERAPP_SLOW_MS": "2"})
    kills: list[str] = []
    try:
        checker.start()
        run = app.start(until_caught_up=True)
        _started(spark_standalone, app, run)
        for worker in (0, 1, 0):
            wait_until(lambda w=worker: spark_standalone.executor_pids(w), 120,
                       f"an executor on w{worker + 1}", run=run)
            seen = _batches(app)
            wait_until(lambda s=seen: _batches(app) > s, 120, "the next batch", run=run)
            killed = spark_standalone.kill_executors(worker)
            assert killed, f"no executor to kill on w{worker + 1}"
            kills.append(f"executor {killed} on w{worker + 1} after batch {_batches(app)}")
        seen = _batches(app)
        wait_until(lambda: _batches(app) > seen + 1, 240, "batches after the executor kills", run=run)
        spark_standalone.kill_host(1)
        kills.append(f"host w2 after batch {_batches(app)}")
        code = run.wait(900)
        log = app.log_text()
        assert code == 0, log[-5000:]
        assert _batches(app) > seen + 2, "the run did not go on after the host was lost"
        hosts_after = {a["host"] for a in task_attempts(app_dir) if a["end"] == "Success"}
        assert spark_standalone.host(0).address in hosts_after
        checker.drain()
        h.verdict("executors killed, a host lost", hosts_kafka, app, expected, checker=checker,
                  extra="; ".join(kills))
    finally:
        checker.stop_event.set()
        app.destroy_all()
        spark_standalone.restart_worker(1)



def unit_hosts(app_dir: Path, app_id: str, units: int) -> dict[int, dict[int, str]]:
    """{batch: {unit: host}}: where each unit's task (merge and publisher, the batch job's stage
    of `units` tasks) last succeeded, from Spark's event log (job groups name the batch)."""
    stages: dict[int, int] = {}   # stage id -> batch
    prefix = f"txstream-{app_id}-batch-"
    for log in (app_dir.parent / "events").rglob("*"):
        if not log.is_file() or log.name.startswith("appstatus"):
            continue
        for line in log.read_text().splitlines():
            if '"SparkListenerJobStart"' not in line:
                continue
            event = json.loads(line)
            group = (event.get("Properties") or {}).get("spark.jobGroup.id", "")
            if group.startswith(prefix):
                for info in event["Stage Infos"]:
                    if info["Number of Tasks"] == units:
                        stages[info["Stage ID"]] = int(group[len(prefix):])
    hosts: dict[int, dict[int, str]] = defaultdict(dict)
    for a in sorted(task_attempts(app_dir), key=lambda a: (a["stage"], a["attempt"])):
        if a["stage"] in stages and a["end"] == "Success":
            hosts[stages[a["stage"]]][a["index"]] = a["host"]
    return dict(hosts)


def state_copies(host, app_id: str) -> set[int]:
    """The units whose local copy of the state (task/state_unit.py `_store`: RocksDB in the
    executor's local directory) is on `host`."""
    found = host.run(["find", "/tmp", "-maxdepth", "7", "-type", "d", "-name", "agg-*",
                      "-path", f"*/txstream-state-{app_id}/*"],
                     capture_output=True, text=True).stdout.split()
    return {int(path.rsplit("-", 1)[1]) for path in found}


def test_state_restored_on_the_other_host_when_its_host_is_lost(spark_standalone, hosts_kafka, hosts_topic,
                                                                app_dir):
    """Running totals (3 state units, RocksDB copies in the executors' local directories, a
    snapshot due every 20 changelog records) on both hosts; once a batch has run units on w2,
    every process of w2's host is killed: its executor, its Python workers and its copies of the
    state are gone. The next batches run those units on w1, which restores them from Kafka (the
    newest snapshot and the changelog's tail), and per bucket the updates a read_committed reader
    sees strictly increase and the last equals the exact total. Takes w2 down (restarted after).
    (The batch events carry no per-unit restore: where the units ran comes from Spark's event log.)"""
    from tests.support.state_processors import running_totals_check
    from txstream.state.changelog import snapshot_topic

    units = 3
    source, sink = hosts_topic("st-in", PARTITIONS), hosts_topic("st-out", units)
    records = h.scale(8_000, 80_000)
    seed_numbered(hosts_kafka, source, PARTITIONS, records)
    app = cluster_app(spark_standalone, hosts_kafka, source, sink, app_dir, cap=h.scale(150, 1_000),
                      processor=TOTALS, extra=["--output-units", str(units), "--state-snapshot-every", "20"],
                      # No locality wait: the units' tasks go to both hosts, not all to the one that
                      # holds most of the shuffle's map output.
                      conf={"spark.locality.wait": "0"})
    w1, w2 = spark_standalone.host(0).address, spark_standalone.host(1).address
    try:
        run = app.start(until_caught_up=True)
        _started(spark_standalone, app, run)
        held: set[int] = set()
        # A copy appears while its batch runs: wait for that batch's event too, so that the
        # event log's hosts of the batches up to the kill include it.
        wait_until(lambda: (held.update(state_copies(spark_standalone.host(1), app.app_id)) or held)
                   and app.events().batches, 240, "a unit's copy of the state on w2 and a batch done", run=run)
        spark_standalone.kill_host(1)
        killed_after = max(b["batch"] for b in app.events().batches)
        code = run.wait(600)
        log = app.log_text()
        assert code == 0, log[-5000:]
        where = unit_hosts(app_dir, app.app_id, units)
        before = [b for b in where if b <= killed_after]
        after = [b for b in where if b > killed_after + 1]   # the batch in flight at the kill may have finished on w2
        on_w2 = {u for b in before for u, host in where[b].items() if host == w2}
        assert held <= on_w2, f"w2 held copies of units {held}, but the event log has {where}"
        assert after and all(set(where[b].values()) == {w1} for b in after), where
        moved = {u for u in held if any(u in where[b] for b in after)}
        assert moved, f"none of w2's units {held} ran on w1 after the loss: {where}"
        out = read_all(hosts_kafka, sink, timeout=120)
        problems = running_totals_check(out, range(records))
        manifests = sum(1 for r in read_all(hosts_kafka, snapshot_topic(app.app_id, "agg"), timeout=30)
                        if r.key == b"manifest")
        print(f"state across a lost host: {records} records, {len(where)} batches, units {sorted(moved)} of w2's "
              f"restored on w1 after batch {killed_after}, {manifests} snapshots, {len(out)} updates, "
              f"{len(problems)} problems", flush=True)
        assert not problems, problems[:8]
        assert manifests, "no snapshot was written: the restore on w1 read the changelog alone"
    finally:
        app.destroy_all()
        spark_standalone.restart_worker(1)


def test_a_table_join_runs_on_both_hosts_and_survives_a_lost_one(spark_standalone, hosts_kafka, hosts_topic,
                                                                 app_dir):
    """A stream joined to a table that changes while it runs (tests/support/table_check.py), on
    both hosts; once tasks have run on w2, every process of w2's host is killed (its Python
    workers' copies of the table gone). The run goes on on w1, which reads the table from its
    topic: every order once, every batch's rows one version of the table. Takes w2 down
    (restarted after)."""
    import uuid
    from collections import Counter

    from confluent_kafka.admin import AdminClient, NewTopic

    from tests.support.kafka import produce
    from tests.support.table_check import TableWriter, versions_by_batch

    table = f"tj-table-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": hosts_kafka})   # kept: a client collected early fails its futures
    admin.create_topics([NewTopic(table, 1, 1, config={"cleanup.policy": "compact"})])[table].result(30)
    source, sink = hosts_topic("tj-in", PARTITIONS), hosts_topic("tj-out", 3)
    writer = TableWriter(hosts_kafka, table)
    orders = [(f"c{i % writer.customers}".encode(), f"o{i}".encode()) for i in range(h.scale(4_000, 40_000))]
    produce(hosts_kafka, source, orders)
    app = cluster_app(spark_standalone, hosts_kafka, source, sink, app_dir, cap=h.scale(150, 1_000),
                      processor=f"{REPO}/tests/support/table_processors.py:EnrichWide",
                      extra=["--output-units", "3", "--table", f"customers={table}"],
                      conf={"spark.locality.wait": "0"})
    w2 = spark_standalone.host(1).address
    try:
        writer.start()
        run = app.start(until_caught_up=True)
        _started(spark_standalone, app, run)
        wait_until(lambda: app.events().batches and any(a["host"] == w2 for a in task_attempts(app_dir)), 240,
                   "a batch done and tasks on w2", run=run)
        spark_standalone.kill_host(1)
        code = run.wait(600)
        assert code == 0, app.log_text()[-5000:]
        writer.finish()
        out = read_all(hosts_kafka, sink, timeout=120)
        assert Counter(r.value.split(b"=")[0] for r in out) == Counter(v for _, v in orders), \
            "an order missing or published twice"
        by_batch, torn = versions_by_batch(out, writer.log)
        print(f"table join across a lost host: {len(orders)} orders, {len(writer.log)} table writes, "
              f"{len(by_batch)} batches", flush=True)
        assert not torn, f"batches whose rows joined different versions of the table: {sorted(torn)[:5]}"
    finally:
        writer.finish()
        app.destroy_all()
        spark_standalone.restart_worker(1)
