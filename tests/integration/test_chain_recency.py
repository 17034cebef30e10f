"""Chain-aware recency over a whole request, not per chunk (issue 6, section 4).

Reads are pinned in chunks (the client's PinBlocks / data-plane GET batches, and the node's
64-key pin chunks of one data-plane GET) and puts are committed per chunk. Whatever the
chunking, a request's first block must end up the most recent and eviction must take the
request's tail first. The node here is a real daemon with the SSD tier on; eviction moves a
block from DRAM to SSD, which ``Client.where`` shows without touching recency.
"""

from __future__ import annotations

from typing import Any

import pytest
from it_helpers import random_keys, value_for, wait_until

from kvstored import Client, Tier

pytestmark = pytest.mark.usefixtures("pinned_reads")  # the pinned path's tests (PinBlocks)

BLOCK_BYTES = 64 << 10
NUM_BLOCKS = 40  # five client chunks of max_batch_keys=8
TRANSPORTS = ["shm", "tcp", "grpc"]


@pytest.fixture
def small_node(start_node: Any, tmp_path: Any) -> Any:
    node = start_node(
        dram_size_bytes=NUM_BLOCKS * BLOCK_BYTES,  # the prefix fills DRAM exactly
        max_block_bytes=BLOCK_BYTES,
        max_batch_keys=8,
        ssd_dir=str(tmp_path / "ssd"),
        ssd_size_bytes=64 << 20,
        ssd_direct_io=False,
    )
    dp = node.daemon._data_plane
    assert dp is not None
    dp.get_chunk_keys = 3  # the node also splits each data-plane GET into pin chunks
    return node


def _eviction_order(node: Any, c: Client, prefix: list[bytes]) -> list[int]:
    """Put one filler block at a time into the full DRAM; the index of the prefix block each
    one pushes out to SSD, in order."""
    wait_until(lambda: node.daemon.store.stats().pinned_blocks == 0, what="read pins released")
    stats = node.daemon.store.stats().tiers[0]
    assert stats.used_bytes == stats.capacity_bytes == NUM_BLOCKS * BLOCK_BYTES
    order: list[int] = []
    for filler in random_keys(NUM_BLOCKS):
        assert node.daemon.store.put(filler, value_for(filler, BLOCK_BYTES))
        tiers = c.where(prefix)
        out = [i for i, t in enumerate(tiers) if t == Tier.SSD and i not in order]
        assert len(out) == 1, f"one filler block pushed out {out}"
        order += out
    return order


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_put_longer_than_one_chunk_evicts_its_tail_first(small_node: Any, transport: str) -> None:
    prefix = random_keys(NUM_BLOCKS)
    values = [value_for(k, BLOCK_BYTES) for k in prefix]
    with Client(small_node.address_for(transport), transport=transport) as c:
        assert all(r.stored for r in c.put(prefix, values))
        assert _eviction_order(small_node, c, prefix) == list(range(NUM_BLOCKS - 1, -1, -1))
        assert c.get(prefix) == values  # demoted, not lost, and byte-identical


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_read_longer_than_one_chunk_makes_its_head_most_recent(small_node: Any, transport: str) -> None:
    prefix = random_keys(NUM_BLOCKS)
    values = [value_for(k, BLOCK_BYTES) for k in prefix]
    with Client(small_node.address_for(transport), transport=transport) as c:
        for k, v in zip(prefix, values, strict=True):  # one at a time: the tail is most recent now
            assert c.put([k], [v])[0].stored
        assert c.get(prefix) == values  # the read alone must reverse that
        assert _eviction_order(small_node, c, prefix) == list(range(NUM_BLOCKS - 1, -1, -1))
