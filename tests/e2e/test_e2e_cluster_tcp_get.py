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

from cluster_helpers import (
    NodeProcess,
    _indexed,
    _wait,
    start_each,
    start_master,
    wait_healthy,
)
from e2e_helpers import value_for
from test_kvstorectl_cluster import _scrape

from kvstored import Client
from kvstored.client.master import MasterClient
from kvstored.transport.tcp import DataPlaneClient


def test_an_engine_on_the_tcp_data_plane_reads_a_peers_blocks_and_peers_never_chain(
    workdir: Path, procs: list[Any]
) -> None:
    master = start_master(workdir, procs, metrics_listen=True)
    n1, n2 = NodeProcess(workdir / "n1", master.address, "n1"), NodeProcess(
        workdir / "n2", master.address, "n2")
    start_each([n1, n2], procs)
    wait_healthy(master.address, {"n1", "n2"})
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
