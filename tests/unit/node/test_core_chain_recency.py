"""NodeCore.pinned_chunks: recency follows the whole request, not each pin chunk."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from helpers import key

from kvstored.config import NodeConfig
from kvstored.node.core import NodeCore
from kvstored.tiers.tiered import TieredStore

BLOCK = 4096


@pytest.fixture
def core() -> Iterator[NodeCore]:
    cfg = NodeConfig(node_id="unit-recency", dram_size_bytes=10 * BLOCK, ssd_size_bytes=0,
                     max_block_bytes=BLOCK, max_batch_keys=64)
    store = TieredStore(dram_size_bytes=cfg.dram_size_bytes, arena_dir=None, max_block_bytes=BLOCK)
    yield NodeCore(store, cfg, epoch=1)
    store.close()


def _evicted_in_order(core: NodeCore, keys: list[bytes]) -> list[int]:
    order: list[int] = []
    for j in range(len(keys)):
        core.store.put(key(1000 + j), bytes(BLOCK))
        gone = [i for i, p in enumerate(core.store.exists(keys)) if not p and i not in order]
        assert len(gone) == 1
        order += gone
    return order


@pytest.mark.parametrize("chunk_keys", [1, 3, 4, 10])
def test_pinned_chunks_leave_the_head_most_recent(core: NodeCore, chunk_keys: int) -> None:
    keys = [key(i) for i in range(10)]
    for k in keys:  # one at a time: the tail is the most recent now
        assert core.store.put(k, k * (BLOCK // 16))
    with contextlib.closing(core.pinned_chunks(keys, b"", chunk_keys=chunk_keys)) as chunks:
        got = [b for _, chunk in chunks for b in chunk]
    assert [b.key for b in got] == keys  # type: ignore[union-attr]
    assert core.store.stats().pinned_blocks == 0
    assert _evicted_in_order(core, keys) == list(range(9, -1, -1))


def test_touch_many_skips_absent_keys_and_never_counts_a_get(core: NodeCore) -> None:
    keys = [key(i) for i in range(3)]
    for k in keys:
        core.store.put(k, bytes(BLOCK))
    gets = core.store.stats().gets
    core.store.touch_many([keys[0], key(99), keys[1], keys[2]])  # keys[0] most recent now
    assert core.store.stats().gets == gets and core.store.stats().pinned_blocks == 0
    for j in range(7):  # fills DRAM: nothing evicted yet
        core.store.put(key(500 + j), bytes(BLOCK))
    assert core.store.exists(keys) == [True, True, True]
    core.store.put(key(600), bytes(BLOCK))
    assert core.store.exists(keys) == [True, True, False]  # the touched order's tail went first
