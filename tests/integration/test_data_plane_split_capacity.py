"""A split data-plane GET whose streams compete for DRAM still reads every stored block.

A GET large enough is split into runs sent on parallel streams (kvstored/transport/tcp.py).
On a node whose DRAM holds one run's blocks, one stream's pinned chunk can fill DRAM while
another stream asks the node to promote its SSD blocks: the node answers those NoCapacity
(nothing it can free: the pins are the same GET's). Those blocks are stored; the client reads
them again once its streams are done, in one request that the node streams chunk by chunk
(as it does for any read larger than DRAM), so they are hits, not misses.

Ordering by the server's hook, never by sleeps: the first stream to have its chunk pinned is
held before sending until another stream's request is done.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from it_helpers import random_keys, value_for, wait_until

from kvstored.config import NodeConfig
from kvstored.errors import ErrorCode
from kvstored.node.core import NodeCore
from kvstored.tiers.tiered import TieredStore
from kvstored.transport.tcp import DataPlaneClient
from kvstored.transport.tcp_server import DataPlaneServer
from kvstored.types import Tier

MIB = 1 << 20
HANG_GUARD_S = 30.0


class _HoldFirstChunk:
    """Server hook: hold the first connection thread that has a GET chunk pinned until a
    request of another thread is done (its items answered while the pins were held)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.holder: int | None = None
        self.other_done = threading.Event()

    def __call__(self, event: str, **fields: Any) -> None:
        me = threading.get_ident()
        if event == "get_before_send":
            with self._lock:
                if self.holder is not None:
                    return
                self.holder = me
            assert self.other_done.wait(HANG_GUARD_S), "no other stream's request finished"
        elif event == "request_done" and fields.get("op") is not None:
            with self._lock:
                if self.holder is not None and me != self.holder:
                    self.other_done.set()


@pytest.fixture
def small_node(tmp_path: Path) -> Iterator[tuple[TieredStore, DataPlaneServer, _HoldFirstChunk]]:
    cfg = NodeConfig(node_id=f"sc-{uuid.uuid4().hex[:8]}", dram_size_bytes=4 * MIB,
                     ssd_size_bytes=64 * MIB, ssd_dir=tmp_path / "ssd", max_block_bytes=MIB,
                     log_level="warning")
    store = TieredStore.from_config(cfg)
    core = NodeCore(store, cfg, epoch=1)
    hook = _HoldFirstChunk()
    server = DataPlaneServer(core, "127.0.0.1:0", hook=hook)
    server.start()
    yield store, server, hook
    hook.other_done.set()
    server.stop(0)
    store.close()


def test_a_split_get_whose_streams_fill_dram_reads_every_stored_block(small_node: Any) -> None:
    store, server, hook = small_node
    keys = random_keys(8)  # two runs of 4 MiB: each run alone fills the 4 MiB of DRAM
    values = [value_for(k, MIB) for k in keys]
    for k, v in zip(keys, values, strict=True):
        assert store.put(k, v)
    listed, _ = store.list_blocks()
    assert sum(Tier.DRAM not in b.tiers for b in listed) >= 4  # on SSD only: promoted to read
    bufs = [bytearray(MIB) for _ in keys]
    dp = DataPlaneClient(server.address, max_streams=2, stream_min_bytes=4 * MIB)
    try:
        got = dp.get(keys, b"", lambda i, size, meta: memoryview(bufs[i]),
                     deadline=time.monotonic() + HANG_GUARD_S, size_hints=[MIB] * len(keys))
    finally:
        dp.close()
    assert hook.other_done.is_set(), "the streams never competed: the test proves nothing"
    assert dp.num_split_gets >= 1
    codes = [ErrorCode(g.code).name if g.code else "" for g in got]
    assert [g.found for g in got] == [True] * len(keys), codes
    assert [bytes(b) for b in bufs] == values
    wait_until(lambda: store.stats().pinned_blocks == 0, what="the node to release its pins")
