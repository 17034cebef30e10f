"""Reading blocks out of the store for export (spill): coldest first, never promoting.

:class:`Exports` is the store component (built with the
:class:`~kvstored.tiers.state.StoreState` and the :class:`~kvstored.tiers.reads.Reads` that
releases pins) behind ``TieredStore.coldest_blocks`` / ``read_for_export`` /
``release_export``; the contracts are on the facade (tiered.py). A node that moves its coldest blocks
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

Buffers: a call's SSD-only blocks are read into one page-aligned anonymous mapping
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
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, cast

from kvstored.errors import NotFound
from kvstored.tiers.ssd_format import round_up_page, split_store_key, store_key
from kvstored.types import BlockInfo, ExportedBlock, PinnedBlock, Tier

if TYPE_CHECKING:
    from kvstored.tiers.reads import Reads
    from kvstored.tiers.ssd_format import SsdEntry
    from kvstored.tiers.state import StoreState

DEFAULT_MAX_SCAN = 4096
"""Entries :meth:`Exports.coldest_blocks` examines at most per call."""
EXPORT_POOL_MAX_BYTES = 64 << 20
"""Most bytes of released read buffers a store keeps for its next exports."""


class ExportBuffer:
    """One page-aligned mapping the SSD reads of one ``read_for_export`` call share.

    Attributes:
        mm: the anonymous mapping (``len(mm)`` bytes, a multiple of the page size).
        live: blocks read into it not yet released; at 0 it goes back to the pool.
    """

    __slots__ = ("live", "mm")

    def __init__(self, num_bytes: int) -> None:
        self.mm = mmap.mmap(-1, num_bytes)
        self.live = 0


class Exports:
    """``coldest_blocks`` / ``read_for_export`` / ``release_export`` of one store (module
    docstring; contracts on ``TieredStore``).

    Args:
        state: the store's shared state.
        reads: releases the DRAM pins of exported blocks.

    Attributes:
        pool: released read buffers kept for the next exports (newest last), or None
            before the first release; changed with the store lock held.
    """

    def __init__(self, state: StoreState, reads: Reads) -> None:
        self._state = state
        self._reads = reads
        self.pool: list[ExportBuffer] | None = None

    def coldest_blocks(
        self, limit: int, *, exclude: Collection[tuple[bytes, bytes]] = (),
        max_scan: int = DEFAULT_MAX_SCAN,
    ) -> list[BlockInfo]:
        """``TieredStore.coldest_blocks`` (contract there)."""
        out: list[BlockInfo] = []
        if limit <= 0:
            return out
        st = self._state
        with st.lock:
            st.check_open()
            demoting, promoting = st.demoting, st.promoting
            dram, ssd = st.dram.entries, st.ssd.entries if st.ssd is not None else {}
            if st.ssd is not None and st.ssd.capacity_bytes > 0:
                for n, (skey, s) in enumerate(ssd.items()):
                    if len(out) >= limit or n >= max_scan:
                        break
                    if skey in dram or skey in promoting:
                        continue
                    ns, key = split_store_key(skey)
                    if (ns, key) in exclude:
                        continue
                    out.append(BlockInfo(key, s.size_bytes, ns, (Tier.SSD,), False))
            copies = st.dram.copies  # remote-fill copies (spare.py): a peer holds them
            for pass_copies in (True, False):  # copies first (oldest first), then DRAM LRU
                source = ((k, dram[k]) for k in copies if k in dram) if pass_copies else dram.items()
                for n, (skey, e) in enumerate(source):
                    if len(out) >= limit or n >= max_scan:
                        break
                    if not pass_copies and skey in copies:
                        continue  # taken in the first pass
                    if e.pins > 0 or skey in demoting or skey in promoting:
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
        """``TieredStore.read_for_export`` (contract there)."""
        skeys = [store_key(namespace_id, bytes(k)) for k in keys]
        out: list[ExportedBlock | None] = [None] * len(skeys)
        reads: list[tuple[int, bytes, SsdEntry, memoryview]] = []
        found: list[tuple[int, bytes, SsdEntry]] = []
        buffer: ExportBuffer | None = None
        st = self._state
        with st.lock:
            st.check_open()
            dram, ssd = st.dram, st.ssd
            for i, (key, skey) in enumerate(zip(keys, skeys, strict=True)):
                e = dram.entries.get(skey)
                if e is not None:
                    st.pin(e)
                    view = st.arena[e.offset : e.offset + e.size_bytes].toreadonly()
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
                buffer = self._take_buffer(
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
        with st.lock:
            for (i, skey, s, buf), reason in zip(reads, reasons, strict=True):
                doomed += ssd.end_read(skey, s, reason)
                if not reason:
                    buffer.live += 1
                    out[i] = ExportedBlock(bytes(keys[i]), namespace_id, s.size_bytes, s.meta,
                                           Tier.SSD, buf[: s.size_bytes].toreadonly(),
                                           generation=s.generation, buffer=buffer)
            if not buffer.live:  # every read failed: nothing refers to it
                self._give_buffer(buffer)
        if doomed:
            ssd.delete_files(doomed)
        return out

    def _take_buffer(self, num_bytes: int) -> ExportBuffer:
        """The smallest pooled buffer of at least ``num_bytes``, else a new one (lock held)."""
        pool = self.pool
        if pool:
            fits = [b for b in pool if len(b.mm) >= num_bytes]
            if fits:
                best = min(fits, key=lambda b: len(b.mm))
                pool.remove(best)
                return best
        return ExportBuffer(num_bytes)

    def _give_buffer(self, buffer: ExportBuffer) -> None:
        """Keep a buffer no block refers to any more for a next export (lock held); the
        pool keeps the newest up to :data:`EXPORT_POOL_MAX_BYTES` (a larger one is dropped,
        freed once the last view of it goes)."""
        if len(buffer.mm) > EXPORT_POOL_MAX_BYTES:
            return
        pool = self.pool
        if pool is None:
            pool = self.pool = []
        pool.append(buffer)
        total = sum(len(b.mm) for b in pool)
        while total > EXPORT_POOL_MAX_BYTES:
            total -= len(pool.pop(0).mm)

    def release_export(self, blocks: Sequence[ExportedBlock | None]) -> None:
        """``TieredStore.release_export`` (contract there).

        Raises:
            NotFound: a block released twice.
        """
        freed: list[ExportBuffer] = []
        for b in blocks:
            if b is None:
                continue
            if b.pinned is not None:
                self._reads.unpin(b.pinned)
            elif b.buffer is not None:
                freed.append(cast(ExportBuffer, b.buffer))  # the store made it
        if freed:
            with self._state.lock:
                for buffer in freed:
                    buffer.live -= 1
                    if buffer.live == 0:
                        self._give_buffer(buffer)
                    elif buffer.live < 0:
                        raise NotFound("an SSD block read for export was released twice")
