"""A peer's data plane restarted on the same address: pooled connections to the old one.

A node restarted with a fixed data address (the usual production config) is reached at the
same ``host:port``; every idle connection a reader pooled to the old process is dead. The
reader's next request must find a live connection (retrying once on a fresh one), not fail
with an internal error because its one retry also drew a dead pooled connection. Real
sockets over loopback, no sleeps.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from it_helpers import random_keys

from kvstored.config import NodeConfig
from kvstored.node.core import NodeCore
from kvstored.tiers.tiered import TieredStore
from kvstored.transport.tcp import DataPlaneClient
from kvstored.transport.tcp_server import DataPlaneServer

MIB = 1 << 20


def _serve(address: str) -> tuple[TieredStore, DataPlaneServer, str]:
    cfg = NodeConfig(node_id=f"rs-{uuid.uuid4().hex[:8]}", dram_size_bytes=16 * MIB,
                     ssd_size_bytes=0, max_block_bytes=MIB, log_level="warning")
    store = TieredStore.from_config(cfg)
    server = DataPlaneServer(NodeCore(store, cfg, epoch=1), address)
    return store, server, server.start()


def test_a_reader_whose_pooled_connections_all_died_with_a_restart_reads_again() -> None:
    store, server, address = _serve("127.0.0.1:0")
    keys = random_keys(2)
    value = b"v" * 4096
    dp = DataPlaneClient(address, pool_size=4)
    stopped: list[Any] = []
    try:
        for k in keys:
            assert store.put(k, value)
        # three idle pooled connections to this process (a reader's earlier batches)
        conns = [dp._connect(time.monotonic() + 10) for _ in range(3)]
        for sock in conns:
            dp._release(sock)
        server.stop(0)
        store.close()
        stopped.append(True)
        store, server, again = _serve(address)  # the restarted node, same data address
        assert again == address
        for k in keys:
            assert store.put(k, value)
        out = bytearray(len(value))
        got = dp.get(keys[:1], b"", lambda i, size, meta: memoryview(out),
                     deadline=time.monotonic() + 10)
        assert [g.found for g in got] == [True]
        assert bytes(out) == value
    finally:
        dp.close()
        server.stop(0)
        store.close()
