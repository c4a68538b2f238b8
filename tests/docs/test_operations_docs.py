"""The dashboard and the operations guide name only metrics the endpoint serves (issue 16)."""
from __future__ import annotations

import json
import re
from pathlib import Path

from processors.enrich_orders import EnrichOrders
from txstream.driver.metrics import Telemetry
from txstream.settings import resolve

DOCS = Path(__file__).resolve().parents[2] / "docs"
NAME = re.compile(r"\btxstream_[a-z_]+\b")
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
            "gauge": ("",), "info": ("_info",)}


def served_names() -> set[str]:
    """Every sample name the registry of a Driver's telemetry can serve (by family type)."""
    settings = resolve(EnrichOrders, bootstrap_servers="localhost:1", metrics_port=None)
    registry = Telemetry(settings, print).registry
    return {family.name + suffix for family in registry.collect() for suffix in SUFFIXES[family.type]}


def test_every_dashboard_query_names_a_served_metric() -> None:
    served = served_names()
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queries += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    assert len(queries) > 10
    for query in queries:
        names = NAME.findall(query)
        assert names, f"a query names no txstream metric: {query}"
        unknown = set(names) - served
        assert not unknown, f"{query} names {unknown}, which /metrics does not serve"
    # ...and every family served is on the dashboard somewhere.
    shown = {n for q in queries for n in NAME.findall(q)}
    families = {re.sub(r"_(total|bucket|count|sum|created)$", "", n) for n in served}
    missing = {f for f in families if not any(n == f or n.startswith(f + "_") for n in shown)}
    assert missing <= {"txstream_partition_committed_offset", "txstream_partition_last_stable_offset"}, missing


def test_the_operations_guide_names_served_metrics() -> None:
    served = served_names()
    text = (DOCS / "operations.md").read_text()
    # Its table may name a histogram by its family name (the PromQL names the series).
    histograms = {n.removesuffix("_bucket") for n in served if n.endswith("_bucket")}
    unknown = set(NAME.findall(text)) - served - histograms
    assert not unknown, f"docs/operations.md names {unknown}, which /metrics does not serve"
