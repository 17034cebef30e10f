"""Batch promotion and demotion: several blocks of one get (or one eviction window) move at once.

Parallelism is shown deterministically: the SSD tier's ``io_hook`` waits on a
``threading.Barrier`` of N parties, which only N reads (or writes) in flight at the same time
can pass. Serial I/O breaks the barrier (its timeout is a hang guard, not a sync).
"""

from __future__ import annotations

import os
import pathlib
import threading
from collections.abc import Iterator

import pytest
from helpers import key, odirect_supported

from kvstored.tiers.ssd import READ_CHUNK_BYTES, SsdTier
from kvstored.tiers.ssd_format import store_key
from kvstored.tiers.tiered import TieredStore
from kvstored.types import PinnedBlock, Tier

K = 4096
BLOCK = 3 * K


def val(i: int, n: int = BLOCK - 5) -> bytes:
    return bytes([(i * 7) % 251]) * n + b"%05d" % i


class BarrierIo:
    """An io_hook that makes every ``op`` wait until ``parties`` of them are in flight."""

    def __init__(self, op: str, parties: int) -> None:
        self.op = op
        self.barrier = threading.Barrier(parties, timeout=10)
        self.passed = 0
        self._lock = threading.Lock()

    def __call__(self, op: str, skey: bytes) -> None:
        if op == self.op:
            self.barrier.wait()  # BrokenBarrierError if the I/O is serial
            with self._lock:
                self.passed += 1


@pytest.fixture
def store(tmp_path: pathlib.Path) -> Iterator[TieredStore]:
    s = TieredStore(
        dram_size_bytes=8 * BLOCK, arena_dir=None, ssd_dir=tmp_path / "ssd",
        ssd_size_bytes=64 * BLOCK,
    )
    yield s
    if s._state.ssd is not None:
        s._state.ssd.io_hook = None
    s.close()


def test_a_batch_get_reads_its_ssd_blocks_in_parallel_into_dram(store: TieredStore) -> None:
    for i in range(16):
        store.put(key(i), val(i))  # 0..7 demoted to SSD by 8..15
    keys = [key(i) for i in range(4)]
    assert store.lookup_prefix(keys) == [Tier.SSD] * 4
    for i in range(8, 12):
        store.remove([key(i)])  # room for four promotions without demotions
    hook = BarrierIo("read", 4)
    assert store._state.ssd is not None
    store._state.ssd.io_hook = hook
    pins = store.pin_many(keys)
    try:
        assert all(isinstance(p, PinnedBlock) for p in pins), pins
        assert [p.tier for p in pins] == [Tier.SSD] * 4  # type: ignore[union-attr]
        assert [bytes(p.view) for p in pins] == [val(i) for i in range(4)]  # type: ignore[union-attr]
    finally:
        for p in pins:
            if isinstance(p, PinnedBlock):
                store.unpin(p)
    assert hook.passed == 4
    assert store.lookup_prefix(keys) == [Tier.DRAM] * 4
    st = store.stats()
    assert (st.hits, st.misses) == (4, 0)
    assert [t.hits for t in st.tiers] == [0, 4]  # counted as SSD hits, once each


def test_batch_promotion_never_evicts_a_dram_hit_of_the_same_get(store: TieredStore) -> None:
    for i in range(16):
        store.put(key(i), val(i))  # DRAM: 8..15 (full); SSD: 0..7
    # key 8 is the LRU DRAM block: promoting key 0 would evict it unless the get holds it
    assert store._state.ssd is not None
    reads: list[bytes] = []
    store._state.ssd.io_hook = lambda op, skey: reads.append(skey) if op == "read" else None
    pins = store.pin_many([key(8), key(0), key(1)])
    try:
        assert [p.tier for p in pins] == [Tier.DRAM, Tier.SSD, Tier.SSD]  # type: ignore[union-attr]
        assert [bytes(p.view) for p in pins] == [val(8), val(0), val(1)]  # type: ignore[union-attr]
    finally:
        for p in pins:
            if isinstance(p, PinnedBlock):
                store.unpin(p)
    assert sorted(reads) == sorted([store_key(b"", key(0)), store_key(b"", key(1))])
    assert store.stats().pinned_blocks == 0


def test_demotions_of_one_eviction_window_write_in_parallel(tmp_path: pathlib.Path) -> None:
    s = TieredStore(
        dram_size_bytes=8 * BLOCK, arena_dir=None, ssd_dir=tmp_path / "ssd",
        ssd_size_bytes=64 * BLOCK,
    )
    try:
        for i in range(12):
            s.put(key(i), val(i, 2 * K - 5))  # 2 pages each: DRAM (24 pages) is full
        assert s._state.ssd is not None
        hook = BarrierIo("write", 2)
        s._state.ssd.io_hook = hook
        s.put(key(100), val(100, 4 * K - 5))  # needs 4 pages: a window of two victims
        s._state.ssd.io_hook = None
        assert hook.passed == 2
        assert s.lookup_prefix([key(0), key(1)]) == [Tier.SSD, Tier.SSD]
        assert s.get(key(0)) == (val(0, 2 * K - 5), b"")
    finally:
        s.close()


def test_read_files_reports_each_block_and_keeps_the_others(tmp_path: pathlib.Path) -> None:
    t = SsdTier(tmp_path / "ssd", 64 * BLOCK)
    try:
        skeys = [store_key(b"", key(i)) for i in range(3)]
        for i, sk in enumerate(skeys):
            assert t.write(sk, memoryview(val(i)), namespace_id=b"", meta=b"")
        os.truncate(t.path_of(skeys[1]), 100)  # one broken file
        bufs = [memoryview(bytearray(BLOCK)) for _ in skeys]
        reasons = t.read_files([(sk, t.entries[sk], b) for sk, b in zip(skeys, bufs, strict=True)])
        assert reasons == ["", "wrong_size", ""]
        assert bytes(bufs[0][: len(val(0))]) == val(0)
        assert bytes(bufs[2][: len(val(2))]) == val(2)
    finally:
        t.close()


@pytest.mark.parametrize("where", [0, READ_CHUNK_BYTES + 5, 2 * READ_CHUNK_BYTES + 17])
def test_streaming_checksum_covers_every_chunk(tmp_path: pathlib.Path, where: int) -> None:
    size = 2 * READ_CHUNK_BYTES + 4096 + 123  # three chunks, the last one partial
    data = os.urandom(size)
    t = SsdTier(tmp_path / "ssd", 4 * size)
    try:
        sk = store_key(b"", b"big")
        assert t.write(sk, memoryview(data), namespace_id=b"", meta=b"")
        dest = memoryview(bytearray(size + 8192))
        assert t.read_file(sk, t.entries[sk], dest) == ""
        assert bytes(dest[:size]) == data
        with open(t.path_of(sk), "r+b") as f:  # flip one byte of one chunk
            f.seek(where)
            b = f.read(1)
            f.seek(where)
            f.write(bytes([b[0] ^ 0xFF]))
        assert t.read_file(sk, t.entries[sk], dest) == "checksum_mismatch"
    finally:
        t.close()


@pytest.mark.ssd
@pytest.mark.parametrize("size", [4096, 3 * 4096 + 123, 100])
def test_demotion_writes_with_o_direct_from_an_aligned_buffer(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    if not odirect_supported(tmp_path):
        pytest.skip(f"{tmp_path} refuses O_DIRECT: the buffered path is the only one here")
    import mmap

    real_open = os.open
    tmp_flags: list[int] = []

    def spy_open(path: object, flags: int, *a: object) -> int:
        if str(path).endswith(".tmp"):
            tmp_flags.append(flags)
        return real_open(path, flags, *a)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", spy_open)
    arena = mmap.mmap(-1, 8 * 4096)  # page-aligned, like an arena slot
    data = os.urandom(size)
    arena[4096 : 4096 + size] = data
    t = SsdTier(tmp_path / "ssd", 64 * BLOCK)
    sk = store_key(b"ns", b"direct")
    try:
        with memoryview(arena) as mv:
            assert t.write(sk, mv[4096 : 4096 + size], namespace_id=b"ns", meta=b"m")
        assert tmp_flags and all(f & os.O_DIRECT for f in tmp_flags)  # no buffered retry
        dest = memoryview(bytearray(size + 8192))
        assert t.read_file(sk, t.entries[sk], dest) == ""
        assert bytes(dest[:size]) == data
    finally:
        t.close()
    monkeypatch.undo()
    (tmp_path / "ssd" / "index" / "CURRENT").write_bytes(b"garbage\n")  # rebuild from trailers
    t2 = SsdTier(tmp_path / "ssd", 64 * BLOCK)
    try:
        assert list(t2.entries) == [sk] and t2.entries[sk].meta == b"m"
        dest = memoryview(bytearray(size + 8192))
        assert t2.read_file(sk, t2.entries[sk], dest) == ""
        assert bytes(dest[:size]) == data
    finally:
        t2.close()
    arena.close()


def test_an_unaligned_buffer_falls_back_to_a_buffered_write(tmp_path: pathlib.Path) -> None:
    t = SsdTier(tmp_path / "ssd", 64 * BLOCK)
    sk = store_key(b"", b"unaligned")
    raw = bytearray(3 * 4096 + 1)
    data = memoryview(raw)[1:]  # off by one byte from whatever alignment bytearray has
    data[:] = os.urandom(3 * 4096)
    try:
        assert t.write(sk, data, namespace_id=b"", meta=b"")
        dest = memoryview(bytearray(4 * 4096))
        assert t.read_file(sk, t.entries[sk], dest) == ""
        assert bytes(dest[: 3 * 4096]) == bytes(data)
        assert t.put_failures == 0
    finally:
        t.close()


def test_close_while_a_batch_promotion_makes_room_keeps_its_blocks_on_ssd(
    tmp_path: pathlib.Path,
) -> None:
    s = TieredStore(
        dram_size_bytes=8 * BLOCK, arena_dir=None, ssd_dir=tmp_path / "ssd",
        ssd_size_bytes=64 * BLOCK,
    )
    for i in range(16):
        s.put(key(i), val(i))  # DRAM: 8..15 (full, DRAM-only); SSD: 0..7
    s.remove([key(8)])  # room for one promotion; the second needs a demotion
    assert s._state.ssd is not None
    entered, release = threading.Event(), threading.Event()

    def hold_write(op: str, skey: bytes) -> None:
        if op == "write":
            entered.set()
            assert release.wait(30), "held write never released"

    s._state.ssd.io_hook = hold_write
    box: list[object] = []

    def reader() -> None:
        try:
            box.append(s.pin_many([key(0), key(1)]))
        except BaseException as exc:
            box.append(exc)

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    assert entered.wait(10)  # key 0 has its slot (PROMOTING); key 1 waits for a demotion
    closer = threading.Thread(target=s.close, daemon=True)
    closer.start()
    for _ in range(1000):
        if s._state.closed:
            break
        closer.join(0.01)
    assert s._state.closed
    release.set()
    t.join(10)
    closer.join(10)
    assert not closer.is_alive() and len(box) == 1
    from kvstored.errors import Unavailable

    assert isinstance(box[0], Unavailable)
    assert s._state.ssd.checksum_failures == 0  # nothing was read, so nothing was judged bad
    s2 = TieredStore(
        dram_size_bytes=8 * BLOCK, arena_dir=None, ssd_dir=tmp_path / "ssd",
        ssd_size_bytes=64 * BLOCK,
    )
    try:
        assert s2.lookup_prefix([key(0), key(1)]) == [Tier.SSD, Tier.SSD]
        assert s2.get(key(0)) == (val(0), b"")
    finally:
        s2.close()


def _pinned_bytes(store: TieredStore, keys: list[bytes]) -> list[bytes | None]:
    """Pin ``keys`` in one batch, read each pinned block's bytes, unpin them all."""
    pins = store.pin_many(keys)
    try:
        return [bytes(p.view) if isinstance(p, PinnedBlock) else None for p in pins]
    finally:
        for p in pins:
            if isinstance(p, PinnedBlock):
                store.unpin(p)


def test_a_batch_get_into_a_full_dram_tier_demotes_its_victims_in_parallel(
    store: TieredStore,
) -> None:
    for i in range(12):
        store.put(key(i), val(i))  # DRAM: 4..11 (full, DRAM-only); SSD: 0..3
    keys = [key(i) for i in range(4)]
    assert store.lookup_prefix(keys) == [Tier.SSD] * 4
    assert store._state.ssd is not None
    hook = BarrierIo("write", 4)  # the four demotions that make room, in flight together
    store._state.ssd.io_hook = hook
    got = _pinned_bytes(store, keys)
    store._state.ssd.io_hook = None
    assert got == [val(i) for i in range(4)]
    assert hook.passed == 4
    victims = [key(i) for i in range(4, 8)]  # the LRU DRAM blocks, demoted, not dropped
    assert store.lookup_prefix(victims) == [Tier.SSD] * 4
    assert [store.get(k) for k in victims] == [(val(i), b"") for i in range(4, 8)]
    assert store._state.ssd.put_failures == 0


def test_batch_room_making_never_evicts_the_batchs_own_ssd_blocks(tmp_path: pathlib.Path) -> None:
    probe = SsdTier(tmp_path / "probe", 64 * BLOCK)
    charge = probe._charge(store_key(b"", key(0)), probe._entry(len(val(0)), 0, b"", b""))
    probe.close()
    s = TieredStore(
        dram_size_bytes=8 * BLOCK, arena_dir=None, ssd_dir=tmp_path / "ssd",
        ssd_size_bytes=8 * charge,  # room for 8 blocks: each demotion then evicts one
    )
    try:
        for i in range(16):
            s.put(key(i), val(i))  # DRAM: 8..15 (DRAM-only); SSD: 0..7 (full), 0 its LRU
        keys = [key(i) for i in range(4)]  # the SSD's four LRU blocks
        assert s.lookup_prefix(keys) == [Tier.SSD] * 4
        # demotes 8..11 into the full SSD: it must evict 4..7
        assert _pinned_bytes(s, keys) == [val(i) for i in range(4)]
        assert s.lookup_prefix([key(i) for i in range(4, 8)]) == []  # the SSD's victims
        assert s.lookup_prefix([key(i) for i in range(8, 12)]) == [Tier.SSD] * 4
    finally:
        s.close()
