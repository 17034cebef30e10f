"""kvstorectl's cluster views against a real ``kvstored master`` and three ``kvstored node``
processes on loopback ports, and the master's /metrics scraped over HTTP.

Blocks are put through n1 and read through n2 (so n2 holds copies too); ``where`` shows
every replica of every block in the caller's order and marks the first block missing
cluster-wide; ``blocks --node`` pages what the master indexes on a node; ``evict`` removes
replicas from every holder through its own Remove RPC (checked against the nodes' own
listings, not the master's); bad input exits with the documented codes; the single-node
commands against a node's address answer exactly as before. Waits poll with a deadline.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import MasterProcess, NodeProcess, _ctl, _wait, start_each, start_master
from e2e_helpers import value_for

from kvstored import Client


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[MasterProcess, dict[str, NodeProcess]]]:
    workdir = Path(tempfile.mkdtemp(prefix="kvctl", dir="/tmp"))  # short unix socket paths
    started: list[Any] = []
    try:
        master = start_master(workdir, started, metrics_listen=True)
        nodes = {name: NodeProcess(workdir / name, master.address, name, dram_size="8MiB",
                                   ssd_size="32MiB") for name in ("n1", "n2", "n3")}
        start_each(list(nodes.values()), started)
        _wait("three healthy nodes", lambda: sorted(
            n["node_id"] for n in _json(master.address, "nodes")["nodes"]
            if n["health"] == "healthy") == ["n1", "n2", "n3"])
        yield master, nodes
    finally:
        for p in reversed(started):
            p.kill()
        shutil.rmtree(workdir, ignore_errors=True)


def _json(address: str, *args: str) -> Any:
    out = _ctl(address, *args, "--output", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _scrape(address: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {m.group(1): float(m.group(2)) for line in text.splitlines()
            if (m := re.match(r"^([a-zA-Z_:][\w:]*(?:\{[^}]*\})?) (\S+)$", line))}


def _holders(where: dict[str, Any]) -> list[list[tuple[str, str]]]:
    return [sorted((r["node_id"], r["tier"]) for r in b["replicas"]) for b in where["blocks"]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_where_blocks_evict_and_metrics_across_three_nodes(
    cluster: tuple[MasterProcess, dict[str, NodeProcess]]
) -> None:
    master, nodes = cluster
    addr = master.address
    n1, n2, n3 = nodes["n1"], nodes["n2"], nodes["n3"]
    keys = [bytes([0xA0 + i]) + os.urandom(15) for i in range(6)]
    m0 = _scrape(master.metrics)
    with Client(n1.unix_address) as c:
        assert all(r.stored for r in c.put(keys, [value_for(k) for k in keys]))
    _wait("n1's blocks indexed",
          lambda: all(_holders(_json(addr, "where", *[k.hex() for k in keys]))))
    with Client(n2.unix_address) as c:  # a remote get copies keys 2, 3 into n2's DRAM
        assert c.get(keys[2:4]) == [value_for(k) for k in keys[2:4]]
    missing = os.urandom(16)
    asked = [keys[3], keys[0], keys[2], missing, keys[1]]  # the user's order, a miss inside
    where = _wait("n2's copies indexed", lambda: (
        w := _json(addr, "where", *[k.hex() for k in asked]))
        and _holders(w)[0] == [("n1", "DRAM"), ("n2", "DRAM")] and w)
    assert [b["key"] for b in where["blocks"]] == [k.hex() for k in asked]
    assert _holders(where) == [[("n1", "DRAM"), ("n2", "DRAM")], [("n1", "DRAM")],
                               [("n1", "DRAM"), ("n2", "DRAM")], [], [("n1", "DRAM")]]
    assert where["num_leading_present"] == 3 and where["num_blocks"] == 5
    assert [b["in_prefix"] for b in where["blocks"]] == [True, True, True, False, False]
    assert [b["present"] for b in where["blocks"]] == [True, True, True, False, True]
    table = _ctl(addr, "where", *[k.hex() for k in asked])
    assert table.returncode == 0, table.stderr
    assert "first miss" in table.stdout and "3 leading blocks present" in table.stdout
    # the master's gauges are a snapshot taken once per maintenance tick: wait for the tick
    # that counts every replica `where` names (n1's puts and n2's copies)
    num_replicas = sum(len(h) for h in _holders(_json(addr, "where", *[k.hex() for k in keys])))
    m1 = _wait("the replica gauge counts every replica", lambda: (
        (s := _scrape(master.metrics))["kvstored_master_replicas"] == num_replicas and s))
    assert m1["kvstored_master_lookups_total"] > m0["kvstored_master_lookups_total"]  # n2's get
    assert (m1["kvstored_master_lookup_blocks_total"]
            - m0["kvstored_master_lookup_blocks_total"]) >= 2

    # blocks --node: everything n1 holds, in pages
    full = _json(addr, "blocks", "--node", "n1")
    assert sorted(b["key"] for b in full["blocks"]) == sorted(k.hex() for k in keys)
    assert full["count"] == 6 and not full["truncated"] and full["num_replicas"] == 6
    assert {b["tier"] for b in full["blocks"]} == {"DRAM"}
    assert {b["state"] for b in full["blocks"]} == {"committed"}
    assert {b["size_bytes"] for b in full["blocks"]} == {len(value_for(k)) for k in keys}
    first = _json(addr, "blocks", "--node", "n1", "--limit", "4")
    assert first["count"] == 4 and first["truncated"] and first["next_page_token"]
    rest = _json(addr, "blocks", "--node", "n1", "--page-token", first["next_page_token"])
    assert [b["key"] for b in first["blocks"] + rest["blocks"]] == [b["key"] for b in full["blocks"]]
    # n2's copies: `blocks --node` and `where` name them the same way ("committed copy")
    on_n2 = _json(addr, "blocks", "--node", "n2")
    assert {b["key"]: (b["state"], b["copy"]) for b in on_n2["blocks"]} == {
        k.hex(): ("committed", True) for k in keys[2:4]}
    assert {b["copy"] for b in full["blocks"]} == {False}
    listed = _ctl(addr, "blocks", "--node", "n2")
    assert "blocks indexed on n2" in listed.stdout
    assert listed.stdout.count("committed copy") == 2, listed.stdout
    located = _ctl(addr, "where", keys[2].hex())
    assert located.stdout.count("committed copy") == 1, located.stdout

    # evict two keys cluster-wide: both holders remove them through their own Remove
    ev = _json(addr, "evict", keys[2].hex(), "--keys", keys[3].hex())
    assert ev["num_removed"] == 4 and ev["num_kept"] == 0
    assert {n["node_id"]: sorted(n["removed"]) for n in ev["nodes"]} == {
        "n1": sorted(k.hex() for k in keys[2:4]), "n2": sorted(k.hex() for k in keys[2:4])}
    for node in (n1, n2):
        with Client(node.unix_address) as c:
            held = {b.key for b in c.list_blocks()[0]}
        assert not held & set(keys[2:4])
    _wait("the master drops the evicted replicas",
          lambda: _holders(_json(addr, "where", keys[2].hex(), keys[3].hex())) == [[], []])
    with Client(n3.unix_address) as c:  # a miss everywhere now, never a stale answer
        assert c.get(keys[2:4]) == [None, None]
    # evict --prefix on one node only: key 0 is the only one whose hex starts "a0"
    ev = _json(addr, "evict", "--prefix", "a0", "--node", "n1")
    assert [(n["node_id"], n["removed"]) for n in ev["nodes"]] == [("n1", [keys[0].hex()])]
    again = _json(addr, "evict", missing.hex())
    assert again["num_not_indexed"] == 1 and again["nodes"] == []
    m2 = _wait("the replica gauge follows the evictions", lambda: (
        (s := _scrape(master.metrics))["kvstored_master_replicas"]
        == m1["kvstored_master_replicas"] - 5 and s))
    assert m2["kvstored_master_nodes{state=\"healthy\"}"] == 3
    # where calls (3 json + 1 table + 2 polls at least) and evict-by-keys calls (2) each
    # asked ListReplicas once; blocks --node asked ListNodeBlocks once per page (4 + 2: n2's
    # JSON listing and its table)
    assert (m2["kvstored_master_admin_requests_total{method=\"ListReplicas\"}"]
            - m1["kvstored_master_admin_requests_total{method=\"ListReplicas\"}"]) >= 3
    assert (m2["kvstored_master_admin_requests_total{method=\"ListNodeBlocks\"}"]
            - m1.get("kvstored_master_admin_requests_total{method=\"ListNodeBlocks\"}", 0)) == 4 + 2


def test_bad_input_exit_codes_and_node_commands_unchanged(
    cluster: tuple[MasterProcess, dict[str, NodeProcess]]
) -> None:
    master, nodes = cluster
    addr = master.address
    n1 = nodes["n1"]
    bad = _ctl(addr, "where", "zz-not-hex")
    assert bad.returncode == 2 and "key 'zz-not-hex' is not hex" in bad.stderr
    for args in (("blocks", "--node", "nope"), ("evict", "--node", "nope", "--prefix", "a")):
        out = _ctl(addr, *args)
        assert out.returncode == 2, (args, out.stderr)
        assert "unknown node id 'nope'" in out.stderr and "n1, n2, n3" in out.stderr
    out = _ctl(addr, "evict")
    assert out.returncode == 2 and "--prefix" in out.stderr
    out = _ctl(addr, "blocks")
    assert out.returncode == 2 and "give --node NODE_ID" in out.stderr
    out = _ctl(n1.unix_address, "blocks", "--node", "n1")
    assert out.returncode == 2 and "asks the master" in out.stderr
    for args in (("nodes",), ("evict", "--prefix", "a")):  # a node's address: one clean line
        out = _ctl(n1.tcp_address, *args)
        assert out.returncode == 2, (args, out.stderr)
        assert out.stderr == (f"kvstorectl: INVALID_ARGUMENT: {args[0]} asks the master: "
                              f"{n1.tcp_address} is not a master (a node?); give --address "
                              "MASTER_HOST:PORT\n"), out.stderr
    down = f"127.0.0.1:{_free_port()}"
    for args in (("nodes",), ("where", "00" * 16), ("evict", "00" * 16)):
        out = _ctl(down, "--timeout-s", "2", *args)
        assert out.returncode == 3, (args, out.stderr)
        assert out.stderr.startswith("kvstorectl: UNAVAILABLE"), out.stderr
    err = _ctl(down, "--timeout-s", "2", "where", "00" * 16, "--output", "json")
    assert json.loads(err.stdout)["error"]["code"] == "UNAVAILABLE"
    # a node's address: the single-node views as before (tier per block, local blocks)
    key = os.urandom(16)
    with Client(n1.unix_address) as c:
        assert c.put([key], [value_for(key)])[0].stored
    for address in (n1.unix_address, n1.tcp_address):
        got = _json(address, "where", key.hex(), "00" * 16)
        assert got == {"num_blocks": 2, "num_leading_hits": 1, "namespace_id": "",
                       "blocks": [{"index": 0, "key": key.hex(), "tier": "DRAM"},
                                  {"index": 1, "key": "00" * 16, "tier": None}]}
        listed = _json(address, "blocks")
        assert key.hex() in {b["key"] for b in listed["blocks"]}
        assert set(listed["blocks"][0]) == {"key", "size_bytes", "namespace_id", "tenant", "tiers",
                                            "pinned"}


def test_a_node_on_probation_shows_as_probation_in_nodes_and_metrics(
    cluster: tuple[MasterProcess, dict[str, NodeProcess]]
) -> None:
    # three failed transfers make n3 unhealthy; heartbeating for its retry time (one node
    # lease) puts it on probation, which nodes and the metrics name; a success heals it
    from kvstored.client.master import MasterClient

    master, _ = cluster
    addr = master.address
    epoch = {n["node_id"]: n["epoch"] for n in _json(addr, "nodes")["nodes"]}["n3"]
    with MasterClient(addr, timeout_s=10) as m:
        for _ in range(3):
            m.report_transfer("n3", epoch, ok=False, reporter_node_id="n1")
        assert {n["node_id"]: n["health"] for n in m.list_nodes()["nodes"]}["n3"] in (
            "unhealthy", "probation")
        _wait("n3 on probation", lambda: {
            n["node_id"]: n["health"] for n in _json(addr, "nodes")["nodes"]} == {
            "n1": "healthy", "n2": "healthy", "n3": "probation"})
        table = _ctl(addr, "nodes")
        assert table.returncode == 0 and re.search(r"n3 .*probation", table.stdout), table.stdout
        _wait("the probation gauge", lambda: (
            (s := _scrape(master.metrics))["kvstored_master_nodes{state=\"probation\"}"] == 1
            and s["kvstored_master_nodes{state=\"unhealthy\"}"] == 0))
        assert m.report_transfer("n3", epoch, ok=True, reporter_node_id="n1") == "healthy"
    _wait("three healthy nodes again", lambda: (
        (s := _scrape(master.metrics))["kvstored_master_nodes{state=\"healthy\"}"] == 3
        and s["kvstored_master_nodes{state=\"probation\"}"] == 0))
