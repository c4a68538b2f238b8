"""benchmarks/restore.py's report and docs/performance.md's restore figures, from results built by
hand (no broker: the benchmark itself restores from one)."""
from __future__ import annotations

import types

from benchmarks import figures, restore
from benchmarks.restore import GeneratedState, extrapolate, fits, key_of, markdown, row


def _run(store: str, keys: int, seconds: float, ok: bool = True) -> dict:
    return {"store": store, "keys": keys, "ok": ok, "problems": [] if ok else ["key 10 lacks its tail update"],
            "seconds": seconds, "keys_per_s": round(keys / seconds), "records_per_s": round(keys * 1.1 / seconds),
            "keys_per_cpu_s": round(keys / seconds * 1.5), "store_load_s": 1.0, "chunk_decode_s": 0.5,
            "fetch_and_python_s": seconds - 1.5, "cpu_s": seconds / 1.5, "memory_bytes_per_key": 190.0,
            "disk_bytes_per_key": 17.0 if store == "rocksdb" else None, "loadavg_before": 1.0, "loadavg_after": 2.0}


def _results(extra: dict | None = None) -> dict:
    sizes = [{"keys": 1_000_000, "seed": {"snapshot_bytes_per_key": 19.1},
              "runs": [_run("memory", 1_000_000, 2.0), _run("rocksdb", 1_000_000, 4.0, ok=False)]},
             {"keys": 10_000_000, "seed": {"snapshot_bytes_per_key": 19.1},
              "runs": [_run("memory", 10_000_000, 20.0), _run("rocksdb", 10_000_000, 10.0)]}]
    hardware = {"cpu_model": "cpu", "logical_cores": 2, "memory_gib": 23.5, "loadavg_at_start": [3.0, 0, 0],
                "loadavg_at_end": [4.0, 0, 0]}
    return {"mode": "restore", "started_at": "2026-11-28T18:00:00+00:00", "args": {"quick": False},
            "hardware": hardware, "key_bytes": 18, "goal_keys_per_s": 500_000, "sizes": sizes,
            "extrapolated": extra or {}}


def test_extrapolation_scales_the_largest_exact_size_of_each_store():
    runs = [r for s in _results()["sizes"] for r in s["runs"]]
    assert extrapolate(runs, 50_000_000) == {"memory": 100.0, "rocksdb": 50.0}
    assert extrapolate([r for r in runs if r["store"] == "rocksdb" and r["keys"] == 1_000_000], 10) == {}


def test_the_report_names_failures_and_labels_extrapolated_sizes():
    text = markdown(_results({50_000_000: {"rocksdb": 50.0}}), _results()["sizes"])
    assert "| 10,000,000 | rocksdb | 10.0 | 1,000,000 |" in text
    assert "key 10 lacks its tail update" in text
    assert "extrapolated" in text and "50,000,000 keys: rocksdb ~50 s" in text


def test_figures_show_each_size_and_store_and_the_check(tmp_path):
    path = tmp_path / "20261128-180000-restore.json"
    path.write_text("{}")
    results = _results({"50000000": {"memory": 100.0}})
    assert figures.kind_of(results, path) == "restore"
    lines = "\n".join(figures.restore_section(path, results, tmp_path))
    assert "| 10,000,000 | memory | 20.0 | 500,000 | 750,000 |" in lines
    assert "| 1,000,000 | rocksdb | 4.0 |" in lines and "key 10 lacks its tail update" in lines
    assert "50,000,000 keys memory ~100 s" in lines


def test_the_seeded_state_is_generated_lazily_with_nothing_pending():
    state = GeneratedState(range(5, 8), 2, str)
    pairs = state.items()
    assert isinstance(pairs, types.GeneratorType) and state.changes() == {} and state.version.batch == 2
    assert list(pairs) == [(key_of(i), str(row(i, 2))) for i in (5, 6, 7)]


def test_a_store_that_would_not_fit_is_skipped_with_its_reason_and_reported(monkeypatch):
    monkeypatch.setattr(restore, "mem_available", lambda: 20 << 30)
    measured = [_run("memory", 10_000_000, 20.0), _run("rocksdb", 10_000_000, 10.0)]   # 190 B/key both
    assert fits(50_000_000, "rocksdb", [dict(measured[1], memory_bytes_per_key=60.0)]) is None
    why = fits(100_000_000, "memory", measured)
    assert why.startswith("skipped: needs ~21.2 GiB (228 B/key), 16.0 GiB free")
    assert fits(1_000, "memory", []) is None
    results = _results()
    results["sizes"].append({"keys": 100_000_000, "seed": {"snapshot_bytes_per_key": 19.1},
                             "runs": [{"store": "memory", "keys": 100_000_000, "ok": True, "skipped": why,
                                       "problems": []}]})
    assert f"| 100,000,000 | memory | {why} |" in markdown(results, results["sizes"])
    path_lines = "\n".join(figures.restore_section(restore.RESULTS / "x-restore.json", results, restore.RESULTS))
    assert f"| 100,000,000 | memory | {why} |" in path_lines
