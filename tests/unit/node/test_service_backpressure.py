"""The node's gRPC puts never wait for the pool on the event loop.

With the spiller's backpressure installed (``TieredStore.set_pool_room``), a put that needs
an eviction may wait for a spill round; on a DRAM-only node such a put used to be
reserved on the loop (evictions were metadata only). It must go to the store executor
instead, or one full node would stall every request and heartbeat it serves.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from helpers import key

from kvstored.config import NodeConfig
from kvstored.node.core import NodeCore
from kvstored.node.service import NodeServicer
from kvstored.tiers.tiered import TieredStore
from kvstored.v1 import node_pb2 as pb

BLOCK = 16 << 10
DRAM = 4 * BLOCK


def _running_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def test_a_put_that_waits_for_the_pool_runs_on_the_executor_not_the_loop() -> None:
    cfg = NodeConfig(node_id="n", dram_size_bytes=DRAM, ssd_size_bytes=0, max_block_bytes=BLOCK)
    store = TieredStore(dram_size_bytes=DRAM, arena_dir=None, max_block_bytes=BLOCK)
    core = NodeCore(store, cfg, epoch=1)
    for i in range(4):
        store.put(key(i), bytes([i]) * BLOCK)
    on_loop: list[bool] = []

    def pool_room(need_bytes: int, deadline: float) -> bool:  # the spiller moving 0 out
        on_loop.append(_running_loop())
        store.remove([key(0)])
        return True

    store.set_pool_room(pool_room, wait_s=60.0)
    try:
        with ThreadPoolExecutor(2) as pool:
            servicer = NodeServicer(core, pool, version="test")
            req = pb.PutRequest(items=[pb.PutItem(key=key(9), value=b"x" * BLOCK)])
            resp = asyncio.run(servicer.Put(req, None))
        assert [r.stored for r in resp.results] == [True]
        assert on_loop == [False]  # asked once, from an executor thread
        assert store.exists([key(i) for i in (1, 2, 3, 9)]) == [True] * 4
    finally:
        store.close()
