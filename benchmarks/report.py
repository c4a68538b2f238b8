"""Results files: JSON (everything), Markdown (the table and ratios), PNG (a chart)."""
from __future__ import annotations

import json
from pathlib import Path

TXS = "txstream-exactly-once"
VERSUS = [("txstream-at-least-once", "at-least-once"), ("handwritten", "hand-written loop"),
          ("quix", "Quix Streams"), ("spark-ss", "Spark SS"), ("ceiling", "the ceiling")]


def _median(results: dict, name: str, key: str):
    entry = results["contenders"].get(name) or {}
    if entry.get("status") != "ok":
        return None
    if results.get("mode") == "latency":
        return (entry.get("latency") or {}).get(key)
    return ((entry.get("summary") or {}).get(key) or {}).get("median")


def ratios(results: dict) -> dict:
    """txstream exactly-once against each other contender (throughput, CPU per record, RSS, latency)."""
    keys = ["p50_ms", "p99_ms"] if results.get("mode") == "latency" else ["records_per_s", "cpu_s_per_m", "peak_rss_mb"]
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


def markdown(results: dict) -> str:
    s = results["settings"]
    hw = results["hardware"]
    v = results.get("versions", {})
    lines = [f"# txstream benchmark — {results['mode']} ({results['started_at']})", ""]
    lines.append(f"Machine: {hw['cpu_model']}, {hw['logical_cores']} logical cores, {hw['memory_gib']} GiB; "
                 f"load average at start {hw['loadavg_at_start'][0]:.1f} (shared machine: figures are noisy).")
    lines.append(f"Versions: Python {v.get('python')}, pyspark {v.get('pyspark')}, confluent-kafka "
                 f"{v.get('confluent_kafka')} (librdkafka {v.get('librdkafka')}), {v.get('kafka_broker')}, "
                 f"quixstreams {v.get('quixstreams', 'n/a')} (with confluent-kafka {v.get('quix_confluent_kafka', 'n/a')}), "
                 f"Spark connectors {v.get('spark_connectors', 'n/a')}.")
    if results["mode"] == "throughput":
        inp = results.get("input", {})
        lines.append(f"Input: {inp.get('records', 0):,} Avro orders ({inp.get('bytes', 0) / 1e6:.1f} MB, "
                     f"{inp.get('avg_value_bytes')} B per value) in {s['partitions']} partitions; "
                     f"{inp.get('expected_output', 0):,} have amount > 0 and must come out. "
                     f"Runs per contender: {s['runs']}; median (min–max).")
        lines += ["", "| contender | status | records/s | MB/s (input) | wall s | first output s | CPU s per M records | peak RSS MiB | vs hand-written (rec/s) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        rel = results.get("ratios", {}).get("each vs hand-written loop", {})
        for name, e in results["contenders"].items():
            sm = e.get("summary") or {}
            status = e.get("status", "?")
            if status != "ok":
                status = status.replace("|", "/")[:300]
            r = (rel.get(name) or {}).get("records_per_s")
            lines.append(f"| {e['label']} | {status} | {_range(sm.get('records_per_s'), ',.0f')} | "
                         f"{_range(sm.get('mb_per_s'), '.2f')} | {_range(sm.get('wall_s'), '.1f')} | "
                         f"{_range(sm.get('first_output_s'), '.1f')} | {_range(sm.get('cpu_s_per_m'), ',.0f')} | "
                         f"{_range(sm.get('peak_rss_mb'), ',.0f')} | {_fmt(r, '.2f')}{'×' if r is not None else ''} |")
    else:
        lines.append(f"Steady input of {s['rate']:,.0f} records/s; latency = time a read_committed consumer sees "
                     f"the output record - time its input was produced; {s['latency_seconds']:.0f}s window "
                     f"after {s['warmup']:.0f}s of warm-up past the first output.")
        lines += ["", "| contender | status | p50 ms | p99 ms | max ms | records measured / produced in window |",
                  "|---|---|---|---|---|---|"]
        for name, e in results["contenders"].items():
            lat = e.get("latency") or {}
            status = e.get("status", "?").replace("|", "/")[:300]
            lines.append(f"| {e['label']} | {status} | {_fmt(lat.get('p50_ms'))} | {_fmt(lat.get('p99_ms'))} | "
                         f"{_fmt(lat.get('max_ms'))} | {lat.get('measured', 'n/a')} / {lat.get('produced_in_window', 'n/a')} |")
    lines += ["", "## txstream exactly-once vs the others", ""]
    for label, row in results.get("ratios", {}).items():
        if label.startswith("each"):
            continue
        parts = [f"{k} {_fmt(x, '.2f')}{'×' if x is not None else ''}" for k, x in row.items()]
        lines.append(f"- {label}: " + ", ".join(parts))
    lines += ["", "records/s ratio > 1 means txstream is faster; CPU and RSS ratios > 1 mean it uses more; "
              "n/a where a contender is unavailable.", ""]
    return "\n".join(lines)


def chart(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [(n, e) for n, e in results["contenders"].items() if e.get("status") == "ok"]
    if results["mode"] == "throughput":
        metrics = [("records_per_s", "records/s (median, min–max)"), ("cpu_s_per_m", "CPU s per million records"),
                   ("peak_rss_mb", "peak RSS of the process tree, MiB")]
    else:
        metrics = [("p50_ms", "latency p50, ms"), ("p99_ms", "latency p99, ms")]
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 4.8))
    names = [e["label"].replace(" (", "\n(").replace(": ", ":\n") for _, e in ok]
    for ax, (key, title) in zip(axes, metrics):
        if results["mode"] == "throughput":
            stats = [(e["summary"].get(key) or {"median": 0, "min": 0, "max": 0}) for _, e in ok]
            med = [s["median"] for s in stats]
            err = [[m - s["min"] for m, s in zip(med, stats)], [s["max"] - m for m, s in zip(med, stats)]]
            ax.barh(names, med, xerr=err, color="#4c72b0", capsize=3)
        else:
            ax.barh(names, [e["latency"].get(key) or 0 for _, e in ok], color="#dd8452")
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


def write_all(results: dict, directory: Path, prefix: str) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    js, md, png = (directory / f"{prefix}.{ext}" for ext in ("json", "md", "png"))
    js.write_text(json.dumps(results, indent=2, default=str) + "\n")
    md.write_text(markdown(results))
    paths = [js, md]
    try:
        chart(results, png)
        paths.append(png)
    except Exception as exc:  # noqa: BLE001 - the table and JSON still stand
        print(f"(no chart: {exc})")
    return paths
