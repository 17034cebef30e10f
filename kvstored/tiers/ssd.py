"""SSD tier: a directory with a hard byte cap, one data file per block, a persistent index.

Layout of ``ssd_dir``::

    ssd_dir/
      index/                 rocksdict (RocksDB), raw bytes:  b"B" + key -> record
      data/<shard>/<name>.blk      block bytes, exactly size_bytes long
      data/<shard>/<name>.blk.tmp  a write in progress (deleted on start)

``shard`` is two hex digits of xxh3_64(key); ``name`` is the key in hex (or ``h`` + its
xxh3_128 for keys longer than 100 bytes). A record holds the block's size, xxh3_64 checksum,
namespace id, meta, a write/touch sequence number (the LRU order after a restart) and the file
name. A block is written to the temp name, renamed into place, then indexed, so a crash leaves
at worst an orphan file (deleted on the next start) and never an index entry for a partial file
of the right size whose bytes are wrong without the checksum noticing.

Invariants:

- ``used_bytes`` = sum over indexed blocks of size rounded up to 4096 <= ``capacity_bytes``
  (enforced on every write and on start, where an over-full directory is trimmed LRU-first);
- every read is checksum-verified; a mismatch, short file or read error deletes the block and
  it is reported as a miss, never served;
- a failed write (ENOSPC, EIO) leaves no index entry and no file, and harms no other block.

Reads use O_DIRECT (``direct_io=True``) with ``os.preadv`` into the 4096-aligned destination,
falling back to buffered reads when the filesystem refuses O_DIRECT (tmpfs). Data files are not
fsync'd: after a power loss the checksum turns a torn file into a miss.

Not thread-safe on its own: :class:`kvstored.tiers.tiered.TieredStore` calls it under its lock.
"""

from __future__ import annotations

import errno
import os
import struct
from collections import OrderedDict
from collections.abc import Callable

import structlog
import xxhash
from rocksdict import Options, Rdict

from kvstored.errors import StorageIOError

log = structlog.get_logger(__name__)

PAGE_BYTES = 4096
_REC_VERSION = 1
_REC_HEADER = struct.Struct("<BQQQHHI")  # version, size, checksum, seq, ns_len, name_len, meta_len
_BLOCK_PREFIX = b"B"
_DATA_SUFFIX = ".blk"
_TMP_SUFFIX = ".blk.tmp"


def round_up_page(size_bytes: int) -> int:
    """``size_bytes`` rounded up to a multiple of 4096 (at least 4096)."""
    return max(PAGE_BYTES, (size_bytes + PAGE_BYTES - 1) // PAGE_BYTES * PAGE_BYTES)


def checksum_of(data: memoryview | bytes) -> int:
    """The block checksum stored in the index: xxh3_64 of the bytes."""
    return xxhash.xxh3_64_intdigest(data)


class SsdEntry:
    """In-memory metadata of one block on the SSD tier (lean: no file name, no sequence)."""

    __slots__ = ("size_bytes", "checksum", "info")

    def __init__(self, size_bytes: int, checksum: int, info: tuple[bytes, bytes]) -> None:
        self.size_bytes = size_bytes
        self.checksum = checksum
        self.info = info  # (namespace_id, meta), interned

    @property
    def namespace_id(self) -> bytes:
        """Namespace the block was stored under (b"" = none)."""
        return self.info[0]

    @property
    def meta(self) -> bytes:
        """Opaque metadata stored with the block."""
        return self.info[1]


def _no_intern(namespace_id: bytes, meta: bytes) -> tuple[bytes, bytes]:
    return (namespace_id, meta)


def _file_rel(key: bytes) -> str:
    shard = f"{xxhash.xxh3_64_intdigest(key) & 0xFF:02x}"
    name = key.hex() if len(key) <= 100 else "h" + xxhash.xxh3_128_hexdigest(key)
    return f"{shard}/{name}{_DATA_SUFFIX}"


class SsdTier:
    """Capped directory of block files with a persistent rocksdict index and an LRU.

    Opening rebuilds the in-memory index from the persistent one: entries whose file is
    missing or has the wrong size are dropped, orphan and temp files are deleted, and the cap
    is enforced (LRU blocks are deleted until the directory fits).

    Args:
        directory: the tier's directory (created if missing).
        capacity_bytes: hard cap on the sum of block sizes rounded up to 4096, > 0.
        direct_io: read with O_DIRECT when the filesystem allows it.
        intern_info: maps ``(namespace_id, meta)`` to a shared tuple (saves memory per block).
        intern_size: maps a block size to a shared int object (same reason).

    Raises:
        StorageIOError: the directory or its index cannot be opened (e.g. another daemon holds
            the index lock).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        capacity_bytes: int,
        *,
        direct_io: bool = True,
        intern_info: Callable[[bytes, bytes], tuple[bytes, bytes]] = _no_intern,
        intern_size: Callable[[int], int] = int,
    ) -> None:
        if capacity_bytes <= 0:
            raise ValueError(f"SSD capacity_bytes must be > 0, got {capacity_bytes}")
        self.directory = os.fspath(directory)
        self.capacity_bytes = int(capacity_bytes)
        self.used_bytes = 0
        self.entries: OrderedDict[bytes, SsdEntry] = OrderedDict()
        self.hits = 0
        self.evictions = 0
        self.checksum_failures = 0
        self.put_failures = 0
        self._direct_io = direct_io and hasattr(os, "O_DIRECT")
        self._intern_info = intern_info
        self._intern_size = intern_size
        self._seq = 0
        self._data_dir = os.path.join(self.directory, "data")
        self._made_shards: set[str] = set()
        self._closed = False
        try:
            os.makedirs(self._data_dir, exist_ok=True)
            self._db = Rdict(os.path.join(self.directory, "index"), options=Options(raw_mode=True))
        except Exception as exc:  # rocksdict raises plain Exception for a held lock / corruption
            raise StorageIOError(f"cannot open SSD tier at {self.directory}: {exc}") from exc
        self._rebuild()

    # ---- records -----------------------------------------------------------------------
    def _encode(self, key: bytes, e: SsdEntry, seq: int) -> bytes:
        name = _file_rel(key).encode()
        return (
            _REC_HEADER.pack(
                _REC_VERSION, e.size_bytes, e.checksum, seq, len(e.namespace_id), len(name),
                len(e.meta),
            )
            + e.namespace_id
            + name
            + e.meta
        )

    def _decode(self, rec: bytes) -> tuple[SsdEntry, int, str]:
        ver, size, csum, seq, ns_len, name_len, meta_len = _REC_HEADER.unpack_from(rec)
        if ver != _REC_VERSION:
            raise ValueError(f"unknown record version {ver}")
        p = _REC_HEADER.size
        ns = rec[p : p + ns_len]
        p += ns_len
        name = rec[p : p + name_len].decode()
        p += name_len
        meta = rec[p : p + meta_len]
        if p + meta_len != len(rec):
            raise ValueError("record length mismatch")
        return SsdEntry(self._intern_size(size), csum, self._intern_info(ns, meta)), seq, name

    def _path(self, rel: str) -> str:
        return os.path.join(self._data_dir, rel)

    # ---- start -------------------------------------------------------------------------
    def _rebuild(self) -> None:
        found: list[tuple[int, bytes, SsdEntry]] = []
        known: set[str] = set()
        broken: list[bytes] = []
        for ikey, rec in self._db.items():
            if not ikey.startswith(_BLOCK_PREFIX):
                continue
            key = bytes(ikey[1:])
            try:
                entry, seq, rel = self._decode(bytes(rec))
                ok = rel == _file_rel(key) and os.stat(self._path(rel)).st_size == entry.size_bytes
            except (ValueError, struct.error, UnicodeDecodeError, OSError):
                ok = False
            if not ok:
                broken.append(ikey)  # its file, if any, is deleted below as an orphan
                continue
            found.append((seq, key, entry))
            known.add(rel)
        for ikey in broken:
            self._db.delete(ikey)
        dropped = len(broken)
        found.sort(key=lambda t: t[0])
        for seq, key, entry in found:
            self.entries[key] = entry
            self.used_bytes += round_up_page(entry.size_bytes)
            self._seq = max(self._seq, seq + 1)
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
        trimmed = 0
        while self.used_bytes > self.capacity_bytes and self.entries:
            self._evict_lru()
            trimmed += 1
        log.info(
            "ssd_tier_opened", directory=self.directory, num_blocks=len(self.entries),
            used_bytes=self.used_bytes, capacity_bytes=self.capacity_bytes,
            dropped_entries=dropped, orphan_files_deleted=orphans, trimmed_blocks=trimmed,
        )

    @staticmethod
    def _unlink(path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("ssd_unlink_failed", path=path, error=str(exc))

    # ---- write -------------------------------------------------------------------------
    def _evict_lru(self) -> None:
        key = next(iter(self.entries))
        self.delete(key)
        self.evictions += 1

    def write(self, key: bytes, data: memoryview, *, namespace_id: bytes, meta: bytes) -> bool:
        """Store a block (a demotion or spill), evicting LRU SSD blocks to stay under the cap.

        A block already on the tier is left as it is (the tier is content-addressed).

        Args:
            key: block key.
            data: the block's bytes (``size_bytes = data.nbytes``).
            namespace_id: namespace stored with the block.
            meta: metadata stored with the block.

        Returns:
            True if the block is on the tier now; False if it could not be written: larger
            than the whole tier, or an I/O error (ENOSPC, EIO: counted in ``put_failures``
            and logged as a warning). Nothing already stored is harmed by a failure.
        """
        if key in self.entries:
            return True
        size = data.nbytes
        need = round_up_page(size)
        if need > self.capacity_bytes:
            log.debug("ssd_block_skipped", size_bytes=size, capacity_bytes=self.capacity_bytes)
            return False
        while self.used_bytes + need > self.capacity_bytes and self.entries:
            self._evict_lru()
        rel = _file_rel(key)
        path = self._path(rel)
        tmp = path[: -len(_DATA_SUFFIX)] + _TMP_SUFFIX
        entry = SsdEntry(
            self._intern_size(size), checksum_of(data), self._intern_info(namespace_id, meta)
        )
        stage = "open"
        try:
            shard = rel[:2]
            if shard not in self._made_shards:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                self._made_shards.add(shard)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                stage = "write"
                done = 0
                while done < size:
                    n = os.write(fd, data[done:])
                    if n <= 0:
                        raise OSError(errno.EIO, "short write")
                    done += n
            finally:
                os.close(fd)
            stage = "rename"
            os.rename(tmp, path)
            stage = "index"
            self._db.put(_BLOCK_PREFIX + key, self._encode(key, entry, self._seq))
        except Exception as exc:  # OSError, or rocksdict's Exception on an index write
            self._unlink(tmp)
            if stage == "index":
                self._unlink(path)
            self.put_failures += 1
            log.warning(
                "ssd_write_failed", stage=stage, size_bytes=size,
                error=getattr(exc, "strerror", None) or str(exc),
            )
            return False
        self._seq += 1
        self.entries[key] = entry
        self.used_bytes += need
        return True

    # ---- read --------------------------------------------------------------------------
    def _open_for_read(self, path: str) -> tuple[int, bool]:
        if self._direct_io:
            try:
                return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECT), True
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self._direct_io = False
                log.info("ssd_direct_io_disabled", directory=self.directory)
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC), False

    @staticmethod
    def _read_all(fd: int, buf: memoryview) -> int:
        total = 0
        want = buf.nbytes
        while total < want:
            n = os.preadv(fd, [buf[total:]], total)
            if n == 0:
                break
            total += n
        return total

    def read_into(self, key: bytes, dest: memoryview) -> bool:
        """Read a block into ``dest`` and verify its checksum.

        Args:
            key: block key; must be on the tier.
            dest: writable buffer of at least ``round_up_page(size_bytes)`` bytes; for
                O_DIRECT it should start 4096-aligned (arena slices do); otherwise the read
                falls back to buffered I/O.

        Returns:
            True if ``dest[:size_bytes]`` now holds the verified block. False if the file is
            missing, short, long, unreadable or fails its checksum: the block is deleted,
            counted in ``checksum_failures`` (or logged as a read error) and must be treated
            as a miss.

        Raises:
            KeyError: the key is not on the tier.
            ValueError: ``dest`` is too small.
        """
        entry = self.entries[key]
        size = entry.size_bytes
        need = round_up_page(size)
        if dest.nbytes < need:
            raise ValueError(f"destination of {dest.nbytes} bytes is smaller than {need}")
        buf = dest[:need]
        path = self._path(_file_rel(key))
        reason = ""
        try:
            fd, direct = self._open_for_read(path)
            try:
                if os.fstat(fd).st_size != size:
                    reason = "wrong_size"
                else:
                    try:
                        got = self._read_all(fd, buf)
                    except OSError as exc:
                        if not direct or exc.errno != errno.EINVAL:
                            raise
                        os.close(fd)  # O_DIRECT refused this buffer: retry buffered
                        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                        got = self._read_all(fd, buf)
                    if got < size:
                        reason = "short_read"
            finally:
                os.close(fd)
        except OSError as exc:
            self.delete(key)
            log.warning("ssd_read_failed", error=exc.strerror or str(exc), size_bytes=size)
            return False
        if not reason and checksum_of(buf[:size]) != entry.checksum:
            reason = "checksum_mismatch"
        if reason:
            self.checksum_failures += 1
            self.delete(key)
            log.warning("ssd_block_rejected", reason=reason, size_bytes=size, key=key[:8].hex())
            return False
        return True

    # ---- misc --------------------------------------------------------------------------
    def touch(self, key: bytes) -> None:
        """Make ``key`` the most recent SSD block, in memory and in the persistent order."""
        entry = self.entries[key]
        self.entries.move_to_end(key)
        try:
            self._db.put(_BLOCK_PREFIX + key, self._encode(key, entry, self._seq))
            self._seq += 1
        except Exception as exc:  # a failed recency update is harmless
            log.debug("ssd_touch_failed", error=str(exc))

    def delete(self, key: bytes) -> bool:
        """Remove a block's index entry and file. Returns False if it was not on the tier."""
        entry = self.entries.pop(key, None)
        if entry is None:
            return False
        self.used_bytes -= round_up_page(entry.size_bytes)
        try:
            self._db.delete(_BLOCK_PREFIX + key)
        except Exception as exc:  # the file goes anyway; a dangling entry is dropped on start
            log.warning("ssd_index_delete_failed", error=str(exc))
        self._unlink(self._path(_file_rel(key)))
        return True

    def close(self) -> None:
        """Flush and close the index; idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._db.flush()
        finally:
            self._db.close()
        log.info("ssd_tier_closed", directory=self.directory, num_blocks=len(self.entries))
