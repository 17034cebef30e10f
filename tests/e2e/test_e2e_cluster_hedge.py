"""Hedged copies end to end: a SIGSTOPped holder (its kernel still accepts connections, its
process never answers) costs neither a read nor a repair its deadline.

- read: blocks are put with ``replicas=2`` through ``a`` while only ``a`` and ``b`` run, then
  ``c`` joins and reads them with a long deadline (``remote_fetch_timeout_s`` 10 s). c's
  read is held after its lookup (``remote_fill_before_copy``), the holder the master named
  for most blocks is SIGSTOPped, and the read released: the blocks it holds are hedged to
  the other replica after ``hedge_after_ms`` and every block is served with its bytes.
  Without hedging the stopped holder keeps the read for its whole deadline: misses.
- repair: blocks with ``replicas=3`` on a, b and c; d joins; a is SIGKILLed, and the master
  sends d COPY commands naming b or c as the source. d's first COPY is held before its GET
  (``remote_copy_before_copy``; the ``.held`` file names the source), that source is
  SIGSTOPped and the COPY released: d asks the master for the block's other holders and
  hedges to the one left; every block gets its replica on d.

Nothing is timed: the assertions are on served bytes and on d's and c's counters
(``kvstored_remote_blocks_total{outcome="hedged"|"hedge_won"}``). Every stopped process
is sent SIGCONT before the test ends (the fixture then kills it).
"""

from __future__ import annotations

import os
import signal
import threading
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from cluster_helpers import NodeProcess, _keys, _wait, start_master, start_nodes, wait_healthy
from e2e_helpers import value_for
from prometheus_client.parser import text_string_to_metric_families
from scheduler_helpers import with_metrics

from kvstored import Client
from kvstored.client.master import MasterClient
from kvstored.client.master_admin import MasterAdminClient

N = 24


def _remote_blocks(node: NodeProcess, outcome: str) -> float:
    """``kvstored_remote_blocks_total{outcome=...}`` from ``node``'s /metrics."""
    url = node.metrics if node.metrics.startswith("http") else f"http://{node.metrics}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "kvstored_remote_blocks_total" and s.labels.get("outcome") == outcome:
                return float(s.value)
    return 0.0


def _stop(node: NodeProcess, sig: signal.Signals) -> None:
    assert node.proc is not None
    node.proc.send_signal(sig)


def test_a_sigstopped_holders_blocks_are_served_in_full_by_hedged_copies(
    workdir: Path, procs: list[Any]
) -> None:
    master = start_master(workdir, procs)
    fifo = workdir / "fill.fifo"
    os.mkfifo(fifo)
    env = {"KVSTORED_CLUSTER__HEARTBEAT_INTERVAL_S": "0.25"}
    nodes = {n: NodeProcess(workdir / n, master.address, n, dram_size="16MiB") for n in "ab"}
    start_nodes(list(nodes.values()), procs, env)
    wait_healthy(master.address, {"a", "b"})
    keys = _keys(N)
    with Client(nodes["a"].unix_address) as c:
        results = c.put(keys, [value_for(k) for k in keys], replicas=2)
    assert [(r.ok, r.replicas_written) for r in results] == [(True, 2)] * N
    with MasterAdminClient(master.address) as m:
        _wait("every block readable on a and b", lambda: all(
            sorted(r["node_id"] for r in reps if r["readable"]) == ["a", "b"]
            for reps in m.list_replicas(b"", keys)[0]))

    reader = with_metrics(NodeProcess(workdir / "c", master.address, "c", dram_size="32MiB"))
    reader.env["KVSTORED_TEST_HOOKS"] = f"remote_fill_before_copy:{fifo}"
    reader.env["KVSTORED_CLUSTER__REMOTE_FETCH_TIMEOUT_S"] = "10"  # a long deadline
    start_nodes([reader], procs, env)
    wait_healthy(master.address, {"a", "b", "c"})
    assert _remote_blocks(reader, "hedged") == 0

    got: list[Any] = []

    def read() -> None:
        with Client(reader.unix_address) as c:
            got.append(c.get(keys, timeout_s=60))

    t = threading.Thread(target=read)
    t.start()
    victim = ""
    try:
        _wait("c's read held after its lookup", lambda: Path(f"{fifo}.held").exists())
        with MasterClient(master.address) as m:  # what c's lookup was answered
            named = m.lookup_each(b"", keys, local_node_id="c")
        assert named is not None and len(named[0]) == N
        victim, num_named = Counter(r.node_id for r in named[0].values()).most_common(1)[0]
        assert victim in nodes and num_named > 0
        _stop(nodes[victim], signal.SIGSTOP)  # accepts connections, never answers
        open(fifo, "wb").close()  # release the held read
        t.join(60)
        assert got, "the read through c did not return"
        missed = [i for i, (k, v) in enumerate(zip(keys, got[0], strict=True))
                  if v != value_for(k)]
        assert not missed, f"{len(missed)} of {N} blocks missed with {victim} stopped: {missed}"
        assert _remote_blocks(reader, "hedged") >= num_named
        assert _remote_blocks(reader, "hedge_won") >= num_named
        assert "remote_fill_hedged" in reader.log()
    finally:
        if not got:
            open(fifo, "wb").close()
        t.join(60)
        if victim:
            _stop(nodes[victim], signal.SIGCONT)


def _originals(m: MasterAdminClient, keys: list[bytes]) -> list[list[str]]:
    per, _ = m.list_replicas(b"", keys)
    return [sorted({r["node_id"] for r in reps
                    if not r["copy"] and r["readable"] and r["state"] == "committed"})
            for reps in per]


def test_a_repair_copy_whose_source_is_sigstopped_completes_from_another_replica(
    workdir: Path, procs: list[Any]
) -> None:
    master = start_master(workdir, procs, lease_s=3.0)
    fifo = workdir / "copy.fifo"
    os.mkfifo(fifo)
    env = {"KVSTORED_CLUSTER__HEARTBEAT_INTERVAL_S": "0.25"}
    nodes = {n: NodeProcess(workdir / n, master.address, n, dram_size="16MiB") for n in "abc"}
    start_nodes(list(nodes.values()), procs, env)
    wait_healthy(master.address, {"a", "b", "c"})
    keys = _keys(N)
    with Client(nodes["a"].unix_address) as c:
        results = c.put(keys, [value_for(k) for k in keys], replicas=3)
    assert [(r.ok, r.replicas_written) for r in results] == [(True, 3)] * N
    with MasterAdminClient(master.address, timeout_s=10) as m:
        _wait("3 originals per block", lambda: all(h == ["a", "b", "c"]
                                                   for h in _originals(m, keys)))
        d = with_metrics(NodeProcess(workdir / "d", master.address, "d", dram_size="32MiB"))
        d.env["KVSTORED_TEST_HOOKS"] = f"remote_copy_before_copy:{fifo}"
        d.env["KVSTORED_CLUSTER__REMOTE_FETCH_TIMEOUT_S"] = "10"
        start_nodes([d], procs, env)
        wait_healthy(master.address, {"a", "b", "c", "d"})
        nodes["a"].kill()  # the master re-creates a's replicas on d, from b or c
        source = ""
        try:
            _wait("d's first COPY held", lambda: Path(f"{fifo}.held").exists()
                  and Path(f"{fifo}.held").read_text() in ("b", "c"))
            source = Path(f"{fifo}.held").read_text()
            _stop(nodes[source], signal.SIGSTOP)
            open(fifo, "wb").close()  # release the held COPY
            _wait("every block re-replicated on d",
                  lambda: all("d" in h for h in _originals(m, keys)))
            assert _remote_blocks(d, "hedged") > 0
            assert _remote_blocks(d, "hedge_won") > 0
            assert "replica_copy_other_source" in d.log()
            with Client(d.unix_address) as c:  # d's replicas are the blocks' bytes
                assert c.get(keys, timeout_s=30) == [value_for(k) for k in keys]
        finally:
            if not source:
                open(fifo, "wb").close()
            else:
                _stop(nodes[source], signal.SIGCONT)
