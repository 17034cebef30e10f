"""Reading blocks out for export (kvstored/tiers/export.py, what spill uses): the eviction
order walked from its cold end, bounded; DRAM blocks pinned in place and SSD-only blocks read
from their files, checksum-verified, never promoted, never touched, never counted."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest
from helpers import key

from kvstored.tiers.ssd_format import file_rel, store_key
from kvstored.tiers.tiered import TieredStore
from kvstored.types import Tier

K = 4096
BLOCK = 3 * K


def val(i: int) -> bytes:
    return bytes([i % 251]) * (BLOCK - 7) + b"%07d" % i


@pytest.fixture
def store(tmp_path: pathlib.Path) -> Iterator[TieredStore]:
    """Blocks 0-3 SSD-only (demoted, coldest first), 4-7 in DRAM (LRU order), all on SSD."""
    s = TieredStore(dram_size_bytes=4 * BLOCK, arena_dir=None, ssd_dir=tmp_path / "ssd",
                    ssd_size_bytes=40 * BLOCK, ssd_direct_io=False)
    for i in range(8):
        assert s.put(key(i), val(i))
    yield s
    s.close()


def _keys(blocks: list) -> list[int]:
    return [int.from_bytes(b.key, "big") for b in blocks]


def test_coldest_blocks_follow_the_eviction_order_and_skip_pinned_excluded_and_beyond_the_scan(
    store: TieredStore,
) -> None:
    got = store.coldest_blocks(10)
    assert _keys(got) == [0, 1, 2, 3, 4, 5, 6, 7]  # SSD-only first, then DRAM LRU
    assert [b.tiers for b in got[:4]] == [(Tier.SSD,)] * 4
    assert all(b.tiers[0] is Tier.DRAM for b in got[4:])
    assert _keys(store.coldest_blocks(3)) == [0, 1, 2]
    held = store.read_for_export([key(4)])
    try:
        assert _keys(store.coldest_blocks(10)) == [0, 1, 2, 3, 5, 6, 7]  # pinned: skipped
        assert _keys(store.coldest_blocks(10, exclude={(b"", key(0)), (b"", key(6))})) == [
            1, 2, 3, 5, 7]
        assert _keys(store.coldest_blocks(10, max_scan=2)) == [0, 1, 5]  # 2 entries per map
    finally:
        store.release_export(held)
    assert store.coldest_blocks(10, exclude={(b"other", key(0))})[0].key == key(0)


def test_export_pins_dram_in_place_reads_ssd_from_the_file_and_never_promotes_or_touches(
    store: TieredStore,
) -> None:
    before = store.stats()
    got = store.read_for_export([key(0), key(5), key(99)])
    try:
        ssd_block, dram_block, missing = got
        assert missing is None
        assert ssd_block is not None and ssd_block.tier is Tier.SSD and ssd_block.pinned is None
        assert bytes(ssd_block.view) == val(0) and ssd_block.size_bytes == BLOCK
        assert dram_block is not None and dram_block.tier is Tier.DRAM
        assert bytes(dram_block.view) == val(5) and dram_block.pinned is not None
        assert store.remove([key(5)]) == [False]  # pinned while exported
        assert store.stats().pinned_blocks == 1
    finally:
        store.release_export(got)
    after = store.stats()
    assert (after.gets, after.hits, after.misses) == (before.gets, before.hits, before.misses)
    assert after.tiers == before.tiers  # nothing promoted, demoted, evicted or hit
    assert after.pinned_blocks == 0
    assert _keys(store.coldest_blocks(10)) == [0, 1, 2, 3, 4, 5, 6, 7]  # recency untouched
    assert store.remove([key(5)]) == [True]


def test_a_bad_ssd_file_is_never_exported_and_the_block_is_dropped(store: TieredStore) -> None:
    ssd = store._state.ssd
    assert ssd is not None
    path = ssd._path(file_rel(store_key(b"", key(1))))
    with open(path, "r+b") as f:  # flip one payload byte: same size, wrong checksum
        b = f.read(1)
        f.seek(0)
        f.write(bytes([b[0] ^ 0xFF]))
    before = store.stats().checksum_failures
    got = store.read_for_export([key(1), key(2)])
    try:
        assert got[0] is None
        assert got[1] is not None and bytes(got[1].view) == val(2)
    finally:
        store.release_export(got)
    assert store.stats().checksum_failures == before + 1
    assert store.exists([key(1), key(2)]) == [False, True]
