"""The whole-system test's topology without vLLM: namespaces on one bridge (bridge_helpers.py).

A master on the bridge's root address and two nodes, each in its own namespace: a block put
through one node reads back through the other (the copy crosses from one namespace to the
other over the bridge), and a node in a namespace cannot reach a port bound to the root
namespace's loopback (traffic stays on the bridge). Cleanup leaves no namespace, veth or
bridge behind. Skipped where a bridge or ``ip netns add`` is not available.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bridge_helpers import BridgedNamespace, BridgeNet
from cluster_helpers import NodeProcess, _keys, _put, _wait, start_master, start_nodes, wait_healthy
from e2e_helpers import value_for

from kvstored import Client

pytestmark = pytest.mark.netns


@pytest.fixture
def net() -> Iterator[BridgeNet]:
    bridge = BridgeNet()
    try:
        yield bridge.create()
    finally:
        bridge.close()


def _node(ns: BridgedNamespace, workdir: Path, master: str, node_id: str) -> NodeProcess:
    n = NodeProcess(workdir, master, node_id)
    n.args = ns.exec_args(*[a.replace("127.0.0.1:", f"{ns.ip}:") for a in n.args])
    return n


def _names(prefix: str) -> set[str]:
    """Root-namespace interfaces and namespaces whose name starts with ``prefix``."""
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, timeout=30,
                           check=True).stdout
    spaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                            timeout=30, check=True).stdout
    found = {ln.split(":")[1].strip().split("@")[0] for ln in links.splitlines()}
    found |= {ln.split()[0] for ln in spaces.splitlines() if ln.strip()}
    return {n for n in found if n.startswith(prefix)}


def test_nodes_in_two_namespaces_share_a_block_over_the_bridge(
    workdir: Path, net: BridgeNet, procs: list[Any]
) -> None:
    ns1, ns2 = net.add_namespace(), net.add_namespace()
    assert (ns1.ip, ns2.ip) == (f"{net.subnet}.2", f"{net.subnet}.3")
    master = start_master(workdir, procs, listen_host=net.root_ip)
    n1 = _node(ns1, workdir / "n1", master.address, "n1")
    n2 = _node(ns2, workdir / "n2", master.address, "n2")
    start_nodes([n1, n2], procs, {})
    wait_healthy(master.address, {"n1", "n2"})
    assert n1.data.startswith(f"{ns1.ip}:") and n2.data.startswith(f"{ns2.ip}:")
    keys = _keys(3)
    _put(n1, keys)
    with Client(n2.unix_address) as c:
        _wait("n1's blocks read through n2",
              lambda: c.get(keys, timeout_s=10) == [value_for(k) for k in keys])
    # the root namespace's loopback is not reachable from inside (only the bridge is)
    probe = subprocess.run(ns1.exec_args(
        "python3", "-c", "import socket,sys; s=socket.socket(); s.settimeout(2); "
        f"sys.exit(s.connect_ex(('127.0.0.1', {master.address.rsplit(':', 1)[1]})) == 0)"),
        capture_output=True, timeout=30, check=False)
    assert probe.returncode == 0, "a namespace reached the root namespace's loopback"


def test_close_removes_every_namespace_link_and_the_bridge() -> None:
    net = BridgeNet().create()
    try:
        net.add_namespace()
        net.add_namespace()
        p = net.prefix
        assert _names(p) == {f"{p}br", f"{p}n1a", f"{p}n2a", f"{p}n1", f"{p}n2"}
    finally:
        net.close()
    assert _names(net.prefix) == set()
    net.close()  # idempotent
