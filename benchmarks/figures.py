"""`python -m benchmarks.figures`: rewrite docs/performance.md's figures from the result files.

Everything between `<!-- bench:start -->` and `<!-- bench:end -->` in docs/performance.md is
replaced by figures taken from the newest JSON of each kind under benchmarks/results/ (throughput,
first output, latency at each rate, each sweep, the wide groupBy benchmark of `python -m
benchmarks.wide`, the windowed count of `python -m benchmarks --windowed` and the state restore of
`python -m benchmarks.restore`; a full run is preferred over a `--quick` one), with links to the files, so no
figure is typed by hand. A page without the markers is left alone (each benchmark calls this at
the end of its run). `--check` exits 1 when the section is not what the files say; `--page` and
`--results` point it at other files (e.g. a copy of the page and a scratch results directory).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from benchmarks import report

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
PAGE = REPO / "docs" / "performance.md"
START, END = "<!-- bench:start -->", "<!-- bench:end -->"
# The order of the section; latency has one kind per rate ("latency@2000", "latency@20000"),
# in ascending rate, where "latency" stands.
KINDS = ["throughput", "first-output", "latency", "sweep-batch", "sweep-partitions", "sweep-record-size", "wide",
         "windowed", "totals", "dedup", "tables", "restore"]


def is_wide(results: dict, path: Path | None = None) -> bool:
    """benchmarks/wide.py's files: "mode": "wide" since it writes one; older ones by their shape
    (a list of runs, its processor and args) or name (<stamp>-wide[-quick].json)."""
    if results.get("mode") == "wide":
        return True
    if "mode" in results:
        return False
    shaped = isinstance(results.get("runs"), list) and "args" in results and "processor" in results
    return shaped or bool(path and path.stem.removesuffix("-quick").endswith("-wide"))


def kind_of(results: dict, path: Path | None = None) -> str:
    if is_wide(results, path):
        return "wide"
    mode = results.get("mode", "throughput")
    if mode == "latency":
        chained = (results.get("settings") or {}).get("input_transactions_ms")
        return f"latency@{_rate(results)}" + (f"/txn{chained:g}" if chained else "")
    return f"sweep-{results.get('sweep')}" if mode == "sweep" else mode


def _rate(results: dict) -> str:
    rate = float((results.get("settings") or {}).get("rate") or 2000)
    return str(int(rate)) if rate.is_integer() else f"{rate:g}"


def is_quick(results: dict) -> bool:
    return bool((results.get("settings") or results.get("args") or {}).get("quick"))


def ordered_kinds(found) -> list[str]:
    """KINDS with "latency" replaced by the latency kinds found, slowest rate first; those of an
    input written in transactions ("latency@200/txn100") after the others."""
    def order(kind: str) -> tuple[bool, float]:
        rate, _, chained = kind.split("@", 1)[1].partition("/")
        return bool(chained), float(rate)

    rates = sorted((k for k in found if k.startswith("latency@")), key=order)
    out: list[str] = []
    for kind in KINDS:
        out += rates if kind == "latency" else [kind]
    return out


def newest(directory: Path = RESULTS) -> dict[str, tuple[Path, dict]]:
    """Newest result of each kind: full runs first, a --quick run only when there is no full one."""
    best: dict[str, tuple[tuple, Path, dict]] = {}
    for path in directory.glob("*.json"):
        try:
            results = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(results, dict) or "hardware" not in results:
            continue
        kind = kind_of(results, path)
        quick = is_quick(results)
        rank = (not quick, results.get("started_at", ""), path.name)
        if kind not in best or rank > best[kind][0]:
            best[kind] = (rank, path, results)
    return {k: (p, r) for k, (_rank, p, r) in best.items()}


def _link(path: Path, base: Path) -> str:
    """Links to a result's files, relative to `base` (the page's directory)."""
    rel = Path(os.path.relpath(path, base)).as_posix()
    md, png = path.with_suffix(".md"), path.with_suffix(".png")
    parts = [f"[{path.stem}.md]({rel[:-5]}.md)" if md.exists() else None, f"[json]({rel})",
             f"[chart]({rel[:-5]}.png)" if png.exists() else None]
    return ", ".join(p for p in parts if p)


def _x(v, spec=".2f") -> str:
    return "n/a" if v is None else f"{format(v, spec)}×"


def _n(v, spec=",.0f") -> str:
    return "n/a" if v is None else format(v, spec)


def _machine(results: dict) -> str:
    hw = results["hardware"]
    end = hw.get("loadavg_at_end")
    load = f"load average {hw['loadavg_at_start'][0]:.1f} at start" + (f", {end[0]:.1f} at end" if end else "")
    git = results.get("git_at_start")
    return (f"{results.get('started_at', '?')[:16].replace('T', ' ')} UTC, {hw['cpu_model']}, "
            f"{hw['logical_cores']} logical cores, {hw['memory_gib']} GiB, {load}"
            + (f", txstream at {git}" if git else ""))


def throughput_section(path: Path, results: dict, base: Path) -> list[str]:
    s = results["settings"]
    inp = results.get("input", {})
    quick = " (a `--quick` smoke run)" if s.get("quick") else ""
    lines = [f"**Throughput**{quick}: {inp.get('records', 0):,} orders ({inp.get('avg_value_bytes')} B values) in "
             f"{s['partitions']} partitions, {s['runs']} run(s) per contender, median; {_machine(results)}. "
             f"Files: {_link(path, base)}.", "",
             "| contender | records/s | steady records/s | first output s | CPU s per M records | peak RSS MiB "
             "| other work (cores) |",
             "|---|---|---|---|---|---|---|"]
    for _name, e in results["contenders"].items():
        if e.get("status") != "ok":
            lines.append(f"| {e['label']} | {e.get('status', '?').replace('|', '/')[:160]} | | | | | |")
            continue
        sm = e.get("summary", {})

        def med(key, spec=",.0f", sm=sm):
            return _n((sm.get(key) or {}).get("median"), spec)
        lines.append(f"| {e['label']} | {med('records_per_s')} | {report.steady(e, ranged=False)} | "
                     f"{med('first_output_s', '.1f')} | "
                     f"{med('cpu_s_per_m')} | {med('peak_rss_mb')} | {report.other_work(e)} |")
    ratios = results.get("ratios", {})
    parts = []
    for label, row in ratios.items():
        if label.startswith("each"):
            continue
        other = label.replace("txstream exactly-once vs ", "")
        parts.append(f"{other} {_x(row.get('records_per_s'))}")
    ks_cpu = (ratios.get("txstream exactly-once vs Kafka Streams") or {}).get("cpu_s_per_m")
    if parts:
        lines += ["", "Other work (cores): CPU that other processes on the shared machine used during the run, "
                  "on average (2 cores in all).", "",
                  "txstream exactly-once's records/s divided by each other's: " + ", ".join(parts)
                  + " (> 1: txstream is faster). CPU per record against the hand-written loop: "
                  + _x((ratios.get("txstream exactly-once vs hand-written loop") or {}).get("cpu_s_per_m"), ".1f")
                  + (f", against Kafka Streams: {_x(ks_cpu, '.1f')}" if ks_cpu is not None else "")
                  + "."]
    rows = [report.batch_row(e["label"], e["batches"]) for e in results["contenders"].values() if e.get("batches")]
    inside = {n: (e.get("batches") or {}).get("in_batch_records_per_s") for n, e in results["contenders"].items()
              if e.get("status") == "ok"}
    eo = inside.get(report.TXS)
    others = [(n, results["contenders"][n]["label"]) for n in inside if n != report.TXS and inside[n]]
    if eo and others:
        lines += ["", f"Inside batches (Spark's start-up left out), txstream exactly-once moves {eo:,.0f} records/s: "
                  + ", ".join(f"{_x(eo / inside[n])} {label}'s {inside[n]:,.0f}" for n, label in others) + "."]
    if rows:
        lines += ["", *report.BATCH_HEADER, *rows]
    return lines


def latency_section(path: Path, results: dict, base: Path) -> list[str]:
    s = results["settings"]
    quick = " (a `--quick` smoke run)" if s.get("quick") else ""
    window = (f"{s['latency_seconds']:.0f} s window after {s['warmup']:.0f} s of warm-up"
              if s.get("latency_seconds") is not None and s.get("warmup") is not None else "")
    rate = f"{s['rate']:,.0f} record{'' if s['rate'] == 1 else 's'}/s"
    lines = [f"**Latency at {rate}**{quick}: end-to-end, input produced at a steady {rate} in {s['partitions']} partitions"
             + (f", written in transactions committed every {s['input_transactions_ms']:g} ms (as an upstream "
                "exactly-once processor writes it; latency counts from each record's produce call)"
                if s.get("input_transactions_ms") else "")
             + ", read back read_committed"
             + (f"; {window}" if window else "") + f"; {_machine(results)}; {_link(path, base)}.", "",
             "| contender | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | records measured | input records/s |",
             "|---|---|---|---|---|---|---|---|"]
    for e in results["contenders"].values():
        lat = e.get("latency") or {}
        if e.get("status") == "ok":
            lines.append(f"| {e['label']} | {_n(lat.get('p50_ms'))} | {_n(lat.get('p90_ms'))} | "
                         f"{_n(lat.get('p99_ms'))} | {_n(lat.get('p999_ms'))} | {_n(lat.get('max_ms'))} | "
                         f"{_n(lat.get('measured'))} | {_n(lat.get('input_rate_achieved'))} |")
        else:
            lines.append(f"| {e['label']} | {e.get('status', '?').replace('|', '/')[:120]} | | | | | | |")
    ratios = results.get("ratios") or {}
    parts = [f"{label.replace('txstream exactly-once vs ', '')} {_x(row.get('p50_ms'))} / {_x(row.get('p99_ms'))}"
             for label, row in ratios.items() if not label.startswith("each")
             and (row.get("p50_ms") is not None or row.get("p99_ms") is not None)]
    if parts:
        lines += ["", "txstream exactly-once's p50 / p99 divided by each other's: " + ", ".join(parts)
                  + " (> 1: txstream is slower)."]
    ok = [e for e in results["contenders"].values() if e.get("status") == "ok"]
    short = [e["label"] for e in ok
             if (e.get("latency") or {}).get("input_rate_achieved", s["rate"]) < 0.95 * s["rate"]]
    old = not any((e.get("latency") or {}).get("percentiles_ms") for e in ok)
    notes = ["input records/s: what the harness's generator produced during the window (n/a in older files)"
             + (f"; short of {s['rate']:,.0f} for {', '.join(short)}: the machine could not generate the rate "
                "beside the contender, which then saw less input" if short else ""),
             "p90 and p99.9 n/a: this file predates the stored distribution (p50, p99 and max only)" if old else
             "the chart shows every contender's distribution (box p25–p75, whiskers p1–p99, and the share of "
             "records slower than each latency)"]
    lines += ["", "; ".join(notes)[0].upper() + "; ".join(notes)[1:] + "."]
    return lines


def wide_section(path: Path, results: dict, base: Path) -> list[str]:
    """benchmarks/wide.py: a per-batch groupBy(customer).agg(), txstream's two publication modes
    next to Spark SS foreachBatch with Spark's Kafka sink and Kafka Streams (totals per interval)."""
    args = results.get("args") or {}
    inp = results.get("input") or {}
    labels = results.get("contenders") or {}
    summary = results.get("summary") or {}
    quick = " (a `--quick` smoke run)" if args.get("quick") else ""
    git = (results.get("versions") or {}).get("git")
    lines = [f"**Wide transform** (per-batch `groupBy(customer).agg()`, `python -m benchmarks.wide`){quick}: "
             f"{inp.get('records', args.get('records', 0)):,} orders in {inp.get('partitions', args.get('partitions'))} "
             f"partitions, batches of {inp.get('records_per_batch', 0):,} records, {args.get('runs')} round(s), "
             f"median; {_machine(results | {'git_at_start': git})}; {_link(path, base)}.", "",
             "| contender | records/s | first output s | steady records/s | in-batch records/s | batches | CPU s "
             "| peak RSS MB | other work (cores) | vs units: records/s | vs units: steady | vs units: in-batch |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, entry in summary.items():
        label = labels.get(name, name)
        if not entry.get("ok_runs"):
            lines.append(f"| {label} | failed ({entry.get('failed_runs', 0)} run(s)) | | | | | | | | | | |")
            continue
        lines.append(f"| {label} | {_n(entry.get('records_per_s'))} | {_n(entry.get('first_output_s'), '.1f')} | "
                     f"{_n(entry.get('steady_records_per_s'))} | {_n(entry.get('in_batch_records_per_s'))} | "
                     f"{_n(entry.get('batches'), 'g')} | {_n(entry.get('cpu_s'), '.0f')} | "
                     f"{_n(entry.get('peak_rss_mb'))} | {_n(entry.get('foreign_cores'), '.2f')} | "
                     f"{_x(entry.get('vs_units_records_per_s'))} | {_x(entry.get('vs_units_steady'))} | "
                     f"{_x(entry.get('vs_units_in_batch'))} |")
    for name, why in (results.get("unavailable") or {}).items():
        lines.append(f"| {labels.get(name, name)} | unavailable: {str(why).replace('|', '/')[:120]} | | | | | | | | | | |")
    lines += ["", "records/s over wall time (Spark start-up included; Kafka Streams, which runs until stopped: from its "
              "start to the moment its output added up to the input); steady = from the first totals readable to the "
              "output's completion, start-up left out; in-batch = records / the batches' own "
              "seconds; ratios against txstream's units mode (> 1: faster than it)."]
    return lines


def windowed_check(entry: dict) -> str:
    """The windowed runs' output check in a cell: exact, or what was wrong (older files: '-')."""
    if "exact_runs" not in entry:
        return "-"
    late = entry.get("late_records")
    note = f", {late:,.0f} late records" if late else ""
    if entry["exact_runs"] == entry["ok_runs"]:
        return f"exact{note}"
    why = "; ".join(p or "?" for p in entry.get("problems") or [])[:200].replace("|", "/")
    return f"NOT exact{note}: {why}"


def windowed_section(path: Path, results: dict, base: Path) -> list[str]:
    """benchmarks/windowed.py: a windowed count per currency per minute under a 30 s watermark,
    txstream exactly-once next to Spark SS's own windowed aggregation and Kafka Streams."""
    args = results.get("args") or {}
    inp = results.get("input") or {}
    quick = " (a `--quick` smoke run)" if args.get("quick") else ""
    lines = [f"**Windowed count** (orders per currency per 1-minute window, 30 s watermark, append mode, "
             f"`python -m benchmarks --windowed`){quick}: {inp.get('records', args.get('records', 0)):,} orders in "
             f"{inp.get('partitions', args.get('partitions'))} partitions, {inp.get('event_span_s', 0):,.0f} s of event "
             f"time, {inp.get('closed_windows', 0)} (window, currency) results closed by the final watermark, "
             f"{args.get('runs')} round(s), median; {_machine(results)}; {_link(path, base)}.", ""]
    lines += contenders_table(results, "txstream-windowed")
    lines += ["", "records/s over wall time (start-up included; Spark SS and Kafka Streams, which run until stopped: "
              "to the moment their output held every closed window); steady = from the first window emitted to the "
              "last, start-up left out; txstream vs: txstream's figure / the other's (records/s: > 1 is faster; CPU "
              "per record: > 1 uses more). Every run's windows are checked against the input's exact counts and "
              "sums (output check); a run that did not finish shows as failed."]
    return lines


def stateful_section(path: Path, results: dict, base: Path) -> list[str]:
    """benchmarks/stateful.py: running totals over N customers or dedup over N ids, txstream
    exactly-once next to Spark SS's same query and Kafka Streams, the windowed count's harness."""
    args = results.get("args") or {}
    inp = results.get("input") or {}
    quick = " (a `--quick` smoke run)" if args.get("quick") else ""
    if results.get("mode") == "tables":
        what = (f"**A stream joined to a table** (`orders.join(customers, ..., \"left\")`, the customers a compacted "
                f"topic, `python -m benchmarks --tables`){quick}: {inp.get('keys', 0):,} customers, "
                f"{inp.get('records', 0):,} orders")
    elif results.get("mode") == "totals":
        what = (f"**Running totals** (`groupBy(customer).agg(count, sum, max)` of orders with amount > 0, update mode, "
                f"`python -m benchmarks --stateful totals`){quick}: {inp.get('keys', 0):,} customers, "
                f"{inp.get('records', 0):,} orders")
    else:
        what = (f"**Dedup** (`withWatermark(created_at, 10 minutes).dropDuplicatesWithinWatermark([id])`, append mode, "
                f"`python -m benchmarks --stateful dedup`){quick}: {inp.get('ids', 0):,} ids and "
                f"{inp.get('duplicates', 0):,} copies")
    lines = [f"{what} in {inp.get('partitions', args.get('partitions'))} partitions, {args.get('runs')} round(s), "
             f"median; {_machine(results)}; {_link(path, base)}.", ""]
    lines += contenders_table(results, results.get("baseline", ""))
    lines += ["", "records/s over wall time (start-up included; Spark SS and Kafka Streams, which run until stopped: "
              "to the moment they had read all input and their output was complete); steady = from the first output "
              "to completion; txstream vs: txstream's figure / the other's (records/s: > 1 is faster; CPU per "
              "record: > 1 uses more). Output check: "
              + {"totals": "per customer the last update read_committed equals its exact totals.",
                 "tables": "every order exactly once with its customer's name and tier."}.get(
                  results.get("mode"), "every id exactly once.")]
    return lines


def contenders_table(results: dict, baseline: str) -> list[str]:
    """The windowed and stateful benchmarks' table: a row per contender, ratios against `baseline`."""
    labels = results.get("contenders") or {}
    lines = ["| contender | records/s | steady records/s | first output s | CPU s per M records | peak RSS MB "
             "| other work (cores) | txstream vs: records/s | steady | CPU per record | output check |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    unavailable = results.get("unavailable") or {}
    for name, entry in (results.get("summary") or {}).items():
        label = labels.get(name, name)
        if name in unavailable:
            lines.append(f"| {label} | unavailable: {str(unavailable[name]).replace('|', '/')[:160]} | | | | | | | | | |")
            continue
        if not entry.get("ok_runs"):
            why = "; ".join(p or "?" for p in entry.get("problems") or [])[:200].replace("|", "/")
            lines.append(f"| {label} | failed: {why} | | | | | | | | | |")
            continue
        base_row = name == baseline
        lines.append(f"| {label} | {_n(entry.get('records_per_s'))} | {_n(entry.get('steady_records_per_s'))} | "
                     f"{_n(entry.get('first_output_s'), '.1f')} | {_n(entry.get('cpu_s_per_m'), ',.0f')} | "
                     f"{_n(entry.get('peak_rss_mb'))} | {_n(entry.get('foreign_cores'), '.2f')} | "
                     + " | ".join("1 (baseline)" if base_row else _x(entry.get(f"txstream_vs_{k}"))
                                  for k in ("records_per_s", "steady_records_per_s", "cpu_s_per_m"))
                     + f" | {windowed_check(entry)} |")
    return lines


def restore_section(path: Path, results: dict, base: Path) -> list[str]:
    """benchmarks/restore.py: a unit's state restored from Kafka (snapshot + a 10% tail) into the
    memory and RocksDB stores, at each size measured; larger sizes extrapolated, and said so."""
    args = results.get("args") or {}
    quick = " (a `--quick` smoke run)" if args.get("quick") else ""
    sizes = results.get("sizes") or []
    counts = ", ".join(f"{s['keys']:,}" for s in sizes)
    lines = [f"**State restore** (snapshot + a changelog tail of 10%, `python -m benchmarks.restore`){quick}: "
             f"(string key, count, sum), {counts} keys; goal "
             f"{results.get('goal_keys_per_s', 500_000):,} keys/s; {_machine(results)}; {_link(path, base)}.", "",
             "| keys | store | restore s | keys/s | keys per CPU s | of which: store load s | chunk decode s "
             "| fetch + Python s | memory B/key | disk B/key | snapshot in Kafka B/key | check |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for size in sizes:
        for r in size.get("runs", []):
            if r.get("skipped"):
                lines.append(f"| {size['keys']:,} | {r['store']} | {r['skipped']} | | | | | | | | | |")
                continue
            if not r.get("seconds"):
                why = "; ".join(r.get("problems") or ["?"])[:200].replace("|", "/")
                lines.append(f"| {size['keys']:,} | {r['store']} | failed: {why} | | | | | | | | | |")
                continue
            lines.append(f"| {size['keys']:,} | {r['store']} | {r['seconds']:.1f} | {_n(r['keys_per_s'])} | "
                         f"{_n(r.get('keys_per_cpu_s'))} | {r['store_load_s']:.1f} | {r['chunk_decode_s']:.1f} | "
                         f"{r['fetch_and_python_s']:.1f} | {_n(r.get('memory_bytes_per_key'))} | "
                         f"{_n(r.get('disk_bytes_per_key'), '.1f')} | "
                         f"{_n(size.get('seed', {}).get('snapshot_bytes_per_key'), '.1f')} | "
                         + ("exact" if r.get("ok") else "; ".join(r.get("problems") or [])[:200].replace("|", "/"))
                         + " |")
    extra = results.get("extrapolated") or {}
    if extra:
        lines += ["", "Not run here, extrapolated from the largest size's keys/s: "
                  + "; ".join(f"{int(n):,} keys " + ", ".join(f"{k} ~{v:,.0f} s" for k, v in sorted(by.items()))
                              for n, by in extra.items()) + "."]
    lines += ["", "keys/s = the state's keys / restore seconds (finding the snapshot, loading it, reading the tail); "
              "keys per CPU s: the same over the restoring process's CPU seconds, the rate on a core of its own. "
              "memory = the restoring process's resident-set growth per key; disk = the RocksDB directory after close."]
    return lines


SWEEP_TITLES = {"batch": "Records per batch", "partitions": "Partitions", "record-size": "Record size"}


def first_output_section(path: Path, results: dict, base: Path) -> list[str]:
    """benchmarks/first_output.py: seconds to the first output, against brokers with and without
    Kafka's 3 s initial rebalance delay (this tree's txstream; a baseline's too when it ran one)."""
    s = results["settings"]
    lines = [f"**First output**: seconds from launching `txstream run` ({s['guarantee']}, `--master {s['master']}`, "
             f"{s['records']:,} orders in {s['partitions']} partitions) to the first output record a read_committed "
             f"consumer sees, {s['rounds']} round(s), median (each run); {_machine(results)}; {_link(path, base)}.", ""]
    for tree, by_delay in results["first_output_s"].items():
        who = "txstream" if tree == "this" else f"txstream at {results.get('baseline') or tree} ({tree})"
        parts = [f"{statistics.median(runs):.2f} s ({', '.join(f'{x:.1f}' for x in runs)}) with "
                 f"group.initial.rebalance.delay.ms {delay}" for delay, runs in by_delay.items()]
        lines.append(f"- {who}: " + "; ".join(parts))
    return lines


def sweep_section(path: Path, results: dict, base: Path) -> list[str]:
    pts = results["points"]
    quick = " (a `--quick` smoke run)" if results["settings"].get("quick") else ""
    most = max(p["input"]["records"] for p in pts)
    fewer = [f"{p['input']['records']:,} at {p['label']}" for p in pts if p["input"]["records"] != most]
    capped = (f" ({', '.join(fewer)}: input capped at {results['settings'].get('max_input_mb', 0):.0f} MB)"
              if fewer else "")
    per_point = f"{most:,} records per point{capped}"
    if results["sweep"] == "batch" and fewer:   # at least --sweep-batches batches of each point's size
        per_point = "records per point " + " / ".join(f"{p['input']['records']:,}" for p in pts)
    lines = [f"**{SWEEP_TITLES.get(results['sweep'], results['sweep'])} sweep**{quick}: {results['parameter']}; "
             f"{per_point}"
             + (f", {pts[0]['input']['partitions']} partitions" if results["sweep"] != "partitions" else "")
             + f"; {_machine(results)}; {_link(path, base)}.", ""]
    mbs = results["sweep"] == "record-size"
    for name, label in report.sweep_names(results):
        cells = []
        for p in pts:
            e = p["contenders"].get(name, {})
            wall = report.sweep_value(e, "records_per_s")
            fast = report.sweep_value(e, "in_batch_records_per_s") or report.sweep_value(e, "steady_records_per_s")
            if wall is None:
                cells.append(f"{p['label']} failed")
            else:
                mb = report.sweep_value(e, "mb_per_s") if mbs else None
                cells.append(f"{p['label']} → {_n(wall)}" + (f" ({_n(fast)})" if fast else "")
                             + (f" [{mb:.1f} MB/s]" if mb is not None else ""))
        lines.append(f"- {label}: " + ", ".join(cells))
    lines += report.sweep_ratio_lines(results)
    busy = [f"{p['label']} {e['label']} {r['foreign_cores']:.1f}" for p in pts for e in p["contenders"].values()
            for r in e.get("runs", []) if r.get("foreign_cores", 0) >= 0.25]
    lines += ["", "records/s over wall time; in brackets without start-up (txstream: inside batches; others: "
              "steady state after the first output)" + ("; in square brackets input MB/s over wall time" if mbs else "")
              + ". "
              + ("Other work on the machine during runs (cores): " + ", ".join(busy) + "." if busy else
                 "No other work above 0.25 cores during any run." if any(
                     r.get("foreign_cores") is not None for p in pts for e in p["contenders"].values()
                     for r in e.get("runs", [])) else "")]
    return lines


def section(directory: Path = RESULTS, base: Path = PAGE.parent) -> str:
    """The generated section, its links relative to `base`."""
    found = newest(directory)
    results_link = Path(os.path.relpath(RESULTS, base)).as_posix()
    how_link = Path(os.path.relpath(REPO / "benchmarks" / "README.md", base)).as_posix()
    out = [START, "", "_Generated by `python -m benchmarks.figures` from the newest files in "
           f"[benchmarks/results/]({results_link}/) (each benchmark reruns it after its run); do not edit "
           f"by hand. How the figures are computed: [benchmarks/README.md]({how_link}). "
           "The machine is small and shared with other work, so compare ratios within one file, not absolute "
           "numbers across files._", ""]
    if not found:
        out += ["No results yet: run `make bench`.", ""]
    for kind in ordered_kinds(found):
        if kind not in found:
            continue
        path, results = found[kind]
        try:
            if kind == "throughput":
                out += throughput_section(path, results, base)
            elif kind.startswith("latency@"):
                out += latency_section(path, results, base)
            elif kind == "wide":
                out += wide_section(path, results, base)
            elif kind == "windowed":
                out += windowed_section(path, results, base)
            elif kind in ("totals", "dedup", "tables"):
                out += stateful_section(path, results, base)
            elif kind == "restore":
                out += restore_section(path, results, base)
            elif kind == "first-output":
                out += first_output_section(path, results, base)
            else:
                out += sweep_section(path, results, base)
        except Exception as exc:  # one odd file must not break the rest
            out.append(f"({path.name}: could not be summarised: {type(exc).__name__}: {exc})")
        out.append("")
    out.append(END)
    return "\n".join(out)


def update(page: Path = PAGE, directory: Path = RESULTS, check: bool = False) -> str:
    """Rewrite the marked section; returns what happened (never raises for missing markers)."""
    try:
        text = page.read_text()
    except OSError as exc:
        return f"figures not updated: {exc}"
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        return f"figures not updated: {page.name} has no {START} ... {END} markers"
    new = text[:start] + section(directory, page.parent) + text[end + len(END):]
    if new == text:
        return f"{page.name}: figures already up to date"
    if check:
        return f"{page.name}: figures are out of date"
    page.write_text(new)
    return f"{page.name}: figures rewritten from {len(newest(directory))} result file(s)"


def update_after_run(results_dir: Path, skip: bool, log) -> None:
    """What each benchmark does once its files are written: rewrite the figures from them, unless
    they went elsewhere or `--no-figures` (`skip`); a failure here leaves the results standing."""
    page = PAGE.relative_to(REPO)
    if Path(results_dir).resolve() != RESULTS.resolve():
        log(f"{page} left alone: results written to {results_dir}, not {RESULTS.relative_to(REPO)}")
    elif not skip:
        try:
            log(update())
        except Exception as exc:  # the results stand without the page
            log(f"{page} not updated: {type(exc).__name__}: {exc}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.figures", description=__doc__)
    ap.add_argument("--check", action="store_true", help="only say whether the section is up to date")
    ap.add_argument("--print", action="store_true", help="print the section instead of writing it")
    ap.add_argument("--page", type=Path, default=PAGE,
                    help="the page to rewrite (default: docs/performance.md)")
    ap.add_argument("--results", type=Path, default=RESULTS,
                    help="the results directory to read (default: benchmarks/results)")
    args = ap.parse_args(argv)
    if args.print:
        print(section(args.results, args.page.parent))
        return 0
    message = update(page=args.page, directory=args.results, check=args.check)
    print(message)
    return 1 if "out of date" in message else 0


if __name__ == "__main__":
    sys.exit(main())
