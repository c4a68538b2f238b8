"""Which local store and which value encoding txstream's state uses (txstream/state/), measured.

Three parts, each printed as a table:

- `--part stores`: every candidate store (a Python dict, RocksDB through `rocksdict`, LMDB
  through `lmdb`, sqlite3, and Arrow feather files, which only write and read whole) loads N
  keys of (string key, count int64, sum double) in commits of 10,000, then is measured for
  random gets, in-order scans, prefix scans and deletes; bytes per key on disk (after close) and
  in memory (the process's resident set growth). Each candidate runs in its own process so the
  memory figure is its own.
- `--part codecs`: encode and decode rates and bytes per value of the state row (count, sum):
  fastavro schemaless, struct, Arrow IPC per record; and Arrow IPC chunks of (key, value) for
  snapshots.
- `--part restore`: restore of N keys from a real local broker (txstream.local.cluster): a
  snapshot of N keys plus a changelog tail of N/10 updates, through txstream.state.restore.

    .venv/bin/python benchmarks/experiments/state_store.py --part stores --keys 1000000
    .venv/bin/python benchmarks/experiments/state_store.py --part restore --keys 1000000

Nothing is written under benchmarks/results: the figures are for the commit that chose.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMIT_EVERY = 10_000
SAMPLE = 200_000
PACK = struct.Struct("<qd")


def key_of(i: int) -> bytes:
    return b"customer-%09d" % i


def value_of(i: int) -> bytes:
    return PACK.pack(i % 1000, i * 0.5)


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def du(path: str) -> int:
    """Blocks allocated, not file sizes: LMDB's map is a sparse file of its whole map size."""
    return sum(p.stat().st_blocks * 512 for p in Path(path).rglob("*") if p.is_file())


# --------------------------------------------------------------------------------------------
# Candidates: put_many (one commit), get, scan_all, scan_prefix, delete_many, close
# --------------------------------------------------------------------------------------------

class DictStore:
    def __init__(self, _path: str) -> None:
        self.d: dict[bytes, bytes] = {}

    def put_many(self, pairs):
        self.d.update(pairs)

    def get(self, key):
        return self.d.get(key)

    def scan_all(self):
        return sum(1 for _ in sorted(self.d.items()))

    def scan_prefix(self, prefix):
        return sum(1 for k in self.d if k.startswith(prefix))

    def delete_many(self, keys):
        for k in keys:
            self.d.pop(k, None)

    def close(self):
        pass


class RocksStore:
    def __init__(self, path: str) -> None:
        from rocksdict import Options, Rdict, WriteOptions

        options = Options(raw_mode=True)
        options.create_if_missing(True)
        self.db = Rdict(path, options)
        write = WriteOptions()
        write.disable_wal = True
        self.db.set_write_options(write)

    def put_many(self, pairs):
        from rocksdict import WriteBatch

        batch = WriteBatch(raw_mode=True)
        for k, v in pairs:
            batch.put(k, v)
        self.db.write(batch)

    def get(self, key):
        return self.db.get(key)

    def scan_all(self):
        return sum(1 for _ in self.db.items())

    def scan_prefix(self, prefix):
        n = 0
        for k, _v in self.db.items(from_key=prefix):
            if not k.startswith(prefix):
                break
            n += 1
        return n

    def delete_many(self, keys):
        from rocksdict import WriteBatch

        batch = WriteBatch(raw_mode=True)
        for k in keys:
            batch.delete(k)
        self.db.write(batch)

    def close(self):
        self.db.flush()
        self.db.compact_range(None, None)
        self.db.close()


class LmdbStore:
    def __init__(self, path: str) -> None:
        import lmdb

        self.env = lmdb.open(path, map_size=64 << 30, sync=False, metasync=False, writemap=True)

    def put_many(self, pairs):
        with self.env.begin(write=True) as txn:
            txn.cursor().putmulti(pairs)

    def get(self, key):
        with self.env.begin() as txn:
            return txn.get(key)

    def scan_all(self):
        with self.env.begin() as txn:
            return sum(1 for _ in txn.cursor())

    def scan_prefix(self, prefix):
        n = 0
        with self.env.begin() as txn:
            cursor = txn.cursor()
            if cursor.set_range(prefix):
                for k, _v in cursor:
                    if not k.startswith(prefix):
                        break
                    n += 1
        return n

    def delete_many(self, keys):
        with self.env.begin(write=True) as txn:
            for k in keys:
                txn.delete(k)

    def close(self):
        self.env.sync(True)
        self.env.close()


class SqliteStore:
    def __init__(self, path: str) -> None:
        import sqlite3

        os.makedirs(path, exist_ok=True)
        self.db = sqlite3.connect(os.path.join(path, "state.db"), isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=OFF")
        self.db.execute("CREATE TABLE s (k BLOB PRIMARY KEY, v BLOB) WITHOUT ROWID")

    def put_many(self, pairs):
        self.db.execute("BEGIN")
        self.db.executemany("INSERT OR REPLACE INTO s VALUES (?, ?)", pairs)
        self.db.execute("COMMIT")

    def get(self, key):
        row = self.db.execute("SELECT v FROM s WHERE k = ?", (key,)).fetchone()
        return row[0] if row else None

    def scan_all(self):
        return sum(1 for _ in self.db.execute("SELECT k, v FROM s ORDER BY k"))

    def scan_prefix(self, prefix):
        end = prefix[:-1] + bytes([prefix[-1] + 1])
        return sum(1 for _ in self.db.execute("SELECT k, v FROM s WHERE k >= ? AND k < ?", (prefix, end)))

    def delete_many(self, keys):
        self.db.execute("BEGIN")
        self.db.executemany("DELETE FROM s WHERE k = ?", ((k,) for k in keys))
        self.db.execute("COMMIT")

    def close(self):
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self.db.close()


STORES = {"dict": DictStore, "rocksdict": RocksStore, "lmdb": LmdbStore, "sqlite3": SqliteStore}


def measure_store(name: str, keys: int) -> dict:
    path = tempfile.mkdtemp(prefix=f"state-bench-{name}-")
    try:
        if name == "feather":
            return measure_feather(path, keys)
        base = rss()
        store = STORES[name](path)
        out: dict = {"store": name, "keys": keys}
        started = time.perf_counter()
        for first in range(0, keys, COMMIT_EVERY):
            store.put_many([(key_of(i), value_of(i)) for i in range(first, min(first + COMMIT_EVERY, keys))])
        out["put/s"] = keys / (time.perf_counter() - started)
        out["memory B/key"] = (rss() - base) / keys
        sample = [key_of(random.randrange(keys)) for _ in range(SAMPLE)]
        started = time.perf_counter()
        for k in sample:
            if store.get(k) is None:
                raise AssertionError(f"{name} lost {k!r}")
        out["get/s"] = SAMPLE / (time.perf_counter() - started)
        started = time.perf_counter()
        seen = store.scan_all()
        out["scan/s"] = seen / (time.perf_counter() - started)
        prefixes = [b"customer-%06d" % random.randrange(keys // 1000) for _ in range(100)]
        started = time.perf_counter()
        found = sum(store.scan_prefix(p) for p in prefixes)
        out["prefix scan keys/s"] = found / (time.perf_counter() - started)
        doomed = list(range(0, keys, 10))
        started = time.perf_counter()
        for first in range(0, len(doomed), COMMIT_EVERY):
            store.delete_many([key_of(i) for i in doomed[first:first + COMMIT_EVERY]])
        out["delete/s"] = len(doomed) / (time.perf_counter() - started)
        out["memory B/key (end)"] = (rss() - base) / keys
        store.close()
        out["disk B/key"] = du(path) / (keys - len(doomed)) if name != "dict" else None
        return out
    finally:
        shutil.rmtree(path, ignore_errors=True)


def measure_feather(path: str, keys: int) -> dict:
    """Arrow files hold a whole table: written and read in one piece, no point updates."""
    import pyarrow as pa
    import pyarrow.feather as feather

    base = rss()
    started = time.perf_counter()
    table = pa.table({"key": [key_of(i) for i in range(keys)],
                      "count": pa.array([i % 1000 for i in range(keys)], pa.int64()),
                      "sum": pa.array([i * 0.5 for i in range(keys)], pa.float64())})
    file = os.path.join(path, "state.feather")
    feather.write_feather(table, file, compression="lz4")
    put = keys / (time.perf_counter() - started)
    memory = (rss() - base) / keys
    del table
    started = time.perf_counter()
    back = feather.read_table(file)
    scan = sum(1 for _ in back.column("key").to_pylist()) / (time.perf_counter() - started)
    return {"store": "feather", "keys": keys, "put/s": put, "memory B/key": memory, "get/s": None, "scan/s": scan,
            "prefix scan keys/s": None, "delete/s": None, "memory B/key (end)": None,
            "disk B/key": os.path.getsize(file) / keys}


# --------------------------------------------------------------------------------------------
# Codecs
# --------------------------------------------------------------------------------------------

def measure_codecs(n: int) -> list[dict]:
    import fastavro
    import pyarrow as pa

    from txstream.state.codec import StateCodec, snapshot_chunk, snapshot_rows

    schema = fastavro.parse_schema({"type": "record", "name": "state", "fields": [
        {"name": "count", "type": "long"}, {"name": "sum", "type": "double"}]})
    rows = [{"count": i % 1000, "sum": i * 0.5} for i in range(n)]
    out = []

    def run(name, encode, decode):
        started = time.perf_counter()
        encoded = [encode(r) for r in rows]
        enc = n / (time.perf_counter() - started)
        started = time.perf_counter()
        for b in encoded:
            decode(b)
        dec = n / (time.perf_counter() - started)
        out.append({"codec": name, "encode/s": enc, "decode/s": dec,
                    "bytes/value": sum(map(len, encoded)) / n})

    def avro_encode(r):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, schema, r)
        return buf.getvalue()

    run("fastavro schemaless", avro_encode, lambda b: fastavro.schemaless_reader(io.BytesIO(b), schema, None))
    codec = StateCodec(schema)
    run("txstream StateCodec", codec.encode, codec.decode)
    run("struct <qd", lambda r: PACK.pack(r["count"], r["sum"]), PACK.unpack)
    arrow_schema = pa.schema([("count", pa.int64()), ("sum", pa.float64())])

    def arrow_encode(r):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, arrow_schema) as w:
            w.write_batch(pa.record_batch([[r["count"]], [r["sum"]]], schema=arrow_schema))
        return sink.getvalue().to_pybytes()

    run("Arrow IPC per record", arrow_encode, lambda b: pa.ipc.open_stream(b).read_all().to_pylist()[0])
    keys = [key_of(i) for i in range(n)]
    values = [codec.encode(r) for r in rows]
    started = time.perf_counter()
    chunks = [snapshot_chunk(keys[i:i + 10_000], values[i:i + 10_000]) for i in range(0, n, 10_000)]
    enc = n / (time.perf_counter() - started)
    started = time.perf_counter()
    d: dict = {}
    for c in chunks:
        keys_, values_ = snapshot_rows(c)
        d.update(zip(keys_, values_, strict=True))
    dec = n / (time.perf_counter() - started)
    out.append({"codec": "snapshot chunks (Arrow IPC, 10,000 keys)", "encode/s": enc, "decode/s": dec,
                "bytes/value": sum(map(len, chunks)) / n})
    return out


# --------------------------------------------------------------------------------------------
# Restore from a real broker
# --------------------------------------------------------------------------------------------

def measure_restore(keys: int, store_kind: str) -> dict:
    import uuid

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from txstream.kafka.config import KafkaClients
    from txstream.local.cluster import LocalKafkaCluster, free_port_block
    from txstream.records import Marker
    from txstream.state.changelog import ChangelogWriter, changelog_end, changelog_topic, snapshot_topic
    from txstream.state.codec import StateCodec
    from txstream.state.restore import restore
    from txstream.state.snapshot import write_snapshot
    from txstream.state.stores import open_store

    work = tempfile.mkdtemp(prefix="state-restore-")
    cluster = LocalKafkaCluster(port=free_port_block(1), data_dir=os.path.join(work, "kafka"), die_with_parent=True)
    try:
        bootstrap = cluster.start()
        clients = KafkaClients(bootstrap)
        app, op = f"bench-{uuid.uuid4().hex[:6]}", "agg"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        topics = [NewTopic(changelog_topic(app, op), 1, 1, config={"cleanup.policy": "compact,delete",
                                                                  "retention.ms": "-1"}),
                  NewTopic(snapshot_topic(app, op), 1, 1, config={"cleanup.policy": "compact"})]
        for f in admin.create_topics(topics).values():
            f.result(30)
        codec = StateCodec({"type": "record", "name": "state", "fields": [
            {"name": "count", "type": "long"}, {"name": "sum", "type": "double"}]})
        producer = Producer(clients.producer(**{"transactional.id": f"{app}-bench", "linger.ms": 50,
                                                "batch.size": 1 << 20, "compression.type": "lz4",
                                                "transaction.timeout.ms": 600_000}))
        producer.init_transactions(30)
        source = open_store("memory", None, unit=0)
        writer = ChangelogWriter(app, op, 0)
        started = time.perf_counter()
        # Batch 1: every key, committed and snapshotted; batch 2: a tenth of them updated (the tail).
        for batch, span in ((1, range(keys)), (2, range(0, keys, 10))):
            for i in span:
                source.put(key_of(i), codec.encode({"count": i % 1000 + batch, "sum": i * 0.5}))
            producer.begin_transaction()
            writer.produce(producer, source.changes(), batch)
            producer.commit_transaction(600)
            source.commit(batch)
            if batch == 1:
                write_snapshot(clients, producer, app, op, source, changelog_offset=changelog_end(clients, app, op, 0))
        produce_s = time.perf_counter() - started
        target = open_store(store_kind, os.path.join(work, "target"), unit=0)
        del source
        started = time.perf_counter()
        report = restore(clients, app, op, 0, target, Marker(3))
        seconds = time.perf_counter() - started
        expected = codec.encode({"count": 10 % 1000 + 2, "sum": 5.0})
        if target.get(key_of(10)) != expected or target.get(key_of(11)) is None:
            raise AssertionError("restored state differs from the source")
        return {"store": store_kind, "keys": keys, "snapshot keys": report.snapshot_keys,
                "changelog records": report.changelog_records, "restore s": seconds,
                "of which snapshot s": report.snapshot_seconds,
                "records/s": (report.snapshot_keys + report.changelog_records) / seconds,
                "state keys/s": keys / seconds, "write s": produce_s,
                "snapshot MB": _topic_bytes(work, snapshot_topic(app, op)) / 1e6,
                "changelog MB": _topic_bytes(work, changelog_topic(app, op)) / 1e6}
    finally:
        cluster.destroy()
        shutil.rmtree(work, ignore_errors=True)


def _topic_bytes(work: str, topic: str) -> int:
    return sum(p.stat().st_size for p in Path(work, "kafka").rglob(f"{topic}-*/*.log"))


def table(rows: list[dict]) -> str:
    heads = list(rows[0])
    cell = lambda v: "-" if v is None else (f"{v:,.1f}" if isinstance(v, float) and v < 1000 else  # noqa: E731
                                            f"{v:,.0f}" if isinstance(v, (int, float)) else str(v))
    widths = [max(len(h), *(len(cell(r[h])) for r in rows)) for h in heads]
    lines = ["  ".join(h.rjust(w) for h, w in zip(heads, widths, strict=True))]
    lines += ["  ".join(cell(r[h]).rjust(w) for h, w in zip(heads, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["stores", "codecs", "restore"], default="stores")
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--only", help="one store (runs in this process, prints JSON)")
    parser.add_argument("--stores", default="dict,rocksdict,lmdb,sqlite3,feather")
    parser.add_argument("--store", default="memory", help="the store(s) restore loads into: memory,rocksdb")
    args = parser.parse_args()
    random.seed(7)
    if args.only:
        print(json.dumps(measure_store(args.only, args.keys)))
    elif args.part == "stores":
        rows = []
        for name in args.stores.split(","):
            run = subprocess.run([sys.executable, __file__, "--only", name, "--keys", str(args.keys)],
                                 capture_output=True, text=True, check=True)
            rows.append(json.loads(run.stdout.strip().splitlines()[-1]))
            print(f"# {name} done", file=sys.stderr)
        print(table(rows))
    elif args.part == "codecs":
        print(table(measure_codecs(args.keys)))
    else:
        print(table([measure_restore(args.keys, kind) for kind in args.store.split(",")]))


if __name__ == "__main__":
    main()
