"""Restore of a stateful unit's state from Kafka (issue 52's restore benchmark): a snapshot of N
keys plus a changelog tail of N/10 updates, through txstream.state.restore, into the in-memory
store and the RocksDB store.

    python -m benchmarks.restore                                   # what `make bench` runs: 1, 10, 50 million keys
    python -m benchmarks.restore --quick                           # smoke run: 200,000 keys
    python -m benchmarks.restore --keys 1000000 --stores rocksdb --no-figures

The state is issue 52's shape: a string key (`customer-000000042`, 18 bytes) and (count long,
sum double) encoded as txstream encodes a state row (schemaless Avro, txstream/state/codec.py).
For each size, on a fresh single-broker cluster (txstream.local.cluster): batch 1 writes every
key to the changelog (in transactions of 5 million) and a snapshot of it (txstream.state.snapshot,
Arrow chunks in the snapshot topic); batch 2 updates every tenth key (the tail). The state is
generated key by key as it is written (`GeneratedState`), never held whole, so that 50 million keys
seed on a shared 24 GiB machine. A store whose restore would not fit the memory free at the time
(its bytes per key at the largest size run so far, times the keys, against MemAvailable less
4 GiB) is skipped with that reason, and its time at that size extrapolated, labelled so. Each store then
restores it in its own child process (so its memory figure is its own): seconds, keys/s (the
state's keys / restore seconds) and records/s (snapshot keys + tail records / seconds), where the
time went (the store's `load`, the decoding of snapshot chunks, the rest: Kafka fetches and Python
per fetch), CPU seconds, the child's resident-set growth per key (memory), the RocksDB directory
per key after close (disk), and the snapshot and changelog topics per key on the broker. The
restored state is checked (key count, an updated key's value, an untouched key's value).

Issue 52's goal: >= 500,000 keys/s on this machine. Results:
benchmarks/results/<timestamp>-restore[-quick].{json,md} ("mode": "restore"); docs/performance.md's
figures are rewritten at the end (`--no-figures` skips it).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.common import REPO

RESULTS = REPO / "benchmarks" / "results"
STORES = ("memory", "rocksdb")
GOAL_KEYS_PER_S = 500_000
OPERATOR = "totals"
STATE_SCHEMA = {"type": "record", "name": "state", "fields": [
    {"name": "count", "type": "long"}, {"name": "sum", "type": "double"}]}
T0 = time.monotonic()


def log(message: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {message}", flush=True)


def key_of(i: int) -> bytes:
    return b"customer-%09d" % i


def row(i: int, batch: int) -> dict:
    return {"count": i % 1000 + batch, "sum": i * 0.5}


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def du(path: str) -> int:
    return sum(p.stat().st_blocks * 512 for p in Path(path).rglob("*") if p.is_file())


# ---------------------------------------------------------------------------------------------
# The state written to Kafka
# ---------------------------------------------------------------------------------------------

SEED_TRANSACTION_KEYS = 5_000_000    # batch 1's changelog in transactions of this many, each well inside 15 min


class GeneratedState:
    """The committed state after `batch`, generated key by key from `row` when read: what
    write_snapshot and ChangelogWriter read of a store (`items`, `changes`, `version`), without
    the state ever in memory (50 million keys would not fit a dict on a shared 24 GiB machine)."""

    def __init__(self, keys: range, batch: int, encode) -> None:
        from txstream.state.store import StoreVersion

        self.keys, self.batch, self.encode = keys, batch, encode
        self.version = StoreVersion(unit=0, batch=batch)

    def items(self):
        encode, batch = self.encode, self.batch
        return ((key_of(i), encode(row(i, batch))) for i in self.keys)

    def changes(self) -> dict:
        return {}      # nothing pending: the whole of it is committed state


def seed(bootstrap: str, app: str, keys: int) -> dict:
    """Batch 1: every key (changelog + snapshot); batch 2: every tenth key updated (the tail).
    Streamed: keys are generated as they are produced, nothing of the state is held."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from txstream.kafka.config import KafkaClients
    from txstream.state.changelog import ChangelogWriter, changelog_end, changelog_topic, snapshot_topic
    from txstream.state.codec import StateCodec
    from txstream.state.snapshot import write_snapshot

    clients = KafkaClients(bootstrap)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [NewTopic(changelog_topic(app, OPERATOR), 1, 1, config={"cleanup.policy": "compact,delete",
                                                                     "retention.ms": "-1"}),
              NewTopic(snapshot_topic(app, OPERATOR), 1, 1, config={"cleanup.policy": "compact"})]
    for future in admin.create_topics(topics).values():
        future.result(60)
    codec = StateCodec(STATE_SCHEMA)
    producer = Producer(clients.producer(**{"transactional.id": f"{app}-bench", "linger.ms": 50,
                                            "batch.size": 1 << 20, "compression.type": "lz4",
                                            "transaction.timeout.ms": 900_000}))
    producer.init_transactions(60)
    writer = ChangelogWriter(app, OPERATOR, 0)
    started = time.perf_counter()
    snapshot_s = 0.0
    rss0 = rss_bytes()
    for batch, span in ((1, range(keys)), (2, range(0, keys, 10))):
        # batch 1's changelog in several transactions: the restore reads only what follows the
        # snapshot's offset, so how batch 1 was split changes nothing it reads
        for start in range(0, len(span), SEED_TRANSACTION_KEYS):
            producer.begin_transaction()
            writer.produce(producer, GeneratedState(span[start:start + SEED_TRANSACTION_KEYS], batch, codec.encode),
                           batch)
            producer.commit_transaction(900)
        log(f"  batch {batch}: {len(span):,} changelog records committed")
        if batch == 1:
            snap = time.perf_counter()
            write_snapshot(clients, producer, app, OPERATOR, GeneratedState(span, 1, codec.encode),
                           changelog_offset=changelog_end(clients, app, OPERATOR, 0), timeout=900)
            snapshot_s = time.perf_counter() - snap
            log(f"  snapshot of {keys:,} keys written in {snapshot_s:.1f} s")
    producer.flush(60)
    del producer
    return {"seed_s": round(time.perf_counter() - started, 1), "snapshot_write_s": round(snapshot_s, 1),
            "seed_rss_growth_mb": round((rss_bytes() - rss0) / 2**20)}


# ---------------------------------------------------------------------------------------------
# One restore, in a child process
# ---------------------------------------------------------------------------------------------

def restore_child(bootstrap: str, app: str, keys: int, store_kind: str, workdir: str) -> dict:
    """Restore unit 0 into a fresh `store_kind` store and measure it (runs in its own process)."""
    import txstream.state.snapshot as snapshot_module
    from txstream.kafka.config import KafkaClients
    from txstream.records import Marker
    from txstream.state.codec import StateCodec
    from txstream.state.restore import restore
    from txstream.state.stores import open_store

    clients = KafkaClients(bootstrap)
    path = os.path.join(workdir, f"store-{store_kind}")
    rss0 = rss_bytes()
    store = open_store(store_kind, path, unit=0)
    spent = {"store": 0.0, "decode": 0.0}

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - t
        return wrapper

    store.load = timed("store", store.load)      # every snapshot chunk and tail fetch goes through it
    snapshot_module.snapshot_rows = timed("decode", snapshot_module.snapshot_rows)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    profiler = None
    if os.environ.get("TXSTREAM_BENCH_PROFILE"):    # where the wall time goes, to stderr
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    started = time.perf_counter()
    report = restore(clients, app, OPERATOR, 0, store, Marker(3), timeout=600)
    seconds = time.perf_counter() - started
    if profiler is not None:
        import pstats

        profiler.disable()
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    rss1 = rss_bytes()
    codec = StateCodec(STATE_SCHEMA)
    problems = []
    if store.get(key_of(10)) != codec.encode(row(10, 2)):
        problems.append("key 10 lacks its tail update")
    if keys > 11 and store.get(key_of(11)) != codec.encode(row(11, 1)):
        problems.append("key 11 lacks its snapshot value")
    count = store.approximate_count() if store_kind == "memory" else sum(1 for _ in store.items())
    if count != keys:
        problems.append(f"{count:,} keys restored, not {keys:,}")
    store.close()
    disk = du(path) if os.path.isdir(path) else 0
    records = report.snapshot_keys + report.changelog_records
    other = max(0.0, seconds - spent["store"] - spent["decode"])
    return {"store": store_kind, "keys": keys, "ok": not problems, "problems": problems,
            "source": report.source, "snapshot_keys": report.snapshot_keys,
            "tail_records": report.changelog_records, "seconds": round(seconds, 2),
            "snapshot_s": round(report.snapshot_seconds, 2), "keys_per_s": round(keys / seconds),
            "records_per_s": round(records / seconds), "store_load_s": round(spent["store"], 2),
            "chunk_decode_s": round(spent["decode"], 2), "fetch_and_python_s": round(other, 2),
            "cpu_s": round(cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime, 1),
            "keys_per_cpu_s": round(keys / max(1e-3, cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime)),
            "memory_bytes_per_key": round((rss1 - rss0) / keys, 1),
            "disk_bytes_per_key": round(disk / keys, 1) if disk else None,
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def run_child(bootstrap: str, app: str, keys: int, store_kind: str, workdir: str) -> dict:
    command = [sys.executable, "-m", "benchmarks.restore", "--child", store_kind, "--bootstrap", bootstrap,
               "--app", app, "--keys", str(keys), "--workdir", workdir]
    load0 = os.getloadavg()[0]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=3600)
    if os.environ.get("TXSTREAM_BENCH_PROFILE"):
        log(done.stderr[-6000:])
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode or not lines:
        return {"store": store_kind, "keys": keys, "ok": False,
                "problems": [f"exit {done.returncode}: {done.stderr.strip()[-400:]}"]}
    return {**json.loads(lines[-1]), "loadavg_before": round(load0, 2), "loadavg_after": round(os.getloadavg()[0], 2)}


# resident bytes per key a restore grew by at 10 million keys (benchmarks/results/20261128-180752-restore),
# with room: what a store is assumed to need before this invocation has measured it
ASSUMED_BYTES_PER_KEY = {"memory": 260, "rocksdb": 80}
HEADROOM = 4 << 30     # left to the broker, the other helpers' Spark and the OS


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))


def fits(keys: int, store: str, measured: list[dict]) -> str | None:
    """Why `store` cannot restore `keys` here (None: it fits): its bytes per key, as measured at the
    largest size run so far (or assumed), times `keys`, against what the machine has free now."""
    done = [r for r in measured if r["store"] == store and r.get("seconds")]
    per_key = max(done, key=lambda r: r["keys"])["memory_bytes_per_key"] * 1.2 if done else ASSUMED_BYTES_PER_KEY[store]
    need, free = per_key * keys, mem_available() - HEADROOM
    if need <= free:
        return None
    return (f"skipped: needs ~{need / 2**30:.1f} GiB ({per_key:.0f} B/key), "
            f"{max(0, free) / 2**30:.1f} GiB free beyond {HEADROOM >> 30} GiB of headroom")


def measure_size(keys: int, stores: list[str], measured: list[dict]) -> tuple[dict, list[dict]]:
    from txstream.local.cluster import LocalKafkaCluster, free_port_block

    work = tempfile.mkdtemp(prefix="txstream-bench-restore-")
    cluster = LocalKafkaCluster(port=free_port_block(1), data_dir=os.path.join(work, "kafka"), die_with_parent=True)
    try:
        bootstrap = cluster.start()
        app = f"bench-restore-{uuid.uuid4().hex[:6]}"
        log(f"{keys:,} keys: seeding {app} on {bootstrap} ...")
        seeded = seed(bootstrap, app, keys)
        from txstream.state.changelog import changelog_topic, snapshot_topic

        seeded["snapshot_bytes_per_key"] = round(_topic_bytes(work, snapshot_topic(app, OPERATOR)) / keys, 1)
        seeded["changelog_bytes_per_key"] = round(_topic_bytes(work, changelog_topic(app, OPERATOR)) / keys, 1)
        runs = []
        for kind in stores:
            skipped = fits(keys, kind, measured + runs)
            if skipped:
                runs.append({"store": kind, "keys": keys, "ok": True, "skipped": skipped, "problems": []})
                log(f"{keys:,} keys: {kind} {skipped}")
                continue
            log(f"{keys:,} keys: restoring into {kind} ...")
            result = run_child(bootstrap, app, keys, kind, work)
            runs.append(result)
            log(f"  {kind}: " + (f"{result['seconds']:.1f} s, {result['keys_per_s']:,} keys/s (store load "
                                f"{result['store_load_s']} s, chunk decode {result['chunk_decode_s']} s, fetch + "
                                f"Python {result['fetch_and_python_s']} s), {result['memory_bytes_per_key']} B/key "
                                f"in memory, {result['disk_bytes_per_key']} B/key on disk"
                                if result.get("seconds") else "FAILED")
                + ("" if result["ok"] else f": {result['problems']}"))
        return seeded, runs
    finally:
        cluster.destroy()
        shutil.rmtree(work, ignore_errors=True)


def _topic_bytes(work: str, topic: str) -> int:
    return sum(p.stat().st_size for p in Path(work, "kafka").rglob(f"{topic}-*/*.log"))


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

def extrapolate(runs: list[dict], keys: int) -> dict[str, float]:
    """Seconds for `keys` per store, linear from the largest size measured (its keys/s)."""
    out = {}
    for kind in {r["store"] for r in runs}:
        done = [r for r in runs if r["store"] == kind and r.get("ok")]
        if done:
            big = max(done, key=lambda r: r["keys"])
            out[kind] = round(keys / big["keys_per_s"], 1)
    return out


def markdown(meta: dict, sizes: list[dict]) -> str:
    hw = meta["hardware"]
    counts = ", ".join(f"{s['keys']:,}" for s in sizes)
    lines = [f"# Restore: snapshot + a tail of 10% into each store, {counts} keys",
             "", f"State: (string key, count, sum), {meta['key_bytes']}-byte keys, values as txstream encodes them. "
             f"Goal (issue 52): >= {GOAL_KEYS_PER_S:,} keys/s. Machine: {hw.get('cpu_model')}, "
             f"{hw.get('logical_cores')} cores (shared), {hw.get('memory_gib')} GiB, load {hw['loadavg_at_start'][0]:.2f} "
             f"at start, {hw.get('loadavg_at_end', [0])[0]:.2f} at end. Started {meta['started_at']}; git "
             f"{meta.get('git_at_start')}.", "",
             "| keys | store | restore s | keys/s | records/s | vs goal | store load s | chunk decode s | "
             "fetch + Python s | CPU s | keys per CPU s | memory B/key | disk B/key | snapshot B/key (Kafka) | load before/after | check |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for size in sizes:
        for r in size["runs"]:
            if r.get("skipped"):
                lines.append(f"| {size['keys']:,} | {r['store']} | {r['skipped']} | | | | | | | | | | | | | |")
                continue
            if not r.get("seconds"):
                lines.append(f"| {size['keys']:,} | {r['store']} | failed: {'; '.join(r['problems'])[:300]} "
                             "| | | | | | | | | | | | | |")
                continue
            lines.append(f"| {size['keys']:,} | {r['store']} | {r['seconds']:.1f} | {r['keys_per_s']:,} | "
                         f"{r['records_per_s']:,} | {r['keys_per_s'] / GOAL_KEYS_PER_S:.2f}x | {r['store_load_s']} | "
                         f"{r['chunk_decode_s']} | {r['fetch_and_python_s']} | {r['cpu_s']} | {r.get('keys_per_cpu_s', 0):,} | "
                         f"{r['memory_bytes_per_key']} | {r['disk_bytes_per_key'] or '-'} | "
                         f"{size['seed']['snapshot_bytes_per_key']} | {r['loadavg_before']}/{r['loadavg_after']} | "
                         f"{'exact' if r['ok'] else '; '.join(r['problems'])} |")
    extra = meta.get("extrapolated") or {}
    if extra:
        lines += ["", "Not measured, extrapolated linearly from the largest size's keys/s: "
                  + "; ".join(f"{n:,} keys: " + ", ".join(f"{k} ~{s:,.0f} s" for k, s in sorted(v.items()))
                              for n, v in extra.items()) + "."]
    lines += ["", "keys/s = the state's keys / restore seconds (find the snapshot, load it, read the tail); records/s "
              "counts the tail's records too. store load = the store's `load` (RocksDB: one write batch per snapshot "
              "chunk or fetch); chunk decode = Arrow IPC to key and value lists; fetch + Python = the rest (the "
              "consumer's fetches, header checks, lists per fetch, and waiting for a core). keys per CPU s = the state's "
              "keys / the restoring process's CPU seconds (its librdkafka threads included, the broker's not): the "
              "rate the restore would reach on a core of its own. memory = the restoring process's resident-set "
              "growth per key; disk = the RocksDB directory after close.", ""]
    return "\n".join(lines)


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.restore", description=__doc__.splitlines()[0])
    ap.add_argument("--keys", default="1000000,10000000,50000000", help="comma-separated state sizes (keys)")
    ap.add_argument("--stores", default=",".join(STORES), help="memory,rocksdb")
    ap.add_argument("--extrapolate", default="", help="sizes not run, extrapolated (comma-separated)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 200,000 keys")
    ap.add_argument("--results-dir", type=Path, default=RESULTS)
    ap.add_argument("--no-figures", action="store_true", help="leave docs/performance.md alone")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--bootstrap", help=argparse.SUPPRESS)
    ap.add_argument("--app", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(restore_child(args.bootstrap, args.app, int(args.keys), args.child, args.workdir)))
        return 0
    from benchmarks.harness import git_state, hardware

    sizes = [200_000] if args.quick else [int(k) for k in args.keys.split(",")]
    stores = args.stores.split(",")
    meta: dict = {"mode": "restore", "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                  "hardware": hardware(), "git_at_start": git_state(), "key_bytes": len(key_of(0)),
                  "goal_keys_per_s": GOAL_KEYS_PER_S}
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    results = []
    for keys in sizes:
        seeded, runs = measure_size(keys, stores, [r for s in results for r in s["runs"]])
        results.append({"keys": keys, "seed": seeded, "runs": runs})
    all_runs = [r for s in results for r in s["runs"]]
    wanted = [int(k) for k in args.extrapolate.split(",") if k] if not args.quick else []
    meta["extrapolated"] = {n: extrapolate(all_runs, n) for n in wanted if n not in sizes}
    for size in results:     # a store skipped for want of memory: its time extrapolated, labelled so
        skipped = {r["store"] for r in size["runs"] if r.get("skipped")}
        if skipped:
            guess = extrapolate([r for r in all_runs if r["store"] in skipped and r["keys"] < size["keys"]], size["keys"])
            meta["extrapolated"].setdefault(size["keys"], {}).update(guess)
    meta["hardware"]["loadavg_at_end"] = os.getloadavg()
    meta["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    report = markdown(meta, results)
    results_dir = args.results_dir.resolve()
    results_dir.mkdir(parents=True, exist_ok=True)
    out = results_dir / (f"{stamp}-restore" + ("-quick" if args.quick else ""))
    Path(f"{out}.json").write_text(json.dumps({**meta, "sizes": results}, indent=2, default=str))
    Path(f"{out}.md").write_text(report)
    print(report)
    log(f"written: {out}.json, {out}.md")
    from benchmarks import figures

    figures.update_after_run(results_dir, args.no_figures, log)
    return 0 if all_runs and all(r.get("ok") for r in all_runs) else 1


if __name__ == "__main__":
    sys.exit(main())
