"""SSD tier: a directory with a hard byte cap, one data file per block, a persistent index.

Layout of ``ssd_dir``::

    ssd_dir/
      kvstored.lock          flock'd by the one process that owns the directory (holds its pid)
      index/                 rocksdict (RocksDB), raw bytes:  b"N" + store key -> record
      index.corrupt/         the last index that could not be opened (kept for inspection)
      data/<shard>/<name>.blk      block bytes + trailer (formats: ssd_format.py)
      data/<shard>/<name>.blk.tmp  a write in progress (deleted on start)

A block is written to the temp name, renamed into place, then indexed, so a crash leaves at
worst an orphan file and never an index entry for a partial file. A write that has to evict a
block of the same size (page count) takes that block's file: its index record is deleted,
the file renamed to the new block's name and overwritten in place (an orphan until indexed),
so a full tier's demotions skip block allocation (1 MiB writes ~1.5x faster on ext4).
Each file ends with a trailer naming its store key, size, checksum and meta, so a corrupt index (a garbage CURRENT
file, say) is rebuilt from the block files with a warning instead of refusing to start.

Invariants:

- ``used_bytes`` = sum over indexed blocks *and writes in flight* of their file size rounded
  up to 4096 <= ``capacity_bytes`` (enforced when a write begins and on start, where an
  over-full directory is trimmed LRU-first);
- every read is checksum-verified against the entry the reader looked up; a mismatch, short
  or long file or read error drops that entry (only if it is still the indexed one) and is
  reported as a miss, never served;
- a failed write (ENOSPC, EIO) leaves no index entry and no file, and harms no other block;
- one process owns the directory: a second gets :class:`StorageIOError` naming it.

Concurrency: metadata (``entries``, ``used_bytes``, counters) is guarded by ``lock`` (the
owning :class:`~kvstored.tiers.tiered.TieredStore` passes its store lock). Disk I/O never runs
under it: each operation is split into phases, ``begin_*`` / ``end_*`` with the lock held and
``*_file`` / :meth:`delete_files` / :meth:`persist` without it::

    begin_write (lock) -> write_file (no lock: write, xxh3, rename, index put) -> end_write (lock)
    lookup (lock)      -> read_file  (no lock: O_DIRECT read, xxh3)            -> end_read  (lock)
    drop / evict (lock: forget the entry) -> delete_files (no lock: index delete, unlink)

The convenience methods :meth:`write`, :meth:`read_into` and :meth:`delete` run the phases in
order, taking the lock themselves; they must not be called with the lock held.

Reads and writes use O_DIRECT (``direct_io=True``): reads with ``os.preadv`` into the
4096-aligned destination (an arena slot: promotion copies nothing), in chunks of up to 16 MiB
hashed (xxh3 streaming) as they arrive; writes straight from the arena slot (see
:func:`~kvstored.tiers.ssd_io.write_direct`). Both fall back to buffered I/O when the
filesystem or the buffer refuses O_DIRECT. A batch's blocks are read or written several at once by the tier's
I/O pool (:meth:`SsdTier.read_files`, :meth:`SsdTier.write_files`; ``io_threads``, default 8 =
queue depth 8). Data files are not fsync'd: after a power loss the checksum turns a torn file
into a miss. The file format is unchanged by O_DIRECT (ssd_format.py).
"""

from __future__ import annotations

import errno
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import structlog

from kvstored.tiers import ssd_batch
from kvstored.tiers.ssd_format import (
    DATA_SUFFIX,
    TMP_SUFFIX,
    SsdEntry,
    SsdWrite,
    checksum_of,
    encode_record,
    file_rel,
    index_key,
    round_up_page,
    split_store_key,
    store_key,
    touch_time,
    trailer_bytes,
    trailer_of,
)
from kvstored.tiers.ssd_io import (
    READ_CHUNK_BYTES,
    REFUSED_AT_OPEN,
    read_all,
    unlink_quietly,
    write_all,
    write_direct,
)
from kvstored.tiers.ssd_recovery import DATA_DIR, recover
from kvstored.types import Tier, TierStats

if TYPE_CHECKING:
    from kvstored.tiers.tenants import TenantUsage

__all__ = [
    "READ_CHUNK_BYTES", "SsdTier", "checksum_of", "file_rel", "round_up_page", "store_key",
]

log = structlog.get_logger(__name__)

IoHook = Callable[[str, bytes], None]

IO_QUEUE_DEPTH = 8
"""Blocks of one batch read or written at once (threads of the tier's I/O pool)."""
DUPLICATE_SCAN = 256
"""Most SSD blocks (LRU first) an SSD allocation looks at for one whose bytes are in DRAM."""


def _no_intern(namespace_id: bytes, meta: bytes) -> tuple[bytes, bytes]:
    return (namespace_id, meta)


class SsdTier:
    """Capped directory of block files with a persistent rocksdict index and an LRU (a
    :class:`~kvstored.tiers.base.TierBackend`).

    Opening (ssd_recovery.recover) takes the directory's lock file, then rebuilds the
    in-memory index from the persistent one: entries whose file is missing or has the wrong size are dropped, orphan
    and temp files are deleted, version-1 records are migrated, and the cap is enforced (LRU
    blocks are deleted until the directory fits). An index RocksDB cannot open is moved to
    ``index.corrupt`` and rebuilt from the block files' trailers (warning
    ``ssd_index_rebuilt_from_files``).

    Args:
        directory: the tier's directory (created if missing).
        capacity_bytes: hard cap on the sum of file sizes rounded up to 4096, > 0.
        direct_io: read with O_DIRECT when the filesystem allows it.
        intern_info: maps ``(namespace_id, meta)`` to a shared tuple (saves memory per block).
        intern_size: maps a block size to a shared int object (same reason).
        lock: guards the metadata; the owning store passes its own lock (default: a new
            Lock; not reentrant).
        io_threads: size of the tier's I/O pool ("kvstored-ssd-io"): how many blocks of
            one batch :meth:`read_files` / :meth:`write_files` move at once (queue depth).

    Raises:
        StorageIOError: the directory is in use by another kvstored process, or it (or its
            index) cannot be created.
    """

    tier = Tier.SSD

    io_hook: IoHook | None
    """Called as ``io_hook(op, store_key)`` (op: "write", "read", "delete") before each disk
    I/O, never under the lock. For tests that hold an I/O at a chosen point."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        capacity_bytes: int,
        *,
        direct_io: bool = True,
        intern_info: Callable[[bytes, bytes], tuple[bytes, bytes]] = _no_intern,
        intern_size: Callable[[int], int] = int,
        lock: threading.Lock | None = None,
        io_threads: int = IO_QUEUE_DEPTH,
    ) -> None:
        if capacity_bytes <= 0:
            raise ValueError(f"SSD capacity_bytes must be > 0, got {capacity_bytes}")
        if io_threads < 1:
            raise ValueError(f"SSD io_threads must be >= 1, got {io_threads}")
        self.directory = os.fspath(directory)
        self.capacity_bytes = int(capacity_bytes)
        self.hits = 0
        self.checksum_failures = 0
        self.put_failures = 0
        self.io_hook = None
        self.tenants: TenantUsage | None = None  # per-tenant SSD quotas (set by TieredStore)
        self.duplicated: Callable[[bytes], bool] | None = None
        """Per store key: is the block also in DRAM (set by the store)? Such blocks are
        this tier's first victims (:meth:`_victim`)."""
        self.redundant_victim: Callable[[], bytes | None] | None = None
        """The least recent block here that is a redundant replica (another live node holds
        it; tiers/redundant.py), or None (set by the store): an SSD allocation evicts it
        before a sole copy (:meth:`_victim`)."""
        self.lock = lock if lock is not None else threading.Lock()
        self._writing: set[bytes] = set()
        self._deleting: set[bytes] = set()
        self._direct_io = direct_io and hasattr(os, "O_DIRECT")
        self._intern_info = intern_info
        self._intern_size = intern_size
        self._data_dir = os.path.join(self.directory, DATA_DIR)
        self._closed = False
        self._io = ssd_batch.IoPool(io_threads)  # its threads are made on the first batch
        found = recover(self.directory, self.capacity_bytes, make_entry=self._entry)
        self._lock_fd = found.lock_fd
        self._db = found.db
        self.entries: OrderedDict[bytes, SsdEntry] = found.entries
        self.used_bytes = found.used_bytes
        self.evictions = found.num_trimmed  # the blocks trimmed to fit the cap
        self._seq = found.next_seq
        self._made_shards = found.made_shards

    def _path(self, rel: str) -> str:
        return os.path.join(self._data_dir, rel)

    def path_of(self, skey: bytes) -> str:
        """Absolute path of a block's data file (for tests and ``kvstored offline``)."""
        return self._path(file_rel(skey))

    def _entry(self, size: int, csum: int, ns: bytes, meta: bytes) -> SsdEntry:
        return SsdEntry(self._intern_size(size), csum, self._intern_info(ns, meta))

    def _charge(self, skey: bytes, e: SsdEntry) -> int:
        return round_up_page(e.size_bytes + trailer_bytes(skey, e.meta))

    def stats(self) -> TierStats:
        """The tier's counters and usage now (lock held)."""
        return TierStats(
            tier=Tier.SSD, capacity_bytes=self.capacity_bytes, used_bytes=self.used_bytes,
            num_blocks=len(self.entries), hits=self.hits, evictions=self.evictions,
        )

    def _hook(self, op: str, skey: bytes) -> None:
        hook = self.io_hook
        if hook is not None:
            hook(op, skey)

    # ---- metadata phases (lock held) -------------------------------------------------------
    def _evict_lru(self) -> list[bytes]:
        skey = self._victim()
        self.evictions += 1
        return self.drop(skey)

    def _victim(self) -> bytes:
        """The block an SSD allocation evicts (lock held; the tier is not empty): the least
        recent of the first :data:`DUPLICATE_SCAN` whose bytes are also in DRAM
        (:attr:`duplicated`: evicting this SSD copy drops nothing from the node), else the
        least recent redundant replica (:attr:`redundant_victim`: another node holds it), else
        the least recent block."""
        dup = self.duplicated
        if dup is not None:
            for i, skey in enumerate(self.entries):
                if i >= DUPLICATE_SCAN:
                    break
                if dup(skey):
                    return skey
        red = self.redundant_victim
        if red is not None:
            found = red()
            if found is not None:
                return found
        return next(iter(self.entries))

    def drop(self, skey: bytes, entry: SsdEntry | None = None) -> list[bytes]:
        """Forget a block (lock held); returns what :meth:`delete_files` must then delete.

        Args:
            entry: drop only if this is still the indexed entry (a reader's stale view).
        """
        e = self.entries.get(skey)
        if e is None or (entry is not None and e is not entry):
            return []
        del self.entries[skey]
        self.used_bytes -= self._charge(skey, e)
        return [skey]

    def begin_write(
        self, skey: bytes, size_bytes: int, *, namespace_id: bytes, meta: bytes
    ) -> SsdWrite | None:
        """Start storing a block (lock held): charge its space, evicting LRU SSD blocks.

        Returns:
            The write to pass to :meth:`write_file` and :meth:`end_write`, or None when there
            is nothing to write: the block is on the tier or being written already, or it is
            larger than the whole tier.
        """
        if skey in self.entries or skey in self._writing or skey in self._deleting:
            return None  # (a block whose old file is being deleted is not re-written now)
        tenants = self.tenants
        if tenants is not None and not tenants.may_write_ssd(skey, size_bytes):
            log.debug("ssd_block_skipped", size_bytes=size_bytes, reason="tenant_ssd_quota")
            return None  # before any eviction: a quota never costs another tenant a block
        charge = round_up_page(size_bytes + trailer_bytes(skey, meta))
        if charge > self.capacity_bytes:
            log.debug("ssd_block_skipped", size_bytes=size_bytes, capacity_bytes=self.capacity_bytes)
            return None
        w = SsdWrite(skey, size_bytes, namespace_id, meta, charge)
        while self.used_bytes + charge > self.capacity_bytes and self.entries:
            victim = self._victim()
            if w.reuse is None and self._charge(victim, self.entries[victim]) == charge:
                self.evictions += 1  # its file is overwritten in place (see write_file)
                self.drop(victim)
                self._deleting.add(victim)
                w.reuse = victim
            else:
                w.doomed += self._evict_lru()
        if self.used_bytes + charge > self.capacity_bytes:  # the rest is writes in flight
            log.debug("ssd_block_skipped", size_bytes=size_bytes, reason="writes_in_flight")
            return None
        self.used_bytes += charge
        self._writing.add(skey)
        if tenants is not None:
            tenants.start_ssd_write(skey, size_bytes)
        w.seq = self._seq
        self._seq += 1
        return w

    def end_write(self, w: SsdWrite, *, keep: bool = True) -> list[bytes]:
        """Finish a write (lock held): index it, or give its space back.

        Args:
            keep: False when the block was removed while being written; a file already
                written is then returned for :meth:`delete_files`.
        """
        self._writing.discard(w.skey)
        if self.tenants is not None:
            self.tenants.end_ssd_write(w.skey, w.size_bytes)
        undone = w.doomed  # evictions write_file never ran to delete (it raised, or no call)
        if w.reuse is not None:
            self._deleting.discard(w.reuse)
            undone.append(w.reuse)
        w.doomed, w.reuse = [], None
        if w.entry is not None and keep:
            if w.generation:
                w.entry.generation = w.generation
            if w.touched:
                w.entry.touched = w.touched  # a demotion: the block's last use in DRAM
            self.entries[w.skey] = w.entry
            return undone
        self.used_bytes -= w.charge_bytes
        if w.entry is None:
            self.put_failures += 1
            return undone
        return [*undone, w.skey]

    def touch(self, skey: bytes) -> tuple[bytes, bytes] | None:
        """Make a block the most recent (lock held); returns the record for :meth:`persist`."""
        e = self.entries.get(skey)
        if e is None:
            return None
        self.entries.move_to_end(skey)
        e.touched = touch_time()
        seq = self._seq
        self._seq += 1
        return index_key(skey), encode_record(
            e.size_bytes, e.checksum, seq, e.namespace_id, file_rel(skey), e.meta
        )

    # ---- I/O phases (no lock) --------------------------------------------------------------
    def _take_file(self, victim: bytes, path: str) -> bool:
        """Unindex an evicted block and rename its file to ``path``, the new block's name (the
        write then overwrites its already-allocated pages in place: no block allocation,
        ~1.5x faster for 1-4 MiB blocks on ext4). Until the new block is indexed the file is
        an orphan (deleted on start; were the index lost, its trailer names another key, or
        its data fails the checksum). A reader still holding the old file open reads a
        checksum mismatch: a miss."""
        try:
            self._hook("delete", victim)
            self._db.delete(index_key(victim))
            os.rename(self.path_of(victim), path)
            return True
        except Exception as exc:  # the write creates a new file; a dangling entry goes on start
            log.debug("ssd_file_reuse_failed", error=str(exc))
            unlink_quietly(self.path_of(victim))
            return False
        finally:
            with self.lock:
                self._deleting.discard(victim)

    def write_file(self, w: SsdWrite, data: memoryview) -> bool:
        """Write, checksum, rename and index one block (no lock held).

        Returns:
            True on success (``w.entry`` is set); False on an I/O error (ENOSPC, EIO), logged
            as a warning: no file and no index entry is left behind.
        """
        self.delete_files(w.doomed)
        w.doomed = []
        size = w.size_bytes
        rel = file_rel(w.skey)
        path = self._path(rel)
        tmp = path[: -len(DATA_SUFFIX)] + TMP_SUFFIX
        csum = checksum_of(data)
        stage = "open"
        reused = False
        try:
            shard = rel[:2]
            if shard not in self._made_shards:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                self._made_shards.add(shard)
            reused = w.reuse is not None and self._take_file(w.reuse, path)
            w.reuse = None
            target = path if reused else tmp
            self._hook("write", w.skey)  # (after the take: a test can crash a reuse here)
            tail = trailer_of(w.skey, size, csum, w.meta)
            stage = "write"
            refused = (
                write_direct(target, data, tail, truncate=not reused) if self._direct_io
                else REFUSED_AT_OPEN
            )
            if refused == REFUSED_AT_OPEN and self._direct_io:
                self._direct_io = False
                log.info("ssd_direct_io_disabled", directory=self.directory)
            if refused:
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
                try:
                    write_all(fd, data, 0)
                    write_all(fd, memoryview(tail), size)
                finally:
                    os.close(fd)
            stage = "rename"
            if target != path:
                os.rename(tmp, path)
            stage = "index"
            self._db.put(
                index_key(w.skey),
                encode_record(size, csum, w.seq, w.namespace_id, rel, w.meta),
            )
        except Exception as exc:  # OSError, or rocksdict's Exception on an index write
            unlink_quietly(tmp)
            if stage == "index" or reused:
                unlink_quietly(path)
            log.warning(
                "ssd_write_failed", stage=stage, size_bytes=size,
                error=getattr(exc, "strerror", None) or str(exc),
            )
            return False
        w.entry = self._entry(size, csum, w.namespace_id, w.meta)
        return True

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

    def read_file(self, skey: bytes, entry: SsdEntry, dest: memoryview) -> str:
        """Read a block into ``dest`` and verify it against ``entry`` (no lock held).

        Args:
            skey: the block's store key.
            entry: the entry looked up (under the lock) before the read.
            dest: writable buffer of at least ``round_up_page(size_bytes)`` bytes; for
                O_DIRECT it should start 4096-aligned (arena slices do); otherwise the read
                falls back to buffered I/O.

        Returns:
            "" when ``dest[:size_bytes]`` holds the verified block, else the reason it does
            not ("wrong_size", "short_read", "checksum_mismatch", "read_error: ...").

        Raises:
            ValueError: ``dest`` is too small.
        """
        size = entry.size_bytes
        need = round_up_page(size)
        if dest.nbytes < need:
            raise ValueError(f"destination of {dest.nbytes} bytes is smaller than {need}")
        self._hook("read", skey)
        buf = dest[:need]
        path = self._path(file_rel(skey))
        try:
            fd, direct = self._open_for_read(path)
            try:
                if os.fstat(fd).st_size != size + trailer_bytes(skey, entry.meta):
                    return "wrong_size"
                try:
                    got, csum = read_all(fd, buf, size)
                except OSError as exc:
                    if not direct or exc.errno != errno.EINVAL:
                        raise
                    os.close(fd)  # O_DIRECT refused this buffer: retry buffered
                    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                    got, csum = read_all(fd, buf, size)
                if got < size:
                    return "short_read"
            finally:
                os.close(fd)
        except OSError as exc:
            return f"read_error: {exc.strerror or exc}"
        if csum != entry.checksum:
            return "checksum_mismatch"
        return ""

    def end_read(self, skey: bytes, entry: SsdEntry, reason: str) -> list[bytes]:
        """Account a finished read (lock held); a failed one drops the block (if unchanged)."""
        if not reason:
            return []
        if self.entries.get(skey) is not entry:
            return []  # evicted (its file maybe reused) while being read: a plain miss
        if reason.startswith("read_error"):
            log.warning("ssd_read_failed", error=reason, size_bytes=entry.size_bytes)
        else:
            self.checksum_failures += 1
            log.warning(
                "ssd_block_rejected", reason=reason, size_bytes=entry.size_bytes,
                key=split_store_key(skey)[1][:8].hex(),
            )
        return self.drop(skey, entry)

    def read_files(self, reads: Sequence[ssd_batch.ReadItem]) -> list[str]:
        """:meth:`read_file` of several blocks, up to ``io_threads`` at once (no lock held;
        ssd_batch.read_files: one block's failure is its own reason, never the others')."""
        return ssd_batch.read_files(self._io, self.read_file, reads)

    def write_files(self, writes: Sequence[ssd_batch.WriteItem]) -> list[bool]:
        """:meth:`write_file` of several blocks, up to ``io_threads`` at once (no lock held;
        ssd_batch.write_files: per block, in order, True if written)."""
        return ssd_batch.write_files(self._io, self.write_file, writes)

    def delete_files(self, skeys: Iterable[bytes]) -> None:
        """Delete the index records and files of dropped blocks (no lock held).

        A block indexed or being written again meanwhile under the same store key is skipped
        (its new file stays); while a file is being deleted, :meth:`begin_write` of its store
        key declines, so a delete never removes a newer file.
        """
        for skey in skeys:
            with self.lock:
                if skey in self.entries or skey in self._writing or skey in self._deleting:
                    continue
                self._deleting.add(skey)
            try:
                self._hook("delete", skey)
                try:
                    self._db.delete(index_key(skey))
                except Exception as exc:  # the file goes anyway; a dangling entry is dropped on start
                    log.warning("ssd_index_delete_failed", error=str(exc))
                unlink_quietly(self._path(file_rel(skey)))
            finally:
                with self.lock:
                    self._deleting.discard(skey)

    def persist(self, records: Iterable[tuple[bytes, bytes] | None]) -> None:
        """Write touched records (recency after a restart; no lock held). Failures are harmless."""
        for rec in records:
            if rec is None:
                continue
            try:
                self._db.put(rec[0], rec[1])
            except Exception as exc:
                log.debug("ssd_touch_failed", error=str(exc))

    # ---- convenience (take the lock themselves; never call with it held) ------------------
    def write(self, skey: bytes, data: memoryview, *, namespace_id: bytes, meta: bytes) -> bool:
        """Store a block, evicting LRU SSD blocks to stay under the cap.

        Returns:
            True if the block is on the tier now; False if it could not be written (larger
            than the whole tier, or an I/O error counted in ``put_failures``).
        """
        with self.lock:
            if skey in self.entries:
                return True
            w = self.begin_write(skey, data.nbytes, namespace_id=namespace_id, meta=meta)
        if w is None:
            return False
        ok = self.write_file(w, data)
        with self.lock:
            self.end_write(w)
        return ok

    def read_into(self, skey: bytes, dest: memoryview) -> bool:
        """Read and verify a block; False (and the block dropped) if it is unreadable.

        Raises:
            KeyError: the block is not on the tier.
        """
        with self.lock:
            entry = self.entries[skey]
        reason = self.read_file(skey, entry, dest)
        with self.lock:
            doomed = self.end_read(skey, entry, reason)
        self.delete_files(doomed)
        return not reason

    def delete(self, skey: bytes) -> bool:
        """Remove a block's index entry and file. Returns False if it was not on the tier."""
        with self.lock:
            doomed = self.drop(skey)
        self.delete_files(doomed)
        return bool(doomed)

    def close(self) -> None:
        """Flush and close the index, release the directory; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._io.shutdown()
        try:
            self._db.flush()
        finally:
            self._db.close()
            os.close(self._lock_fd)
        log.info("ssd_tier_closed", directory=self.directory, num_blocks=len(self.entries))
