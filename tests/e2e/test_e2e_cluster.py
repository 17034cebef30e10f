"""A real ``kvstored master`` and two ``kvstored node`` processes on loopback ports.

Registration, heartbeats and change events flow; ``kvstorectl nodes`` shows the cluster; a
node SIGKILLed and restarted at once is a new epoch whose SSD blocks are visible again (and
stay visible after its old epoch's lease passes) while its DRAM-only blocks are gone; a
node SIGKILLed for good leaves after its lease and its replicas with it; a node stopped
with SIGTERM leaves at once.

Waits poll the master's state with a deadline: the lease is real time in real processes.
The exact orders and races are pinned by the FakeClock unit tests in tests/unit/master.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import grpc
from cluster_helpers import (  # MasterProcess, WAIT_S: re-exported for older importers
    WAIT_S,  # noqa: F401
    MasterProcess,  # noqa: F401
    NodeProcess,
    _ctl,
    _nodes,
    _wait,
    _where,
    start_each,
    start_master,
    wait_healthy,
)
from e2e_helpers import value_for

from kvstored import Client
from kvstored.client.master import MasterClient
from kvstored.types import Tier
from kvstored.v1 import master_pb2, master_pb2_grpc


def _register_witness(master: str, node_id: str) -> None:
    """Register a node that never heartbeats (nothing listens at its addresses): the master
    drops it, as "expired", one node lease after now."""
    info = master_pb2.NodeInfo(node_id=node_id, epoch=1, grpc_address="127.0.0.1:1",
                               data_address="127.0.0.1:1")
    with grpc.insecure_channel(master) as ch:
        master_pb2_grpc.MasterServiceStub(ch).RegisterNode(
            master_pb2.RegisterNodeRequest(node=info), timeout=30)


def _departed(master: str) -> dict[str, str]:
    """``node_id -> reason`` of the nodes that left recently ("expired" or "left")."""
    with MasterClient(master) as m:
        departed = m.list_nodes()["departed"]
    return {d["node_id"]: d["reason"] for d in departed}  # type: ignore[index,union-attr]


def test_master_and_two_nodes_register_heartbeat_leave_and_restart(
    workdir: Path, procs: list[Any]
) -> None:
    master = start_master(workdir, procs)
    addr = master.address
    n1 = NodeProcess(workdir / "n1", addr, "n1")
    n2 = NodeProcess(workdir / "n2", addr, "n2")
    start_each([n1, n2], procs)
    nodes = wait_healthy(addr, {"n1", "n2"})
    assert nodes["n1"]["grpc_address"] == n1.tcp_address
    assert nodes["n2"]["data_address"] == n2.data
    assert {t["tier"] for t in nodes["n1"]["tiers"]} == {"DRAM", "SSD"}
    old_epoch = nodes["n2"]["epoch"]

    # blocks put through each node reach the master as ordered events
    k1 = [os.urandom(16) for _ in range(5)]
    k2 = [os.urandom(16) for _ in range(80)]  # ~3.6 MiB: more than n2's 4 MiB DRAM keeps
    with Client(n1.unix_address) as c:
        assert all(r.stored for r in c.put(k1, [value_for(k) for k in k1]))
    with Client(n2.unix_address) as c:
        for i in range(0, len(k2), 8):
            assert all(r.stored for r in c.put(k2[i:i + 8], [value_for(k) for k in k2[i:i + 8]]))
        blocks_before, _ = c.list_blocks()
    ssd_before = {b.key for b in blocks_before if Tier.SSD in b.tiers}
    assert ssd_before, "the test needs some of n2's blocks demoted to SSD"
    with MasterClient(addr) as m:
        where = _wait("n1's blocks indexed", lambda: (w := _where(m, k1)) and len(w) == 5 and w)
        assert set(where.values()) == {("n1", Tier.DRAM)}
        _wait("n2's blocks indexed", lambda: len(_where(m, k2)) == len(k2))
        got, complete = m.lookup_prefix(b"", k1, local_node_id="n2")
        assert [r.node_id for r in got] == ["n1"] * 5 and complete

    table = _ctl(addr, "nodes")
    assert table.returncode == 0, table.stderr
    assert "n1" in table.stdout and "n2" in table.stdout and "healthy" in table.stdout
    assert n1.tcp_address in table.stdout

    # SIGKILL n2 and restart it at once: a new epoch; its SSD blocks come back, DRAM ones not
    n2.kill()
    _register_witness(addr, "witness")  # lapses one lease after n2's last heartbeat, or later
    n2b = NodeProcess(workdir / "n2", addr, "n2")
    procs.append(n2b)
    n2b.start()
    nodes = _wait("n2's new epoch healthy", lambda: (
        (n := _nodes(addr)).get("n2", {}).get("epoch", old_epoch) != old_epoch
        and n["n2"]["health"] == "healthy" and n))
    assert nodes["n2"]["epoch"] > old_epoch
    with Client(n2b.unix_address) as c:
        blocks_after, _ = c.list_blocks()
    truth = {b.key for b in blocks_after}
    assert truth and truth <= ssd_before  # the restarted daemon found its SSD blocks only
    with MasterClient(addr) as m:
        where = _wait("n2's SSD blocks re-registered",
                      lambda: (w := _where(m, k2)) and set(w) == truth and w)
        assert set(where.values()) == {("n2", Tier.SSD)}
        # the old epoch's lease passes (the master has dropped the witness, registered after
        # n2's last heartbeat, for its lapsed lease): what the new epoch reported stays
        _wait("the witness's lease to lapse", lambda: _departed(addr).get("witness") == "expired")
        assert set(_where(m, k2)) == truth
        assert _nodes(addr)["n2"]["epoch"] == nodes["n2"]["epoch"]

        # SIGKILL n2 for good: it leaves after its lease, its replicas with it; n1 stays
        n2b.kill()
        _wait("n2 gone", lambda: "n2" not in _nodes(addr))
        assert _where(m, k2) == {}
        assert set(_where(m, k1).values()) == {("n1", Tier.DRAM)}
    assert _nodes(addr)["n1"]["health"] == "healthy"
    expired = [ln for ln in master.log_path.read_text().splitlines() if "node_lease_expired" in ln]
    assert any("n2" in ln for ln in expired), expired  # (the witness's is there too)
    # SIGTERM: the node leaves the cluster as its drain begins, before it exits
    assert n1.terminate() == 0, n1.log()
    assert _nodes(addr) == {}
    with MasterClient(addr) as m:
        assert _where(m, k1) == {}


def test_a_second_daemon_with_the_same_node_id_exits_2_and_the_first_keeps_its_blocks(
    workdir: Path, procs: list[Any]
) -> None:
    master = MasterProcess(workdir)
    procs.append(master)
    master.start()
    n1 = NodeProcess(workdir / "n1", master.address, "n1")
    procs.append(n1)
    n1.start()
    keys = [os.urandom(16) for _ in range(3)]
    with Client(n1.unix_address) as c:
        assert all(r.stored for r in c.put(keys, [value_for(k) for k in keys]))
    with MasterClient(master.address) as m:
        _wait("n1's blocks indexed", lambda: len(_where(m, keys)) == len(keys))
    epoch = _nodes(master.address)["n1"]["epoch"]
    # the same --node-id, its own ports and SSD dir: a second daemon, not a restart
    dup = NodeProcess(workdir / "dup", master.address, "n1")
    rc = subprocess.run(dup.args, env=dup.env, cwd=dup.workdir, capture_output=True, text=True,
                        timeout=60)
    assert rc.returncode == 2, rc.stderr[-3000:]
    assert "--node-id 'n1'" in rc.stderr and "held by a live daemon" in rc.stderr
    assert n1.data in rc.stderr and "s left" in rc.stderr
    # the first keeps the id, its epoch and its blocks
    assert _nodes(master.address)["n1"]["epoch"] == epoch
    with MasterClient(master.address) as m:
        assert set(v[0] for v in _where(m, keys).values()) == {"n1"} and len(_where(m, keys)) == 3
    with Client(n1.unix_address) as c:
        assert c.get(keys) == [value_for(k) for k in keys]
    assert "stale daemon" not in n1.log() and "master_asks_reregister" not in n1.log()
