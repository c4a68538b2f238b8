"""What a running txstream tells its operators: Prometheus metrics and JSON log lines.

Everything is handed in by the loop: each batch's report (the result row every task reports,
task/result.py RESULT_SCHEMA), the planner's watermarks, the cap and totals, the group membership
it follows. Nothing runs in executors and nothing runs per record: the loop calls `batch()` once
per batch and `event()` per notable event (assignment, revocation, retry, dead letter, fatal
error), and a batch updates a few series per partition, each looked up once and kept. One
CollectorRegistry per run (tests run several drivers in one process). docs/operations.md lists
the metrics and what to alert on.
"""
from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from txstream.constants import ACKED, ALREADY_DONE, COMMITTED, EXACTLY_ONCE, FENCED, batch_job_group
from txstream.errors import SettingsError

if TYPE_CHECKING:  # pragma: no cover
    from confluent_kafka import TopicPartition

    from txstream.driver.report import BatchReport
    from txstream.kafka.lookups import Watermarks
    from txstream.settings import RunSettings

log = logging.getLogger("txstream")

HUMAN, JSON = "human", "json"
LOG_FORMATS = (HUMAN, JSON)

# Time per stage, from each task's result row: reading+decoding; the publisher's wait for the
# transform's output ("upstream": the transform, the JVM hops, and the reading it is pipelined
# with in the same task, so the transform alone is not measured apart); encoding and producing;
# send_offsets+commit (or the acknowledgements); init_transactions (fresh producers only).
STAGES = ("read", "upstream", "produce", "commit", "init_transactions")
STAGE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
BATCH_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)


def _stage_seconds(row: dict) -> dict[str, float]:
    return {"read": float(row["read_s"]), "upstream": float(row["upstream_s"]),
            "produce": float(row["produce_s"]), "commit": float(row["commit_s"]),
            "init_transactions": float(row["init_s"])}


def _state_fields(report: BatchReport) -> dict[str, Any]:
    """A stateful batch's fields of its JSON event (docs/state.md); none for other batches."""
    if not any("rows_merged" in r and (r.get("state_keys") or r.get("rows_merged")) for r in report.rows) \
            and report.watermark_ms is None:
        return {}
    return {"watermark_ms": report.watermark_ms, "late": report.late,
            "late_outcome": "dead-lettered" if report.dead_letter_topic else "dropped",
            "rows_merged": sum(int(r.get("rows_merged") or 0) for r in report.rows),
            "state_keys": sum(int(r.get("state_keys") or 0) for r in report.rows),
            "restored_records": sum(int(r.get("restore_records") or 0) for r in report.rows)}


def failed_task_attempts(spark, job_group: str) -> int:
    """Task attempts Spark re-ran in the job group's stages (its own task retries)."""
    tracker = spark.sparkContext.statusTracker()
    failed = 0
    for job_id in tracker.getJobIdsForGroup(job_group):
        job = tracker.getJobInfo(job_id)
        for stage_id in (job.stageIds if job is not None else ()):
            stage = tracker.getStageInfo(stage_id)
            failed += stage.numFailedTasks if stage is not None else 0
    return failed


class Membership(Protocol):
    """What the metrics read of the group membership at scrape time."""

    generation_changes: int

    def owned(self) -> list[TopicPartition]: ...


class _Series(NamedTuple):
    records_in: Any
    records_out: Any
    lag: Any
    log_end_lag: Any
    committed: Any
    last_stable: Any


class _Live:
    """Figures read at scrape time, not pushed: membership changes happen between batches."""

    def __init__(self, telemetry: Telemetry) -> None:
        self.t = telemetry

    def describe(self) -> list:
        return []

    def collect(self):
        membership = self.t.membership
        rebalances = CounterMetricFamily(
            "txstream_rebalances", "Assignments and revocations this instance's group membership went through",
            labels=["app"])
        assigned = GaugeMetricFamily("txstream_assigned_partitions",
                                     "Input partitions this instance owns now (0: it processes nothing)",
                                     labels=["app"])
        rebalances.add_metric([self.t.app], membership.generation_changes if membership else 0)
        assigned.add_metric([self.t.app], len(membership.owned()) if membership else 0)
        yield rebalances
        yield assigned


class Telemetry:
    """Metrics (served when the settings name a port) and the log lines, human or JSON."""

    def __init__(self, settings: RunSettings, echo: Callable[[str], None]) -> None:
        s = settings
        self.membership: Membership | None = None   # read at scrape time (`follow`)
        self.app = s.app_id
        self.guarantee = s.guarantee
        self.json = s.log_format == JSON
        self.metrics_port, self.metrics_address = s.metrics_port, s.metrics_address
        self._out = echo
        self._server = None
        self.port: int | None = None    # the port bound (metrics_port 0 picks a free one)
        self.registry = r = CollectorRegistry()
        part = ["app", "guarantee", "topic", "partition"]
        self.records_in = Counter("txstream_records_in", "Input records decoded and given to the transform "
                                  "(undecodable ones count as dead letters)", part, registry=r)
        self.records_out = Counter("txstream_records_out", "Output records published", part, registry=r)
        self.dead_letters = Counter("txstream_dead_letters", "Input records set aside in the dead-letter topic",
                                    ["app", "topic", "partition", "stage"], registry=r)
        self.batches = Counter("txstream_batches", "Batches published", ["app", "guarantee"], registry=r)
        # State across batches (docs/state.md).
        self.state_keys = Gauge("txstream_state_keys", "Keys a state unit held after its last batch", ["app", "unit"],
                                registry=r)
        # outcome: "dead-lettered" (at stage late) or "dropped" (no dead-letter topic, as Spark drops them).
        self.late = Counter("txstream_late_records", "Rows behind the watermark, by where they went",
                            ["app", "outcome"], registry=r)
        self.restore_seconds = Gauge("txstream_state_restore_seconds", "How long a state unit's last restore took",
                                     ["app", "unit"], registry=r)
        self.restored = Counter("txstream_state_restored_records", "Changelog records state restores read", ["app"],
                                registry=r)
        self.watermark = Gauge("txstream_watermark_timestamp_seconds", "The last batch's watermark (Unix time)",
                               ["app"], registry=r)
        self.watermark_delay = Gauge("txstream_watermark_delay_seconds", "Wall-clock time minus the last batch's "
                                     "watermark, when the batch finished", ["app"], registry=r)
        self.batch_seconds = Histogram("txstream_batch_duration_seconds", "Wall time of a batch, plan to results",
                                       ["app"], buckets=BATCH_BUCKETS, registry=r)
        self.stage_seconds = Histogram("txstream_stage_duration_seconds", "Time per stage per task "
                                       "(upstream: the publisher's wait for the transform's output, reading included)", ["app", "stage"],
                                       buckets=STAGE_BUCKETS, registry=r)
        self.task_results = Counter("txstream_task_results", "Outcomes per range, one per input partition of a "
                                    "batch (committed, acked, already-done, stale-plan, fenced, empty)",
                                    ["app", "status"], registry=r)
        self.transactions = Counter("txstream_transactions", "Kafka transactions of the tasks by outcome",
                                    ["app", "outcome"], registry=r)
        self.fenced = Counter("txstream_fenced_producers", "Task producers fenced by a newer one of their "
                              "transactional.id (a zombie or a speculative attempt)", ["app"], registry=r)
        self.task_retries = Counter("txstream_task_retries", "Task attempts that failed and Spark ran again",
                                    ["app"], registry=r)
        self.batch_retries = Counter("txstream_batch_retries", "Batches or plans that failed and were retried",
                                     ["app", "error"], registry=r)
        self.lag = Gauge("txstream_partition_lag_records", "Records up to the last stable offset not yet "
                         "processed, as of the last plan", ["app", "topic", "partition"], registry=r)
        self.log_end_lag = Gauge("txstream_partition_log_end_lag_records", "Offsets up to the log end "
                                 "(including open transactions) not yet processed", ["app", "topic", "partition"],
                                 registry=r)
        self.committed = Gauge("txstream_partition_committed_offset", "The group's offset after the last batch",
                               ["app", "topic", "partition"], registry=r)
        self.last_stable = Gauge("txstream_partition_last_stable_offset", "Last stable offset at the last plan",
                                 ["app", "topic", "partition"], registry=r)
        self.cap = Gauge("txstream_batch_cap_records", "Records per partition per batch in force (capped to "
                         "stay inside transaction.timeout.ms)", ["app"], registry=r)
        self.timeout = Gauge("txstream_transaction_timeout_seconds", "transaction.timeout.ms of the task "
                             "producers, in seconds", ["app"], registry=r)
        self.last_plan = Gauge("txstream_last_plan_timestamp_seconds", "When the loop last planned (Unix time; "
                               "every batch and every idle turn plans)", ["app"], registry=r)
        self.last_batch = Gauge("txstream_last_batch_timestamp_seconds", "When the last batch finished (Unix "
                                "time)", ["app"], registry=r)
        self.info = Gauge("txstream_info", "One per running instance", ["app", "guarantee"], registry=r)
        r.register(_Live(self))
        self.info.labels(self.app, self.guarantee).set(1)
        self.timeout.labels(self.app).set(s.transaction_timeout_s)
        self.cap.labels(self.app).set(s.max_records_per_partition)
        # Every stage listed from the start, even before its first observation.
        self._stages = {stage: self.stage_seconds.labels(self.app, stage) for stage in STAGES}
        self._by_partition: dict[tuple[str, int], _Series] = {}
        self._log_end_lags: dict[str, int] = {}
        for outcome in ("committed", "aborted"):
            self.transactions.labels(self.app, outcome)
        self.fenced.labels(self.app)
        self.task_retries.labels(self.app)
        self.batches.labels(self.app, self.guarantee)

    # -- output -----------------------------------------------------------------------------------

    def echo(self, line: str) -> None:
        """The driver's other lines (warnings, notes): as they are, or as a JSON 'message'."""
        if self.json:
            self._emit("message", line)
        else:
            self._out(line)

    def _emit(self, event: str, message: str | None, **fields: Any) -> None:
        record = {"time": round(time.time(), 3), "event": event, "app": self.app, **fields}
        if message:
            record["message"] = message
        self._out(json.dumps(record, sort_keys=False, default=str))

    def start(self) -> None:
        if self.metrics_port is None or self._server is not None:
            return
        from prometheus_client import start_http_server

        try:
            self._server, _thread = start_http_server(self.metrics_port, self.metrics_address, registry=self.registry)
        except OSError as exc:
            raise SettingsError(f"cannot serve metrics on {self.metrics_address}:{self.metrics_port} "
                                f"({exc.strerror or exc}); choose another --metrics-port") from None
        self.port = self._server.server_address[1]
        host = "localhost" if self.metrics_address in ("0.0.0.0", "::", "") else self.metrics_address
        self.event("metrics", f"metrics at http://{host}:{self.port}/metrics", url=f"http://{host}:{self.port}/metrics")

    def follow(self, membership: Membership | None) -> None:
        """The group membership whose rebalances and assignment the metrics show (None: none)."""
        self.membership = membership

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # -- once per batch ---------------------------------------------------------------------------

    def batch(self, report: BatchReport, marks: dict[tuple[str, int], Watermarks] | None, line: str,
              cap: int, totals: dict[str, int], spark: Any = None) -> None:
        """Count a finished batch and print its line (human) or object (JSON).

        `marks` are the watermarks its plan was made from (the planner's, not asked again); None
        for a batch that is not the loop's own (the records before a poison record). `cap`: the
        records per partition in force; `totals`: the run's; `spark`: the session whose task
        retries of the batch are counted (None: not counted)."""
        app, g = self.app, self.guarantee
        committed = aborted = fenced = 0
        positions: dict[tuple[str, int], int] = {}
        dead: list[tuple[str, int, int]] = []
        slowest = dict.fromkeys(STAGES, 0.0)
        # A slot's ranges share one producer and one transaction (driver/slots.py): its rows
        # count once for transactions and the publisher's stages (its first row has them), each
        # for its own reading.
        slots_seen: set[str] = set()
        wide = report.reads is not None   # rows per output unit, not per range (driver/wide.py)
        if wide:
            committed = self._wide_batch(report, dead, positions, slowest)
        for row in ([] if wide else report.rows):
            plan = report.plans[int(row["index"])]
            topic, partition = plan.topic, str(plan.partition)
            series = self._series((plan.topic, plan.partition))
            n_in, n_out, n_dead = int(row["records_in"]), int(row["records_out"]), int(row["dead_letters"])
            series.records_in.inc(n_in)
            series.records_out.inc(n_out)
            if n_dead:
                # Only the reader's undecodable records come with the rows; the transform's are
                # counted by `event('dead_letter')` when the poison isolator sets one aside.
                self.dead_letters.labels(app, topic, partition, "decode").inc(n_dead)
                dead.append((plan.topic, plan.partition, n_dead))
            status = row["status"]
            self.task_results.labels(app, status).inc()
            first_of_slot = plan.transactional_id not in slots_seen or not plan.transactional_id
            slots_seen.add(plan.transactional_id)
            if status in (COMMITTED, ACKED):
                self._observe_stages(row, slowest, publisher=first_of_slot)
            positions[(plan.topic, plan.partition)] = (plan.end if status in (COMMITTED, ACKED, ALREADY_DONE)
                                                       else plan.start)
            if g == EXACTLY_ONCE:
                # A task's publish loop begins a new transaction only after aborting the last
                # (abortable error) or losing it to a fence (task/publish.py); a fenced task
                # ends with its transaction aborted.
                if first_of_slot:
                    committed += status == COMMITTED
                    aborted += max(0, int(row["attempts"]) - 1) + (status == FENCED)
            fenced += status == FENCED and first_of_slot
        self.batches.labels(app, g).inc()
        self.batch_seconds.labels(app).observe(report.seconds)
        self.last_batch.labels(app).set(time.time())
        if committed:
            self.transactions.labels(app, "committed").inc(committed)
        if aborted:
            self.transactions.labels(app, "aborted").inc(aborted)
        if fenced:
            self.fenced.labels(app).inc(fenced)
        if report.watermark_ms is not None:
            self.watermark.labels(app).set(report.watermark_ms / 1000)
            self.watermark_delay.labels(app).set(time.time() - report.watermark_ms / 1000)
        retried = self._spark_retries(spark, report.batch_id)
        lags = self._lags(marks, positions)
        self.cap.labels(app).set(cap)
        if self.json:
            self._emit("batch", None, batch=report.batch_id, guarantee=g, partitions=len(report.plans),
                       records_in=report.total("records_in"), records_out=report.total("records_out"),
                       dead_letters=report.total("dead_letters"), seconds=round(report.seconds, 4),
                       stage_seconds={k: round(v, 4) for k, v in slowest.items()},
                       driver_seconds=None if report.driver_s is None else round(report.driver_s, 4),
                       statuses=dict(report.statuses),
                       transactions_committed=committed, transactions_aborted=aborted, fenced_producers=fenced,
                       task_retries=retried, lag=sum(lags.values()) if lags else None,
                       lag_by_partition=lags or None, log_end_lag_by_partition=self._log_end_lags or None,
                       batch_cap=cap, totals=dict(totals), **_state_fields(report),
                       **({"tables": report.table_ends} if report.tables else {}))
            for topic, partition, count in dead:
                self._emit("dead_letter", None, topic=topic, partition=partition, stage="decode", count=count,
                           batch=report.batch_id)
        else:
            self._out(line)

    def _observe_stages(self, row: dict, slowest: dict, publisher: bool) -> None:
        """A finished task's stage seconds into the histograms; `publisher`: its producer's stages
        count too (a slot's later ranges share its first's producer and transaction)."""
        for stage, seconds in _stage_seconds(row).items():
            slowest[stage] = max(slowest[stage], seconds)
            if stage != "read" and not publisher:
                continue
            if stage != "init_transactions" or seconds > 0:  # a reused producer did not init
                self._stages[stage].observe(seconds)

    def _wide_batch(self, report: BatchReport, dead: list, positions: dict, slowest: dict) -> int:
        """A wide batch (driver/wide.py), whose rows are per output unit: input counted per input
        partition from `report.reads`, output under no source partition (topic and partition
        empty), every planned range done. Returns the transactions it committed."""
        app, g = self.app, self.guarantee
        for (topic, partition), (n_in, n_dead) in report.reads.items():
            self._series((topic, partition)).records_in.inc(n_in)
            if n_dead:
                self.dead_letters.labels(app, topic, str(partition), "decode").inc(n_dead)
                dead.append((topic, partition, n_dead))
        self.records_out.labels(app, g, "", "").inc(report.total("records_out"))
        committed = 0
        for row in report.rows:
            status = row["status"]
            self.task_results.labels(app, status).inc()
            committed += status == COMMITTED and g == EXACTLY_ONCE
            if status == COMMITTED and int(row["index"]) >= 0 and (row.get("rows_merged") or row.get("state_keys")):
                unit = str(row["index"])
                self.state_keys.labels(app, unit).set(int(row.get("state_keys") or 0))
                self.restore_seconds.labels(app, unit).set(float(row.get("restore_s") or 0.0))
                self.restored.labels(app).inc(int(row.get("restore_records") or 0))
            if row.get("late"):
                self.late.labels(app, "dead-lettered" if report.dead_letter_topic else "dropped").inc(int(row["late"]))
            if status in (COMMITTED, ACKED):
                self._observe_stages(row, slowest, publisher=True)
        for plan in report.plans:
            positions[(plan.topic, plan.partition)] = plan.end   # a wide batch returns only when closed
        return committed

    def _series(self, key: tuple[str, int]) -> _Series:
        """One partition's labelled series, looked up once (label lookups cost more than updates)."""
        series = self._by_partition.get(key)
        if series is None:
            labels = (self.app, key[0], str(key[1]))
            with_guarantee = (self.app, self.guarantee, key[0], str(key[1]))
            series = self._by_partition[key] = _Series(
                self.records_in.labels(*with_guarantee), self.records_out.labels(*with_guarantee),
                self.lag.labels(*labels), self.log_end_lag.labels(*labels), self.committed.labels(*labels),
                self.last_stable.labels(*labels))
        return series

    def _spark_retries(self, spark: Any, batch_id: int) -> int:
        """Spark's re-run task attempts of this batch's job (a few status calls; only when served)."""
        if self._server is None or spark is None:
            return 0
        try:
            failed = failed_task_attempts(spark, batch_job_group(self.app, batch_id))
        except Exception as exc:
            log.debug("task retries of batch %s: %s", batch_id, exc)
            return 0
        if failed:
            self.task_retries.labels(self.app).inc(failed)
        return failed

    def _lags(self, marks: dict[tuple[str, int], Watermarks] | None,
              positions: dict[tuple[str, int], int]) -> dict[str, int]:
        """Per owned partition: the last stable offset and the log end (the planner's watermarks,
        not asked again) minus where the group now is."""
        if not marks:
            return {}
        out, self._log_end_lags = {}, {}
        for key, mark in marks.items():
            # A partition the plan left out had nothing to do: the group is at its LSO.
            position = positions.get(key, mark.last_stable)
            lag, log_end_lag = max(0, mark.last_stable - position), max(0, mark.log_end - position)
            series = self._series(key)
            series.lag.set(lag)
            series.log_end_lag.set(log_end_lag)
            series.committed.set(position)
            series.last_stable.set(mark.last_stable)
            name = f"{key[0]}[{key[1]}]"
            out[name], self._log_end_lags[name] = lag, log_end_lag
        self.last_plan.labels(self.app).set(time.time())
        return out

    def idle(self, marks: dict[tuple[str, int], Watermarks], owned: set[tuple[str, int]]) -> None:
        """A turn of the loop with nothing to do: every owned partition is at its last stable
        offset (lag 0), and the loop is alive. No line is printed."""
        # With nothing owned the planner did not run: its last watermarks are of partitions gone.
        self._lags({k: m for k, m in marks.items() if k in owned}, {})
        self.last_plan.labels(self.app).set(time.time())   # alive, even owning nothing (a standby)

    # -- events -----------------------------------------------------------------------------------

    def event(self, kind: str, line: str | None, **fields: Any) -> None:
        """A notable event: counted, and printed as the human line or as one JSON object."""
        if kind == "retry":
            self.batch_retries.labels(self.app, fields.get("error_type", "")).inc()
        elif kind == "dead_letter":
            self.dead_letters.labels(self.app, fields["topic"], str(fields["partition"]),
                                     fields.get("stage", "transform")).inc(fields.get("count", 1))
        elif kind == "revoked":
            for name in fields.get("partitions", ()):
                topic, _, partition = name.rpartition("[")
                key = (topic, int(partition.rstrip("]")))
                self._by_partition.pop(key, None)
                for gauge in (self.lag, self.log_end_lag, self.committed, self.last_stable):
                    try:
                        gauge.remove(self.app, key[0], str(key[1]))
                    except KeyError:
                        pass
        if self.json:
            self._emit(kind, line, **fields)
        elif line:
            self._out(line)


__all__ = ["Telemetry", "LOG_FORMATS", "HUMAN", "JSON", "STAGES", "failed_task_attempts"]
