"""The store's seams: the TierBackend protocol both tiers implement, ssd_recovery.recover,
and closing every tier even when one fails."""

from __future__ import annotations

import mmap
import os
import pathlib

import pytest
from helpers import key

from kvstored.tiers.base import TierBackend
from kvstored.tiers.dram import DramTier
from kvstored.tiers.ssd import SsdTier
from kvstored.tiers.ssd_format import (
    SsdEntry,
    index_key,
    round_up_page,
    store_key,
    trailer_bytes,
)
from kvstored.tiers.ssd_recovery import recover
from kvstored.tiers.tiered import TieredStore
from kvstored.types import Tier

K = 4096
BLOCK = 3 * K - 100


def sk(i: int) -> bytes:
    return store_key(b"", key(i))


def charge(i: int) -> int:
    return round_up_page(BLOCK + trailer_bytes(sk(i), b""))


def page_aligned(i: int) -> memoryview:
    buf = mmap.mmap(-1, round_up_page(BLOCK))
    buf[:BLOCK] = bytes([i]) * BLOCK
    return memoryview(buf)[:BLOCK]


def test_both_tiers_are_backends_and_report_the_store_stats(tmp_path: pathlib.Path) -> None:
    s = TieredStore(dram_size_bytes=4 * K, arena_dir=None, ssd_dir=tmp_path / "ssd",
                    ssd_size_bytes=16 * K, ssd_direct_io=False)
    try:
        tiers = s._state.tiers
        assert [type(t) for t in tiers] == [DramTier, SsdTier]  # fastest first
        assert all(isinstance(t, TierBackend) for t in tiers)
        assert [t.tier for t in tiers] == [Tier.DRAM, Tier.SSD]
        assert s.put(key(1), b"a" * BLOCK) and s.put(key(2), b"b" * BLOCK)  # 1 demoted
        dram, ssd = (t.stats() for t in tiers)
        assert (dram.used_bytes, dram.num_blocks, dram.evictions) == (3 * K, 1, 1)
        assert (ssd.used_bytes, ssd.num_blocks) == (charge(1), 1)
        assert s.stats().tiers == (dram, ssd)
    finally:
        s.close()


def test_recover_returns_the_blocks_it_kept_and_counts_the_ones_it_trimmed(
    tmp_path: pathlib.Path,
) -> None:
    t = SsdTier(tmp_path / "ssd", 8 * charge(0), direct_io=False)
    for i in range(4):
        assert t.write(sk(i), page_aligned(i), namespace_id=b"", meta=b"")
    t.close()
    made: list[int] = []

    def make_entry(size: int, csum: int, ns: bytes, meta: bytes) -> SsdEntry:
        made.append(size)
        return SsdEntry(size, csum, (ns, meta))

    found = recover(str(tmp_path / "ssd"), 2 * charge(0), make_entry=make_entry)
    try:
        assert list(found.entries) == [sk(2), sk(3)]  # LRU first: 0 and 1 trimmed
        assert found.num_trimmed == 2 and found.used_bytes == 2 * charge(0)
        assert made == [BLOCK] * 4 and found.next_seq == 4
        assert len(found.made_shards) == 256
        assert sorted(bytes(k) for k, _ in found.db.items()) == [index_key(sk(2)), index_key(sk(3))]
    finally:
        found.db.close()
        os.close(found.lock_fd)
    t2 = SsdTier(tmp_path / "ssd", 2 * charge(0), direct_io=False)
    try:
        assert list(t2.entries) == [sk(2), sk(3)] and t2.evictions == 0  # nothing left to trim
    finally:
        t2.close()


def test_a_tier_that_fails_to_close_still_lets_the_others_close(tmp_path: pathlib.Path) -> None:
    arena_dir = tmp_path / "shm"
    arena_dir.mkdir()
    s = TieredStore(dram_size_bytes=4 * K, arena_dir=arena_dir, ssd_dir=tmp_path / "ssd",
                    ssd_size_bytes=16 * K, ssd_direct_io=False)
    ssd = s._state.ssd
    assert ssd is not None and s.arena_path is not None
    real_close = ssd.close

    def failing_close() -> None:
        real_close()
        raise OSError("index flush failed")

    ssd.close = failing_close  # type: ignore[method-assign]
    with pytest.raises(OSError, match="index flush failed"):
        s.close()
    assert not pathlib.Path(s.arena_path).exists()  # the DRAM tier closed all the same
    assert s.arena.nbytes == 0
    s.close()  # idempotent: closed once
