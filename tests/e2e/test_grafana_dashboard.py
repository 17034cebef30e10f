"""The Grafana dashboard (docs/grafana/kvstored.json) reads only metrics that a running node
and master export: every PromQL expression of every panel is checked against real /metrics
scrapes of a ``kvstored master`` and a ``kvstored node`` joined to it."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

from cluster_helpers import MasterProcess, NodeProcess, wait_healthy
from e2e_helpers import value_for
from helpers import key
from prometheus_client.parser import text_string_to_metric_families

from kvstored import Client

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "kvstored.json"
_METRIC = re.compile(r"\bkvstored_[a-z0-9_]+\b")
_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
             "gauge": ("",), "summary": ("_sum", "_count", "_created"), "unknown": ("",)}


def exported_names(exposition: str) -> set[str]:
    """Every series name an exposition offers (families with no sample yet included, by type)."""
    names: set[str] = set()
    for fam in text_string_to_metric_families(exposition):
        names.add(fam.name)
        names.update(fam.name + s for s in _SUFFIXES.get(fam.type, ("",)))
        names.update(s.name for s in fam.samples)
    return names


def dashboard_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL expression) of every target of every panel, rows included."""
    out: list[tuple[str, str]] = []
    for panel in dashboard["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                out.append((inner["title"], target["expr"]))
    return out


def missing_metrics(exprs: list[tuple[str, str]], exported: set[str]) -> list[str]:
    """``"panel: metric"`` for every metric an expression names that is not exported."""
    return [f"{title}: {m}" for title, expr in exprs for m in _METRIC.findall(expr) if m not in exported]


def _scrape(address: str) -> str:
    url = address if address.startswith("http") else f"http://{address}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


def test_the_checker_names_a_metric_nobody_exports() -> None:
    text = "# HELP kvstored_a_total x\n# TYPE kvstored_a_total counter\nkvstored_a_total 1.0\n"
    exported = exported_names(text)
    assert missing_metrics([("p", "rate(kvstored_a_total[1m])")], exported) == []
    assert missing_metrics([("p", "rate(kvstored_b_total[1m]) + kvstored_a_total")], exported) == [
        "p: kvstored_b_total"]


def test_dashboard_is_importable_json_with_unique_panel_ids() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["__inputs"][0]["name"] == "DS_PROMETHEUS"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    titles = {t for t, _ in dashboard_exprs(dash)}
    for needed in ("Hit ratio per tier", "Bytes moved per path", "Evictions per tier",
                   "Quarantine and lapsed leases", "Spill", "Transfer errors per peer",
                   "RPC latency (p50, p99)", "Nodes by state"):
        assert needed in titles


def test_every_dashboard_metric_is_exported_by_a_running_node_and_master(
        workdir: Path, procs: list[Any]) -> None:
    master = MasterProcess(workdir, metrics_listen=True)
    procs.append(master)
    master.start()
    node = NodeProcess(workdir / "n0", master.address, "n0")
    i = node.args.index("--metrics-address", node.args.index("--master"))
    node.args[i + 1] = "127.0.0.1:0"
    procs.append(node)
    node.start()
    wait_healthy(master.address, {"n0"})
    keys = [key(i) for i in range(4)]
    with Client(node.unix_address) as c:  # traffic, so per-request series exist too
        c.put(keys, [value_for(k) for k in keys])
        assert c.get(keys) == [value_for(k) for k in keys]
    exported = exported_names(_scrape(node.metrics)) | exported_names(_scrape(master.metrics))
    exprs = dashboard_exprs(json.loads(DASHBOARD.read_text()))
    assert len(exprs) >= 30
    assert missing_metrics(exprs, exported) == []
