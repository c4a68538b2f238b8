"""Results files: JSON (everything), Markdown (the table and ratios), PNG (a chart)."""
from __future__ import annotations

import json
import statistics
from itertools import pairwise
from pathlib import Path

TXS = "txstream-exactly-once"
VERSUS = [("txstream-at-least-once", "at-least-once"), ("txstream-passthrough", "pass-through (no decode)"),
          ("txstream-exactly-once-tls-scram", "itself over TLS + SCRAM"),
          ("txstream-exactly-once-registry", "itself on registry-framed Avro"),
          ("handwritten", "hand-written loop"), ("kafka-streams", "Kafka Streams"), ("quix", "Quix Streams"),
          ("spark-ss", "Spark SS"), ("ceiling", "the ceiling")]
THROUGHPUT_KEYS = ["records_per_s", "steady_records_per_s", "cpu_s_per_m", "peak_rss_mb"]


def _median(results: dict, name: str, key: str):
    entry = results["contenders"].get(name) or {}
    if entry.get("status") != "ok":
        return None
    if results.get("mode") == "latency":
        return (entry.get("latency") or {}).get(key)
    return ((entry.get("summary") or {}).get(key) or {}).get("median")


def ratios(results: dict) -> dict:
    """txstream exactly-once against each other contender (throughput, CPU per record, RSS, latency)."""
    keys = ["p50_ms", "p99_ms"] if results.get("mode") == "latency" else THROUGHPUT_KEYS
    out: dict = {}
    for name, label in VERSUS:
        row = {}
        for key in keys:
            a, b = _median(results, TXS, key), _median(results, name, key)
            row[key] = (a / b) if (a is not None and b) else None
        out[f"txstream exactly-once vs {label}"] = row
    # Also every contender against the hand-written loop, which is always there to compare with.
    base = {}
    for name in results["contenders"]:
        row = {}
        for key in keys:
            a, b = _median(results, name, key), _median(results, "handwritten", key)
            row[key] = (a / b) if (a is not None and b) else None
        base[name] = row
    out["each vs hand-written loop"] = base
    return out


def _fmt(v, spec=",.0f", none="n/a") -> str:
    return none if v is None else format(v, spec)


def _range(stats: dict | None, spec: str) -> str:
    if not stats:
        return "n/a"
    return f"{format(stats['median'], spec)} ({format(stats['min'], spec)}–{format(stats['max'], spec)})"


def steady(entry: dict, ranged: bool = True) -> str:
    sm = (entry.get("summary") or {}).get("steady_records_per_s")
    if sm:
        one_batch = (entry.get("batches") or {}).get("batches") == 1
        # One txstream batch: the output after the first commit is the rest of that batch's
        # partition tasks (a second wave on 2 cores), not a stream of batches.
        text = _range(sm, ",.0f") if ranged else format(sm["median"], ",.0f")
        return text + (" (1 batch: its later tasks)" if one_batch else "")
    notes = [r.get("steady_note") for r in entry.get("runs", []) if r.get("steady_note")]
    return "n/a (one burst)" if notes and entry.get("status") == "ok" else "n/a"


def other_work(entry: dict) -> str:
    """Average cores other processes (not the harness's) used during the runs: the machine is shared."""
    vals = [r["foreign_cores"] for r in entry.get("runs", []) if r.get("foreign_cores") is not None]
    if not vals:
        return "n/a"
    tops = [t for r in entry.get("runs", []) if r.get("foreign_cores", 0) >= 0.25 for t in r.get("foreign_top", [])]
    job = ""
    if tops:
        first = tops[0]
        job = " (" + ("pytest" if "pytest" in first else first.split(" (")[0][:40]) + ")"
    return f"{max(vals):.1f}{job}"


def _s(v, spec=".2f") -> str:
    return "n/a" if v is None else format(v, spec)


def init_text(b: dict) -> str:
    init = b.get("init") or {}
    if init.get("tasks") is not None and not init.get("tasks_paid"):
        return f"none of {init['tasks']:.0f} tasks"
    if init.get("tasks") is not None:
        return (f"{init.get('tasks_paid', 0):.0f} of {init['tasks']:.0f} tasks, median {_s(init.get('median_s'))}s"
                f" (max {_s(init.get('max_s'))}s)")
    return (f"{init.get('batches_paid', 0):.0f} batches (per-batch max), median {_s(init.get('median_s'))}s")


BATCH_HEADER = ["| contender | batches | records per batch | batch s median (max) | in-batch records/s | "
                "read / upstream / produce / commit / init / driver s (median per batch) | init_transactions paid "
                "| first batch s |",
                "|---|---|---|---|---|---|---|---|"]


def batch_row(label: str, b: dict) -> str:
    sp = b.get("split_median") or {}
    return (f"| {label} | {b['batches']:.0f} | {b.get('records_per_batch_median') or 0:,.0f} | "
            f"{_s(b.get('batch_s_median'))} ({_s(b.get('batch_s_max'))}) | {_fmt(b.get('in_batch_records_per_s'))} | "
            f"{_s(sp.get('read'))} / {_s(sp.get('upstream'))} / {_s(sp.get('produce'))} / {_s(sp.get('commit'))} / "
            f"{_s(sp.get('init'))} / {_s(sp.get('driver'))} | "
            f"{init_text(b)} | {_s(b.get('first_batch_s'))} |")


def batch_table(contenders: dict, scope: str = "from each run's log; median over runs") -> list[str]:
    rows = [batch_row(e["label"], e["batches"]) for e in contenders.values() if e.get("batches")]
    if not rows:
        return []
    return ["", f"### txstream batches ({scope})", "", *BATCH_HEADER, *rows, "",
            "Per batch, read / upstream / produce / commit / init are the maxima over the batch's tasks "
            "(txstream's batch line): reading and decoding; the publisher's wait for its input (reading, JVM "
            "hops and the transform together); encoding and producing; send_offsets + commit (or the "
            "acknowledgements); init_transactions; driver is the driver's own time before the job (offsets, "
            "planning, building and checking the DataFrame). In-batch records/s = records / time inside batches "
            "(no Spark session start-up). "
            "init_transactions paid: tasks that created a transactional producer (0 s when a cached one was "
            "reused), from the per-task lines benchmarks/contenders/txstream_run.py adds."]


def markdown(results: dict) -> str:
    if results.get("mode") == "sweep":
        return sweep_markdown(results)
    s = results["settings"]
    hw = results["hardware"]
    v = results.get("versions", {})
    what = results["mode"] + (f" at {s['rate']:,.0f} records/s" if results["mode"] == "latency" else "")
    lines = [f"# txstream benchmark — {what} ({results['started_at']})", ""]
    end = hw.get("loadavg_at_end")
    lines.append(f"Machine: {hw['cpu_model']}, {hw['logical_cores']} logical cores, {hw['memory_gib']} GiB; "
                 f"load average at start {hw['loadavg_at_start'][0]:.1f}" + (f", at end {end[0]:.1f}" if end else "")
                 + " (shared machine: figures are noisy).")
    lines.append(f"Versions: Python {v.get('python')}, pyspark {v.get('pyspark')}, confluent-kafka "
                 f"{v.get('confluent_kafka')} (librdkafka {v.get('librdkafka')}), {v.get('kafka_broker')}, "
                 f"quixstreams {v.get('quixstreams', 'n/a')} "
                 f"(with confluent-kafka {v.get('quix_confluent_kafka', 'n/a')}), "
                 f"Spark connectors {v.get('spark_connectors', 'n/a')}, "
                 f"Kafka Streams {v.get('kafka_streams', 'n/a')} (Java {v.get('kafka_streams_java', 'n/a')}); "
                 f"txstream at {results.get('git_at_start', '?')} "
                 f"(start), {v.get('git', '?')} (end).")
    if results["mode"] == "throughput":
        inp = results.get("input", {})
        lines.append(f"Input: {inp.get('records', 0):,} Avro orders ({inp.get('bytes', 0) / 1e6:.1f} MB, "
                     f"{inp.get('avg_value_bytes')} B per value) in {s['partitions']} partitions; "
                     f"{inp.get('expected_output', 0):,} have amount > 0 and must come out. "
                     f"Runs per contender: {s['runs']}; median (min–max).")
        lines += ["", "| contender | status | records/s | steady records/s | MB/s (input) | wall s | first output s "
                      "| CPU s per M records | peak RSS MiB | vs hand-written (rec/s) | other work (cores) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        rel = results.get("ratios", {}).get("each vs hand-written loop", {})
        for name, e in results["contenders"].items():
            sm = e.get("summary") or {}
            status = e.get("status", "?")
            if status != "ok":
                status = status.replace("|", "/")[:300]
            r = (rel.get(name) or {}).get("records_per_s")
            lines.append(f"| {e['label']} | {status} | {_range(sm.get('records_per_s'), ',.0f')} | "
                         f"{steady(e)} | "
                         f"{_range(sm.get('mb_per_s'), '.2f')} | {_range(sm.get('wall_s'), '.1f')} | "
                         f"{_range(sm.get('first_output_s'), '.1f')} | {_range(sm.get('cpu_s_per_m'), ',.0f')} | "
                         f"{_range(sm.get('peak_rss_mb'), ',.0f')} | {_fmt(r, '.2f')}{'×' if r is not None else ''} | "
                         f"{other_work(e)} |")
        lines += ["", "records/s = input records / wall time (start of the process to the last output record); "
                  "steady records/s = input records processed after the first output record / (done - first "
                  "output), n/a when the output came in one burst (e.g. txstream with all input in one batch)."]
        lines += cpu_by_role(results["contenders"], results.get("input", {}).get("records", 0))
        lines += batch_table(results["contenders"])
    else:
        lines.append(f"Steady input of {s['rate']:,.0f} records/s; latency = time a read_committed consumer sees "
                     f"the output record - time its input was produced; {s['latency_seconds']:.0f}s window "
                     f"after {s['warmup']:.0f}s of warm-up past the first output.")
        lines += ["", "| contender | status | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms "
                      "| records measured / produced in window | input records/s reached |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for e in results["contenders"].values():
            lat = e.get("latency") or {}
            status = e.get("status", "?").replace("|", "/")[:300]
            lines.append(f"| {e['label']} | {status} | {_fmt(lat.get('p50_ms'))} | {_fmt(lat.get('p90_ms'))} | "
                         f"{_fmt(lat.get('p99_ms'))} | {_fmt(lat.get('p999_ms'))} | "
                         f"{_fmt(lat.get('max_ms'))} | {lat.get('measured', 'n/a')} / "
                         f"{lat.get('produced_in_window', 'n/a')} | {_fmt(lat.get('input_rate_achieved'))} |")
        lines += ["", "Input records/s reached: what the harness's generator produced during the window (void "
                  "orders included); below the rate asked for, the machine could not generate it.", "",
                  "The chart shows each contender's whole distribution (box p25–p75, whiskers p1–p99, "
                  "the maximum as a circle; and the share of records slower than each latency), from the "
                  "percentiles in the JSON (`latency.percentiles_ms`)."]
        lines += batch_table(results["contenders"], "from the run's log, warm-up and window together")
    lines += ["", "## txstream exactly-once vs the others", ""]
    for label, row in results.get("ratios", {}).items():
        if label.startswith("each"):
            continue
        parts = [f"{k} {_fmt(x, '.2f')}{'×' if x is not None else ''}" for k, x in row.items()]
        lines.append(f"- {label}: " + ", ".join(parts))
    lines += ["", "Other work (cores): the most CPU other processes on the machine (not this harness's) used on "
              "average during a run of that contender; above 0.25 the run is flagged in the log. The machine has "
              f"{results['hardware']['logical_cores']} cores."]
    lines += ["", "records/s ratios > 1 mean txstream is faster; CPU and RSS ratios > 1 mean it uses more; "
              "n/a where a contender is unavailable (or, for steady records/s, where output came in one burst).", ""]
    return "\n".join(lines)


def _header(results: dict) -> list[str]:
    hw = results["hardware"]
    v = results.get("versions", {})
    end = hw.get("loadavg_at_end")
    return [f"Machine: {hw['cpu_model']}, {hw['logical_cores']} logical cores, {hw['memory_gib']} GiB; "
            f"load average at start {hw['loadavg_at_start'][0]:.1f}"
            + (f", at end {end[0]:.1f}" if end else "") + " (shared machine: figures are noisy).",
            f"Versions: Python {v.get('python')}, pyspark {v.get('pyspark')}, confluent-kafka "
            f"{v.get('confluent_kafka')} (librdkafka {v.get('librdkafka')}), {v.get('kafka_broker')}; "
            f"txstream at {results.get('git_at_start', '?')} (start), {v.get('git', '?')} (end)."]


def sweep_value(entry: dict, key: str):
    if entry.get("status") != "ok":
        return None
    if key in ("in_batch_records_per_s", "later_in_batch_records_per_s", "batches", "batch_s_median"):
        return (entry.get("batches") or {}).get(key)
    if key.startswith("split_"):
        return ((entry.get("batches") or {}).get("split_median") or {}).get(key[6:])
    return ((entry.get("summary") or {}).get(key) or {}).get("median")


SWEEP_METRICS = [("records_per_s", "records/s (wall)", ",.0f"),
                 ("steady_records_per_s", "steady records/s (after first output)", ",.0f"),
                 ("in_batch_records_per_s", "txstream in-batch records/s", ",.0f"),
                 ("later_in_batch_records_per_s", "txstream in-batch records/s after the first batch", ",.0f"),
                 ("mb_per_s", "MB/s input (wall)", ".2f"),
                 ("first_output_s", "first output s", ".1f"),
                 ("cpu_s_per_m", "CPU s per M records", ",.0f"),
                 ("broker_cpu_s_per_m", "broker CPU s per M records", ",.1f"),
                 ("foreign_cores", "other work during the run (cores)", ".1f"),
                 ("batches", "txstream batches", ".0f"),
                 ("batch_s_median", "txstream batch s (median)", ".2f"),
                 ("split_read", "txstream read s (median per batch)", ".2f"),
                 ("split_upstream", "txstream upstream s (median per batch)", ".2f"),
                 ("split_produce", "txstream produce s (median per batch)", ".2f"),
                 ("split_commit", "txstream commit s (median per batch)", ".2f"),
                 ("split_init", "txstream init s (median per batch)", ".2f"),
                 ("split_driver", "txstream driver s before the job (median per batch)", ".2f")]


def sweep_names(results: dict) -> list[tuple[str, str]]:
    seen: dict[str, str] = {}
    for p in results["points"]:
        for name, e in p["contenders"].items():
            seen.setdefault(name, e["label"])
    return list(seen.items())


def sweep_ratio_lines(results: dict) -> list[str]:
    """One line per comparison: txstream exactly-once / the other, at every point."""
    lines = []
    names = dict(sweep_names(results))
    for other, what in (("txstream-at-least-once", "at-least-once"), ("handwritten", "hand-written loop"),
                        ("kafka-streams", "Kafka Streams")):
        if other not in names or TXS not in names:
            continue
        for key, label in (("records_per_s", "records/s"), ("steady_records_per_s", "steady records/s"),
                           ("in_batch_records_per_s", "in-batch records/s"),
                           ("later_in_batch_records_per_s", "in-batch records/s after the first batch")):
            cells = []
            for p in results["points"]:
                a = sweep_value(p["contenders"].get(TXS, {}), key)
                b = sweep_value(p["contenders"].get(other, {}), key)
                cells.append(f"{p['label']}: " + (f"{a / b:.2f}×" if a is not None and b else "n/a"))
            if any(not c.endswith("n/a") for c in cells):
                lines.append(f"- txstream exactly-once / {what}, {label}: " + ", ".join(cells))
    if results.get("sweep") == "partitions":
        # How a batch's time grows across the points: each against the first (same records per batch).
        for name, label in sweep_names(results):
            times = [sweep_value(p["contenders"].get(name, {}), "batch_s_median") for p in results["points"]]
            if times and times[0]:
                cells = [f"{p['label']}: " + (f"{t / times[0]:.2f}×" if t else "n/a")
                         for p, t in zip(results["points"], times, strict=True)]
                lines.append(f"- {label}, batch s (median) against {results['points'][0]['label']} partitions: "
                             + ", ".join(cells))
    return lines


def sweep_markdown(results: dict) -> str:
    s = results["settings"]
    pts = results["points"]
    lines = [f"# txstream benchmark — {results['sweep']} sweep ({results['started_at']})", ""]
    lines += _header(results)
    inputs = "; ".join(f"{p['label']}: {p['input']['records']:,} records, {p['input']['partitions']} partitions, "
                       f"{p['input']['avg_value_bytes']} B per value, {p['input']['bytes'] / 1e6:.1f} MB" for p in pts)
    lines.append(f"Parameter: {results['parameter']}. Runs per point: {s['runs']} (median when more). "
                 f"Inputs: {inputs}.")
    settings = []
    for name, label in sweep_names(results):
        per = [p["contenders"][name].get("settings") or {} for p in pts if name in p["contenders"]]
        keys = [k for k in (per[0] if per else {}) if k != "processor"]
        if not keys:
            continue
        cells = []
        for k in keys:
            vals = [str(d.get(k, "n/a")) for d in per]
            cells.append(f"{k} {' / '.join(vals) if len(set(vals)) > 1 else vals[0]}")
        settings.append(f"{label}: " + ", ".join(cells))
    if settings:
        lines += ["", "Contender settings (per point when they differ): " + "; ".join(settings) + "."]
    head = "| metric | contender | " + " | ".join(p["label"] for p in pts) + " |"
    lines += ["", head, "|---|---|" + "---|" * len(pts)]
    for key, title, spec in SWEEP_METRICS:
        for name, label in sweep_names(results):
            vals = [sweep_value(p["contenders"].get(name, {}), key) for p in pts]
            if all(v is None for v in vals):
                continue
            lines.append(f"| {title} | {label} | " + " | ".join(_fmt(v, spec) for v in vals) + " |")
    problems = [f"- {p['label']}, {e['label']}: {e.get('status')}" for p in pts for e in p["contenders"].values()
                if e.get("status") != "ok"]
    if problems:
        lines += ["", "Failed points:", *problems]
    ratio_lines = sweep_ratio_lines(results)
    if ratio_lines:
        lines += ["", "## txstream exactly-once against the others, point by point", "", *ratio_lines]
    for p in pts:
        rows = [batch_row(e["label"], e["batches"]) for e in p["contenders"].values() if e.get("batches")]
        if rows:
            lines += ["", f"### txstream batches at {results['parameter']} = {p['label']}", "", *BATCH_HEADER, *rows]
    lines += ["", "records/s = input records / wall time (includes Spark's start-up for txstream); steady "
              "records/s = records processed after the first output / (done - first output), n/a when the output "
              "came in one burst; in-batch records/s = records / time inside txstream batches; after the first batch: "
              "the same without the first batch (which also builds the Spark job and, under exactly-once, fences "
              "every transactional.id of each slot).", ""]
    return "\n".join(lines)


def sweep_chart(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = results["points"]
    xs = [p["value"] for p in pts]
    metrics = [("records_per_s", "records/s (wall, incl. start-up)"),
               ("rate_no_startup", "records/s without start-up\n(txstream: in batches; others: steady)"),
               ("cpu_s_per_m", "CPU s per million records")]
    if results["sweep"] == "batch":
        metrics.append(("batch_s_median", "txstream batch s (median)"))
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.8 * len(metrics), 4.4))
    for ax, (key, title) in zip(axes, metrics, strict=True):
        for name, label in sweep_names(results):
            ys = []
            for p in pts:
                e = p["contenders"].get(name, {})
                if key == "rate_no_startup":
                    v = sweep_value(e, "in_batch_records_per_s") or sweep_value(e, "steady_records_per_s")
                else:
                    v = sweep_value(e, key)
                ys.append(v)
            if all(v is None for v in ys):
                continue
            ax.plot([x for x, y in zip(xs, ys, strict=True) if y is not None], [y for y in ys if y is not None],
                    marker="o", label=label)
        ax.set_title(title, fontsize=10)
        if key in ("records_per_s", "rate_no_startup", "cpu_s_per_m"):
            ax.set_yscale("log")  # txstream and the one-process loop are orders of magnitude apart
        ax.set_xlabel(results["parameter"], fontsize=8)
        if results["sweep"] in ("batch", "record-size"):
            ax.set_xscale("log")
        ax.set_xticks(xs)
        ax.set_xticklabels([p["label"] for p in pts], fontsize=7)
        ax.minorticks_off()
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    s = results["settings"]
    fig.suptitle(f"txstream {results['sweep']} sweep: {s['records']:,} records per point, "
                 f"{results['hardware']['logical_cores']} cores", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def chart(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if results["mode"] == "latency":
        latency_chart(results, path)
        return
    ok = [(n, e) for n, e in results["contenders"].items() if e.get("status") == "ok"]
    metrics = [("records_per_s", "records/s (median, min–max)"), ("cpu_s_per_m", "CPU s per million records"),
               ("peak_rss_mb", "peak RSS of the process tree, MiB")]
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 4.8))
    names = [e["label"].replace(" (", "\n(").replace(": ", ":\n") for _, e in ok]
    for ax, (key, title) in zip(axes, metrics, strict=True):
        stats = [(e["summary"].get(key) or {"median": 0, "min": 0, "max": 0}) for _, e in ok]
        med = [s["median"] for s in stats]
        err = [[m - s["min"] for m, s in zip(med, stats, strict=True)],
               [s["max"] - m for m, s in zip(med, stats, strict=True)]]
        ax.barh(names, med, xerr=err, color="#4c72b0", capsize=3)
        ax.set_title(title, fontsize=10)
        ax.invert_yaxis()
        ax.tick_params(axis="y", labelsize=8)
        if ax is not axes[0]:
            ax.set_yticklabels([])
    s = results["settings"]
    fig.suptitle(f"txstream benchmark ({results['mode']}): {s['records']:,} records, {s['partitions']} partitions, "
                 f"{results['hardware']['logical_cores']} cores", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def latency_distribution(lat: dict) -> list[tuple[float, float]] | None:
    """[(percentile, ms), ...] ascending, from a latency result's `percentiles_ms` (None in files
    written before the harness kept it: those have p50, p99 and max only)."""
    pct = lat.get("percentiles_ms")
    if not pct:
        return None
    return sorted((float(q), float(ms)) for q, ms in pct.items())


def _at(dist: list[tuple[float, float]], q: float) -> float:
    """The latency at percentile q, interpolated between the stored ones."""
    for (q0, v0), (q1, v1) in pairwise(dist):
        if q0 <= q <= q1:
            return v0 if q1 == q0 else v0 + (v1 - v0) * (q - q0) / (q1 - q0)
    return dist[-1][1]


def latency_chart(results: dict, path: Path) -> None:
    """Each contender's end-to-end latency distribution: box plots on a log axis (box p25–p75,
    whiskers p1–p99, maximum as a circle, p50 and p99 written out) and the share of records slower
    than each latency (log-log, so p50, p90, p99 and p99.9 are evenly spaced)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ok = [e for e in results["contenders"].values() if e.get("status") == "ok" and e.get("latency")]
    s = results["settings"]
    n = max(1, len(ok))
    fig, (box_ax, tail_ax) = plt.subplots(1, 2, figsize=(14, 1.9 + 0.75 * n),
                                          gridspec_kw={"width_ratios": [1.25, 1]})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    names = [e["label"].replace(" (", "\n(").replace(": ", ":\n") for e in ok]
    stats, missing = [], []
    for i, e in enumerate(ok):
        lat = e["latency"]
        dist = latency_distribution(lat)
        if dist:
            stats.append({"label": names[i], "med": _at(dist, 50), "q1": _at(dist, 25), "q3": _at(dist, 75),
                          "whislo": _at(dist, 1), "whishi": _at(dist, 99), "fliers": [dist[-1][1]]})
        else:  # an old file: p50, p99 and max only
            p50, p99 = lat.get("p50_ms") or 0, lat.get("p99_ms") or 0
            stats.append({"label": names[i], "med": p50, "q1": p50, "q3": p50, "whislo": p50, "whishi": p99,
                          "fliers": [lat["max_ms"]] if lat.get("max_ms") else []})
            missing.append(e["label"])
    if stats:
        positions = list(range(len(stats), 0, -1))  # first contender on top
        parts = box_ax.bxp(stats, positions=positions, orientation="horizontal", widths=0.55, patch_artist=True,
                           showfliers=True, medianprops={"color": "black", "linewidth": 1.6},
                           flierprops={"marker": "o", "markersize": 4, "markerfacecolor": "none"})
        for i, box in enumerate(parts["boxes"]):
            box.set_facecolor(colors[i % len(colors)])
            box.set_alpha(0.55)
        for pos, st in zip(positions, stats, strict=True):
            box_ax.plot([st["whishi"]], [pos], marker="D", color="#c44e52", markersize=5, zorder=3)
            box_ax.text(st["med"], pos + 0.3, f"p50 {st['med']:,.0f}", ha="center", va="bottom", fontsize=7)
            box_ax.text(st["whishi"], pos - 0.17, f"p99 {st['whishi']:,.0f}", ha="center", va="top", fontsize=7,
                        color="#c44e52")
        box_ax.set_yticks(positions)
        box_ax.set_yticklabels([st["label"] for st in stats], fontsize=8)
        box_ax.set_ylim(0.4, len(stats) + 0.6)
        box_ax.set_xscale("log")
    box_ax.set_xlabel("end-to-end latency, ms (log)", fontsize=9)
    box_ax.set_title("box p25–p75, line p50, whiskers p1–p99 (◆ p99), ○ max", fontsize=10)
    box_ax.grid(axis="x", which="both", alpha=0.3)

    for i, e in enumerate(ok):
        dist = latency_distribution(e["latency"])
        color = colors[i % len(colors)]
        if not dist:
            continue
        tail = [(q, ms) for q, ms in dist if q < 100]
        tail_ax.plot([ms for _, ms in tail], [100 - q for q, _ in tail], color=color, label=e["label"],
                     linewidth=1.4)
        for q, marker in ((50, "o"), (99, "D")):
            tail_ax.plot([_at(dist, q)], [100 - q], marker=marker, color=color, markersize=5)
    tail_ax.set_xscale("log")
    tail_ax.set_yscale("log")
    tail_ax.set_yticks([50, 10, 1, 0.1])
    tail_ax.set_yticklabels(["p50 (50%)", "p90 (10%)", "p99 (1%)", "p99.9 (0.1%)"], fontsize=8)
    tail_ax.minorticks_off()
    tail_ax.set_ylim(0.08, 100)
    for ax in (box_ax, tail_ax):  # 50, 100, 200, 500, 1,000 ... rather than 5 x 10^1
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.tick_params(axis="x", labelsize=8)
    tail_ax.set_xlabel("end-to-end latency, ms (log)", fontsize=9)
    tail_ax.set_title("share of records slower than x (● p50, ◆ p99)", fontsize=10)
    tail_ax.grid(which="both", alpha=0.3)
    if any(latency_distribution(e["latency"]) for e in ok):
        tail_ax.legend(fontsize=7, loc="lower left")
    note = f"\n(no distribution stored for {', '.join(missing)}: p50, p99, max only)" if missing else ""
    fig.suptitle(f"txstream benchmark (latency): steady {s['rate']:,.0f} records/s, {s['partitions']} partitions, "
                 f"{s['latency_seconds']:.0f}s window after {s['warmup']:.0f}s warm-up, "
                 f"{results['hardware']['logical_cores']} cores{note}", fontsize=11 if not missing else 9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_all(results: dict, directory: Path, prefix: str) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    js, md, png = (directory / f"{prefix}.{ext}" for ext in ("json", "md", "png"))
    js.write_text(json.dumps(results, indent=2, default=str) + "\n")
    md.write_text(markdown(results))
    paths = [js, md]
    try:
        (sweep_chart if results.get("mode") == "sweep" else chart)(results, png)
        paths.append(png)
    except Exception as exc:  # the table and JSON still stand
        print(f"(no chart: {exc})")
    return paths


def cpu_by_role(contenders: dict, records: int) -> list[str]:
    """Where each contender of several processes spent its CPU, per million input records (median
    over its runs): the JVM, Spark's Python workers, the main process."""
    lines = []
    for e in contenders.values():
        runs = [r["cpu_by_role_s"] for r in e.get("runs", []) if r.get("ok") and r.get("cpu_by_role_s")]
        if not runs or not records:
            continue
        roles = sorted({role for run in runs for role in run})
        parts = [f"{role} {statistics.median(run.get(role, 0.0) for run in runs) / (records / 1e6):,.1f}"
                 for role in roles]
        lines.append(f"- {e['label']}: " + ", ".join(parts))
    if not lines:
        return []
    return ["", "CPU s per M records by process (median over runs; start-up included, so a small run shows "
            "mostly start-up):", "", *lines]
