"""Disk I/O never runs under the store lock: a held SSD read or write stalls only its own get.

The SSD tier's ``io_hook`` holds one I/O on an Event the test controls (the FUSE-pause
measurement of issue 6, without FUSE). Every other call is run through ``completes()``, which
fails the test if the call does not return while the I/O is still held (the join timeout is a
hang guard: with the old code those calls deadlock on the store lock and never return).
"""

from __future__ import annotations

import pathlib
import threading
from collections.abc import Iterator

import pytest
from helpers import key
from thread_helpers import completes, in_thread

from kvstored.errors import Unavailable
from kvstored.tiers.ssd_format import file_rel, store_key
from kvstored.tiers.tiered import TieredStore
from kvstored.types import PinnedBlock, Tier

K = 4096
BLOCK = 3 * K


def val(i: int) -> bytes:
    return bytes([i % 251]) * (BLOCK - 7) + b"%07d" % i


class HeldIo:
    """An io_hook that holds the first ``op`` on ``skey`` (any key if None) until released."""

    def __init__(self, op: str, skey: bytes | None = None) -> None:
        self.op, self.skey = op, skey
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls: list[tuple[str, bytes]] = []

    def __call__(self, op: str, skey: bytes) -> None:
        self.calls.append((op, skey))
        if op == self.op and (self.skey is None or skey == self.skey) and not self.entered.is_set():
            self.entered.set()
            assert self.release.wait(30), "held I/O never released"


@pytest.fixture
def store(tmp_path: pathlib.Path) -> Iterator[TieredStore]:
    s = TieredStore(
        dram_size_bytes=4 * BLOCK, arena_dir=None, ssd_dir=tmp_path / "ssd",
        ssd_size_bytes=40 * BLOCK,
    )
    yield s
    if s._state.ssd is not None:
        s._state.ssd.io_hook = None
    s.close()


def test_dram_hits_lookups_exists_stats_do_not_wait_for_a_held_promotion_read(
    store: TieredStore,
) -> None:
    for i in range(6):
        store.put(key(i), val(i))  # 0, 1 demoted to SSD; 2..5 in DRAM
    assert store.lookup_prefix([key(0)]) == [Tier.SSD]
    store.remove([key(2)])  # room for the promotion, so it needs no demotion
    held = HeldIo("read", store_key(b"", key(0)))
    assert store._state.ssd is not None
    store._state.ssd.io_hook = held
    reader, box = in_thread(lambda: store.get(key(0)))
    assert held.entered.wait(10)
    # key(0) is PROMOTING now; everything about other blocks completes at once
    assert completes(lambda: store.get(key(3))) == (val(3), b"")
    assert completes(lambda: store.lookup_prefix([key(4), key(5), key(0)])) == [
        Tier.DRAM, Tier.DRAM, Tier.SSD
    ]
    assert completes(lambda: store.exists([key(0), key(1), key(2)])) == [True, True, False]
    assert completes(store.stats).pinned_blocks == 0
    pins = completes(lambda: store.pin_many([key(4), key(5)]))
    assert all(isinstance(p, PinnedBlock) for p in pins)
    for p in pins:
        completes(lambda p=p: store.unpin(p))
    r = completes(lambda: store.reserve(key(9), 10))  # fits in free space: no eviction
    assert r is not None
    completes(lambda: store.commit(r))
    assert reader.is_alive()  # still held: only this get waits for its read
    held.release.set()
    reader.join(10)
    assert box == [(val(0), b"")]
    assert [c for c in held.calls if c[0] == "read"] == [("read", store_key(b"", key(0)))]


def test_a_second_reader_of_a_promoting_block_shares_its_read(store: TieredStore) -> None:
    for i in range(6):
        store.put(key(i), val(i))
    store.remove([key(2)])
    held = HeldIo("read", store_key(b"", key(0)))
    assert store._state.ssd is not None
    store._state.ssd.io_hook = held
    r1, b1 = in_thread(lambda: store.get(key(0)))
    assert held.entered.wait(10)
    r2, b2 = in_thread(lambda: store.get(key(0)))
    held.release.set()
    r1.join(10)
    r2.join(10)
    assert b1 == b2 == [(val(0), b"")]
    assert [c for c in held.calls if c[0] == "read"] == [("read", store_key(b"", key(0)))]


def test_dram_ops_do_not_wait_for_a_held_demotion_and_a_demoting_block_stays_readable(
    store: TieredStore,
) -> None:
    for i in range(4):
        store.put(key(i), val(i))  # DRAM full; LRU = 0
    held = HeldIo("write")
    assert store._state.ssd is not None
    store._state.ssd.io_hook = held
    writer, box = in_thread(lambda: store.put(key(7), val(7)))
    assert held.entered.wait(10)
    assert held.calls[-1] == ("write", store_key(b"", key(0)))
    assert store._state.demoting.keys() == {store_key(b"", key(0))}
    # key(0) is DEMOTING: still served from DRAM; other blocks unaffected
    assert completes(lambda: store.get(key(0))) == (val(0), b"")
    assert completes(lambda: store.get(key(2))) == (val(2), b"")
    assert completes(lambda: store.lookup_prefix([key(0), key(1)])) == [Tier.DRAM, Tier.DRAM]
    assert completes(lambda: store.exists([key(7)])) == [False]  # not committed yet
    completes(store.stats)
    held.release.set()
    writer.join(10)
    assert box == [True]
    assert store.lookup_prefix([key(0), key(7)]) == [Tier.SSD, Tier.DRAM]
    assert store.get(key(0)) == (val(0), b"")


def test_remove_during_a_held_demotion_leaves_no_copy_in_either_tier(
    store: TieredStore, tmp_path: pathlib.Path
) -> None:
    for i in range(4):
        store.put(key(i), val(i))
    held = HeldIo("write")
    assert store._state.ssd is not None
    store._state.ssd.io_hook = held
    writer, box = in_thread(lambda: store.put(key(7), val(7)))
    assert held.entered.wait(10)
    assert completes(lambda: store.remove([key(0)])) == [True]
    assert completes(lambda: store.exists([key(0)])) == [False]
    # its arena space is still owned by the demotion: not reused while the write reads it
    used = store._state.dram.allocator.used_bytes
    assert used == 4 * BLOCK
    held.release.set()
    writer.join(10)
    assert box == [True]
    assert store.exists([key(0)]) == [False]
    assert not (tmp_path / "ssd" / "data" / file_rel(store_key(b"", key(0)))).exists()
    store._state.dram.allocator.check_invariants()
    assert store._state.dram.allocator.used_bytes == 4 * BLOCK  # 1, 2, 3 and 7
    assert store.stats().tiers[1].used_bytes == 0


def test_remove_during_a_held_promotion_does_not_resurrect_the_block(store: TieredStore) -> None:
    for i in range(6):
        store.put(key(i), val(i))
    store.remove([key(2)])
    held = HeldIo("read", store_key(b"", key(0)))
    assert store._state.ssd is not None
    store._state.ssd.io_hook = held
    reader, box = in_thread(lambda: store.get(key(0)))
    assert held.entered.wait(10)
    assert completes(lambda: store.remove([key(0)])) == [True]
    held.release.set()
    reader.join(10)
    assert box == [None]  # a miss, never a block that was removed
    assert store.exists([key(0)]) == [False]
    store._state.dram.allocator.check_invariants()
    assert store._state.reserved_bytes == 0


def test_close_waits_for_a_held_transfer(store: TieredStore) -> None:
    for i in range(6):
        store.put(key(i), val(i))
    store.remove([key(2)])
    held = HeldIo("read", store_key(b"", key(0)))
    assert store._state.ssd is not None
    store._state.ssd.io_hook = held
    reader, box = in_thread(lambda: store.get(key(0)))
    assert held.entered.wait(10)
    closer, _ = in_thread(store.close)
    for _ in range(1000):  # until close() has marked the store closed and waits
        if store._state.closed:
            break
        closer.join(0.01)
    assert store._state.closed and closer.is_alive()  # waiting for the promotion in flight
    held.release.set()
    reader.join(10)
    closer.join(10)
    assert not closer.is_alive()
    assert len(box) == 1 and isinstance(box[0], Unavailable)  # the read finished, not served
