"""Opening an SSD tier directory: its lock, its index, and rebuilding the in-memory index.

A mixin of :class:`~kvstored.tiers.ssd.SsdTier` (runs once, in its constructor, before any
other thread can see the tier):

- the directory lock (``kvstored.lock``, flock'd, holds the owner's pid): a second process
  gets :class:`StorageIOError` "already in use by another kvstored process";
- the RocksDB index; one that cannot be opened for any other reason (a garbage CURRENT file,
  a missing manifest) is moved to ``index.corrupt`` and rebuilt from the block files'
  trailers, with the warning ``ssd_index_rebuilt_from_files``;
- version-1 records (identity = bare key) are migrated to version 2 (identity = namespace +
  key): a trailer is appended to the file, which is renamed, and the record re-keyed;
- entries whose file is missing or has the wrong size are dropped, orphan and temp files
  deleted, and the cap enforced LRU-first.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

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
    decode_record,
    encode_record,
    file_rel,
    from_persistent,
    index_key,
    legacy_file_rel,
    parse_trailer,
    split_store_key,
    store_key,
    trailer_of,
)

if TYPE_CHECKING:
    from kvstored.tiers.ssd import SsdEntry

log = structlog.get_logger(__name__)

LOCK_FILE = "kvstored.lock"


class SsdDirInUse(ConfigInvalid, StorageIOError):
    """The SSD directory is locked by another live process: a configuration error (two
    daemons given one ``node.ssd_dir``; the daemon exits 2), also a StorageIOError."""


def is_lock_error(exc: BaseException) -> bool:
    """Whether a rocksdict open error is RocksDB's own LOCK file being held."""
    text = str(exc).lower()
    return "lock" in text and ("hold" in text or "resource temporarily" in text or "lock file" in text)


class SsdRecovery:
    """Directory lock, index open and rebuild for :class:`SsdTier`."""

    directory: str
    capacity_bytes: int
    used_bytes: int
    entries: OrderedDict[bytes, SsdEntry]
    lock: threading.Lock
    _data_dir: str
    _index_dir: str
    _made_shards: set[str]
    _seq: int
    _db: Rdict

    _path: Callable[[str], str]
    _entry: Callable[[int, int, bytes, bytes], SsdEntry]
    _charge: Callable[[bytes, SsdEntry], int]
    _file_ok: Callable[[bytes, SsdEntry, str], bool]
    _unlink: Callable[[str], None]
    _evict_lru: Callable[[], list[bytes]]
    delete_files: Callable[..., None]

    # ---- open ------------------------------------------------------------------------------
    def _take_dir_lock(self) -> int:
        try:
            os.makedirs(self._data_dir, exist_ok=True)
            fd = os.open(
                os.path.join(self.directory, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                0o644,
            )
        except OSError as exc:
            raise StorageIOError(
                f"cannot open SSD tier at {self.directory}: {exc.strerror or exc}; check "
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
                    f"cannot open SSD tier at {self.directory}: the directory is already in "
                    f"use by another kvstored process (pid {holder or 'unknown'}); give each "
                    "daemon its own node.ssd_dir"
                ) from None
            raise StorageIOError(
                f"cannot lock SSD tier directory {self.directory}: {exc.strerror or exc}"
            ) from exc
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def _open_index(self) -> tuple[Rdict, bool]:
        try:
            return Rdict(self._index_dir, options=Options(raw_mode=True)), False
        except Exception as exc:  # rocksdict raises plain Exception (lock, corruption)
            if is_lock_error(exc):  # a daemon of an older version that takes no flock
                raise StorageIOError(
                    f"cannot open SSD tier at {self.directory}: the directory is already in use "
                    "by another kvstored process (its RocksDB index is locked); give each "
                    "daemon its own node.ssd_dir"
                ) from None
            error = str(exc)
        aside = self._index_dir + ".corrupt"
        try:
            shutil.rmtree(aside, ignore_errors=True)
            if os.path.exists(self._index_dir):
                os.rename(self._index_dir, aside)
            db = Rdict(self._index_dir, options=Options(raw_mode=True))
        except Exception as exc:
            raise StorageIOError(
                f"cannot open SSD tier at {self.directory}: the index is unreadable ({error}) "
                f"and a new one cannot be created: {exc}"
            ) from exc
        log.warning(
            "ssd_index_rebuilt_from_files", directory=self.directory, error=error,
            moved_to=aside,
        )
        return db, True

    def _migrate_legacy(self, key: bytes, rec: bytes) -> tuple[int, bytes, SsdEntry] | None:
        """A version-1 record: append a trailer to its file, rename, re-index under b"N"."""
        ver, size, csum, seq, ns, rel, meta = decode_record(rec)
        if ver != LEGACY_REC_VERSION or rel != legacy_file_rel(key):
            return None
        old = self._path(rel)
        if os.stat(old).st_size != size:
            return None
        skey = store_key(ns, key)
        new_rel = file_rel(skey)
        with open(old, "r+b") as fh:
            fh.seek(size)
            fh.write(trailer_of(skey, size, csum, meta))
        os.makedirs(os.path.dirname(self._path(new_rel)), exist_ok=True)
        os.rename(old, self._path(new_rel))
        self._db.put(index_key(skey), encode_record(size, csum, seq, ns, new_rel, meta))
        return seq, skey, self._entry(size, csum, ns, meta)

    def _scan_files(self) -> list[tuple[float, bytes, SsdEntry]]:
        """Entries rebuilt from the block files' trailers (the index was lost)."""
        found: list[tuple[float, bytes, SsdEntry]] = []
        for shard in sorted(os.listdir(self._data_dir)):
            sdir = os.path.join(self._data_dir, shard)
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

                        def body(n: int, fh: object = fh, end: int = st.st_size) -> bytes:
                            fh.seek(max(0, end - FOOTER_BYTES - n))  # type: ignore[attr-defined]
                            return fh.read(n)  # type: ignore[attr-defined,no-any-return]

                        skey, size, csum, meta, want = parse_trailer(footer, body)
                except (OSError, ValueError, struct.error):
                    continue  # not a block file: deleted as an orphan
                if want != st.st_size or file_rel(skey) != f"{shard}/{fname}":
                    continue
                ns, _ = split_store_key(skey)
                found.append((st.st_mtime, skey, self._entry(size, csum, ns, meta)))
        found.sort(key=lambda t: t[0])
        return found

    def _rebuild(self, from_files: bool) -> None:
        found: list[tuple[float, bytes, SsdEntry]] = []
        broken: list[bytes] = []
        migrated = 0
        if from_files:
            found = self._scan_files()
            for seq, (_, skey, e) in enumerate(found):
                ns, _ = split_store_key(skey)
                self._db.put(
                    index_key(skey),
                    encode_record(e.size_bytes, e.checksum, seq, ns, file_rel(skey), e.meta),
                )
        else:
            for ikey, rec in self._db.items():
                ikey, rec = bytes(ikey), bytes(rec)
                try:
                    if ikey.startswith(LEGACY_BLOCK_PREFIX):
                        got = self._migrate_legacy(ikey[1:], rec)
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
                    e = self._entry(size, csum, ns, meta)
                    ok = (
                        ver != LEGACY_REC_VERSION and rel == file_rel(skey)
                        and split_store_key(skey)[0] == ns and self._file_ok(skey, e, rel)
                    )
                except (ValueError, struct.error, UnicodeDecodeError, OSError, IndexError):
                    ok = False
                if not ok:
                    broken.append(ikey)  # its file, if any, is deleted below as an orphan
                    continue
                found.append((float(seq), skey, e))
            for ikey in broken:
                self._db.delete(ikey)
            found.sort(key=lambda t: t[0])
        known: set[str] = set()
        for _, skey, e in found:
            self.entries[skey] = e
            self.used_bytes += self._charge(skey, e)
            known.add(file_rel(skey))
        self._seq = len(found) if from_files else max([int(t[0]) + 1 for t in found] or [0])
        orphans = 0
        for shard in os.listdir(self._data_dir):
            sdir = os.path.join(self._data_dir, shard)
            if not os.path.isdir(sdir):
                self._unlink(sdir)
                orphans += 1
                continue
            self._made_shards.add(shard)
            for fname in os.listdir(sdir):
                if f"{shard}/{fname}" not in known:
                    self._unlink(os.path.join(sdir, fname))
                    orphans += 1
        for shard in (f"{i:02x}" for i in range(256)):  # not later, in a timed demotion
            if shard not in self._made_shards:
                os.makedirs(os.path.join(self._data_dir, shard), exist_ok=True)
                self._made_shards.add(shard)
        trimmed = 0
        while self.used_bytes > self.capacity_bytes and self.entries:
            self.delete_files(self._evict_lru())
            trimmed += 1
        log.info(
            "ssd_tier_opened", directory=self.directory, num_blocks=len(self.entries),
            used_bytes=self.used_bytes, capacity_bytes=self.capacity_bytes,
            dropped_entries=len(broken) - migrated, orphan_files_deleted=orphans,
            trimmed_blocks=trimmed, migrated_entries=migrated, rebuilt_from_files=from_files,
        )

