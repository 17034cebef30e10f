"""Helpers of the scheduler's e2e tests: a node's remote-fetch counter from its /metrics."""

from __future__ import annotations

import urllib.request

from cluster_helpers import NodeProcess
from prometheus_client.parser import text_string_to_metric_families


def remote_fetched(node: NodeProcess) -> float:
    """Node ``node``'s ``kvstored_remote_blocks_total{outcome="fetched"}``."""
    url = node.metrics if node.metrics.startswith("http") else f"http://{node.metrics}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "kvstored_remote_blocks_total" and s.labels.get("outcome") == "fetched":
                return s.value
    return 0.0


def with_metrics(node: NodeProcess) -> NodeProcess:
    """Serve the node's /metrics (NodeProcess turns it off by default)."""
    i = len(node.args) - 1 - node.args[::-1].index("--metrics-address")
    del node.args[i:i + 2]
    return node
