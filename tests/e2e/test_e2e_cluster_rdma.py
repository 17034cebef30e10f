"""Reads across the pool choose RDMA when both ends advertise a device (issue 18 section 2),
with a real master and real node processes.

This machine has no RDMA device: with the real pyverbs, ``get_device_list()`` raises, so the
nodes advertise ``["tcp"]`` and every copy goes over TCP. With the fake verbs layer loaded
into each node (``KVSTORED_TEST_VERBS=tests.fake_verbs:process_verbs``: each process its own
fake device; a READ maps the peer's arena file read-only by the path its ConnectRdma answer
names), the nodes advertise ``rdma``, negotiate a QP over ConnectRdma, and a reader's copies
are one-sided READs checked by the holder's slot headers; a node whose fake QP fails
mid-read (``KVSTORED_TEST_FAKE_FAIL_WR``) copies the same blocks over TCP, byte for byte.
An engine in this process reading the remote node at its TCP address does the same (its DRAM
hits by RDMA, a block the node lacks over TCP, a failed QP over TCP). What served is read
from each node's Stats (``kvstorectl stats``'s counters) and the client's path counts. No
sleeps.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from cluster_helpers import (
    NodeProcess,
    _indexed,
    _wait,
    start_master,
    start_nodes,
)
from e2e_helpers import value_for

from kvstored import Client
from kvstored.client.master import MasterClient

ROOT = Path(__file__).resolve().parents[2]
FAKE = {"KVSTORED_TEST_VERBS": "tests.fake_verbs:process_verbs",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}


def _put_on(node: NodeProcess, name: str, master: str, keys: list[bytes]) -> None:
    with Client(node.unix_address) as c:
        assert all(r.stored for r in c.put(keys, [value_for(k) for k in keys],
                                           metas=[b"meta-" + k[:4] for k in keys]))
    with MasterClient(master) as m:
        _wait(f"the blocks indexed on {name}", lambda: _indexed(m, keys, name))


def _read(node: NodeProcess, keys: list[bytes]) -> None:
    with Client(node.unix_address) as c:
        got = c.get_blocks(keys, timeout_s=30)
        assert [b.value if b is not None else None for b in got] == [value_for(k) for k in keys]
        assert [b.meta for b in got if b is not None] == [b"meta-" + k[:4] for k in keys]


def _stats(node: NodeProcess) -> dict[str, Any]:
    with Client(node.unix_address) as c:
        return c.stats()


def _paths(node: NodeProcess) -> tuple[int, int, int]:
    s = _stats(node)
    return s["remote_rdma_blocks"], s["remote_tcp_blocks"], s["rdma_fallbacks"]


def _healthy(m: MasterClient, names: set[str]) -> dict[str, Any] | None:
    nodes = {n["node_id"]: n for n in m.list_nodes()["nodes"]}  # type: ignore[attr-defined]
    ok = set(nodes) == names and all(n["health"] == "healthy" for n in nodes.values())
    return nodes if ok else None


def test_copies_choose_rdma_when_both_ends_advertise_it_and_fall_back_to_tcp(
    workdir: Path, procs: list[Any], monkeypatch: Any
) -> None:
    master = start_master(workdir, procs)
    n1, n2, n3 = (NodeProcess(workdir / n, master.address, n) for n in ("n1", "n2", "n3"))
    plain = NodeProcess(workdir / "n4", master.address, "n4")  # the real pyverbs: no device here
    n3.env["KVSTORED_TEST_FAKE_FAIL_WR"] = "14"  # 4 blocks: bucket, slot, header READs, then payloads
    start_nodes([n1, n2, n3], procs, FAKE)
    start_nodes([plain], procs, {})
    with MasterClient(master.address) as m:
        table = _wait("4 nodes healthy", lambda: _healthy(m, {"n1", "n2", "n3", "n4"}))
    assert {n: v["transports"] for n, v in table.items()} == {
        "n1": ["tcp", "rdma"], "n2": ["tcp", "rdma"], "n3": ["tcp", "rdma"], "n4": ["tcp"]}
    keys, plain_keys = [os.urandom(16) for _ in range(4)], [os.urandom(16) for _ in range(4)]
    _put_on(n1, "n1", master.address, keys)
    _put_on(plain, "n4", master.address, plain_keys)

    _read(n2, keys)  # both ends advertise rdma: the fake NIC copies n1's arena file
    assert _paths(n2) == (4, 0, 0)
    _read(n2, plain_keys)  # n4 has no device: TCP
    assert _paths(n2) == (4, 4, 0)
    _read(plain, keys)  # nor does the reader: TCP
    assert _paths(plain) == (0, 4, 0)
    _read(n3, keys)  # the 14th work request fails: a payload READ mid-batch -> all over TCP
    assert _paths(n3) == (0, 4, 1)
    s = _stats(n1)
    assert (s["rdma_device"], s["rdma_sessions"]) == ("fake0", 2)  # n2's and n3's QPs
    assert _stats(plain)["rdma_device"] == ""

    # an engine reading the remote node n1 at its TCP address: its DRAM hits by RDMA too
    monkeypatch.setenv("KVSTORED_TEST_VERBS", FAKE["KVSTORED_TEST_VERBS"])
    with Client(n1.tcp_address) as c:
        got = c.get_blocks(keys + plain_keys[:1], timeout_s=30)
        assert [b.value if b is not None else None for b in got] == [
            value_for(k) for k in keys + plain_keys[:1]]  # n4's block: n1 fills it over TCP
        assert c.describe().transports == ("tcp", "rdma")
        counts = c._st.rdma.counts  # type: ignore[union-attr]
        assert (counts.rdma_blocks, counts.tcp_blocks, counts.fallbacks) == (4, 1, 0)
    monkeypatch.setenv("KVSTORED_TEST_FAKE_FAIL_WR", "14")  # this engine's QP fails mid-read
    with Client(n1.tcp_address) as c:
        got = c.get_blocks(keys, timeout_s=30)
        assert [b.value if b is not None else None for b in got] == [value_for(k) for k in keys]
        counts = c._st.rdma.counts  # type: ignore[union-attr]
        assert (counts.rdma_blocks, counts.tcp_blocks, counts.fallbacks) == (0, 4, 1)
    assert _stats(n1)["rdma_sessions"] == 2  # each engine's QP ended when it closed

    out = subprocess.run([sys.executable, "-m", "kvstored.cli.kvstorectl", "--address",
                          n2.unix_address, "stats"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for name, value in (("remote_rdma_blocks", "4"), ("remote_tcp_blocks", "4"),
                        ("rdma_fallbacks", "0"), ("rdma_device", "fake0")):
        assert re.search(rf"\b{name}\b\W+{value}\b", out.stdout), out.stdout
