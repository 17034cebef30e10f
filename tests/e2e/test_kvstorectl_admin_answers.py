"""kvstorectl items of issue 17 (a fresh user's tester) against real processes: a ``kvstored
master`` and two ``kvstored node`` processes (SSD tier on), and for the departed list two
``kvstored master --etcd`` with a failover.

- ``replicate`` of a key no node stores names it and exits 2 (the stored keys get their factor,
  the others none: README "for blocks already stored").
- ``where`` shows a block held in a node's DRAM and on its SSD as one row (``DRAM+SSD``) and
  counts that node once in ``replicas``.
- ``status`` / ``stats`` against a master's address say it is a master (exit 2), not gRPC's
  raw UNIMPLEMENTED text.
- ``where 00`` against a master names the master's key rule, not "the node".
- a BlockTooLarge message labels its key fragment ``key <hex>``.
- ``nodes`` says since which term its departed list is kept: a new leader knows no
  departure from before its term, and the title and JSON say so.

Waits poll with a deadline (cluster_helpers._wait); no sleeps decide an outcome.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import (
    MasterProcess,
    NodeProcess,
    _ctl,
    _wait,
    leader_of,
    start_each,
    start_master,
    start_nodes,
    wait_healthy,
)
from cluster_helpers import ha_master as cluster_ha_master
from etcd_helpers import EtcdServer

from kvstored import BlockTooLarge, Client
from kvstored.types import Tier

MIB = 1 << 20


def _json(address: str, *args: str) -> Any:
    out = _ctl(address, *args, "--output", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[MasterProcess, NodeProcess, NodeProcess]]:
    workdir = Path(tempfile.mkdtemp(prefix="kvc17", dir="/tmp"))  # short unix socket paths
    started: list[Any] = []
    try:
        master = start_master(workdir, started)
        n1 = NodeProcess(workdir / "n1", master.address, "n1", dram_size="8MiB", ssd_size="32MiB")
        n2 = NodeProcess(workdir / "n2", master.address, "n2", dram_size="8MiB", ssd_size="32MiB")
        start_each([n1, n2], started)
        wait_healthy(master.address, {"n1", "n2"})
        yield master, n1, n2
    finally:
        for p in reversed(started):
            p.kill()
        shutil.rmtree(workdir, ignore_errors=True)


def _block_in_dram_and_on_ssd(n1: NodeProcess) -> bytes:
    """Fill n1's 8 MiB DRAM so later puts land on its SSD, then read an SSD block until it is
    promoted into DRAM (its SSD copy stays): the key held in both of n1's tiers."""
    keys = [bytes([0xC0 + i]) * 16 for i in range(12)]
    with Client(n1.unix_address) as c:
        assert all(r.stored for r in c.put(keys, [bytes([i]) * MIB for i in range(12)]))
        on_ssd = [k for k, t in zip(keys, c.where(keys), strict=True) if t is Tier.SSD]
        assert on_ssd, "no put reached n1's SSD: the test needs a full DRAM"
        key = on_ssd[0]

        def in_both() -> bool:
            assert c.get([key])[0] == bytes([keys.index(key)]) * MIB
            held = {b.key: set(b.tiers) for b in c.list_blocks()[0]}
            return held.get(key) == {Tier.DRAM, Tier.SSD}

        _wait("a block in n1's DRAM and on its SSD", in_both)
    return key


Cluster = tuple[MasterProcess, NodeProcess, NodeProcess]


def test_where_shows_one_row_per_node_and_counts_nodes(cluster: Cluster) -> None:
    master, n1, _ = cluster
    addr = master.address
    key = _block_in_dram_and_on_ssd(n1)
    got = _wait("the master indexes both of n1's tiers", lambda: (
        w := _json(addr, "where", key.hex()))
        and sorted(r["tier"] for r in w["blocks"][0]["replicas"]) == ["DRAM", "SSD"] and w)
    block = got["blocks"][0]
    assert block.get("num_replicas") == 1 and block.get("num_copies") == 0, block
    table = _ctl(addr, "where", key.hex())
    assert table.returncode == 0, table.stderr
    rows = [line for line in table.stdout.splitlines() if key.hex() in line]
    assert len(rows) == 1, table.stdout  # was two "committed" rows of n1, "2/1" each
    assert "DRAM+SSD" in rows[0] and " 1/1 " in rows[0] and "n1" in rows[0], rows[0]


def test_replicate_names_the_keys_not_stored_and_sets_only_the_stored(cluster: Cluster) -> None:
    master, n1, n2 = cluster
    addr = master.address
    key = bytes.fromhex("5e" * 16)
    with Client(n2.unix_address) as c:
        assert c.put([key], [b"r" * MIB])[0].stored
    _wait("n2's block indexed", lambda: _json(addr, "where", key.hex())["blocks"][0]["present"])
    absent = bytes.fromhex("ab" * 16)
    out = _ctl(addr, "--output", "json", "replicate", absent.hex(), key.hex(), "--replicas", "2")
    assert out.returncode == 2, (out.stdout, out.stderr)  # was exit 0, "keys 2"
    data = json.loads(out.stdout)
    assert (data["num_keys"], data.get("num_not_stored"), data.get("not_stored")) == (
        1, 1, [absent.hex()]), data
    assert out.stderr.startswith("kvstorectl: NOT_FOUND: 1 of 2 key(s) are not stored"), out.stderr
    assert absent.hex() in out.stderr
    _wait("repair copies the stored key to n1", lambda: {
        r["node_id"] for r in _json(addr, "where", key.hex())["blocks"][0]["replicas"]
        if r["readable"]} == {"n1", "n2"})
    w = _json(addr, "where", key.hex(), absent.hex())
    assert [b["replication_factor"] for b in w["blocks"]] == [2, 0]  # none set for the absent key
    assert w["blocks"][0]["num_replicas"] == 2
    out = _ctl(addr, "replicate", key.hex(), "--replicas", "2")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    out = _ctl(addr, "replicate", absent.hex(), "--replicas", "2")
    assert out.returncode == 2 and "1 of 1 key(s) are not stored" in out.stderr, out.stderr
    assert n1.proc is not None and n1.proc.poll() is None


def test_status_and_stats_against_a_master_say_it_is_a_master(cluster: Cluster) -> None:
    master, n1, _ = cluster
    addr = master.address
    for command in ("status", "stats"):
        out = _ctl(addr, command)
        assert out.returncode == 2, out.stderr
        assert out.stderr.startswith(
            f"kvstorectl: INVALID_ARGUMENT: {addr} is a master, not a node: "
            f"`kvstorectl {command}` asks a node"), out.stderr  # was gRPC's raw text
        assert "UNIMPLEMENTED" not in out.stderr and "`kvstorectl nodes`" in out.stderr
    assert _ctl(n1.tcp_address, "status").returncode == 0  # a node's address: as before


def test_a_short_key_against_a_master_names_the_masters_key_rule(cluster: Cluster) -> None:
    master, n1, _ = cluster
    out = _ctl(master.address, "where", "00")
    assert out.returncode == 2
    assert out.stderr == ("kvstorectl: KEY_INVALID: key #0 is 1 bytes; a master takes block keys "
                          "of 16..64 bytes (32..128 hex digits)\n"), out.stderr  # was "the node"
    out = _ctl(n1.tcp_address, "where", "00")  # a node's address: the node's own bounds
    assert out.returncode == 2 and "the node accepts keys of 16..64 bytes" in out.stderr


def test_block_too_large_labels_its_key(cluster: Cluster) -> None:
    _, _, n2 = cluster
    big = bytes.fromhex("3f2a" * 8)
    with Client(n2.unix_address) as c:
        res = c.put([big], [b"\0" * (16 * MIB)])[0]
    assert not res.stored and isinstance(res.error, BlockTooLarge), res
    assert str(res.error).startswith("value #0 (key 3f2a3f2a3f2a3f2a) is 16777216 bytes"), res.error


PREFIX = "/kvctl17"


@pytest.mark.etcd
def test_nodes_says_since_which_term_it_lists_departed_nodes_across_failovers(
        workdir: Path, procs: list[Any], etcd: EtcdServer) -> None:
    masters = [cluster_ha_master(workdir, name, etcd.url(i), prefix=PREFIX, election_lease_s=3,
                                 lease_s=3.0) for i, name in enumerate(("ma", "mb"))]
    for m in masters:
        procs.append(m)
        m.start()
    both = ",".join(m.address for m in masters)
    first, term1 = _wait("a leader", lambda: leader_of(both)[0] and leader_of(both))
    via_etcd = f"etcd://{etcd.endpoints[0]},{etcd.endpoints[1]}{PREFIX}"
    nodes = [NodeProcess(workdir / f"n{i}", via_etcd, f"n{i}") for i in range(2)]
    start_nodes(nodes, procs, {})
    wait_healthy(both, {"n0", "n1"})
    drained = _ctl(both, "drain", "n1", "--wait-s", "60")
    assert drained.returncode == 0, drained.stderr
    nodes[1].kill()  # stays gone: a drained node that re-registered would not be departed
    listed = _json(both, "nodes")
    assert [d["node_id"] for d in listed["departed"]] == ["n1"]
    assert listed["departed_since_term"] == listed["term"] == term1
    table = _ctl(both, "nodes")
    assert f"1 live, 1 departed since term {term1} began" in table.stdout, table.stdout

    # failover: the new leader learned nothing of n1's departure; it says since when it knows
    leader = next(m for m in masters if m.address == first)
    leader.kill()
    second, term2 = _wait("a new leader", lambda: (
        (lt := leader_of(both))[0] and lt[1] > term1 and lt))
    wait_healthy(both, {"n0"})
    listed = _json(both, "nodes")
    assert listed["term"] == listed["departed_since_term"] == term2 and listed["departed"] == []
    table = _ctl(both, "nodes")
    assert f"1 live, 0 departed since term {term2} began" in table.stdout, table.stdout
    assert second != first
