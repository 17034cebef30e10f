"""Reading blocks out of the store for export (spill): coldest first, never promoting.

A mixin of :class:`~kvstored.tiers.tiered.TieredStore` (its state: ``_lock``, ``_dram``,
``_ssd``, ``_demoting``, ``_promoting``, ``arena``). A node that moves its coldest blocks
to a peer (kvstored/node/spill.py) must neither list the whole store per batch nor promote
the blocks it moves (a promotion would demote other blocks into the very tier that is
full), nor count its reads as gets or make its victims recent::

    coldest_blocks(limit)        the eviction order, walked from its cold end, bounded:
                                 SSD-only blocks first (SSD LRU order) when the store has
                                 an SSD tier, then DRAM blocks (DRAM LRU order; chain
                                 recency puts chain tails first); pinned and in-transit
                                 blocks skipped
    read_for_export(keys)        DRAM block  -> pinned in place (no recency touch)
                                 SSD-only    -> read from its file into a private buffer,
                                                checksum-verified (a bad file is dropped,
                                                as a promotion would); DRAM untouched
    release_export(blocks)       unpins the DRAM ones; hands the SSD reads' buffer back

Buffers (issue 9): a call's SSD-only blocks are read into one page-aligned anonymous mapping
(each block at a page-aligned offset, as O_DIRECT needs), taken from a small pool per store
and handed back to it once every block read into it is released; the pool keeps at most
:data:`EXPORT_POOL_MAX_BYTES`. A fresh mapping per block cost an mmap, its page faults and
an munmap per block: a peer's read was 1.6-2.5x slower than an engine's promotion into the
(prefaulted) arena (bench/bench_export_ssd.py).

Neither method waits on another thread's disk I/O; only ``read_for_export`` does disk I/O
(its own reads, the lock released).
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any, cast

from kvstored.errors import NotFound
from kvstored.types import BlockInfo, ExportedBlock, PinnedBlock, Tier
from kvstored.tiers.ssd_format import round_up_page, split_store_key, store_key

if TYPE_CHECKING:
    from kvstored.tiers.dram import DramEntry, DramTier
    from kvstored.tiers.ssd import SsdEntry, SsdTier

DEFAULT_MAX_SCAN = 4096
"""Entries :meth:`ExportMixin.coldest_blocks` examines at most per call."""
EXPORT_POOL_MAX_BYTES = 64 << 20
"""Most bytes of released read buffers a store keeps for its next exports."""


class ExportBuffer:
    """One page-aligned mapping the SSD reads of one ``read_for_export`` call share.

    Attributes:
        mm: the anonymous mapping (``len(mm)`` bytes, a multiple of the page size).
        live: blocks read into it not yet released; at 0 it goes back to the pool.
    """

    __slots__ = ("mm", "live")

    def __init__(self, num_bytes: int) -> None:
        self.mm = mmap.mmap(-1, num_bytes)
        self.live = 0


class ExportMixin:
    """``coldest_blocks`` / ``read_for_export`` / ``release_export`` (module docstring)."""

    _lock: threading.Lock
    _dram: DramTier
    _ssd: SsdTier | None
    _demoting: dict[bytes, Any]
    _promoting: dict[bytes, Any]
    arena: memoryview

    _export_pool: list[ExportBuffer] | None = None  # per store, made on first use

    def _check_open(self) -> None: ...
    def _pin(self, entry: DramEntry) -> None: ...
    def unpin(self, block: PinnedBlock) -> None: ...

    def coldest_blocks(
        self, limit: int, *, exclude: Collection[tuple[bytes, bytes]] = (),
        max_scan: int = DEFAULT_MAX_SCAN,
    ) -> list[BlockInfo]:
        """Up to ``limit`` unpinned blocks in eviction order, coldest first.

        SSD-only blocks first when the store has an SSD tier (it is then the last tier:
        they were demoted longest ago), in SSD LRU order; then remote-fill copies (oldest
        first: duplicates of a peer's block, ``BlockInfo.copy``); then DRAM blocks in LRU
        order.
        Skipped: pinned blocks, blocks being demoted or promoted, ``exclude``. Walks at most
        ``max_scan`` entries from the cold end of each map, so a call costs O(limit +
        skipped), never O(blocks stored). Never pins, touches recency or counts a get.

        Args:
            limit: most blocks returned (>= 0).
            exclude: ``(namespace_id, key)`` pairs to skip (blocks whose move failed lately).
            max_scan: most entries examined per tier.

        Returns:
            BlockInfo per block (``tiers`` = ``(SSD,)`` for an SSD-only block, else DRAM
            first, plus SSD when it also has an SSD copy), coldest first.

        Raises:
            Unavailable: the store is closed.
        """
        out: list[BlockInfo] = []
        if limit <= 0:
            return out
        with self._lock:
            self._check_open()
            dram, ssd = self._dram.entries, self._ssd.entries if self._ssd is not None else {}
            if self._ssd is not None and self._ssd.capacity_bytes > 0:
                for n, (skey, s) in enumerate(ssd.items()):
                    if len(out) >= limit or n >= max_scan:
                        break
                    if skey in dram or skey in self._promoting:
                        continue
                    ns, key = split_store_key(skey)
                    if (ns, key) in exclude:
                        continue
                    out.append(BlockInfo(key, s.size_bytes, ns, (Tier.SSD,), False))
            copies = self._dram.copies  # remote-fill copies (spare.py): a peer holds them
            for pass_copies in (True, False):  # copies first (oldest first), then DRAM LRU
                source = ((k, dram[k]) for k in copies if k in dram) if pass_copies else dram.items()
                for n, (skey, e) in enumerate(source):
                    if len(out) >= limit or n >= max_scan:
                        break
                    if not pass_copies and skey in copies:
                        continue  # taken in the first pass
                    if e.pins > 0 or skey in self._demoting or skey in self._promoting:
                        continue
                    ns, key = split_store_key(skey)
                    if (ns, key) in exclude:
                        continue
                    tiers = (Tier.DRAM, Tier.SSD) if skey in ssd else (Tier.DRAM,)
                    out.append(BlockInfo(key, e.size_bytes, ns, tiers, False,
                                         copy=pass_copies))
        return out

    def read_for_export(
        self, keys: Sequence[bytes], *, namespace_id: bytes = b""
    ) -> list[ExportedBlock | None]:
        """Blocks of one namespace for sending elsewhere, without promoting any.

        A DRAM block is pinned in place; an SSD-only block is read from its file into a
        private page-aligned buffer and verified against its checksum (a block whose file
        is bad is dropped, counted in ``checksum_failures``, and answered None, as a
        promotion would). Never promotes, demotes, touches recency or counts a get.
        Release every returned block with :meth:`release_export`.

        Args:
            keys: block keys.
            namespace_id: their namespace.

        Returns:
            Per key: the block, or None (absent, gone meanwhile, or its file unreadable).

        Raises:
            Unavailable: the store is closed.
        """
        skeys = [store_key(namespace_id, bytes(k)) for k in keys]
        out: list[ExportedBlock | None] = [None] * len(skeys)
        reads: list[tuple[int, bytes, SsdEntry, memoryview]] = []
        found: list[tuple[int, bytes, SsdEntry]] = []
        buffer: ExportBuffer | None = None
        with self._lock:
            self._check_open()
            dram, ssd = self._dram, self._ssd
            for i, (key, skey) in enumerate(zip(keys, skeys, strict=True)):
                e = dram.entries.get(skey)
                if e is not None:
                    self._pin(e)
                    view = self.arena[e.offset : e.offset + e.size_bytes].toreadonly()
                    pin = PinnedBlock(key=bytes(key), offset=e.offset, size_bytes=e.size_bytes,
                                      meta=e.meta, tier=Tier.DRAM, view=view,
                                      generation=e.generation)
                    out[i] = ExportedBlock(bytes(key), namespace_id, e.size_bytes, e.meta,
                                           Tier.DRAM, view, pin, e.generation)
                    continue
                s = ssd.entries.get(skey) if ssd is not None else None
                if s is not None:
                    found.append((i, skey, s))
            if found:
                buffer = self._take_export_buffer(
                    sum(round_up_page(max(s.size_bytes, 1)) for _, _, s in found))
        if buffer is None:
            return out
        assert ssd is not None
        whole, off = memoryview(buffer.mm), 0
        for i, skey, s in found:
            reads.append((i, skey, s, whole[off : off + round_up_page(max(s.size_bytes, 1))]))
            off += round_up_page(max(s.size_bytes, 1))
        reasons = ssd.read_files([(skey, s, buf) for _, skey, s, buf in reads])
        doomed: list[bytes] = []
        with self._lock:
            for (i, skey, s, buf), reason in zip(reads, reasons, strict=True):
                doomed += ssd.end_read(skey, s, reason)
                if not reason:
                    buffer.live += 1
                    out[i] = ExportedBlock(bytes(keys[i]), namespace_id, s.size_bytes, s.meta,
                                           Tier.SSD, buf[: s.size_bytes].toreadonly(),
                                           generation=s.generation, buffer=buffer)
            if not buffer.live:  # every read failed: nothing refers to it
                self._give_export_buffer(buffer)
        if doomed:
            ssd.delete_files(doomed)
        return out

    def _take_export_buffer(self, num_bytes: int) -> ExportBuffer:
        """The smallest pooled buffer of at least ``num_bytes``, else a new one (lock held)."""
        pool = self._export_pool
        if pool:
            fits = [b for b in pool if len(b.mm) >= num_bytes]
            if fits:
                best = min(fits, key=lambda b: len(b.mm))
                pool.remove(best)
                return best
        return ExportBuffer(num_bytes)

    def _give_export_buffer(self, buffer: ExportBuffer) -> None:
        """Keep a buffer no block refers to any more for a next export (lock held); the
        pool keeps the newest up to :data:`EXPORT_POOL_MAX_BYTES` (a larger one is dropped,
        freed once the last view of it goes)."""
        if len(buffer.mm) > EXPORT_POOL_MAX_BYTES:
            return
        pool = self._export_pool
        if pool is None:
            pool = self._export_pool = []
        pool.append(buffer)
        total = sum(len(b.mm) for b in pool)
        while total > EXPORT_POOL_MAX_BYTES:
            total -= len(pool.pop(0).mm)

    def release_export(self, blocks: Sequence[ExportedBlock | None]) -> None:
        """Release blocks :meth:`read_for_export` returned (each exactly once; None skipped).

        An SSD block's view is reused by a later export once every block of its call is
        released: never read a view after releasing it.

        Raises:
            NotFound: a block released twice.
        """
        freed: list[ExportBuffer] = []
        for b in blocks:
            if b is None:
                continue
            if b.pinned is not None:
                self.unpin(b.pinned)
            elif b.buffer is not None:
                freed.append(cast(ExportBuffer, b.buffer))  # the store made it
        if freed:
            with self._lock:
                for buffer in freed:
                    buffer.live -= 1
                    if buffer.live == 0:
                        self._give_export_buffer(buffer)
                    elif buffer.live < 0:
                        raise NotFound("an SSD block read for export was released twice")
