"""SSD tier: a write that evicts a block of the same size overwrites that block's file in place.

The evicted block's index record goes first, then its file is renamed to the new block's name
and overwritten (no block allocation), then the new block is indexed; a crash, a failed write
or a write that never runs leaves neither block behind, and a reader still holding the
evicted entry gets a miss.
"""

from __future__ import annotations

import errno
import mmap
import os
import pathlib
from collections.abc import Iterator

import pytest

from kvstored.tiers import ssd_io
from kvstored.tiers.ssd import SsdTier
from kvstored.tiers.ssd_format import index_key, round_up_page, store_key, trailer_bytes

BLOCK = 3 * 4096 + 100


def sk(i: int) -> bytes:
    return store_key(b"", i.to_bytes(16, "big"))


def payload(i: int, size: int = BLOCK) -> memoryview:
    """Page-aligned bytes (O_DIRECT writes straight from it), distinct per ``i``."""
    buf = mmap.mmap(-1, round_up_page(size))
    buf.write(bytes([(i * 31 + j) % 251 for j in range(251)]) * (size // 251 + 1))
    return memoryview(buf)[:size]


def charge(i: int) -> int:
    return round_up_page(BLOCK + trailer_bytes(sk(i), b""))


class Crash(BaseException):
    """Stands for the process dying at the hooked step (not caught as an I/O error)."""


@pytest.fixture
def tier(tmp_path: pathlib.Path) -> Iterator[SsdTier]:
    t = SsdTier(tmp_path / "ssd", 2 * charge(0))
    yield t
    t.close()


def stored_files(t: SsdTier) -> list[str]:
    data = pathlib.Path(t.directory) / "data"
    return sorted(str(p.relative_to(data)) for p in data.rglob("*") if p.is_file())


def read_back(t: SsdTier, i: int) -> bytes:
    dest = memoryview(mmap.mmap(-1, round_up_page(BLOCK)))
    assert t.read_into(sk(i), dest)
    return bytes(dest[:BLOCK])


def test_full_tier_write_overwrites_the_evicted_blocks_file(tier: SsdTier) -> None:
    assert tier.write(sk(0), payload(0), namespace_id=b"", meta=b"")
    assert tier.write(sk(1), payload(1), namespace_id=b"", meta=b"")
    inode = os.stat(tier.path_of(sk(0))).st_ino
    assert tier.write(sk(2), payload(2), namespace_id=b"", meta=b"")  # full: evicts 0 (LRU)
    assert list(tier.entries) == [sk(1), sk(2)]
    assert os.stat(tier.path_of(sk(2))).st_ino == inode  # 0's file, renamed and overwritten
    assert not os.path.exists(tier.path_of(sk(0)))
    assert tier._db.get(index_key(sk(0))) is None
    assert tier.used_bytes == tier.capacity_bytes == 2 * charge(0)
    assert read_back(tier, 2) == bytes(payload(2))
    assert read_back(tier, 1) == bytes(payload(1))
    assert tier.evictions == 1
    assert len(stored_files(tier)) == 2


def test_reused_file_is_recovered_after_restart(tmp_path: pathlib.Path, tier: SsdTier) -> None:
    for i in range(4):  # two evictions, both reusing
        assert tier.write(sk(i), payload(i), namespace_id=b"", meta=b"")
    tier.close()
    t2 = SsdTier(tmp_path / "ssd", 2 * charge(0))
    try:
        assert list(t2.entries) == [sk(2), sk(3)]
        assert read_back(t2, 3) == bytes(payload(3))
        assert read_back(t2, 2) == bytes(payload(2))
        assert t2.used_bytes == 2 * charge(0)
    finally:
        t2.close()


def test_crash_after_the_take_leaves_neither_block(tmp_path: pathlib.Path, tier: SsdTier) -> None:
    assert tier.write(sk(0), payload(0), namespace_id=b"", meta=b"")
    assert tier.write(sk(1), payload(1), namespace_id=b"", meta=b"")

    def crash(op: str, skey: bytes) -> None:
        if op == "write" and skey == sk(2):
            raise Crash

    tier.io_hook = crash
    with tier.lock:
        w = tier.begin_write(sk(2), BLOCK, namespace_id=b"", meta=b"")
    assert w is not None and w.reuse == sk(0)
    with pytest.raises(Crash):
        tier.write_file(w, payload(2))
    assert os.path.exists(tier.path_of(sk(2)))  # 0's file, taken: not indexed under 2 yet
    tier.close()  # (the index as a crash leaves it: 0's record deleted, 2's never written)
    t2 = SsdTier(tmp_path / "ssd", 2 * charge(0))
    try:
        assert list(t2.entries) == [sk(1)]
        assert t2.used_bytes == charge(1)
        assert stored_files(t2) == [os.path.relpath(t2.path_of(sk(1)), f"{t2.directory}/data")]
    finally:
        t2.close()


def test_failed_overwrite_leaves_neither_block(
    tier: SsdTier, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert tier.write(sk(0), payload(0), namespace_id=b"", meta=b"")
    assert tier.write(sk(1), payload(1), namespace_id=b"", meta=b"")

    def enospc(*a: object, **kw: object) -> str:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("kvstored.tiers.ssd.write_direct", enospc)
    assert not tier.write(sk(2), payload(2), namespace_id=b"", meta=b"")
    assert list(tier.entries) == [sk(1)]
    assert tier.used_bytes == charge(1)
    assert tier.put_failures == 1
    assert len(stored_files(tier)) == 1
    monkeypatch.setattr("kvstored.tiers.ssd.write_direct", ssd_io.write_direct)
    assert tier.write(sk(2), payload(2), namespace_id=b"", meta=b"")
    assert read_back(tier, 2) == bytes(payload(2))


def test_write_that_never_runs_hands_its_victim_back(tmp_path: pathlib.Path, tier: SsdTier) -> None:
    assert tier.write(sk(0), payload(0), namespace_id=b"", meta=b"")
    assert tier.write(sk(1), payload(1), namespace_id=b"", meta=b"")
    with tier.lock:
        w = tier.begin_write(sk(2), BLOCK, namespace_id=b"", meta=b"")
        assert w is not None and w.reuse == sk(0)
        doomed = tier.end_write(w, keep=False)  # e.g. write_files raised before this one ran
    assert doomed == [sk(0)]
    tier.delete_files(doomed)
    assert tier.used_bytes == charge(1)
    assert not os.path.exists(tier.path_of(sk(0)))
    tier.close()
    t2 = SsdTier(tmp_path / "ssd", 2 * charge(0))
    try:
        assert list(t2.entries) == [sk(1)]  # 0 is not resurrected from a left-over record
    finally:
        t2.close()


def test_reader_of_the_evicted_block_gets_a_miss_not_a_failure(tier: SsdTier) -> None:
    assert tier.write(sk(0), payload(0), namespace_id=b"", meta=b"")
    assert tier.write(sk(1), payload(1), namespace_id=b"", meta=b"")
    with tier.lock:
        stale = tier.entries[sk(0)]  # a reader looked 0 up ...
    assert tier.write(sk(2), payload(2), namespace_id=b"", meta=b"")  # ... 0's file is reused
    dest = memoryview(mmap.mmap(-1, round_up_page(BLOCK)))
    reason = tier.read_file(sk(0), stale, dest)
    assert reason  # never served
    with tier.lock:
        assert tier.end_read(sk(0), stale, "checksum_mismatch") == []
    assert tier.checksum_failures == 0  # an evicted block's read is a miss, not corruption
    assert read_back(tier, 2) == bytes(payload(2))


def test_different_sizes_do_not_reuse(tmp_path: pathlib.Path) -> None:
    t = SsdTier(tmp_path / "ssd", 3 * charge(0))
    try:
        assert t.write(sk(0), payload(0), namespace_id=b"", meta=b"")
        assert t.write(sk(1), payload(1), namespace_id=b"", meta=b"")
        big = 2 * BLOCK
        with t.lock:
            w = t.begin_write(sk(2), big, namespace_id=b"", meta=b"")
        assert w is not None and w.reuse is None and w.doomed == [sk(0)]
        assert t.write_file(w, payload(2, big))
        with t.lock:
            t.end_write(w)
        assert list(t.entries) == [sk(1), sk(2)]
        dest = memoryview(mmap.mmap(-1, round_up_page(big)))
        assert t.read_into(sk(2), dest) and bytes(dest[:big]) == bytes(payload(2, big))
    finally:
        t.close()


def test_store_demotions_into_a_full_ssd_tier_reuse_files(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through TieredStore: once the SSD tier is full, each demotion overwrites the file of the
    SSD block it evicts in place, and every block still stored reads back intact."""
    from kvstored.tiers.tiered import TieredStore

    in_place: list[bool] = []

    def spy(path: str, data: memoryview, tail: bytes, *, truncate: bool = True) -> str:
        in_place.append(not truncate and os.path.exists(path))  # an existing file, kept
        return ssd_io.write_direct(path, data, tail, truncate=truncate)

    monkeypatch.setattr("kvstored.tiers.ssd.write_direct", spy)
    page = 4096
    size = 2 * page + 100  # 3 pages in DRAM, 3 pages (data + trailer) on SSD
    s = TieredStore(dram_size_bytes=2 * 3 * page, arena_dir=None, ssd_dir=tmp_path / "ssd",
                    ssd_size_bytes=4 * 3 * page)
    try:
        keys = [i.to_bytes(16, "big") for i in range(12)]
        vals = [bytes([i]) * size for i in range(12)]
        for k, v in zip(keys, vals, strict=True):
            assert s.put(k, v)
        # DRAM holds 2, the SSD tier 4: the first 4 demotions fill it (new files), the next 6
        # each evict one SSD block and take its file
        assert in_place == [False] * 4 + [True] * 6
        assert s.stats().tiers[1].evictions == 6
        assert len(list((tmp_path / "ssd" / "data").rglob("*.blk"))) == 4
        ssd = s._state.ssd
        assert ssd is not None
        on_ssd = list(ssd.entries)  # (a get would promote, and so demote and evict, again)
        assert on_ssd == [store_key(b"", k) for k in keys[6:10]]
        for i, skey in enumerate(on_ssd, start=6):
            dest = memoryview(mmap.mmap(-1, round_up_page(size)))
            assert ssd.read_into(skey, dest) and bytes(dest[:size]) == vals[i]
        for k, v in zip(keys[10:], vals[10:], strict=True):  # the two in DRAM
            assert s.get(k) == (v, b"")
        assert s.stats().checksum_failures == 0
    finally:
        s.close()


def test_torn_overwrite_after_a_power_loss_is_a_miss(tmp_path: pathlib.Path, tier: SsdTier) -> None:
    """Data files are not fsync'd: after a power loss a reused file may hold the new block's
    trailer over a mix of old and new pages. Its checksum turns it into a miss."""
    assert tier.write(sk(0), payload(0), namespace_id=b"", meta=b"")
    assert tier.write(sk(1), payload(1), namespace_id=b"", meta=b"")
    assert tier.write(sk(2), payload(2), namespace_id=b"", meta=b"")  # took 0's file
    tier.close()
    with open(tier.path_of(sk(2)), "r+b") as f:  # the first page never reached the disk
        f.write(bytes(payload(0))[:4096])
    t2 = SsdTier(tmp_path / "ssd", 2 * charge(0))
    try:
        assert list(t2.entries) == [sk(1), sk(2)]  # the trailer is intact: indexed on start
        dest = memoryview(mmap.mmap(-1, round_up_page(BLOCK)))
        assert not t2.read_into(sk(2), dest)  # never served
        assert t2.checksum_failures == 1
        assert list(t2.entries) == [sk(1)]
        assert not os.path.exists(t2.path_of(sk(2)))
        assert read_back(t2, 1) == bytes(payload(1))
    finally:
        t2.close()


def test_index_lost_while_a_file_was_taken(tmp_path: pathlib.Path, tier: SsdTier) -> None:
    """A crash right after the take, then an index RocksDB cannot open: rebuilt from the
    files' trailers, the taken file (under the new block's name, the old block's trailer)
    is neither block: it is deleted, never indexed."""
    assert tier.write(sk(0), payload(0), namespace_id=b"", meta=b"")
    assert tier.write(sk(1), payload(1), namespace_id=b"", meta=b"")

    def crash(op: str, skey: bytes) -> None:
        if op == "write" and skey == sk(2):
            raise Crash

    tier.io_hook = crash
    with tier.lock:
        w = tier.begin_write(sk(2), BLOCK, namespace_id=b"", meta=b"")
    assert w is not None
    with pytest.raises(Crash):
        tier.write_file(w, payload(2))
    tier.close()
    (tmp_path / "ssd" / "index" / "CURRENT").write_bytes(b"\x00garbage-not-a-manifest")
    t2 = SsdTier(tmp_path / "ssd", 2 * charge(0))
    try:
        assert list(t2.entries) == [sk(1)]
        assert not os.path.exists(t2.path_of(sk(2))) and not os.path.exists(t2.path_of(sk(0)))
        assert read_back(t2, 1) == bytes(payload(1))
    finally:
        t2.close()


def test_reader_holding_the_old_file_open_while_it_is_overwritten(
    tier: SsdTier, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A promotion opened block 0's file; before it reads, a write evicts 0 and overwrites
    that file in place (held by an Event, no sleeps). The reader gets a miss, never 2's or
    mixed bytes, and it is not counted as corruption."""
    import threading

    from thread_helpers import in_thread

    assert tier.write(sk(0), payload(0), namespace_id=b"", meta=b"")
    assert tier.write(sk(1), payload(1), namespace_id=b"", meta=b"")
    opened, go = threading.Event(), threading.Event()
    real_read_all = ssd_io.read_all

    def held_read_all(fd: int, buf: memoryview, size: int) -> tuple[int, int]:
        opened.set()  # the file is open (and its size checked): hold here
        assert go.wait(10)
        return real_read_all(fd, buf, size)

    monkeypatch.setattr("kvstored.tiers.ssd.read_all", held_read_all)
    dest = memoryview(mmap.mmap(-1, round_up_page(BLOCK)))
    with tier.lock:
        stale = tier.entries[sk(0)]
    reader, box = in_thread(lambda: tier.read_file(sk(0), stale, dest))
    assert opened.wait(10)
    monkeypatch.setattr("kvstored.tiers.ssd.read_all", real_read_all)  # (the writer's reads)
    assert tier.write(sk(2), payload(2), namespace_id=b"", meta=b"")  # takes 0's file
    go.set()
    reader.join(10)
    assert box == ["checksum_mismatch"]  # the same inode, now holding 2's bytes
    with tier.lock:
        assert tier.end_read(sk(0), stale, box[0]) == []
    assert tier.checksum_failures == 0
    assert read_back(tier, 2) == bytes(payload(2))
