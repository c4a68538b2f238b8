"""What each contender's run asks of the broker, request type by request type: how many requests,
how many partitions each carries, and the broker's time on them, per 10,000 input records.

The local broker logs every request it completes (`LocalKafkaCluster(request_log=True)`: Kafka's
own request logger, with its timings). `local` is the broker's own work on a request; `remote` is
its wait on others before answering: for Produce, the follower copies of acks=all and, inside a
transaction, the leader's check with the transaction coordinator that the partition is in the
producer's transaction (KIP-890 part 1, once per partition and transaction); for Fetch, the
long poll. The benchmark's output watcher (benchmarks/measure.py) is left out by its client.id;
the broker's own requests to itself (transaction markers, the verification) are in.

    python -m benchmarks.experiments.broker_requests [--partitions 4,256] [--contenders txstream-exactly-once,kafka-streams]
        [--batch-records 25000] [--batches 10] [--data-dir DIR]

The request logger is heavy: the run's own figures (records/s, CPU) are not comparable with the
other benchmarks' and are not reported. What it found: docs/performance.md.
"""
from __future__ import annotations

import collections
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

_PREFIX = "Completed request:"
# Requests the broker sends itself: transaction markers, the leader's check with the coordinator
# (KIP-890), the controller's heartbeats (client id: the node id).
_BROKER_CLIENTS = ("broker-", "AddPartitionsManager")
# Where a request lists its partitions: Produce (partitionData), Fetch, the transactions' and
# offsets' requests (partitions: entries or numbers), the markers (partitionIndexes).
_PARTITION_LISTS = ("partitionData", "partitions", "partitionIndexes")


@dataclass
class RequestTotals:
    """One request type's totals in a window."""

    requests: int = 0
    partitions: int = 0
    local_ms: float = 0.0
    remote_ms: float = 0.0


def read_requests(path: Path, since_ms: int, until_ms: int, leave_out: tuple[str, ...] = ()) -> dict[str, RequestTotals]:
    """The request log's lines from [since_ms, until_ms] (epoch milliseconds), totalled by request
    type, the broker's requests to itself apart ("(broker)"); requests of the client ids in
    `leave_out` are skipped."""
    totals: dict[str, RequestTotals] = collections.defaultdict(RequestTotals)
    with open(path, errors="replace") as log:
        for line in log:
            stamp, _, rest = line.partition(" ")
            if not stamp.isdigit() or not since_ms <= int(stamp) <= until_ms or not rest.startswith(_PREFIX):
                continue
            try:
                request = json.loads(rest[len(_PREFIX):])
            except ValueError:
                continue
            client = request["requestHeader"].get("clientId") or ""
            if client in leave_out:
                continue
            name = request["requestHeader"]["requestApiKeyName"]
            if client.startswith(_BROKER_CLIENTS) or client.isdigit():
                name += " (broker)"
            entry = totals[name]
            entry.requests += 1
            entry.partitions += _partitions(request.get("request"))
            entry.local_ms += request.get("localTimeMs", 0.0)
            entry.remote_ms += request.get("remoteTimeMs", 0.0)
    return dict(totals)


def _partitions(body: object) -> int:
    """How many partitions a request names (the lengths of its partition lists)."""
    if isinstance(body, dict):
        return sum(len(value) if key in _PARTITION_LISTS and isinstance(value, list) else _partitions(value)
                   for key, value in body.items())
    if isinstance(body, list):
        return sum(_partitions(item) for item in body)
    return 0


def table(totals: dict[str, RequestTotals], records: int) -> list[str]:
    """Request types by the broker's local time, per 10,000 input records."""
    per = 10_000 / max(records, 1)
    lines = [f"  {'request':30s} {'per 10k rec':>11s} {'partitions/req':>14s} {'local ms/req':>12s} "
             f"{'remote ms/req':>13s} {'local ms per 10k rec':>20s}"]
    for name, t in sorted(totals.items(), key=lambda kv: -kv[1].local_ms):
        lines.append(f"  {name:30s} {t.requests * per:11.1f} {t.partitions / t.requests:14.1f} "
                     f"{t.local_ms / t.requests:12.2f} {t.remote_ms / t.requests:13.2f} {t.local_ms * per:20.1f}")
    local = sum(t.local_ms for t in totals.values())
    lines.append(f"  {'all':30s} {sum(t.requests for t in totals.values()) * per:11.1f} {'':14s} {'':12s} "
                 f"{'':13s} {local * per:20.1f}")
    return lines


def main() -> None:
    from benchmarks import sweep
    from benchmarks.experiments.broker import local_broker, parser
    from benchmarks.harness import log, run_once, seed
    from benchmarks.measure import WATCHER_CLIENT_ID

    ap = parser(__doc__)
    ap.add_argument("--contenders", default="txstream-exactly-once,kafka-streams",
                    help="comma-separated contender names (python -m benchmarks --help lists them)")
    ap.add_argument("--batch-records", type=int, default=25_000, help="records per txstream batch, over all partitions")
    ap.add_argument("--batches", type=int, default=10, help="input: this many txstream batches")
    ap.add_argument("--data-dir", default=None, help="where the broker's data directory goes (default: /tmp)")
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()
    names = args.contenders.split(",")
    report: list[str] = []
    with local_broker(request_log=True, data_dir=args.data_dir) as broker:
        request_log = Path(broker.cluster.request_log_file(broker.cluster.nodes[0]))
        stamp = time.strftime("%Y%m%d-%H%M%S")
        ctx: dict = {"bootstrap": broker.bootstrap, "stamp": stamp, "timeout": args.timeout, "topics": [],
                     "logdir": Path(tempfile.mkdtemp(prefix="txstream-requests-logs-")),
                     "broker_pids": broker.cluster.alive_pids()}
        for partitions in args.partitions:
            records = args.batch_records * args.batches
            ctx["point"] = f"-requests-{partitions}"
            seed(ctx, f"bench-in-{stamp}-requests-{partitions}", records, partitions)
            for name in names:
                contender = sweep.variant(name, "partitions", partitions, partitions, args.batch_records)
                contender.prepare(log)
                log(f"== {contender.label}, {partitions} partitions ...")
                since = int(time.time() * 1000)
                result = run_once(contender, ctx, 1)
                until = int(time.time() * 1000)
                totals = read_requests(request_log, since, until, leave_out=(WATCHER_CLIENT_ID,))
                batches = (result.get("batches") or {}).get("batches")
                head = (f"{contender.label}, {partitions} partitions, {records:,} records"
                        + (f" in {batches} batches" if batches else "")
                        + f": broker CPU {result.get('broker_cpu_s', 0):.1f} s"
                        + ("" if result.get("ok") else f" (run not ok: {result.get('problem') or result.get('done_by')})"))
                block = [head, *table(totals, records), ""]
                print("\n".join(block), flush=True)
                report += block
    print("\n".join(["", "local: the broker's own time on a request; remote: its wait on others (acks=all "
                     "copies; a transaction's partition check with the coordinator); per 10,000 input records", "",
                     *report]))


if __name__ == "__main__":
    main()
