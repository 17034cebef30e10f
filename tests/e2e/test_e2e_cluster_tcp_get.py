"""Reads across the pool for an engine on the TCP data plane, with a real master and two nodes.

An engine that reaches its node at a TCP address (``Client("HOST:PORT")``: transport auto =
the TCP data plane) reads blocks held by a peer: its GETs carry GET_FLAG_FILL_FROM_PEERS and
the node copies what it lacks first, as for the unix socket / gRPC paths. A node's own GET
of a peer (no flag) never goes further: the node asked answers from its store only, so reads
between nodes cannot chain or loop.

The copy is verified by the generation the holder stamped and sent (one master lookup per
read, counted on the master's metrics). Waits poll observable state (the master's index)
with a deadline; no sleeps.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from e2e_helpers import value_for
from test_e2e_cluster import (  # the cluster helpers and fixtures
    NodeProcess,
    _nodes,
    _wait,
    procs,  # noqa: F401 - fixture
    workdir,  # noqa: F401 - fixture
)
from test_kvstorectl_cluster import Master, _scrape  # a master with its metrics port

from kvstored import Client
from kvstored.client.master import MasterClient
from kvstored.transport.tcp import DataPlaneClient


def _indexed(m: MasterClient, keys: list[bytes], node_id: str) -> bool:
    got, _ = m.lookup_prefix(b"", keys, local_node_id=node_id)
    return len(got) == len(keys) and {r.node_id for r in got} == {node_id}


def test_an_engine_on_the_tcp_data_plane_reads_a_peers_blocks_and_peers_never_chain(
    workdir: Path, procs: list[Any]
) -> None:
    master = Master(workdir)
    procs.append(master)
    master.start()
    n1, n2 = NodeProcess(workdir / "n1", master.address, "n1"), NodeProcess(
        workdir / "n2", master.address, "n2")
    for n in (n1, n2):
        procs.append(n)
        n.start()
    _wait("two nodes healthy", lambda: {k: v["health"] for k, v in _nodes(master.address).items()}
          == {"n1": "healthy", "n2": "healthy"})
    peer_only, engine_keys = [os.urandom(16) for _ in range(3)], [os.urandom(16) for _ in range(3)]
    with Client(n1.unix_address) as c:
        assert all(r.stored for r in c.put(peer_only + engine_keys,
                                           [value_for(k) for k in peer_only + engine_keys]))
    with MasterClient(master.address) as m:
        _wait("the blocks indexed on n1", lambda: _indexed(m, peer_only + engine_keys, "n1"))

    # a node reading its peer (no flag): n2 answers from its own store, asks nobody
    peer = DataPlaneClient(n2.data)
    try:
        items = peer.get(peer_only, b"", lambda i, size, meta: memoryview(bytearray(size)),
                         deadline=time.monotonic() + 30)
        assert [it.found for it in items] == [False] * 3
    finally:
        peer.close()

    lookups = "kvstored_master_lookups_total"
    with Client(n2.tcp_address) as c:  # TCP address: transport auto = the TCP data plane
        assert c.describe().transport == "tcp"
        before = _scrape(master.metrics)[lookups]
        assert c.get(engine_keys, timeout_s=30) == [value_for(k) for k in engine_keys]
        # one lookup for the read; the copies were verified by the generations n1 sent
        # (n1 stamped them, reported them, the master named them): no second lookup
        assert _scrape(master.metrics)[lookups] - before == 1
        held = {b.key for b in c.list_blocks()[0]}
        assert set(engine_keys) <= held  # copied into n2's DRAM by the engine's read
        assert not set(peer_only) & held  # the peer's flagless GET copied nothing
        assert c.get(engine_keys) == [value_for(k) for k in engine_keys]  # local hits now
