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


@pytest.mark.parametrize("batch", [False, True], ids=["get", "pin_many"])
def test_a_put_while_the_ssd_evicts_a_promoting_block_is_never_overwritten_by_the_promotion(
    store: TieredStore, batch: bool,
) -> None:
    # Regression (the racing-threads test's "freeing a pinned block" and KeyError in the
    # eviction walk): the SSD evicted a block while a promotion read it, a put committed the
    # key again in DRAM, and the promotion then indexed its older bytes over the new entry,
    # leaving the new one orphaned in the address-ordered list (space leaked, later walks
    # met a block the map did not know).
    for i in range(6):
        store.put(key(i), val(i))
    store.remove([key(2), key(3)])  # DRAM room for the promotion and for the put
    st = store._state
    assert st.ssd is not None
    skey = store_key(b"", key(0))
    assert skey not in st.dram.entries and skey in st.ssd.entries
    held = HeldIo("read", skey)
    st.ssd.io_hook = held
    def pin_and_release() -> None:  # a batch read: promote_many's parallel reads
        for p in store.pin_many([key(0), key(1)]):
            if isinstance(p, PinnedBlock):
                store.unpin(p)

    reader, box = in_thread(pin_and_release if batch else (lambda: store.get(key(0))))
    assert held.entered.wait(10)
    with st.lock:
        st.ssd.drop(skey)  # the SSD's eviction of the block being read (its file kept)
    newer = b"\x5a" * BLOCK
    assert completes(lambda: store.put(key(0), newer)) is True
    held.release.set()
    reader.join(10)
    assert not reader.is_alive() and len(box) == 1
    got = store.get(key(0))
    assert got is not None and got[0] == newer  # never the promotion's older bytes
    dram = st.dram
    assert len(dram.by_offset) == len(dram.entries)
    dram.allocator.check_invariants()
    assert dram.allocator.used_bytes == sum(dram.round_up(e.size_bytes) for e in dram.entries.values())
    assert st.reserved_bytes == 0


def test_a_block_put_again_and_removed_while_its_removed_predecessor_demotes_is_freed(
    store: TieredStore,
) -> None:
    # Regression (the racing-threads test's used_bytes 8 KiB above its blocks): a block was
    # removed while its demotion wrote, put again, and removed again before that write
    # ended; the second remove took the old demotion for the new block's and only forgot
    # the new block, whose space was then never freed (the demoter frees the old one only).
    store.put(key(0), val(0))
    st = store._state
    assert st.ssd is not None
    held = HeldIo("write", store_key(b"", key(0)))
    st.ssd.io_hook = held
    spiller, box = in_thread(store.spill_to_ssd)
    assert held.entered.wait(10)
    assert completes(lambda: store.remove([key(0)])) == [True]  # mid-demotion
    assert completes(lambda: store.put(key(0), val(0))) is True
    assert completes(lambda: store.remove([key(0)])) == [True]  # the new block, not the old
    held.release.set()
    spiller.join(10)
    assert box == [0]
    assert store.exists([key(0)]) == [False]
    dram = st.dram
    dram.allocator.check_invariants()
    assert dram.allocator.used_bytes == 0 and not dram.entries and len(dram.by_offset) == 0
