"""A get of N keys counts N gets, hits + misses = N, whatever the chunking (issue 9).

A read of SSD-only blocks larger than DRAM is pinned in chunks: when a chunk's own pins fill
DRAM, the chunk is cut at the first block that cannot be promoted and the next chunk restarts
there (the node's data-plane/gRPC pin chunks, the shm client's PinBlocks windows). The keys
past a cut are read again in the next chunk, so they must not be counted in the first one.
Here: a node with 8 blocks of DRAM, 24 SSD-only blocks read in one get.
"""

from __future__ import annotations

from typing import Any

import pytest
from it_helpers import random_keys, value_for, wait_until

from kvstored import Client, Tier

pytestmark = pytest.mark.usefixtures("pinned_reads")  # the pinned path's tests (PinBlocks)

BLOCK_BYTES = 64 << 10
DRAM_BLOCKS = 8
NUM_KEYS = 24


@pytest.fixture
def small_node(start_node: Any, tmp_path: Any) -> Any:
    return start_node(
        dram_size_bytes=DRAM_BLOCKS * BLOCK_BYTES, max_block_bytes=BLOCK_BYTES,
        ssd_dir=str(tmp_path / "ssd"), ssd_size_bytes=64 << 20, ssd_direct_io=False,
    )


@pytest.mark.parametrize("transport", ["tcp", "shm", "grpc"])
def test_a_get_of_ssd_only_blocks_larger_than_dram_counts_each_key_once(
    small_node: Any, transport: str
) -> None:
    store = small_node.daemon.store
    keys = random_keys(NUM_KEYS)
    values = [value_for(k, BLOCK_BYTES) for k in keys]
    with Client(small_node.address_for(transport), transport=transport) as c:
        fillers = random_keys(DRAM_BLOCKS)  # put last: pushes every key out of DRAM
        for i in range(0, NUM_KEYS, 4):  # (a gRPC put holds its whole batch in DRAM)
            assert all(r.stored for r in c.put(keys[i : i + 4], values[i : i + 4]))
        for i in range(0, DRAM_BLOCKS, 4):
            batch = fillers[i : i + 4]
            assert all(r.stored for r in c.put(batch, [value_for(k, BLOCK_BYTES) for k in batch]))
        assert c.where(keys) == [Tier.SSD] * NUM_KEYS
        wait_until(lambda: store.stats().pinned_blocks == 0, what="put pins released")
        before = store.stats()
        assert c.get(keys + [random_keys(1)[0]]) == values + [None]  # and one miss
        after = store.stats()
    gets, hits, misses = (after.gets - before.gets, after.hits - before.hits,
                          after.misses - before.misses)
    assert (gets, hits, misses) == (NUM_KEYS + 1, NUM_KEYS, 1)
