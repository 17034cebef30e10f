"""A node serves an SSD hit straight from its file when its promotion would drop a block
(issue 17 section 3): DRAM holds only DRAM-only originals, the SSD is full of SSD-only
ones, and the spiller (``TieredStore.set_pool_room``) makes no room. The store skips the
promotion (NoCapacity, tiers/transit.py); the node's chunked reads (the inline gRPC Get,
the TCP data-plane GET) read the block for export instead: right bytes, nothing evicted,
the block still SSD-only, its buffer released with the chunk."""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import Iterator

import pytest
from helpers import key

from kvstored.config import NodeConfig
from kvstored.node.core import NodeCore
from kvstored.tiers.tiered import TieredStore
from kvstored.types import ExportedBlock, PinnedBlock, Tier

K = 4096
BLOCK = 2 * K + 100  # 3 units in DRAM and on SSD (with its trailer)


def val(i: int) -> bytes:
    return bytes([i % 256]) * BLOCK


@pytest.fixture
def core(tmp_path: pathlib.Path) -> Iterator[NodeCore]:
    cfg = NodeConfig(node_id="n", dram_size_bytes=6 * K, ssd_size_bytes=6 * K,
                     max_block_bytes=BLOCK)
    store = TieredStore(dram_size_bytes=6 * K, arena_dir=None, ssd_dir=tmp_path / "ssd",
                        ssd_size_bytes=6 * K, max_block_bytes=BLOCK)
    try:
        store.put(key(0), val(0))
        store.put(key(1), val(1))
        assert store.spill_to_ssd() == 2  # SSD [0, 1] full
        store.put(key(2), val(2))  # DRAM [2, 3]: DRAM only; SSD [0, 1]: SSD only
        store.put(key(3), val(3))
        store.set_pool_room(lambda need, deadline: False, wait_s=60.0)  # every peer full
        yield NodeCore(store, cfg, epoch=1)
    finally:
        store.close()


def _all_held(core: NodeCore) -> None:
    assert core.store.exists([key(i) for i in range(4)]) == [True] * 4
    assert core.store.evictions_for_good == 0
    assert core.store.lookup_prefix([key(0)]) == [Tier.SSD]  # not promoted


def test_an_inline_get_serves_a_block_whose_promotion_would_drop_one_from_ssd(
    core: NodeCore,
) -> None:
    out = core.get_inline([key(2), key(0), key(1), key(3)], b"", budget_bytes=1 << 20)
    assert [o.found for o in out] == [True] * 4
    assert [o.value for o in out] == [val(2), val(0), val(1), val(3)]
    assert [o.tier for o in out] == [Tier.DRAM, Tier.SSD, Tier.SSD, Tier.DRAM]
    assert core.reads.num_served_from_ssd == 2
    _all_held(core)


def test_a_chunked_read_yields_the_ssd_block_for_export_and_releases_it(
    core: NodeCore,
) -> None:
    seen: list[object] = []
    with contextlib.closing(core.pinned_chunks([key(0), key(2)], b"", chunk_keys=8)) as chunks:
        for _, got in chunks:
            seen.extend(got)
    assert isinstance(seen[0], ExportedBlock) and seen[0].tier is Tier.SSD
    assert isinstance(seen[1], PinnedBlock) and seen[1].tier is Tier.DRAM
    assert core.store.stats().pinned_blocks == 0  # the DRAM pin went with the chunk
    # the export buffer went too: releasing it again is refused
    with pytest.raises(Exception, match="twice|released|not"):
        core.store.release_export([seen[0]])
    _all_held(core)


def test_the_nodrop_counters_are_exported_by_name(core: NodeCore) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from kvstored.node.spill import NODROP_COUNTERS, NoDropCollector

    core.get_inline([key(0)], b"", budget_bytes=1 << 20)  # one skipped, served from SSD
    reg = CollectorRegistry()
    store = core.store
    reg.register(NoDropCollector({
        "evictions_for_good": lambda: store.evictions_for_good,
        "promotions_skipped": lambda: store.promotions_skipped,
        "served_from_ssd": lambda: core.reads.num_served_from_ssd,
    }))
    text = generate_latest(reg).decode()
    assert "kvstored_nodrop_promotions_skipped_total 1.0" in text
    assert "kvstored_nodrop_served_from_ssd_total 1.0" in text
    assert "kvstored_nodrop_evictions_for_good_total 0.0" in text
    assert set(NODROP_COUNTERS) >= {"copies_skipped", "streamed_through"}


def test_a_shared_memory_read_of_such_a_block_is_marked_through_and_the_get_serves_it(
    core: NodeCore,
) -> None:
    """PinBlocks has no slot to pin for the SSD block whose promotion would drop one: it
    marks it ``through`` (the client then reads exactly it by the inline Get) instead of
    answering NoCapacity, which the shared-memory client took for a miss of a block this
    node holds (the e2e nearly-full-pool reads missed hundreds that way)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from kvstored.node.service import NodeServicer
    from kvstored.v1 import node_pb2 as pb

    session_id = core.open_session()
    with ThreadPoolExecutor(2) as pool:
        servicer = NodeServicer(core, pool, version="test")
        for first in (key(0), key(1)):
            resp = asyncio.run(servicer.PinBlocks(
                pb.PinBlocksRequest(keys=[first, key(2)], session_id=session_id, epoch=core.epoch),
                None))
            assert [b.found for b in resp.blocks] == [False, True]
            assert resp.blocks[0].through and not resp.blocks[0].HasField("status")
            core.release_pins_report([resp.pin_id])
            got = asyncio.run(servicer.Get(pb.GetRequest(keys=[first]), None))
            assert [r.value for r in got.results] == [val(0 if first == key(0) else 1)]
    _all_held(core)
