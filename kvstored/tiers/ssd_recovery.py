"""Opening an SSD tier directory: its lock, its index, and rebuilding the in-memory index.

:func:`recover` runs once, in :class:`~kvstored.tiers.ssd.SsdTier`'s constructor, before
any other thread can see the tier, and returns what it found (:class:`Recovered`):

- the directory lock (``kvstored.lock``, flock'd, holds the owner's pid): a second process
  gets :class:`StorageIOError` "already in use by another kvstored process";
- the RocksDB index; one that cannot be opened for any other reason (a garbage CURRENT file,
  a missing manifest) is moved to ``index.corrupt`` and rebuilt from the block files'
  trailers, with the warning ``ssd_index_rebuilt_from_files``;
- version-1 records (identity = bare key) are migrated to version 2 (identity = namespace +
  key): a trailer is appended to the file, which is renamed, and the record re-keyed;
- entries whose file is missing or has the wrong size are dropped, orphan and temp files
  deleted, and the cap enforced LRU-first (each block trimmed counts as an eviction).
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import struct
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO, cast

import structlog
from rocksdict import Options, Rdict

from kvstored.errors import ConfigInvalid, StorageIOError
from kvstored.tiers.ssd_format import (
    BLOCK_PREFIX,
    DATA_SUFFIX,
    FOOTER_BYTES,
    LEGACY_BLOCK_PREFIX,
    LEGACY_REC_VERSION,
    TMP_SUFFIX,
    SsdEntry,
    decode_record,
    encode_record,
    file_rel,
    from_persistent,
    index_key,
    legacy_file_rel,
    parse_trailer,
    round_up_page,
    split_store_key,
    store_key,
    trailer_bytes,
    trailer_of,
)
from kvstored.tiers.ssd_io import unlink_quietly

log = structlog.get_logger(__name__)

LOCK_FILE = "kvstored.lock"
DATA_DIR = "data"
"""The block files' directory under the tier's directory (``<shard>/<name>.blk``)."""
INDEX_DIR = "index"
"""The RocksDB index's directory under the tier's directory."""

MakeEntry = Callable[[int, int, bytes, bytes], SsdEntry]
"""``make_entry(size_bytes, checksum, namespace_id, meta)``: an entry with interned fields."""


class SsdDirInUse(ConfigInvalid, StorageIOError):
    """The SSD directory is locked by another live process: a configuration error (two
    daemons given one ``node.ssd_dir``; the daemon exits 2), also a StorageIOError."""


def is_lock_error(exc: BaseException) -> bool:
    """Whether a rocksdict open error is RocksDB's own LOCK file being held."""
    text = str(exc).lower()
    return "lock" in text and ("hold" in text or "resource temporarily" in text or "lock file" in text)


@dataclass(slots=True)
class Recovered:
    """What :func:`recover` found and left in an SSD tier directory.

    Attributes:
        lock_fd: the flock'd ``kvstored.lock`` (the tier closes it on close).
        db: the open index, consistent with ``entries``.
        entries: store key -> entry of every block kept, least recently used first.
        used_bytes: their charge (file sizes rounded up to 4096), <= the capacity.
        next_seq: the next recency sequence number to write.
        made_shards: the shard directories that exist under ``data/`` (all 256).
        num_trimmed: blocks deleted, LRU first, because the directory held more than the
            capacity (counted as evictions).
    """

    lock_fd: int
    db: Rdict
    entries: OrderedDict[bytes, SsdEntry]
    used_bytes: int
    next_seq: int
    made_shards: set[str]
    num_trimmed: int


def recover(directory: str, capacity_bytes: int, *, make_entry: MakeEntry) -> Recovered:
    """Take an SSD tier directory: its lock, its index, and the blocks it holds.

    Args:
        directory: the tier's directory (created if missing).
        capacity_bytes: the tier's cap (> 0); blocks beyond it are deleted LRU first.
        make_entry: builds each entry (the store's interning).

    Returns:
        The lock, the index and the blocks kept (module docstring for what is dropped).

    Raises:
        StorageIOError: the directory is in use by another kvstored process
            (:class:`SsdDirInUse`, or an older daemon's RocksDB lock), or it (or its index)
            cannot be created. Nothing is held then.
    """
    data_dir = os.path.join(directory, DATA_DIR)
    lock_fd = _take_dir_lock(directory, data_dir)
    try:
        db, from_files = _open_index(directory, os.path.join(directory, INDEX_DIR))
        return _rebuild(directory, data_dir, capacity_bytes, db, from_files, lock_fd, make_entry)
    except BaseException:
        os.close(lock_fd)
        raise


def _charge(skey: bytes, e: SsdEntry) -> int:
    return round_up_page(e.size_bytes + trailer_bytes(skey, e.meta))


def _take_dir_lock(directory: str, data_dir: str) -> int:
    try:
        os.makedirs(data_dir, exist_ok=True)
        fd = os.open(
            os.path.join(directory, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
            0o644,
        )
    except OSError as exc:
        raise StorageIOError(
            f"cannot open SSD tier at {directory}: {exc.strerror or exc}; check "
            "node.ssd_dir"
        ) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = ""
        try:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        except OSError:
            pass
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise SsdDirInUse(
                f"cannot open SSD tier at {directory}: the directory is already in "
                f"use by another kvstored process (pid {holder or 'unknown'}); give each "
                "daemon its own node.ssd_dir"
            ) from None
        raise StorageIOError(
            f"cannot lock SSD tier directory {directory}: {exc.strerror or exc}"
        ) from exc
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _open_index(directory: str, index_dir: str) -> tuple[Rdict, bool]:
    """The index, and whether it was rebuilt empty (its files' trailers must refill it)."""
    try:
        return Rdict(index_dir, options=Options(raw_mode=True)), False
    except Exception as exc:  # rocksdict raises plain Exception (lock, corruption)
        if is_lock_error(exc):  # a daemon of an older version that takes no flock
            raise StorageIOError(
                f"cannot open SSD tier at {directory}: the directory is already in use "
                "by another kvstored process (its RocksDB index is locked); give each "
                "daemon its own node.ssd_dir"
            ) from None
        error = str(exc)
    aside = index_dir + ".corrupt"
    try:
        shutil.rmtree(aside, ignore_errors=True)
        if os.path.exists(index_dir):
            os.rename(index_dir, aside)
        db = Rdict(index_dir, options=Options(raw_mode=True))
    except Exception as exc:
        raise StorageIOError(
            f"cannot open SSD tier at {directory}: the index is unreadable ({error}) "
            f"and a new one cannot be created: {exc}"
        ) from exc
    log.warning(
        "ssd_index_rebuilt_from_files", directory=directory, error=error,
        moved_to=aside,
    )
    return db, True


def _migrate_legacy(
    db: Rdict, data_dir: str, key: bytes, rec: bytes, make_entry: MakeEntry
) -> tuple[int, bytes, SsdEntry] | None:
    """A version-1 record: append a trailer to its file, rename, re-index under b"N"."""
    ver, size, csum, seq, ns, rel, meta = decode_record(rec)
    if ver != LEGACY_REC_VERSION or rel != legacy_file_rel(key):
        return None
    old = os.path.join(data_dir, rel)
    if os.stat(old).st_size != size:
        return None
    skey = store_key(ns, key)
    new_rel = file_rel(skey)
    with open(old, "r+b") as fh:
        fh.seek(size)
        fh.write(trailer_of(skey, size, csum, meta))
    os.makedirs(os.path.dirname(os.path.join(data_dir, new_rel)), exist_ok=True)
    os.rename(old, os.path.join(data_dir, new_rel))
    db.put(index_key(skey), encode_record(size, csum, seq, ns, new_rel, meta))
    return seq, skey, make_entry(size, csum, ns, meta)


def _scan_files(data_dir: str, make_entry: MakeEntry) -> list[tuple[float, bytes, SsdEntry]]:
    """Entries rebuilt from the block files' trailers (the index was lost), oldest first."""
    found: list[tuple[float, bytes, SsdEntry]] = []
    for shard in sorted(os.listdir(data_dir)):
        sdir = os.path.join(data_dir, shard)
        if not os.path.isdir(sdir):
            continue
        for fname in os.listdir(sdir):
            if not fname.endswith(DATA_SUFFIX) or fname.endswith(TMP_SUFFIX):
                continue
            path = os.path.join(sdir, fname)
            try:
                with open(path, "rb") as fh:
                    st = os.fstat(fh.fileno())
                    fh.seek(max(0, st.st_size - FOOTER_BYTES))
                    footer = fh.read(FOOTER_BYTES)

                    def body(n: int, fh: BinaryIO = fh, end: int = st.st_size) -> bytes:
                        fh.seek(max(0, end - FOOTER_BYTES - n))
                        return fh.read(n)

                    skey, size, csum, meta, want = parse_trailer(footer, body)
            except (OSError, ValueError, struct.error):
                continue  # not a block file: deleted as an orphan
            if want != st.st_size or file_rel(skey) != f"{shard}/{fname}":
                continue
            ns, _ = split_store_key(skey)
            found.append((st.st_mtime, skey, make_entry(size, csum, ns, meta)))
    found.sort(key=lambda t: t[0])
    return found


def _rebuild(
    directory: str, data_dir: str, capacity_bytes: int, db: Rdict, from_files: bool,
    lock_fd: int, make_entry: MakeEntry,
) -> Recovered:
    found: list[tuple[float, bytes, SsdEntry]] = []
    broken: list[bytes] = []
    migrated = 0
    if from_files:
        found = _scan_files(data_dir, make_entry)
        for seq, (_, skey, e) in enumerate(found):
            ns, _ = split_store_key(skey)
            db.put(
                index_key(skey),
                encode_record(e.size_bytes, e.checksum, seq, ns, file_rel(skey), e.meta),
            )
    else:
        for ikey, rec in db.items():
            # raw_mode: both are bytes already (the stubs type every mode's values)
            ikey, rec = cast(bytes, ikey), cast(bytes, rec)
            try:
                if ikey.startswith(LEGACY_BLOCK_PREFIX):
                    got = _migrate_legacy(db, data_dir, ikey[1:], rec, make_entry)
                    if got is None:
                        broken.append(ikey)
                        continue
                    broken.append(ikey)  # the old record goes; the new one is written
                    migrated += 1
                    seq, skey, e = got
                    found.append((float(seq), skey, e))
                    continue
                if not ikey.startswith(BLOCK_PREFIX):
                    continue
                skey = from_persistent(ikey[1:])
                ver, size, csum, seq, ns, rel, meta = decode_record(rec)
                e = make_entry(size, csum, ns, meta)
                ok = (
                    ver != LEGACY_REC_VERSION and rel == file_rel(skey)
                    and split_store_key(skey)[0] == ns
                    and os.stat(os.path.join(data_dir, rel)).st_size
                    == e.size_bytes + trailer_bytes(skey, e.meta)
                )
            except (ValueError, struct.error, UnicodeDecodeError, OSError, IndexError):
                ok = False
            if not ok:
                broken.append(ikey)  # its file, if any, is deleted below as an orphan
                continue
            found.append((float(seq), skey, e))
        for ikey in broken:
            db.delete(ikey)
        found.sort(key=lambda t: t[0])
    entries: OrderedDict[bytes, SsdEntry] = OrderedDict()
    used_bytes = 0
    known: set[str] = set()
    for _, skey, e in found:
        entries[skey] = e
        used_bytes += _charge(skey, e)
        known.add(file_rel(skey))
    next_seq = len(found) if from_files else max([int(t[0]) + 1 for t in found] or [0])
    made_shards: set[str] = set()
    orphans = 0
    for shard in os.listdir(data_dir):
        sdir = os.path.join(data_dir, shard)
        if not os.path.isdir(sdir):
            unlink_quietly(sdir)
            orphans += 1
            continue
        made_shards.add(shard)
        for fname in os.listdir(sdir):
            if f"{shard}/{fname}" not in known:
                unlink_quietly(os.path.join(sdir, fname))
                orphans += 1
    for shard in (f"{i:02x}" for i in range(256)):  # not later, in a timed demotion
        if shard not in made_shards:
            os.makedirs(os.path.join(data_dir, shard), exist_ok=True)
            made_shards.add(shard)
    trimmed = 0
    while used_bytes > capacity_bytes and entries:
        skey, e = entries.popitem(last=False)  # the LRU block
        used_bytes -= _charge(skey, e)
        trimmed += 1
        try:
            db.delete(index_key(skey))
        except Exception as exc:  # the file goes anyway; a dangling entry is dropped on start
            log.warning("ssd_index_delete_failed", error=str(exc))
        unlink_quietly(os.path.join(data_dir, file_rel(skey)))
    log.info(
        "ssd_tier_opened", directory=directory, num_blocks=len(entries),
        used_bytes=used_bytes, capacity_bytes=capacity_bytes,
        dropped_entries=len(broken) - migrated, orphan_files_deleted=orphans,
        trimmed_blocks=trimmed, migrated_entries=migrated, rebuilt_from_files=from_files,
    )
    return Recovered(lock_fd, db, entries, used_bytes, next_seq, made_shards, trimmed)
