"""TieredStore: the node's block store over a DRAM arena and an optional SSD directory.

No gRPC in here: the node service is a thin adapter over this class.

Identity: a block is ``(namespace_id, key)`` (one *store key*, ssd_format.store_key), in
DRAM and on SSD: the same key under two namespaces names two blocks, and every operation
(put, pin, lookup, exists, remove) sees only its own namespace. ``b""`` is a namespace too.

Transfers between the tiers (DEMOTING, PROMOTING), eviction and the lock order are in
transit.py (module docstring: the state machine and why no disk I/O runs under the lock).
Reading blocks out for export (spill: coldest first, never promoting) is in export.py.

Invariants:

- A block is visible (``pin_many``, ``exists``, ``lookup_prefix``...) only once committed or
  read back from SSD with a good checksum; nothing else is ever served.
- A block with ``pins > 0`` is never evicted, freed or removed; a DEMOTING block's space is
  never freed before its write ends.
- DRAM usage (committed + reserved + promotions in flight, rounded to 4096) never exceeds the
  arena; SSD usage (indexed + writes in flight) never exceeds ``ssd_size_bytes``. When an
  allocation does not fit, victims are chosen by eviction.victim_window (LRU first, plus the
  address neighbours needed for a contiguous extent), demoted to SSD when configured, else
  :class:`NoCapacity` and nothing was evicted in vain if the space could never suffice.
- A failed demotion (ENOSPC, EIO) drops the evicted block (a later miss), is counted in
  ``put_failures`` and logged as a warning; no other block is touched.
- Tiers are inclusive: an SSD hit is promoted into DRAM and keeps its SSD copy.
- A read never costs the pool a block: a remote fill's copy (``reserve(copy=True)``) makes
  room only from free space, other copies, blocks on SSD and demotions the SSD takes
  without evicting (spare.py), else NoCapacity; copies are evicted first by every
  allocation and dropped, never demoted.
- Chain-aware recency: ``pin_many`` touches its hits last-key-first and ``commit_many``
  inserts last-first, so the head of a chain is the most recent and is evicted last.
- First commit wins: two reservations of one block may coexist; the later commit returns
  False and frees its space.
- Pins are counted per block, not per holder: release each PinnedBlock exactly once.
- Every change of the DRAM or SSD block map is recorded, in order, in ``change_feed``
  (feed.py; the cluster link drains it), or the feed says a full inventory is owed.

Callers copy bytes into ``Reservation.view`` / out of ``PinnedBlock.view`` outside the lock.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

import structlog

from kvstored.errors import (
    BlockTooLarge,
    InvalidArgument,
    KeyInvalid,
    KvstoredError,
    NoCapacity,
    NotFound,
    Unavailable,
)
from kvstored.tiers.base import NEEDS_IO
from kvstored.types import BlockInfo, PinnedBlock, Reservation, StoreStats, Tier, TierStats
from kvstored.tiers.batch_put import BatchPutMixin
from kvstored.tiers.dram import DramArena, DramEntry, DramTier
from kvstored.tiers.export import ExportMixin
from kvstored.tiers.feed import ChangeFeed, ObservedCopies, ObservedEntries
from kvstored.tiers.ssd import SsdTier
from kvstored.tiers.ssd_format import split_store_key, store_key
from kvstored.tiers.transit import _AGAIN, TransitMixin, _Transit

if TYPE_CHECKING:
    from kvstored.config import NodeConfig

log = structlog.get_logger(__name__)

_INTERN_MAX_ENTRIES = 65536


class _Pending:
    """A reservation's bookkeeping (the caller holds the public :class:`Reservation`)."""

    __slots__ = ("skey", "offset", "size_bytes", "info", "copy")

    def __init__(self, skey: bytes, offset: int, size_bytes: int, info: tuple[bytes, bytes],
                 copy: bool = False):
        self.skey = skey
        self.offset = offset
        self.size_bytes = size_bytes
        self.info = info
        self.copy = copy  # a remote-fill copy of a peer's block (spare.py)


def _check_key(key: object) -> bytes:
    if type(key) is bytes and key:
        return key
    if not isinstance(key, (bytes, bytearray, memoryview)):
        raise KeyInvalid(f"block key must be bytes, got {type(key).__name__}")
    key = bytes(key)
    if not key:
        raise KeyInvalid("block key is empty; pass the block hash bytes")
    return key


def _check_bytes(name: str, value: object) -> bytes:
    if type(value) is bytes:
        return value
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise InvalidArgument(f"{name} must be bytes, got {type(value).__name__}")
    return bytes(value)


class TieredStore(TransitMixin, ExportMixin, BatchPutMixin):
    """The block store of one node: DRAM arena + optional SSD tier, LRU with pins.

    Thread-safe: one lock guards all metadata, never held during disk I/O (module docstring).

    Args:
        dram_size_bytes: hard cap of the DRAM tier = arena size (rounded down to 4096).
        arena_dir: directory (tmpfs) for the shared-memory arena file; None = anonymous
            memory (no file; for tests).
        node_id: used in the arena file name.
        ssd_dir: SSD tier directory; None (or ``ssd_size_bytes == 0``) disables the tier.
        ssd_size_bytes: hard cap of the SSD tier.
        ssd_direct_io: read SSD blocks with O_DIRECT when the filesystem allows it.
        max_block_bytes: largest block accepted.

    Raises:
        InvalidArgument: a size is not positive.
        StorageIOError: the arena file or the SSD directory/index cannot be opened (the SSD
            directory is in use by another kvstored process, say).
    """

    _pending_cls = _Pending  # (batch_put.py makes these too)

    def __init__(
        self,
        *,
        dram_size_bytes: int,
        arena_dir: str | os.PathLike[str] | None = "/dev/shm",
        node_id: str = "node",
        ssd_dir: str | os.PathLike[str] | None = None,
        ssd_size_bytes: int = 0,
        ssd_direct_io: bool = True,
        max_block_bytes: int = 64 << 20,
    ) -> None:
        from kvstored.errors import StorageIOError

        if dram_size_bytes < 4096:
            raise InvalidArgument(
                f"dram_size_bytes must be at least 4096, got {dram_size_bytes}; "
                "set node.dram_size_bytes"
            )
        if max_block_bytes <= 0:
            raise InvalidArgument(f"max_block_bytes must be > 0, got {max_block_bytes}")
        if ssd_size_bytes < 0:
            raise InvalidArgument(f"ssd_size_bytes must be >= 0, got {ssd_size_bytes}")
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._info_table: dict[tuple[bytes, bytes], tuple[bytes, bytes]] = {}
        self._size_table: dict[int, int] = {}
        self.max_block_bytes = int(max_block_bytes)
        try:
            self._arena = DramArena(dram_size_bytes, arena_dir=arena_dir, node_id=node_id)
        except OSError as exc:
            raise StorageIOError(
                f"cannot create the {dram_size_bytes}-byte DRAM arena in {arena_dir}: "
                f"{exc.strerror or exc}; check node.arena_dir and node.dram_size_bytes"
            ) from exc
        self._dram = DramTier(self._arena)
        self._ssd: SsdTier | None = None
        if ssd_dir is not None and ssd_size_bytes > 0:
            try:
                self._ssd = SsdTier(
                    ssd_dir, ssd_size_bytes, direct_io=ssd_direct_io,
                    intern_info=self._intern_info, intern_size=self._intern_size,
                    lock=self._lock,
                )
            except BaseException:
                self._arena.close()
                raise
        # the change feed MasterLink drains (feed.py): the tiers' block maps record changes
        self.change_feed = ChangeFeed()
        self._dram.entries = ObservedEntries(self.change_feed, Tier.DRAM, self._dram.entries.items())
        self._dram.copies = ObservedCopies(self.change_feed, self._dram.entries, self._dram.copies)
        if self._ssd is not None:
            self._ssd.entries = ObservedEntries(self.change_feed, Tier.SSD, self._ssd.entries.items())
        self.arena_path: str | None = self._arena.path
        self.arena_file_id: tuple[int, int] = self._arena.file_id
        """``(st_dev, st_ino)`` of the mapped arena file, recorded when it was created."""
        self.arena: memoryview = self._arena.view
        self.arena_size_bytes: int = self._arena.size_bytes
        self._reservations: dict[int, _Pending] = {}
        self._reservation_ids = itertools.count(1)
        self._reserved_bytes = 0  # reservations + promotions in flight
        self._pinned_bytes = 0
        self._demoting: dict[bytes, _Transit] = {}
        self._promoting: dict[bytes, _Transit] = {}
        self._gets = 0
        self._hits = 0
        self._misses = 0
        self._puts = 0
        self._closed = False

    @classmethod
    def from_config(cls, cfg: NodeConfig) -> TieredStore:
        """Build the store from a node's config section (``ssd_size_bytes == 0`` = no SSD)."""
        return cls(
            dram_size_bytes=cfg.dram_size_bytes,
            arena_dir=cfg.arena_dir,
            node_id=cfg.node_id,
            ssd_dir=cfg.ssd_dir if cfg.ssd_size_bytes > 0 else None,
            ssd_size_bytes=cfg.ssd_size_bytes,
            ssd_direct_io=cfg.ssd_direct_io,
            max_block_bytes=cfg.max_block_bytes,
        )

    # ---- helpers (lock held) -----------------------------------------------------------
    def _intern_info(self, namespace_id: bytes, meta: bytes) -> tuple[bytes, bytes]:
        """One shared ``(namespace_id, meta)`` tuple per distinct pair; bounded table."""
        info = (namespace_id, meta)
        got = self._info_table.get(info)
        if got is not None:
            return got
        if len(self._info_table) < _INTERN_MAX_ENTRIES:
            self._info_table[info] = info
        return info

    def _intern_size(self, size_bytes: int) -> int:
        """One shared int object per distinct block size; bounded table."""
        got = self._size_table.get(size_bytes)
        if got is not None:
            return got
        if len(self._size_table) < _INTERN_MAX_ENTRIES:
            self._size_table[size_bytes] = size_bytes
        return size_bytes

    def _check_open(self) -> None:
        if self._closed:
            raise Unavailable("the block store is closed")

    def _has(self, skey: bytes) -> bool:
        return skey in self._dram.entries or (self._ssd is not None and skey in self._ssd.entries)

    def _pin(self, entry: DramEntry) -> None:
        if entry.pins == 0:
            self._dram.pinned_blocks += 1
            self._pinned_bytes += self._dram.round_up(entry.size_bytes)
        entry.pins += 1

    # ---- put ---------------------------------------------------------------------------
    def reserve(
        self, key: bytes, size_bytes: int, *, namespace_id: bytes = b"", meta: bytes = b"",
        copy: bool = False,
    ) -> Reservation | None:
        """Reserve arena space for a block the caller will write.

        Fill ``reservation.view`` (outside any lock), then :meth:`commit` or :meth:`abort`.
        The block stays invisible to readers until committed. May evict LRU unpinned blocks
        (demoting them to SSD: this call then waits for those writes, nobody else does).

        Args:
            key: block hash, non-empty.
            size_bytes: exact block size, 0 <= size <= ``max_block_bytes``.
            namespace_id: the block's namespace (part of its identity; b"" is one too).
            meta: opaque metadata returned with the block.
            copy: the block is a remote-fill copy of a block a peer holds (node/remote.py):
                room is made only by evicting what drops no block from the pool (other
                copies, blocks on SSD, demotions the SSD takes as is; tiers/spare.py), and
                the committed block is marked a copy (evicted first, dropped, not demoted).
                False (a local put) also unmarks a copy of the same key already here.

        Returns:
            The reservation, or None when the block is already stored (complete) in either
            tier: an idempotent success with nothing to write.

        Raises:
            KeyInvalid: empty or non-bytes key.
            InvalidArgument: negative size, non-bytes or too long (> 255 bytes) namespace,
                non-bytes meta.
            BlockTooLarge: ``size_bytes > max_block_bytes``.
            NoCapacity: retriable; DRAM is full of pinned blocks and writes in progress, or
                (``copy``) no room can be made without dropping a block.
            Unavailable: the store is closed.
        """
        key = _check_key(key)
        namespace_id = _check_bytes("namespace_id", namespace_id)
        meta = _check_bytes("meta", meta)
        if not isinstance(size_bytes, int) or size_bytes < 0:
            raise InvalidArgument(f"size_bytes must be an int >= 0, got {size_bytes!r}")
        if size_bytes > self.max_block_bytes:
            raise BlockTooLarge(
                f"block of {size_bytes} bytes exceeds max_block_bytes={self.max_block_bytes}; "
                "raise node.max_block_bytes or use smaller blocks"
            )
        skey = store_key(namespace_id, key)
        with self._lock:
            self._check_open()
            if self._has(skey):
                if not copy:
                    self._dram.copies.pop(skey, None)  # written here too: no mere duplicate
                return None
            offset = self._allocate(size_bytes, copy=copy)
            rid = next(self._reservation_ids)
            self._reservations[rid] = _Pending(
                skey, offset, self._intern_size(size_bytes), self._intern_info(namespace_id, meta),
                copy,
            )
            self._reserved_bytes += self._dram.round_up(size_bytes)
            view = self.arena[offset : offset + size_bytes]
        return Reservation(
            key=key, offset=offset, size_bytes=size_bytes, view=view, reservation_id=rid
        )

    def _take_pending(self, reservation: Reservation) -> _Pending:
        pending = self._reservations.pop(reservation.reservation_id, None)
        if pending is None:
            raise NotFound(
                f"reservation {reservation.reservation_id} is unknown: already committed or "
                "aborted"
            )
        self._reserved_bytes -= self._dram.round_up(pending.size_bytes)
        return pending

    def _commit_locked(self, pending: _Pending) -> bool:
        if self._has(pending.skey):
            self._dram.allocator.free(pending.offset, pending.size_bytes)
            if not pending.copy:
                self._dram.copies.pop(pending.skey, None)
            return False
        if pending.copy:  # marked first: the entry's one ADDED event says copy (feed.py)
            self._dram.copies[pending.skey] = None
        self._dram.add(pending.skey, DramEntry(pending.offset, pending.size_bytes, pending.info))
        self._puts += 1
        return True

    def keep_copies(self, blocks: Sequence[tuple[bytes, bytes]]) -> int:
        """Unmark remote-fill copies: each is kept as an original from now on (the master
        asks when a copy became the pool's last replica; master/copies.py). The change
        feed re-reports each one ADDED with ``copy=False``.

        Args:
            blocks: ``(namespace_id, key)`` pairs; absent or non-copy blocks are skipped.

        Returns:
            Copies unmarked.
        """
        n = 0
        with self._lock:
            for namespace_id, key in blocks:
                n += self._dram.copies.pop(store_key(namespace_id, key), False) is None
        return n

    def commit(self, reservation: Reservation) -> bool:
        """Make a reserved block visible (most recent in DRAM). Never waits for disk I/O.

        Returns:
            True if the block is stored now; False if it was committed meanwhile by another
            writer (first commit wins; this reservation's space is freed).

        Raises:
            NotFound: the reservation was already committed or aborted.
        """
        with self._lock:
            return self._commit_locked(self._take_pending(reservation))

    def commit_many(self, reservations: Sequence[Reservation]) -> list[bool]:
        """Commit a batch (one prefix, head first) so that the head ends up most recent.

        Returns:
            Per reservation, as :meth:`commit`.

        Raises:
            NotFound: one of the reservations is unknown; none of the batch is committed then.
        """
        with self._lock:
            for r in reservations:
                if r.reservation_id not in self._reservations:
                    raise NotFound(
                        f"reservation {r.reservation_id} is unknown: already committed or aborted"
                    )
            out = [False] * len(reservations)
            for i in range(len(reservations) - 1, -1, -1):
                out[i] = self._commit_locked(self._take_pending(reservations[i]))
            return out

    def abort(self, reservation: Reservation) -> None:
        """Drop a reservation and free its space; idempotent (unknown ids are ignored)."""
        with self._lock:
            pending = self._reservations.pop(reservation.reservation_id, None)
            if pending is None:
                return
            self._reserved_bytes -= self._dram.round_up(pending.size_bytes)
            self._dram.allocator.free(pending.offset, pending.size_bytes)
            self._cond.notify_all()

    def put(
        self,
        key: bytes,
        data: bytes | bytearray | memoryview,
        *,
        namespace_id: bytes = b"",
        meta: bytes = b"",
    ) -> bool:
        """Store a block: reserve, copy, commit.

        Args:
            data: the block's bytes (any C-contiguous buffer; its ``nbytes`` is the size).

        Returns:
            True if stored now, False if the block already existed (idempotent success).

        Raises:
            The errors of :meth:`reserve`; InvalidArgument for a non-contiguous buffer.
        """
        src = memoryview(data)
        if not src.c_contiguous:
            raise InvalidArgument("put data must be a C-contiguous buffer")
        if src.format != "B" or src.ndim != 1:
            src = src.cast("B")
        res = self.reserve(key, src.nbytes, namespace_id=namespace_id, meta=meta)
        if res is None:
            return False
        try:
            res.view[:] = src
        except BaseException:
            self.abort(res)
            raise
        return self.commit(res)

    # ---- get ---------------------------------------------------------------------------
    def pin_many(
        self, keys: Sequence[bytes], *, namespace_id: bytes = b"", may_block: bool = True,
        cut_from: int | None = None,
    ) -> list[PinnedBlock | None | KvstoredError]:
        """Pin blocks of one namespace in DRAM for reading, promoting SSD hits first.

        Each returned :class:`PinnedBlock` must be released with :meth:`unpin` once its view
        has been copied. Hits are touched last-key-first, so ``keys[0]`` (a chain's head) ends
        up the most recent. Counts one get per key, and hits/misses per tier. A DRAM hit
        never waits for disk I/O; an SSD hit waits for its own read only (another reader of
        the same block waits for that read instead of starting a second one).

        Args:
            keys: block keys, typically one prefix in chain order.
            namespace_id: the reader's namespace; blocks of other namespaces are misses.
            may_block: False = never wait (for the event loop): if any key is an SSD-only or
                promoting block, nothing is pinned or counted and every item is
                :data:`~kvstored.tiers.base.NEEDS_IO`.
            cut_from: for a chunked read that reads again from a cut (NodeCore.pinned_chunks,
                the shm client's PinBlocks windows): the first key at index >= ``cut_from``
                whose SSD block cannot be promoted (NoCapacity) ends the call there; it and
                the keys after it are neither pinned nor counted (the next chunk reads and
                counts them), and the list returned is that much shorter. None: every key.

        Returns:
            Per key (a prefix of ``keys`` when cut): a PinnedBlock, None (miss, including a
            block dropped for a bad checksum), or NoCapacity (an SSD hit could not be
            promoted: DRAM all pinned). Errors count as misses and hold no pin.

        Raises:
            KeyInvalid: a key is empty or not bytes (nothing is pinned then).
            Unavailable: the store is closed.
        """
        if set(map(type, keys)) <= {bytes} and all(keys):  # C-level checks (hot path)
            checked = list(keys)
        else:
            checked = [_check_key(k) for k in keys]
        namespace_id = _check_bytes("namespace_id", namespace_id)
        tag = store_key(namespace_id, b"")  # a store key is the namespace's tag + the key
        skeys = [tag + k for k in checked]
        out: list[PinnedBlock | None | KvstoredError] = []
        records: list[tuple[bytes, bytes] | None] = []
        with self._lock:
            self._check_open()
            dram, ssd = self._dram, self._ssd
            hits = list(map(dram.entries.get, skeys))
            if None not in hits:  # every key a DRAM hit: no promotion, wait or miss (hot path)
                return self._pin_dram_hits(checked, hits)  # type: ignore[arg-type]
            if not may_block and ssd is not None and any(
                k not in dram.entries and (k in ssd.entries or k in self._promoting) for k in skeys
            ):
                return [NEEDS_IO] * len(skeys)  # type: ignore[list-item]
            touched_dram: list[bytes] = []
            touched_ssd: list[bytes] = []
            promoted_now: set[bytes] = set()
            if ssd is not None and len(skeys) > 1:  # read a batch's SSD blocks at once
                promoted_now = self._promote_many(skeys)
            for key, skey in zip(checked, skeys, strict=True):
                self._gets += 1
                tier = Tier.DRAM
                got: DramEntry | KvstoredError | None = None
                while True:
                    got = dram.entries.get(skey)
                    if got is not None or ssd is None:
                        break
                    if skey in self._promoting:
                        self._cond.wait()  # another reader is reading this very block
                        self._check_open()
                        continue
                    if skey not in ssd.entries:
                        break
                    promoted = self._promote(skey)
                    if promoted is _AGAIN:
                        continue
                    got = promoted  # type: ignore[assignment]
                    if isinstance(got, DramEntry):
                        tier = Tier.SSD
                        touched_ssd.append(skey)
                    break
                if not isinstance(got, DramEntry):
                    if cut_from is not None and len(out) >= cut_from and isinstance(
                        got, NoCapacity
                    ):
                        self._gets -= 1  # read (and counted) again by the next chunk
                        break
                    self._misses += 1
                    out.append(got)
                    continue
                if skey in promoted_now:
                    promoted_now.discard(skey)  # (a duplicate key later is a DRAM hit)
                    tier = Tier.SSD
                    touched_ssd.append(skey)
                if tier is Tier.DRAM:
                    dram.hits += 1
                self._hits += 1
                self._pin(got)
                touched_dram.append(skey)
                off = got.offset
                out.append(
                    PinnedBlock(
                        key=key, offset=off, size_bytes=got.size_bytes, meta=got.meta,
                        tier=tier, view=self.arena[off : off + got.size_bytes].toreadonly(),
                        generation=got.generation, entry=got,
                    )
                )
            for skey in reversed(touched_dram):
                if skey in dram.entries:
                    dram.entries.move_to_end(skey)
            if ssd is not None:
                records = [ssd.touch(skey) for skey in reversed(touched_ssd)]
        if ssd is not None and records:
            ssd.persist(records)
        return out

    def _pin_dram_hits(self, keys: list[bytes], hits: list[DramEntry]) -> list[PinnedBlock]:
        """:meth:`pin_many` when every key is a DRAM hit (lock held): the same pins, counts
        and recency (touched last-key-first), in one pass without the per-key tier checks."""
        dram = self._dram
        n = len(hits)
        self._gets += n
        self._hits += n
        dram.hits += n
        arena = self.arena
        unit = dram.allocator.alignment_bytes  # round_up, inlined: (size or 1) to whole units
        out = []
        for key, e in zip(keys, hits, strict=True):
            if e.pins == 0:
                dram.pinned_blocks += 1
                self._pinned_bytes += ((e.size_bytes or 1) + unit - 1) // unit * unit
            e.pins += 1
            off, size = e.offset, e.size_bytes
            out.append(PinnedBlock(
                key, off, size, e.info[1], Tier.DRAM, arena[off : off + size].toreadonly(),
                e.generation, e,
            ))
        move_to_end = dram.entries.move_to_end
        for e in reversed(hits):
            move_to_end(e.skey)
        return out

    def uncount_reads(self, blocks: Sequence[PinnedBlock]) -> None:
        """Take back the gets and hits :meth:`pin_many` counted for ``blocks``: pinned but
        not sent, because the reader asks for them again (past the inline Get's budget), so
        a key is counted once per request (issue 9). Pins are untouched; the SSD read of a
        promoted block stays counted on the SSD tier (it happened)."""
        with self._lock:
            self._gets -= len(blocks)
            self._hits -= len(blocks)
            self._dram.hits -= sum(1 for b in blocks if b.tier is Tier.DRAM)

    def touch_many(
        self, keys: Sequence[bytes], *, namespace_id: bytes = b"", ssd_keys: Collection[bytes] = ()
    ) -> None:
        """Touch blocks last-key-first so ``keys[0]`` ends up the most recent (chain recency).

        For a read split into several ``pin_many`` calls: touching the whole request once at
        the end makes recency follow the request's order, not the order of its chunks. Keys
        in ``ssd_keys`` (read from SSD) are touched on the SSD tier too, as ``pin_many`` does.
        Absent keys are skipped. Never pins, promotes or counts a get.
        """
        skeys = [store_key(namespace_id, k) for k in keys]
        records = []
        with self._lock:
            if self._closed:
                return
            dram, ssd = self._dram, self._ssd
            for skey in reversed(skeys):
                if skey in dram.entries:
                    dram.entries.move_to_end(skey)
            if ssd is not None and ssd_keys:
                for key, skey in zip(reversed(keys), reversed(skeys), strict=True):
                    if key in ssd_keys:
                        records.append(ssd.touch(skey))
        if ssd is not None and records:
            ssd.persist(records)

    def unpin(self, block: PinnedBlock) -> None:
        """Release one pin taken by :meth:`pin_many` (once per returned PinnedBlock).

        Raises:
            NotFound: the block is not pinned (released twice, or never pinned).
        """
        if self.unpin_many([block]):
            raise NotFound(f"block {block.key[:8].hex()} is not pinned")

    def unpin_many(self, blocks: Sequence[PinnedBlock]) -> list[PinnedBlock]:
        """Release pins taken by :meth:`pin_many` (each returned PinnedBlock once), under one
        lock acquisition, waking waiters once.

        Returns:
            The blocks that were not pinned (released twice, never pinned); the others are
            released. Never raises for them, so one stale block does not keep the rest pinned.
        """
        stale: list[PinnedBlock] = []
        dram = self._dram
        entries = dram.entries
        unit = dram.allocator.alignment_bytes
        freed = False
        with self._lock:
            for b in blocks:
                e = b.entry
                if e is None or entries.get(e.skey) is not e:  # type: ignore[attr-defined]
                    e = dram.entry_at(b.offset)  # not made by pin_many, or no longer indexed
                    if e is None or split_store_key(e.skey)[1] != b.key:
                        stale.append(b)
                        continue
                if e.pins <= 0:  # type: ignore[attr-defined]
                    stale.append(b)
                    continue
                e.pins -= 1  # type: ignore[attr-defined]
                if e.pins == 0:  # type: ignore[attr-defined]
                    dram.pinned_blocks -= 1
                    self._pinned_bytes -= ((e.size_bytes or 1) + unit - 1) // unit * unit  # type: ignore[attr-defined]
                    freed = True
            if freed:
                self._cond.notify_all()
        return stale

    def get(self, key: bytes, *, namespace_id: bytes = b"") -> tuple[bytes, bytes] | None:
        """Copy one block out: ``(value, meta)``, or None on a miss.

        Raises:
            NoCapacity: an SSD hit could not be promoted (DRAM all pinned).
        """
        got = self.pin_many([key], namespace_id=namespace_id)[0]
        if got is None:
            return None
        if isinstance(got, KvstoredError):
            raise got
        try:
            return bytes(got.view), got.meta
        finally:
            self.unpin(got)

    # ---- probes and admin (never pin, never touch recency, not counted, never wait on I/O)
    def lookup_prefix(self, keys: Sequence[bytes], *, namespace_id: bytes = b"") -> list[Tier]:
        """Tiers of the leading present blocks of a prefix in one namespace; stops at the
        first miss. DRAM is reported when a block is in both tiers."""
        namespace_id = _check_bytes("namespace_id", namespace_id)
        if set(map(type, keys)) - {bytes} or not all(keys):  # (C-level checks: issue 9)
            keys = [_check_key(k) for k in keys]
        skeys = list(map(store_key(namespace_id, b"").__add__, keys))  # the namespace's tag + key
        with self._lock:
            self._check_open()
            dram = self._dram.entries
            in_dram = list(map(dram.__contains__, skeys))
            n = in_dram.index(False) if False in in_dram else len(skeys)
            out = [Tier.DRAM] * n
            if n < len(skeys) and self._ssd is not None:  # a run of DRAM and SSD blocks
                ssd = self._ssd.entries
                for skey, hot in zip(skeys[n:], in_dram[n:]):
                    if hot:
                        out.append(Tier.DRAM)
                    elif skey in ssd:
                        out.append(Tier.SSD)
                    else:
                        break
        return out

    def exists(self, keys: Sequence[bytes], *, namespace_id: bytes = b"") -> list[bool]:
        """Per key: stored (committed) in any tier, in this namespace."""
        namespace_id = _check_bytes("namespace_id", namespace_id)
        skeys = [store_key(namespace_id, _check_key(k)) for k in keys]
        with self._lock:
            self._check_open()
            return [self._has(k) for k in skeys]

    def remove(self, keys: Sequence[bytes], *, namespace_id: bytes = b"") -> list[bool]:
        """Delete blocks of one namespace from every tier (file deletion outside the lock).

        Returns:
            Per key: True if removed; False if absent or pinned (a pinned block is kept in
            every tier).
        """
        namespace_id = _check_bytes("namespace_id", namespace_id)
        skeys = [store_key(namespace_id, _check_key(k)) for k in keys]
        out: list[bool] = []
        doomed: list[bytes] = []
        with self._lock:
            self._check_open()
            dram, ssd = self._dram, self._ssd
            for skey in skeys:
                entry = dram.entries.get(skey)
                if entry is not None and entry.pins > 0:
                    out.append(False)
                    continue
                removed = False
                if entry is not None:
                    t = self._demoting.get(skey)
                    if t is not None:
                        dram.forget(skey)  # the demoter frees the space when its write ends
                        t.removed = True
                    else:
                        dram.remove(skey)
                    removed = True
                t = self._promoting.get(skey)
                if t is not None:
                    t.removed = True
                if ssd is not None:
                    dropped = ssd.drop(skey)
                    doomed += dropped
                    removed = removed or bool(dropped)
                out.append(removed)
            self._cond.notify_all()
        if doomed and ssd is not None:
            ssd.delete_files(doomed)
        return out

    def stats(self) -> StoreStats:
        """Counters since start and current usage of each tier (never waits on disk I/O)."""
        with self._lock:
            dram = self._dram
            tiers = [
                TierStats(
                    tier=Tier.DRAM, capacity_bytes=dram.capacity_bytes,
                    used_bytes=dram.allocator.used_bytes, num_blocks=len(dram.entries),
                    hits=dram.hits, evictions=dram.evictions,
                )
            ]
            ssd = self._ssd
            put_failures = checksum_failures = 0
            if ssd is not None:
                tiers.append(
                    TierStats(
                        tier=Tier.SSD, capacity_bytes=ssd.capacity_bytes,
                        used_bytes=ssd.used_bytes, num_blocks=len(ssd.entries),
                        hits=ssd.hits, evictions=ssd.evictions,
                    )
                )
                put_failures, checksum_failures = ssd.put_failures, ssd.checksum_failures
            return StoreStats(
                tiers=tuple(tiers), gets=self._gets, hits=self._hits, misses=self._misses,
                puts=self._puts, put_failures=put_failures, checksum_failures=checksum_failures,
                pinned_blocks=dram.pinned_blocks,
            )

    def list_blocks(
        self, *, namespace_id: bytes | None = None, limit: int = 10000
    ) -> tuple[list[BlockInfo], bool]:
        """Admin listing (DRAM blocks in LRU order, then SSD-only blocks).

        Args:
            namespace_id: only blocks of this namespace; None (or b"", for the admin RPC) =
                every namespace.
            limit: most blocks returned, >= 0.

        Returns:
            ``(blocks, truncated)``; ``truncated`` is True when more blocks matched.
        """
        if limit < 0:
            raise InvalidArgument(f"limit must be >= 0, got {limit}")
        out: list[BlockInfo] = []
        with self._lock:
            ssd_entries = self._ssd.entries if self._ssd is not None else {}
            for skey, e in self._dram.entries.items():
                if namespace_id and e.namespace_id != namespace_id:
                    continue
                if len(out) >= limit:
                    return out, True
                s = ssd_entries.get(skey)
                tiers = (Tier.DRAM, Tier.SSD) if s is not None else (Tier.DRAM,)
                gens = (e.generation, s.generation) if s is not None else (e.generation,)
                key = split_store_key(skey)[1]
                out.append(BlockInfo(key, e.size_bytes, e.namespace_id, tiers, e.pins > 0, gens,
                                     copy=skey in self._dram.copies))
            for skey, s in ssd_entries.items():
                if skey in self._dram.entries:
                    continue
                if namespace_id and s.namespace_id != namespace_id:
                    continue
                if len(out) >= limit:
                    return out, True
                key = split_store_key(skey)[1]
                out.append(BlockInfo(key, s.size_bytes, s.namespace_id, (Tier.SSD,), False,
                                     (s.generation,)))
        return out, False

    # ---- lifecycle ---------------------------------------------------------------------
    def start_prefault(self) -> None:
        """Fault the DRAM arena in from a background thread (see ``DramArena.start_prefault``)."""
        self._arena.start_prefault()

    def close(self) -> None:
        """Wait for transfers between tiers, flush and close the SSD index, unmap and unlink
        the arena; idempotent. Views handed out earlier must not be used afterwards."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
            while self._demoting or self._promoting:
                self._cond.wait()
            try:
                if self._ssd is not None:
                    self._ssd.close()
            finally:
                self._reservations.clear()
                self.arena = memoryview(b"")
                self._arena.close()

    def __enter__(self) -> TieredStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
