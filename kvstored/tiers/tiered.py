"""TieredStore: the node's block store over a DRAM arena and an optional SSD directory.

No gRPC in here: the node service is a thin adapter over this class.

::

          put                                   pin_many (get)
           |                                        |
     reserve(key,size) --alloc--+            DRAM hit? -- pin, touch (tail-first)
           |                    | full?          | no
     caller fills view          v                v
     (outside the lock)   evict LRU unpinned   SSD hit? -- alloc in DRAM (may evict),
           |              DRAM blocks:           |        read + verify checksum,
     commit / abort       demote to SSD unless   |        pin; SSD copy kept (inclusive)
                          already there          v
                                               miss (None)

    DRAM tier  (dram.py)   arena + BlockAllocator + OrderedDict[key -> DramEntry]  (LRU first)
    SSD tier   (ssd.py)    files + rocksdict index + OrderedDict[key -> SsdEntry]  (LRU first)

Invariants (all guarded by ``self._lock``, one ``threading.RLock``):

- A block is visible (``pin_many``, ``exists``, ``lookup_prefix``...) only once committed.
  Reservations own arena space but are in no LRU, so a block being written is never evicted.
- A block with ``pins > 0`` is never evicted, freed or removed.
- DRAM usage (committed + reserved, rounded to 4096) never exceeds the arena; SSD usage never
  exceeds ``ssd_size_bytes``. When an allocation does not fit, LRU unpinned DRAM blocks are
  evicted (demoted to SSD when configured and not already there) until it fits, else
  :class:`NoCapacity` and nothing was evicted in vain if the space could never suffice.
- A failed demotion (ENOSPC, EIO) drops the evicted block (a later miss), is counted in
  ``put_failures`` and logged as a warning; no other block is touched.
- Tiers are inclusive: an SSD hit is promoted into DRAM and keeps its SSD copy; evicting a
  DRAM block that is also on SSD only frees DRAM.
- Chain-aware recency: ``pin_many`` touches its hits last-key-first and ``commit_many``
  inserts last-first, so the head of a chain is the most recent and is evicted last.
- First commit wins: two reservations of one key may coexist; the later commit returns False
  and frees its space. Nothing ever serves bytes that did not pass through a commit or an SSD
  checksum check.
- Pins are counted per block, not per holder: release each PinnedBlock exactly once.

Locking: every public method takes ``self._lock`` for its metadata work. Callers copy bytes
into ``Reservation.view`` / out of ``PinnedBlock.view`` *outside* the lock; the reservation
or pin keeps that range stable. In this first version SSD I/O (demotion writes, promotion
reads, spill) happens *under* the lock, so a slow SSD stalls other callers meanwhile.
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
    NamespaceMismatch,
    NoCapacity,
    NotFound,
    StorageIOError,
    Unavailable,
)
from kvstored.tiers.base import BlockInfo, PinnedBlock, Reservation, StoreStats, Tier, TierStats
from kvstored.tiers.dram import DramArena, DramEntry, DramTier
from kvstored.tiers.ssd import SsdTier

if TYPE_CHECKING:
    from kvstored.config import NodeConfig

log = structlog.get_logger(__name__)

_INTERN_MAX_ENTRIES = 65536


class _Pending:
    """A reservation's bookkeeping (the caller holds the public :class:`Reservation`)."""

    __slots__ = ("key", "offset", "size_bytes", "info")

    def __init__(self, key: bytes, offset: int, size_bytes: int, info: tuple[bytes, bytes]):
        self.key = key
        self.offset = offset
        self.size_bytes = size_bytes
        self.info = info


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


def _ns_conflict(stored: bytes, requested: bytes) -> bool:
    return bool(stored) and bool(requested) and stored != requested


class TieredStore:
    """The block store of one node: DRAM arena + optional SSD tier, LRU with pins.

    Thread-safe: one lock guards all metadata (see the module docstring).

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
        StorageIOError: the arena file or the SSD directory/index cannot be opened.
    """

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
        if dram_size_bytes < 4096:
            raise InvalidArgument(
                f"dram_size_bytes must be at least 4096, got {dram_size_bytes}; "
                "set node.dram_size_bytes"
            )
        if max_block_bytes <= 0:
            raise InvalidArgument(f"max_block_bytes must be > 0, got {max_block_bytes}")
        if ssd_size_bytes < 0:
            raise InvalidArgument(f"ssd_size_bytes must be >= 0, got {ssd_size_bytes}")
        self._lock = threading.RLock()
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
                )
            except BaseException:
                self._arena.close()
                raise
        self.arena_path: str | None = self._arena.path
        self.arena: memoryview = self._arena.view
        self.arena_size_bytes: int = self._arena.size_bytes
        self._reservations: dict[int, _Pending] = {}
        self._reservation_ids = itertools.count(1)
        self._reserved_bytes = 0
        self._pinned_bytes = 0
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
        """One shared ``(namespace_id, meta)`` tuple per distinct pair (most blocks repeat a
        few: one namespace per model, one dtype/shape per layout); bounded table."""
        info = (namespace_id, meta)
        got = self._info_table.get(info)
        if got is not None:
            return got
        if len(self._info_table) < _INTERN_MAX_ENTRIES:
            self._info_table[info] = info
        return info

    def _intern_size(self, size_bytes: int) -> int:
        """One shared int object per distinct block size (sizes > 256 are not cached by
        CPython; a model has a handful of block sizes); bounded table."""
        got = self._size_table.get(size_bytes)
        if got is not None:
            return got
        if len(self._size_table) < _INTERN_MAX_ENTRIES:
            self._size_table[size_bytes] = size_bytes
        return size_bytes

    def _check_open(self) -> None:
        if self._closed:
            raise Unavailable("the block store is closed")

    def _has(self, key: bytes) -> bool:
        return key in self._dram.entries or (self._ssd is not None and key in self._ssd.entries)

    def _pin(self, entry: DramEntry) -> None:
        if entry.pins == 0:
            self._dram.pinned_blocks += 1
            self._pinned_bytes += self._dram.round_up(entry.size_bytes)
        entry.pins += 1

    def _evict_dram(self, key: bytes) -> None:
        entry = self._dram.entries[key]
        ssd = self._ssd
        if ssd is not None and key not in ssd.entries:
            off = entry.offset
            ssd.write(
                key, self.arena[off : off + entry.size_bytes],
                namespace_id=entry.namespace_id, meta=entry.meta,
            )  # a failed demotion is counted and logged by the SSD tier; the block is dropped
        self._dram.remove(key)
        self._dram.evictions += 1

    def _allocate(self, size_bytes: int) -> int:
        """Arena space for ``size_bytes``, evicting LRU unpinned blocks if needed.

        Raises:
            NoCapacity: the block can never fit beside the pinned and reserved blocks; in that
                case nothing is evicted.
        """
        alloc = self._dram.allocator
        need = alloc.round_up(size_bytes)
        off = alloc.allocate(size_bytes)
        if off is not None:
            return off
        evictable = alloc.used_bytes - self._reserved_bytes - self._pinned_bytes
        if need > alloc.free_bytes + evictable:
            raise NoCapacity(
                f"DRAM tier cannot fit a {size_bytes}-byte block: capacity "
                f"{alloc.capacity_bytes} bytes, {self._pinned_bytes} pinned, "
                f"{self._reserved_bytes} reserved by writes in progress"
            )
        while off is None:
            victim = self._dram.first_unpinned()
            if victim is None:
                raise NoCapacity(
                    f"DRAM tier cannot fit a {size_bytes}-byte block: every block is pinned "
                    "or being written (fragmented arena)"
                )
            self._evict_dram(victim)
            off = alloc.allocate(size_bytes)
        return off

    # ---- put ---------------------------------------------------------------------------
    def reserve(
        self, key: bytes, size_bytes: int, *, namespace_id: bytes = b"", meta: bytes = b""
    ) -> Reservation | None:
        """Reserve arena space for a block the caller will write.

        Fill ``reservation.view`` (outside any lock), then :meth:`commit` or :meth:`abort`.
        The block stays invisible to readers until committed. May evict LRU unpinned blocks
        (demoting them to SSD).

        Args:
            key: block hash, non-empty.
            size_bytes: exact block size, 0 <= size <= ``max_block_bytes``.
            namespace_id: namespace stored with the block (b"" = none).
            meta: opaque metadata returned with the block.

        Returns:
            The reservation, or None when the key is already stored (complete) in either tier:
            an idempotent success with nothing to write.

        Raises:
            KeyInvalid: empty or non-bytes key.
            InvalidArgument: negative size or non-bytes namespace/meta.
            BlockTooLarge: ``size_bytes > max_block_bytes``.
            NoCapacity: retriable; DRAM is full of pinned blocks and writes in progress.
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
        with self._lock:
            self._check_open()
            if self._has(key):
                return None
            offset = self._allocate(size_bytes)
            rid = next(self._reservation_ids)
            self._reservations[rid] = _Pending(
                key, offset, self._intern_size(size_bytes), self._intern_info(namespace_id, meta)
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
        if self._has(pending.key):
            self._dram.allocator.free(pending.offset, pending.size_bytes)
            return False
        self._dram.entries[pending.key] = DramEntry(
            pending.offset, pending.size_bytes, pending.info
        )
        self._puts += 1
        return True

    def commit(self, reservation: Reservation) -> bool:
        """Make a reserved block visible (most recent in DRAM).

        Returns:
            True if the block is stored now; False if the key was committed meanwhile by
            another writer (first commit wins; this reservation's space is freed).

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
            True if stored now, False if the key already existed (idempotent success).

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
        self, keys: Sequence[bytes], *, namespace_id: bytes = b""
    ) -> list[PinnedBlock | None | KvstoredError]:
        """Pin blocks in DRAM for reading, promoting SSD hits into DRAM first.

        Each returned :class:`PinnedBlock` must be released with :meth:`unpin` once its view
        has been copied. Hits are touched last-key-first, so ``keys[0]`` (a chain's head) ends
        up the most recent. Counts one get per key, and hits/misses per tier.

        Args:
            keys: block keys, typically one prefix in chain order.
            namespace_id: the reader's namespace (b"" = accept any).

        Returns:
            Per key: a PinnedBlock, None (miss, including a block dropped for a bad checksum),
            or an error object: NamespaceMismatch (both namespaces non-empty and different),
            NoCapacity (an SSD hit could not be promoted: DRAM all pinned). Errors count as
            misses and hold no pin.

        Raises:
            KeyInvalid: a key is empty or not bytes (nothing is pinned then).
            Unavailable: the store is closed.
        """
        checked = [_check_key(k) for k in keys]
        namespace_id = _check_bytes("namespace_id", namespace_id)
        out: list[PinnedBlock | None | KvstoredError] = []
        with self._lock:
            self._check_open()
            dram, ssd = self._dram, self._ssd
            touched_dram: list[bytes] = []
            touched_ssd: list[bytes] = []
            for key in checked:
                self._gets += 1
                entry = dram.entries.get(key)
                tier = Tier.DRAM
                if entry is None and ssd is not None and key in ssd.entries:
                    sentry = ssd.entries[key]
                    if _ns_conflict(sentry.namespace_id, namespace_id):
                        out.append(self._mismatch(key, sentry.namespace_id, namespace_id))
                        continue
                    ssd.entries.move_to_end(key)  # keep it from being evicted by our demotions
                    try:
                        offset = self._allocate(sentry.size_bytes)
                    except NoCapacity as exc:
                        self._misses += 1
                        out.append(exc)
                        continue
                    size = sentry.size_bytes
                    if key not in ssd.entries or not ssd.read_into(
                        key, self.arena[offset : offset + dram.round_up(size)]
                    ):
                        dram.allocator.free(offset, size)
                        self._misses += 1
                        out.append(None)
                        continue
                    entry = DramEntry(offset, self._intern_size(size), sentry.info)
                    dram.entries[key] = entry
                    tier = Tier.SSD
                    ssd.hits += 1
                    touched_ssd.append(key)
                elif entry is None:
                    self._misses += 1
                    out.append(None)
                    continue
                elif _ns_conflict(entry.namespace_id, namespace_id):
                    out.append(self._mismatch(key, entry.namespace_id, namespace_id))
                    continue
                else:
                    dram.hits += 1
                self._hits += 1
                self._pin(entry)
                touched_dram.append(key)
                off = entry.offset
                out.append(
                    PinnedBlock(
                        key=key, offset=off, size_bytes=entry.size_bytes, meta=entry.meta,
                        tier=tier, view=self.arena[off : off + entry.size_bytes].toreadonly(),
                    )
                )
            for key in reversed(touched_dram):
                dram.entries.move_to_end(key)
            if ssd is not None:
                for key in reversed(touched_ssd):
                    if key in ssd.entries:
                        ssd.touch(key)
        return out

    def touch_many(self, keys: Sequence[bytes], *, ssd_keys: Collection[bytes] = ()) -> None:
        """Touch blocks last-key-first so ``keys[0]`` ends up the most recent (chain recency).

        For a read split into several ``pin_many`` calls: touching the whole request once at
        the end makes recency follow the request's order, not the order of its chunks. Keys
        in ``ssd_keys`` (read from SSD) are touched on the SSD tier too, as ``pin_many`` does.
        Absent keys are skipped. Never pins, promotes or counts a get.
        """
        with self._lock:
            if self._closed:
                return
            dram, ssd = self._dram, self._ssd
            for key in reversed(keys):
                if key in dram.entries:
                    dram.entries.move_to_end(key)
            if ssd is not None and ssd_keys:
                for key in reversed(keys):
                    if key in ssd_keys and key in ssd.entries:
                        ssd.touch(key)

    def _mismatch(self, key: bytes, stored: bytes, requested: bytes) -> NamespaceMismatch:
        self._misses += 1
        return NamespaceMismatch(
            f"block {key[:8].hex()} is stored under namespace {stored.hex()[:16]}, "
            f"not the requested {requested.hex()[:16]}"
        )

    def unpin(self, block: PinnedBlock) -> None:
        """Release one pin taken by :meth:`pin_many` (once per returned PinnedBlock).

        Raises:
            NotFound: the block is not pinned (released twice, or never pinned).
        """
        with self._lock:
            entry = self._dram.entries.get(block.key)
            if entry is None or entry.offset != block.offset or entry.pins <= 0:
                raise NotFound(f"block {block.key[:8].hex()} is not pinned")
            entry.pins -= 1
            if entry.pins == 0:
                self._dram.pinned_blocks -= 1
                self._pinned_bytes -= self._dram.round_up(entry.size_bytes)

    def get(self, key: bytes, *, namespace_id: bytes = b"") -> tuple[bytes, bytes] | None:
        """Copy one block out: ``(value, meta)``, or None on a miss.

        Raises:
            NamespaceMismatch: the block is stored under another namespace.
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

    # ---- probes and admin (never pin, never touch recency, not counted) --------------
    def lookup_prefix(self, keys: Sequence[bytes], *, namespace_id: bytes = b"") -> list[Tier]:
        """Tiers of the leading present blocks of a prefix; stops at the first miss.

        A namespace mismatch counts as a miss. DRAM is reported when a block is in both tiers.
        """
        namespace_id = _check_bytes("namespace_id", namespace_id)
        out: list[Tier] = []
        with self._lock:
            self._check_open()
            for key in keys:
                key = _check_key(key)
                entry = self._dram.entries.get(key)
                if entry is not None:
                    if _ns_conflict(entry.namespace_id, namespace_id):
                        break
                    out.append(Tier.DRAM)
                    continue
                sentry = self._ssd.entries.get(key) if self._ssd is not None else None
                if sentry is None or _ns_conflict(sentry.namespace_id, namespace_id):
                    break
                out.append(Tier.SSD)
        return out

    def exists(self, keys: Sequence[bytes]) -> list[bool]:
        """Per key: stored (committed) in any tier."""
        checked = [_check_key(k) for k in keys]
        with self._lock:
            self._check_open()
            return [self._has(k) for k in checked]

    def remove(self, keys: Sequence[bytes]) -> list[bool]:
        """Delete blocks from every tier.

        Returns:
            Per key: True if removed; False if absent or pinned (a pinned block is kept in
            every tier).
        """
        checked = [_check_key(k) for k in keys]
        out: list[bool] = []
        with self._lock:
            self._check_open()
            for key in checked:
                entry = self._dram.entries.get(key)
                if entry is not None and entry.pins > 0:
                    out.append(False)
                    continue
                removed = False
                if entry is not None:
                    self._dram.remove(key)
                    removed = True
                if self._ssd is not None and self._ssd.delete(key):
                    removed = True
                out.append(removed)
        return out

    def stats(self) -> StoreStats:
        """Counters since start and current usage of each tier."""
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
        self, *, namespace_id: bytes = b"", limit: int = 10000
    ) -> tuple[list[BlockInfo], bool]:
        """Admin listing (DRAM blocks in LRU order, then SSD-only blocks).

        Args:
            namespace_id: only blocks stored under this namespace (b"" = all).
            limit: most blocks returned, >= 0.

        Returns:
            ``(blocks, truncated)``; ``truncated`` is True when more blocks matched.
        """
        if limit < 0:
            raise InvalidArgument(f"limit must be >= 0, got {limit}")
        out: list[BlockInfo] = []
        with self._lock:
            ssd_entries = self._ssd.entries if self._ssd is not None else {}
            for key, e in self._dram.entries.items():
                if namespace_id and e.namespace_id != namespace_id:
                    continue
                if len(out) >= limit:
                    return out, True
                tiers = (Tier.DRAM, Tier.SSD) if key in ssd_entries else (Tier.DRAM,)
                out.append(BlockInfo(key, e.size_bytes, e.namespace_id, tiers, e.pins > 0))
            for key, s in ssd_entries.items():
                if key in self._dram.entries:
                    continue
                if namespace_id and s.namespace_id != namespace_id:
                    continue
                if len(out) >= limit:
                    return out, True
                out.append(BlockInfo(key, s.size_bytes, s.namespace_id, (Tier.SSD,), False))
        return out, False

    # ---- lifecycle ---------------------------------------------------------------------
    def start_prefault(self) -> None:
        """Fault the DRAM arena in from a background thread (see ``DramArena.start_prefault``)."""
        self._arena.start_prefault()

    def spill_to_ssd(self) -> int:
        """Write every DRAM-only block to the SSD tier (graceful shutdown), LRU first.

        DRAM keeps its copies. Blocks that fail to write are counted in ``put_failures``.

        Returns:
            Number of blocks written (0 without an SSD tier).
        """
        with self._lock:
            self._check_open()
            ssd = self._ssd
            if ssd is None:
                return 0
            num = 0
            for key, e in list(self._dram.entries.items()):
                if key in ssd.entries:
                    continue
                view = self.arena[e.offset : e.offset + e.size_bytes]
                if ssd.write(key, view, namespace_id=e.namespace_id, meta=e.meta):
                    num += 1
            log.info("blocks_spilled", num_blocks=num)
            return num

    def close(self) -> None:
        """Flush and close the SSD index, unmap and unlink the arena; idempotent.

        Views handed out earlier must not be used afterwards.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
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
