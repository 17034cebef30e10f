"""TieredStore with an SSD tier: demotion/promotion, restart, orphans, caps, corruption, I/O errors."""

from __future__ import annotations

import errno
import os
import pathlib
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest
from helpers import key, odirect_supported
from structlog.testing import capture_logs

from kvstored.errors import ConfigInvalid, NoCapacity, StorageIOError
from kvstored.tiers.ssd_format import file_rel, index_key, store_key
from kvstored.tiers.tiered import TieredStore
from kvstored.types import PinnedBlock, Tier

K = 4096
BLOCK = 2 * K + 100  # takes 3 units in DRAM and on SSD


def val(i: int, size: int = BLOCK) -> bytes:
    return bytes((i * 7 + j) % 256 for j in range(256)) * (size // 256) + bytes([i % 256]) * (
        size % 256
    )


MakeStore = Callable[..., TieredStore]


@pytest.fixture
def make(tmp_path: pathlib.Path) -> Iterator[MakeStore]:
    """Factory: a store with DRAM for ``dram_blocks`` blocks and an SSD dir under tmp_path."""
    opened: list[TieredStore] = []

    def _make(dram_blocks: int = 2, ssd_blocks: int = 100, **kw: object) -> TieredStore:
        kw.setdefault("ssd_dir", tmp_path / "ssd")
        s = TieredStore(
            dram_size_bytes=dram_blocks * 3 * K, arena_dir=None,
            ssd_size_bytes=ssd_blocks * 3 * K, **kw,  # type: ignore[arg-type]
        )
        opened.append(s)
        return s

    yield _make
    for s in opened:
        s.close()


def _file_rel(k: bytes, ns: bytes = b"") -> str:
    return file_rel(store_key(ns, k))


def block_path(ssd_dir: pathlib.Path, k: bytes, ns: bytes = b"") -> pathlib.Path:
    return ssd_dir / "data" / _file_rel(k, ns)


def ssd_stats(s: TieredStore):  # type: ignore[no-untyped-def]
    st = s.stats()
    assert st.tiers[1].tier == Tier.SSD
    return st.tiers[1]


def data_files(ssd_dir: pathlib.Path) -> list[str]:
    return sorted(str(p.relative_to(ssd_dir / "data")) for p in (ssd_dir / "data").rglob("*")
                  if p.is_file())


# ---- demotion / promotion --------------------------------------------------------------


def test_lookup_prefix_walks_a_mixed_run_and_still_checks_every_key(make: MakeStore) -> None:
    """The DRAM run is found at C level, then DRAM and SSD blocks alternate (issue 9's fast
    lookup keeps the per-block tiers, the stop at the first miss, and the key checks)."""
    from kvstored.errors import KeyInvalid

    s = make(dram_blocks=2)
    for i in range(5):
        assert s.put(key(i), val(i), namespace_id=b"ns")
    # 0-2 were demoted; 3, 4 in DRAM
    run = [key(3), key(4), key(0), key(4), key(1), key(9), key(2)]
    assert s.lookup_prefix(run, namespace_id=b"ns") == [Tier.DRAM, Tier.DRAM, Tier.SSD, Tier.DRAM, Tier.SSD]
    assert s.lookup_prefix([bytearray(key(3)), memoryview(key(0))], namespace_id=b"ns") == [Tier.DRAM, Tier.SSD]
    assert s.lookup_prefix(run, namespace_id=b"other") == []
    with pytest.raises(KeyInvalid):  # a bad key after the first miss is still refused
        s.lookup_prefix([key(9), "not bytes"], namespace_id=b"ns")  # type: ignore[list-item]
    with pytest.raises(KeyInvalid):
        s.lookup_prefix([key(3), b""], namespace_id=b"ns")


def test_demotion_and_promotion_round_trip(make: MakeStore) -> None:
    s = make(dram_blocks=2)
    for i in range(5):
        assert s.put(key(i), val(i), namespace_id=b"ns", meta=b"m%d" % i)
    five = [key(i) for i in range(5)]
    assert s.lookup_prefix(five, namespace_id=b"ns") == [Tier.SSD] * 3 + [Tier.DRAM] * 2
    assert ssd_stats(s).num_blocks == 3 and s.stats().tiers[0].evictions == 3
    got = s.pin_many([key(0), key(1)], namespace_id=b"ns")
    assert [g.tier for g in got] == [Tier.SSD, Tier.SSD]  # type: ignore[union-attr]
    for i, g in enumerate(got):
        assert isinstance(g, PinnedBlock)
        assert bytes(g.view) == val(i) and g.meta == b"m%d" % i
        s.unpin(g)
    # inclusive: the promoted blocks keep their SSD copy
    blocks = {b.key: b.tiers for b in s.list_blocks()[0]}
    assert blocks[key(0)] == (Tier.DRAM, Tier.SSD)
    for i in range(5):
        assert s.get(key(i), namespace_id=b"ns") == (val(i), b"m%d" % i)
    st = s.stats()
    assert st.checksum_failures == 0 and st.put_failures == 0 and st.misses == 0
    assert ssd_stats(s).hits >= 2
    assert ssd_stats(s).num_blocks == 5


def test_evicting_a_block_already_on_ssd_only_frees_dram(
    make: MakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = make(dram_blocks=1)
    s.put(key(0), val(0))
    s.put(key(1), val(1))  # 0 demoted
    assert s.get(key(0)) == (val(0), b"")  # promoted; 1 demoted
    renames: list[str] = []
    real_rename = os.rename
    monkeypatch.setattr(os, "rename", lambda a, b: (renames.append(b), real_rename(a, b))[1])
    assert s.get(key(1)) == (val(1), b"")  # 0 evicted again: already on SSD, nothing written
    assert renames == []
    assert ssd_stats(s).num_blocks == 2


def test_promotion_fails_with_no_capacity_when_dram_all_pinned(make: MakeStore) -> None:
    s = make(dram_blocks=1)
    s.put(key(0), val(0))
    s.put(key(1), val(1))
    (p1,) = s.pin_many([key(1)])
    got = s.pin_many([key(0)])
    assert isinstance(got[0], NoCapacity)
    assert s.exists([key(0)]) == [True]  # still on SSD
    s.unpin(p1)  # type: ignore[arg-type]
    assert s.get(key(0)) == (val(0), b"")


def test_same_key_in_two_namespaces_is_two_blocks_on_ssd_and_after_restart(
    make: MakeStore, tmp_path: pathlib.Path
) -> None:
    s = make(dram_blocks=1)
    s.put(key(0), val(0), namespace_id=b"A")
    assert s.put(key(0), val(1), namespace_id=b"B") is True  # not an "already stored" no-op
    s.put(key(1), val(2))  # demotes both key(0) blocks
    assert s.lookup_prefix([key(0)], namespace_id=b"A") == [Tier.SSD]
    assert s.lookup_prefix([key(0)], namespace_id=b"B") == [Tier.SSD]
    assert s.lookup_prefix([key(0)]) == [] and s.pin_many([key(0)]) == [None]
    assert block_path(tmp_path / "ssd", key(0), b"A").exists()
    assert block_path(tmp_path / "ssd", key(0), b"B").exists()
    assert s.remove([key(0)], namespace_id=b"C") == [False]
    assert s.remove([key(0)], namespace_id=b"B") == [True]
    assert not block_path(tmp_path / "ssd", key(0), b"B").exists()
    s.close()
    s2 = make(dram_blocks=1)
    assert s2.get(key(0), namespace_id=b"A") == (val(0), b"")
    assert s2.exists([key(0)], namespace_id=b"B") == [False]
    assert s2.exists([key(0)]) == [False]


def test_ssd_cap_evicts_lru_ssd_blocks(make: MakeStore, tmp_path: pathlib.Path) -> None:
    s = make(dram_blocks=1, ssd_blocks=3)
    for i in range(7):
        s.put(key(i), val(i))
        assert ssd_stats(s).used_bytes <= 9 * K
    # DRAM: 6; SSD holds the 3 most recently demoted: 3, 4, 5
    assert s.exists([key(i) for i in range(7)]) == [False] * 3 + [True] * 4
    assert ssd_stats(s).evictions == 3
    assert len(data_files(tmp_path / "ssd")) == 3


def test_remove_deletes_ssd_file(make: MakeStore, tmp_path: pathlib.Path) -> None:
    s = make(dram_blocks=1)
    s.put(key(0), val(0))
    s.put(key(1), val(1))
    assert block_path(tmp_path / "ssd", key(0)).exists()
    assert s.remove([key(0)]) == [True]
    assert not block_path(tmp_path / "ssd", key(0)).exists()
    assert s.exists([key(0)]) == [False]


def test_second_store_on_same_dir_is_refused_with_a_clear_error(
    make: MakeStore, tmp_path: pathlib.Path
) -> None:
    # regression: the user saw RocksDB's raw "IO error: While lock file: .../index/LOCK"
    s = make()
    s.put(key(0), val(0))
    with pytest.raises(StorageIOError) as err:
        make()
    assert isinstance(err.value, ConfigInvalid)  # a configuration error: the daemon exits 2
    msg = str(err.value)
    assert str(tmp_path / "ssd") in msg and "already in use by another kvstored process" in msg
    assert f"pid {os.getpid()}" in msg and "LOCK" not in msg
    # and from another process, as two daemons would be
    code = (
        "import sys; from kvstored.tiers.tiered import TieredStore\n"
        "try:\n"
        f"    TieredStore(dram_size_bytes=1<<20, arena_dir=None, ssd_dir={str(tmp_path / 'ssd')!r},"
        " ssd_size_bytes=1<<20)\n"
        "except Exception as e: print(type(e).__name__, e); sys.exit(3)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert "SsdDirInUse" in proc.stdout and "already in use by another kvstored process" in proc.stdout
    assert s.get(key(0)) == (val(0), b"")  # the owner is unharmed
    assert s.spill_to_ssd() == 1
    s.close()
    s2 = make()  # released on close
    assert s2.exists([key(0)]) == [True]


@pytest.mark.parametrize("damage", ["current_garbage", "index_deleted"])
def test_corrupt_index_is_rebuilt_from_block_files_with_a_warning(
    make: MakeStore, tmp_path: pathlib.Path, damage: str
) -> None:
    s = make(dram_blocks=4)
    for i in range(3):
        s.put(key(i), val(i), namespace_id=b"ns%d" % (i % 2), meta=b"meta%d" % i)
    s.put(b"L" * 200, val(5))  # a long key (file named by hash): recovered from the trailer
    assert s.spill_to_ssd() == 4
    s.close()
    index = tmp_path / "ssd" / "index"
    if damage == "current_garbage":
        (index / "CURRENT").write_bytes(b"\x00garbage-not-a-manifest")
    else:
        import shutil

        shutil.rmtree(index)
        index.mkdir()
        (index / "CURRENT").write_bytes(b"MANIFEST-000099\n")  # names a missing manifest
    (tmp_path / "ssd" / "data" / "7f").mkdir(exist_ok=True)
    (tmp_path / "ssd" / "data" / "7f" / "feed.blk").write_bytes(b"no trailer here")
    with capture_logs() as logs:
        s2 = make(dram_blocks=4)
    warned = [e for e in logs if e["event"] == "ssd_index_rebuilt_from_files"]
    assert len(warned) == 1 and warned[0]["log_level"] == "warning"
    opened = [e for e in logs if e["event"] == "ssd_tier_opened"][0]
    assert opened["rebuilt_from_files"] is True and opened["num_blocks"] == 4
    assert opened["orphan_files_deleted"] == 1
    for i in range(3):
        assert s2.get(key(i), namespace_id=b"ns%d" % (i % 2)) == (val(i), b"meta%d" % i)
        assert s2.exists([key(i)], namespace_id=b"ns%d" % ((i + 1) % 2)) == [False]
    assert s2.get(b"L" * 200) == (val(5), b"")
    s2.close()
    s3 = make(dram_blocks=4)  # the rebuilt index is a normal index now
    assert s3.exists([key(0)], namespace_id=b"ns0") == [True]


def test_version_1_index_records_are_migrated_to_namespace_scoped_identity(
    make: MakeStore, tmp_path: pathlib.Path
) -> None:
    from rocksdict import Options, Rdict

    from kvstored.tiers.ssd_format import REC_HEADER, checksum_of, legacy_file_rel

    ssd = tmp_path / "ssd"
    (ssd / "data").mkdir(parents=True)
    db = Rdict(str(ssd / "index"), options=Options(raw_mode=True))
    for i, ns in ((0, b"nsA"), (1, b"")):
        rel = legacy_file_rel(key(i))
        (ssd / "data" / rel).parent.mkdir(exist_ok=True)
        (ssd / "data" / rel).write_bytes(val(i))
        name = rel.encode()
        db[b"B" + key(i)] = (
            REC_HEADER.pack(1, BLOCK, checksum_of(val(i)), i, len(ns), len(name), 2)
            + ns + name + b"m%d" % i
        )
    db.close()
    with capture_logs() as logs:
        s = make(dram_blocks=4)
    opened = [e for e in logs if e["event"] == "ssd_tier_opened"][0]
    assert opened["migrated_entries"] == 2 and opened["dropped_entries"] == 0
    assert s.get(key(0), namespace_id=b"nsA") == (val(0), b"m0")
    assert s.get(key(0)) is None
    assert s.get(key(1)) == (val(1), b"m1")
    assert data_files(ssd) == sorted([_file_rel(key(0), b"nsA"), _file_rel(key(1))])


@pytest.mark.ssd
@pytest.mark.parametrize("where", ["open", "read"])
def test_direct_io_refused_falls_back_to_buffered(
    make: MakeStore, monkeypatch: pytest.MonkeyPatch, where: str, tmp_path: pathlib.Path
) -> None:
    if where == "read" and not odirect_supported(tmp_path):
        pytest.skip(f"the filesystem of {tmp_path} has no O_DIRECT (refused at open, e.g. tmpfs "
                    "before Linux 6.6 or FUSE), so a refusal at read time cannot be staged")
    # Older tmpfs and some FUSE filesystems refuse O_DIRECT with EINVAL at open (or at read
    # for an unaligned buffer): simulate both, the block must still be served intact.
    s = make(dram_blocks=1, ssd_direct_io=True)
    s.put(key(0), val(0))
    s.put(key(1), val(1))
    real_open, real_preadv = os.open, os.preadv
    refused: list[str] = []

    def fake_open(path: object, flags: int, *a: object) -> int:
        if where == "open" and flags & os.O_DIRECT:
            refused.append("open")
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *a)  # type: ignore[arg-type]

    def fake_preadv(fd: int, bufs: object, off: int) -> int:
        if where == "read" and os.get_blocking(fd) and fcntl_flags(fd) & os.O_DIRECT:
            refused.append("read")
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_preadv(fd, bufs, off)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "preadv", fake_preadv)
    assert s.get(key(0)) == (val(0), b"")
    assert refused == [where]
    assert s.stats().checksum_failures == 0
    assert s._state.ssd is not None and s._state.ssd._direct_io is (where == "read")


def fcntl_flags(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_GETFL)


@pytest.mark.ssd
def test_direct_io_read_on_disk_dir(make: MakeStore, tmp_path: pathlib.Path) -> None:
    s = make(dram_blocks=1, ssd_direct_io=True)
    s.put(key(0), val(0))
    s.put(key(1), val(1))
    assert s.get(key(0)) == (val(0), b"")
    assert s.stats().checksum_failures == 0
    if not odirect_supported(tmp_path):
        return  # this filesystem refuses O_DIRECT: the buffered fallback was exercised
    assert s._state.ssd is not None and s._state.ssd._direct_io is True


# ---- restart ---------------------------------------------------------------------------


def test_restart_rebuilds_index_with_meta_and_namespace(make: MakeStore) -> None:
    s = make(dram_blocks=4)
    for i in range(3):
        s.put(key(i), val(i), namespace_id=b"ns", meta=b"meta%d" % i)
    assert s.spill_to_ssd() == 3
    assert s.spill_to_ssd() == 0  # already there
    s.close()
    s2 = make(dram_blocks=4)
    assert s2.lookup_prefix([key(i) for i in range(3)], namespace_id=b"ns") == [Tier.SSD] * 3
    blocks = {b.key: b for b in s2.list_blocks(namespace_id=b"ns")[0]}
    assert set(blocks) == {key(0), key(1), key(2)}
    for i in range(3):
        assert s2.get(key(i), namespace_id=b"ns") == (val(i), b"meta%d" % i)


def test_restart_with_smaller_cap_trims_lru_first(make: MakeStore, tmp_path: pathlib.Path) -> None:
    s = make(dram_blocks=1, ssd_blocks=10)
    for i in range(5):
        s.put(key(i), val(i))
    s.spill_to_ssd()
    assert s.get(key(0)) == (val(0), b"")  # touch 0 on SSD: it becomes the most recent there
    s.close()
    # SSD order (oldest first): 1, 2, 3, 4, 0 -> a 2-block cap keeps 4 and 0
    s2 = make(dram_blocks=1, ssd_blocks=2)
    assert s2.exists([key(i) for i in range(5)]) == [True, False, False, False, True]
    assert ssd_stats(s2).used_bytes <= 6 * K
    assert len(data_files(tmp_path / "ssd")) == 2
    assert s2.get(key(4)) == (val(4), b"")


def test_restart_reclaims_orphans_and_drops_broken_entries(
    make: MakeStore, tmp_path: pathlib.Path
) -> None:
    ssd = tmp_path / "ssd"
    s = make(dram_blocks=4)
    for i in range(4):
        s.put(key(i), val(i))
    s.spill_to_ssd()
    s.close()
    block_path(ssd, key(0)).unlink()  # index entry without its file
    with open(block_path(ssd, key(1)), "ab") as fh:  # wrong size
        fh.write(b"x")
    (ssd / "data" / "zz").mkdir()
    (ssd / "data" / "zz" / "deadbeef.blk").write_bytes(b"orphan")
    tmp = block_path(ssd, key(2)).with_suffix(".blk.tmp")
    tmp.write_bytes(b"partial write")
    (ssd / "data" / "stray").write_bytes(b"?")
    with capture_logs() as logs:
        s2 = make(dram_blocks=4)
    assert s2.exists([key(i) for i in range(4)]) == [False, False, True, True]
    assert data_files(ssd) == sorted([_file_rel(key(2)), _file_rel(key(3))])
    opened = [e for e in logs if e["event"] == "ssd_tier_opened"]
    assert opened[0]["dropped_entries"] == 2 and opened[0]["orphan_files_deleted"] == 4
    assert s2.get(key(3)) == (val(3), b"")
    assert ssd_stats(s2).used_bytes == 2 * 3 * K


# ---- corruption ------------------------------------------------------------------------


def _on_ssd_only(make: MakeStore) -> TieredStore:
    s = make(dram_blocks=1)
    s.put(key(0), val(0))
    s.put(key(1), val(1))  # 0 demoted, 1 in DRAM
    assert s.lookup_prefix([key(0)]) == [Tier.SSD]
    return s


@pytest.mark.parametrize("damage", ["truncate", "bitflip", "extend"])
def test_corrupt_file_is_a_counted_miss_and_deleted(
    make: MakeStore, tmp_path: pathlib.Path, damage: str
) -> None:
    s = _on_ssd_only(make)
    path = block_path(tmp_path / "ssd", key(0))
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[:-1]
    elif damage == "bitflip":
        data[1234] ^= 0x10
    else:
        data += b"\0"
    path.write_bytes(bytes(data))
    with capture_logs() as logs:
        assert s.get(key(0)) is None
    assert any(e["event"] == "ssd_block_rejected" and e["log_level"] == "warning" for e in logs)
    st = s.stats()
    assert st.checksum_failures == 1 and st.misses == 1
    assert not path.exists()
    assert s.exists([key(0)]) == [False]
    assert s.pin_many([key(0)]) == [None]  # never served, even on retry
    assert s.stats().checksum_failures == 1
    assert s.get(key(1)) == (val(1), b"")  # store keeps serving
    # and the DRAM space taken for the failed promotion was released
    assert s.stats().tiers[0].used_bytes == 3 * K


def test_read_error_is_a_miss(make: MakeStore, monkeypatch: pytest.MonkeyPatch) -> None:
    s = _on_ssd_only(make)

    def eio(*a: object, **k: object) -> int:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "preadv", eio)
    assert s.get(key(0)) is None
    monkeypatch.undo()
    assert s.exists([key(0)]) == [False]
    assert s.get(key(1)) == (val(1), b"")


# ---- write failures --------------------------------------------------------------------


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EIO])
def test_write_error_fails_demotion_but_store_keeps_serving(
    make: MakeStore, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    s = make(dram_blocks=2)
    for i in range(3):
        s.put(key(i), val(i))  # 0 demoted fine
    calls = 0

    def failing_write(fd: int, data: object, *offset: int) -> int:
        nonlocal calls
        calls += 1
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(os, "write", failing_write)
    monkeypatch.setattr(os, "pwritev", failing_write)  # (O_DIRECT and buffered writes)
    with capture_logs() as logs:
        assert s.put(key(3), val(3)) is True  # evicts 1: its demotion fails
    assert calls >= 1
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["ssd_write_failed"]
    assert s.stats().put_failures == 1
    assert s.exists([key(1)]) == [False]  # a lost cache block: a miss, never wrong bytes
    assert s.spill_to_ssd() == 0  # 2 and 3 fail too
    assert s.stats().put_failures == 3
    monkeypatch.undo()
    assert not any(p.endswith(".tmp") for p in data_files(tmp_path / "ssd"))
    assert data_files(tmp_path / "ssd") == [_file_rel(key(0))]
    for i in (0, 2, 3):
        assert s.get(key(i)) == (val(i), b"")  # old blocks intact
    # demotions work again once the device recovers (the gets above demoted 2 and 3)
    assert ssd_stats(s).num_blocks == 3


def test_index_write_error_leaves_no_file(
    make: MakeStore, tmp_path: pathlib.Path
) -> None:
    s = make(dram_blocks=1)
    ssd_tier = s._state.ssd
    assert ssd_tier is not None

    class BrokenDb:
        def __init__(self, real: object) -> None:
            self.real = real

        def put(self, *a: object) -> None:
            raise Exception("IO error: No space left on device")

        def __getattr__(self, name: str) -> object:
            return getattr(self.real, name)

    real_db = ssd_tier._db
    ssd_tier._db = BrokenDb(real_db)  # type: ignore[assignment]
    s.put(key(0), val(0))
    s.put(key(1), val(1))  # demotion of 0 fails at the index write
    ssd_tier._db = real_db
    assert s.stats().put_failures == 1
    assert data_files(tmp_path / "ssd") == []


def test_block_larger_than_ssd_tier_is_dropped_not_failed(make: MakeStore) -> None:
    s = make(dram_blocks=4, ssd_blocks=1)
    s.put(key(0), b"x" * (4 * K))  # 1 unit larger than the SSD tier (3 units)
    s.put(key(1), val(1))
    s.put(key(2), val(2))
    s.put(key(3), val(3))  # demotes 1 into the SSD's room first (drops nothing)
    assert s.exists([key(0), key(1)]) == [True, True]
    s.put(key(4), val(4))  # no spare victim left: evicts 0 (LRU), which cannot go to SSD
    assert s.exists([key(0)]) == [False]
    assert s.stats().put_failures == 0


@pytest.fixture
def tiny_tmpfs(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    """A real 256 KiB tmpfs mounted under tmp_path (needs root; skipped otherwise)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    try:
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)],
            capture_output=True, text=True, timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"needs the mount binary (util-linux) to mount a 256 KiB tmpfs: {exc}")
    if proc.returncode != 0:
        pytest.skip(f"needs root (CAP_SYS_ADMIN) to mount a 256 KiB tmpfs: {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=10)


@pytest.mark.ssd
def test_real_enospc_on_small_filesystem(make: MakeStore, tiny_tmpfs: pathlib.Path) -> None:
    # The SSD cap (1 MiB) is larger than the filesystem (256 KiB): the device fills first.
    size = 40 * K
    s = TieredStore(
        dram_size_bytes=2 * size, arena_dir=None, ssd_dir=tiny_tmpfs / "ssd",
        ssd_size_bytes=1 << 20,
    )
    try:
        stored: list[int] = []
        for i in range(12):
            assert s.put(key(i), val(i, size)) is True
            if i >= 2:
                stored.append(i - 2)
        st = s.stats()
        assert st.put_failures > 0
        on_ssd = [i for i in stored if s.lookup_prefix([key(i)]) == [Tier.SSD]]
        assert on_ssd, "some demotions should have fit"
        for i in on_ssd:
            assert s.get(key(i)) == (val(i, size), b"")
        assert s.stats().checksum_failures == 0
    finally:
        s.close()


def test_long_keys_and_garbage_index_records_survive_restart(
    make: MakeStore, tmp_path: pathlib.Path
) -> None:
    from rocksdict import Options, Rdict

    long_key = b"L" * 200  # too long for a file name as hex: stored under its xxh3_128
    s = make(dram_blocks=4)
    s.put(long_key, val(1))
    s.put(key(2), val(2))
    assert s.spill_to_ssd() == 2
    s.close()
    db = Rdict(str(tmp_path / "ssd" / "index"), options=Options(raw_mode=True))
    db[b"B" + key(3)] = b"\x01garbage"
    db[index_key(store_key(b"", key(2)))] = b"\x09" + bytes(40)  # unknown record version
    db.close()
    s2 = make(dram_blocks=4)
    assert s2.exists([long_key, key(2), key(3)]) == [True, False, False]
    assert s2.get(long_key) == (val(1), b"")
    assert data_files(tmp_path / "ssd") == [_file_rel(long_key)]


def test_namespace_tags_are_per_process_but_the_directory_is_not(
    make: MakeStore, tmp_path: pathlib.Path
) -> None:
    # in memory a namespace is a 3-byte tag assigned in first-use order; on disk it is the
    # full id. Another process that meets the namespaces in the other order must still find
    # each block under its own namespace.
    s = make(dram_blocks=4)
    s.put(key(0), val(0), namespace_id=b"first-ns")
    s.put(key(0), val(1), namespace_id=b"second-ns")
    assert s.spill_to_ssd() == 2
    s.close()
    code = (
        "from kvstored.tiers.ssd_format import store_key\n"
        "from kvstored.tiers.tiered import TieredStore\n"
        "store_key(b'unrelated', b'x'); store_key(b'second-ns', b'x')\n"  # other tag order
        f"s = TieredStore(dram_size_bytes=1<<20, arena_dir=None, ssd_dir={str(tmp_path / 'ssd')!r},"
        " ssd_size_bytes=1<<20)\n"
        f"k = {key(0)!r}\n"
        "print('RESULT', s.get(k, namespace_id=b'second-ns')[0][:4].hex(),"
        " s.get(k, namespace_id=b'first-ns')[0][:4].hex(), s.get(k))\n"
        "s.close()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line.split()[1:] == [val(1)[:4].hex(), val(0)[:4].hex(), "None"]
