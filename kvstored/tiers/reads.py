"""The store's read side: pins, releases, recency, probes and the admin listing.

:class:`Reads` is the store component (built with the
:class:`~kvstored.tiers.state.StoreState` and the :class:`~kvstored.tiers.transit.Transit`
that promotes SSD hits) behind ``TieredStore.pin_many`` / ``unpin`` / ``unpin_many`` /
``uncount_reads`` / ``touch_many`` / ``get`` and the probes ``lookup_prefix`` / ``exists``
/ ``stats`` / ``list_blocks``; the contracts are on the facade (tiered.py).

A pin is counted per block, not per holder (``DramEntry.pins``); a pinned block is never
evicted, freed or removed. Chain recency: a read touches its hits last-key-first, so the
head of a chain ends up the most recent and is evicted last. Probes never pin, touch
recency, count a get or wait on I/O.

Hot paths (tuned; keep them lean): a batch of DRAM hits (:meth:`Reads.pin_many` ->
``_pin_dram_hits``) and its release (:meth:`Reads.unpin_many`) take the lock once, bind what
their loop needs locally and add the pinned bytes once per batch.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

from kvstored.errors import InvalidArgument, KvstoredError, NoCapacity, NotFound
from kvstored.tiers.base import NEEDS_IO, check_bytes, check_key
from kvstored.tiers.dram import DramEntry
from kvstored.tiers.ssd_format import split_store_key, store_key, touch_time
from kvstored.tiers.transit import AGAIN, PoolWait
from kvstored.types import BlockInfo, PinnedBlock, StoreStats, Tier

if TYPE_CHECKING:
    from kvstored.tiers.state import StoreState
    from kvstored.tiers.transit import Transit


class Reads:
    """The read side of one store (module docstring; contracts on ``TieredStore``).

    Args:
        state: the store's shared state.
        transit: promotes SSD hits into DRAM.
    """

    def __init__(self, state: StoreState, transit: Transit) -> None:
        self._state = state
        self._transit = transit

    def pin_many(
        self, keys: Sequence[bytes], *, namespace_id: bytes = b"", may_block: bool = True,
        cut_from: int | None = None,
    ) -> list[PinnedBlock | None | KvstoredError]:
        """``TieredStore.pin_many`` (contract there)."""
        if set(map(type, keys)) <= {bytes} and all(keys):  # C-level checks (hot path)
            checked = list(keys)
        else:
            checked = [check_key(k) for k in keys]
        namespace_id = check_bytes("namespace_id", namespace_id)
        tag = store_key(namespace_id, b"")  # a store key is the namespace's tag + the key
        skeys = [tag + k for k in checked]
        out: list[PinnedBlock | None | KvstoredError] = []
        records: list[tuple[bytes, bytes] | None] = []
        st = self._state
        with st.lock:
            st.check_open()
            dram, ssd = st.dram, st.ssd
            hits = list(map(dram.entries.get, skeys))
            if None not in hits:  # every key a DRAM hit: no promotion, wait or miss (hot path)
                return self._pin_dram_hits(checked, hits)  # type: ignore[arg-type,return-value]  # no None in hits (checked); a list of hits is a list of outcomes
            promoting = st.promoting
            if not may_block and ssd is not None and any(
                k not in dram.entries and (k in ssd.entries or k in promoting) for k in skeys
            ):
                return [NEEDS_IO] * len(skeys)  # type: ignore[list-item]  # NEEDS_IO is an object sentinel, the documented answer here
            transit = self._transit
            touched_dram: list[bytes] = []
            touched_ssd: list[bytes] = []
            promoted_now: set[bytes] = set()
            pool_wait = PoolWait()  # one bounded wait on the pool for the whole batch
            if ssd is not None and len(skeys) > 1:  # read a batch's SSD blocks at once
                promoted_now = transit.promote_many(skeys, pool_wait)
            for key, skey in zip(checked, skeys, strict=True):
                st.gets += 1
                tier = Tier.DRAM
                got: DramEntry | KvstoredError | None = None
                while True:
                    got = dram.entries.get(skey)
                    if got is not None or ssd is None:
                        break
                    if skey in promoting:
                        st.cond.wait()  # another reader is reading this very block
                        st.check_open()
                        continue
                    if skey not in ssd.entries:
                        break
                    promoted = transit.promote(skey, pool_wait)
                    if promoted is AGAIN:
                        continue
                    got = promoted  # type: ignore[assignment]  # promoted is not AGAIN (an object sentinel) here
                    if isinstance(got, DramEntry):
                        tier = Tier.SSD
                        touched_ssd.append(skey)
                    break
                if not isinstance(got, DramEntry):
                    if cut_from is not None and len(out) >= cut_from and isinstance(
                        got, NoCapacity
                    ):
                        st.gets -= 1  # read (and counted) again by the next chunk
                        break
                    st.misses += 1
                    out.append(got)
                    continue
                if skey in promoted_now:
                    promoted_now.discard(skey)  # (a duplicate key later is a DRAM hit)
                    tier = Tier.SSD
                    touched_ssd.append(skey)
                if tier is Tier.DRAM:
                    dram.hits += 1
                st.hits += 1
                st.pin(got)
                touched_dram.append(skey)
                off = got.offset
                out.append(
                    PinnedBlock(
                        key=key, offset=off, size_bytes=got.size_bytes, meta=got.meta,
                        tier=tier, view=st.arena[off : off + got.size_bytes].toreadonly(),
                        generation=got.generation, entry=got,
                    )
                )
            now = touch_time()
            for skey in reversed(touched_dram):
                e = dram.entries.get(skey)
                if e is not None:
                    e.touched = now
                    dram.entries.move_to_end(skey)
            if ssd is not None:
                records = [ssd.touch(skey) for skey in reversed(touched_ssd)]
        if ssd is not None and records:
            ssd.persist(records)
        return out

    def count_one_sided_hits(self, num_blocks: int) -> None:
        """Count ``num_blocks`` DRAM hits a client read one-sided (no pin, no round trip: its
        client reports them later) as gets and DRAM hits, as :meth:`pin_many` counts its own.
        Thread-safe (the store lock)."""
        st = self._state
        with st.lock:
            st.gets += num_blocks
            st.hits += num_blocks
            st.dram.hits += num_blocks

    def _pin_dram_hits(self, keys: list[bytes], hits: list[DramEntry]) -> list[PinnedBlock]:
        """:meth:`pin_many` when every key is a DRAM hit (lock held): the same pins, counts
        and recency (touched last-key-first), in one pass without the per-key tier checks."""
        st = self._state
        dram = st.dram
        n = len(hits)
        st.gets += n
        st.hits += n
        dram.hits += n
        arena = st.arena
        unit = dram.allocator.alignment_bytes  # round_up, inlined: (size or 1) to whole units
        out = []
        num_pinned = pinned_bytes = 0
        for key, e in zip(keys, hits, strict=True):
            if e.pins == 0:
                num_pinned += 1
                pinned_bytes += ((e.size_bytes or 1) + unit - 1) // unit * unit
            e.pins += 1
            off, size = e.offset, e.size_bytes
            out.append(PinnedBlock(
                key, off, size, e.info[1], Tier.DRAM, arena[off : off + size].toreadonly(),
                e.generation, e,
            ))
        dram.pinned_blocks += num_pinned
        st.pinned_bytes += pinned_bytes
        move_to_end = dram.entries.move_to_end
        now = touch_time()
        for e in reversed(hits):
            e.touched = now
            move_to_end(e.skey)
        return out

    def uncount_reads(self, blocks: Sequence[PinnedBlock]) -> None:
        """``TieredStore.uncount_reads`` (contract there)."""
        st = self._state
        with st.lock:
            st.gets -= len(blocks)
            st.hits -= len(blocks)
            st.dram.hits -= sum(1 for b in blocks if b.tier is Tier.DRAM)

    def touch_many(
        self, keys: Sequence[bytes], *, namespace_id: bytes = b"", ssd_keys: Collection[bytes] = ()
    ) -> None:
        """``TieredStore.touch_many`` (contract there)."""
        skeys = [store_key(namespace_id, k) for k in keys]
        records = []
        st = self._state
        with st.lock:
            if st.closed:
                return
            dram, ssd = st.dram, st.ssd
            now = touch_time()
            for skey in reversed(skeys):
                e = dram.entries.get(skey)
                if e is not None:
                    e.touched = now
                    dram.entries.move_to_end(skey)
            if ssd is not None and ssd_keys:
                for key, skey in zip(reversed(keys), reversed(skeys), strict=True):
                    if key in ssd_keys:
                        records.append(ssd.touch(skey))
        if ssd is not None and records:
            ssd.persist(records)

    def unpin(self, block: PinnedBlock) -> None:
        """``TieredStore.unpin`` (contract there).

        Raises:
            NotFound: the block is not pinned (released twice, or never pinned).
        """
        if self.unpin_many([block]):
            raise NotFound(f"block {block.key[:8].hex()} is not pinned")

    def unpin_many(self, blocks: Sequence[PinnedBlock]) -> list[PinnedBlock]:
        """``TieredStore.unpin_many`` (contract there)."""
        stale: list[PinnedBlock] = []
        st = self._state
        dram = st.dram
        entries = dram.entries
        unit = dram.allocator.alignment_bytes
        num_freed = freed_bytes = 0
        with st.lock:
            for b in blocks:
                e: DramEntry | None = b.entry  # type: ignore[assignment]  # (opaque to others)
                if e is None or entries.get(e.skey) is not e:
                    e = dram.entry_at(b.offset)  # not made by pin_many, or no longer indexed
                    if e is None or split_store_key(e.skey)[1] != b.key:
                        stale.append(b)
                        continue
                if e.pins <= 0:
                    stale.append(b)
                    continue
                e.pins -= 1
                if e.pins == 0:
                    num_freed += 1
                    freed_bytes += ((e.size_bytes or 1) + unit - 1) // unit * unit
            if num_freed:
                dram.pinned_blocks -= num_freed
                st.pinned_bytes -= freed_bytes
                st.cond.notify_all()
        return stale

    def get(self, key: bytes, *, namespace_id: bytes = b"") -> tuple[bytes, bytes] | None:
        """``TieredStore.get`` (contract there): pin, copy out, unpin."""
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
        """``TieredStore.lookup_prefix`` (contract there)."""
        namespace_id = check_bytes("namespace_id", namespace_id)
        if set(map(type, keys)) - {bytes} or not all(keys):  # C-level checks; per key on a failure
            keys = [check_key(k) for k in keys]
        skeys = list(map(store_key(namespace_id, b"").__add__, keys))  # the namespace's tag + key
        st = self._state
        with st.lock:
            st.check_open()
            dram = st.dram.entries
            in_dram = list(map(dram.__contains__, skeys))
            n = in_dram.index(False) if False in in_dram else len(skeys)
            out = [Tier.DRAM] * n
            if n < len(skeys) and st.ssd is not None:  # a run of DRAM and SSD blocks
                ssd = st.ssd.entries
                for skey, hot in zip(skeys[n:], in_dram[n:], strict=True):
                    if hot:
                        out.append(Tier.DRAM)
                    elif skey in ssd:
                        out.append(Tier.SSD)
                    else:
                        break
        return out

    def exists(self, keys: Sequence[bytes], *, namespace_id: bytes = b"") -> list[bool]:
        """``TieredStore.exists`` (contract there)."""
        namespace_id = check_bytes("namespace_id", namespace_id)
        skeys = [store_key(namespace_id, check_key(k)) for k in keys]
        st = self._state
        with st.lock:
            st.check_open()
            return [st.has(k) for k in skeys]

    def stats(self) -> StoreStats:
        """``TieredStore.stats`` (contract there): every tier's stats, then the counts."""
        st = self._state
        with st.lock:
            ssd = st.ssd
            put_failures = checksum_failures = 0
            if ssd is not None:
                put_failures, checksum_failures = ssd.put_failures, ssd.checksum_failures
            return StoreStats(
                tiers=tuple(t.stats() for t in st.tiers), gets=st.gets, hits=st.hits,
                misses=st.misses, puts=st.puts, put_failures=put_failures,
                checksum_failures=checksum_failures, pinned_blocks=st.dram.pinned_blocks,
            )

    def list_blocks(
        self, *, namespace_id: bytes | None = None, limit: int = 10000
    ) -> tuple[list[BlockInfo], bool]:
        """``TieredStore.list_blocks`` (contract there).

        Raises:
            InvalidArgument: ``limit < 0``.
        """
        if limit < 0:
            raise InvalidArgument(f"limit must be >= 0, got {limit}")
        out: list[BlockInfo] = []
        st = self._state
        with st.lock:
            dram = st.dram
            ssd_entries = st.ssd.entries if st.ssd is not None else {}
            for skey, e in dram.entries.items():
                if namespace_id and e.namespace_id != namespace_id:
                    continue
                if len(out) >= limit:
                    return out, True
                s = ssd_entries.get(skey)
                tiers = (Tier.DRAM, Tier.SSD) if s is not None else (Tier.DRAM,)
                gens = (e.generation, s.generation) if s is not None else (e.generation,)
                key = split_store_key(skey)[1]
                out.append(BlockInfo(key, e.size_bytes, e.namespace_id, tiers, e.pins > 0, gens,
                                     copy=skey in dram.copies))
            for skey, s in ssd_entries.items():
                if skey in dram.entries:
                    continue
                if namespace_id and s.namespace_id != namespace_id:
                    continue
                if len(out) >= limit:
                    return out, True
                key = split_store_key(skey)[1]
                out.append(BlockInfo(key, s.size_bytes, s.namespace_id, (Tier.SSD,), False,
                                     (s.generation,)))
        return out, False
