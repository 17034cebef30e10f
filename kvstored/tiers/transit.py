"""Moving blocks between the tiers without holding the store lock during disk I/O.

A mixin of :class:`~kvstored.tiers.tiered.TieredStore`: allocation with eviction, demotion
(DRAM -> SSD), promotion (SSD -> DRAM) and spill. Every method here is called with the
store lock held and releases it only around disk I/O (``_unlocked``).

States of a block (all transitions under ``self._lock``; I/O happens between them)::

                 reserve                 commit (first wins)
     (absent) ----------> RESERVED --------------------------> DRAM ----------+
                 (invisible, owns arena space)   ^               |  evicted,  |
                                                 |               |  not on SSD|
                         PROMOTING <-------------+               v            |
              (arena space owned, invisible  read ok       DEMOTING           |
               in DRAM; SSD copy readable;                 (readable, pinnable;
               other readers of this block                  not evictable; a remove
               wait for it)                                 unindexes it at once and
                   ^                                        frees it when the write ends)
                   | pin_many of an SSD block                    | write done
                   |                                             v
                 SSD  <------------------------------------ DRAM+SSD --evicted--> SSD
                   |  evicted (SSD cap) / removed / bad checksum -> (absent)

    DRAM tier (dram.py)  arena + BlockAllocator + OrderedDict[store key -> DramEntry] (LRU first)
    SSD tier  (ssd.py)   files + rocksdict index + OrderedDict[store key -> SsdEntry] (LRU first)

Locking. One ``threading.Lock`` (not reentrant) guards all metadata of both tiers (the SSD
tier uses the same lock object). No disk I/O ever runs under it: demotion writes, xxh3,
promotion reads, RocksDB writes and unlinks run with the lock released, on a block that its
transit state keeps stable (a DEMOTING block is not freed; a PROMOTING block's arena space is
in no index). So lookup_prefix, exists, stats, commit, abort, unpin and DRAM hits never wait
for a disk; a get of an SSD block waits only for its own read (and, when DRAM is full, for
the demotions that make room for it). Lock order: ``self._lock`` is the only lock taken
while calling into a tier; the SSD tier's phases never take another. ``self._cond`` (on the
same lock) wakes readers waiting for a promotion and allocators waiting for a demotion.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import structlog

from kvstored.errors import KvstoredError, NoCapacity, Unavailable
from kvstored.tiers.dram import DramEntry
from kvstored.tiers.eviction import MAX_WINDOW_TRIES, victim_window
from kvstored.tiers.spare import candidates, spares_pool, window_spares_pool
from kvstored.tiers.ssd_format import split_store_key

if TYPE_CHECKING:
    from kvstored.tiers.dram import DramTier
    from kvstored.tiers.ssd import SsdEntry, SsdTier

log = structlog.get_logger(__name__)

T = TypeVar("T")
_AGAIN = object()


@dataclass(slots=True)
class _Transit:
    """A block between tiers: DEMOTING (``entry`` set) or PROMOTING (``offset`` set)."""

    entry: DramEntry | None = None
    offset: int = -1
    size_bytes: int = 0
    removed: bool = False  # removed while in transit: its copy must not become visible



class TransitMixin:
    """Eviction, demotion, promotion and spill for :class:`TieredStore` (lock held on entry)."""

    _lock: threading.Lock
    _cond: threading.Condition
    _dram: DramTier
    _ssd: SsdTier | None
    arena: memoryview
    _closed: bool
    _reserved_bytes: int
    _pinned_bytes: int
    _demoting: dict[bytes, _Transit]
    _promoting: dict[bytes, _Transit]

    def _check_open(self) -> None:
        if self._closed:
            raise Unavailable("the block store is closed")

    def _intern_size(self, size_bytes: int) -> int:
        raise NotImplementedError

    def _unlocked(self, fn: Callable[..., T], *args: object) -> T:
        """Run ``fn`` (disk I/O) with the lock released; re-take it before returning."""
        self._lock.release()
        try:
            return fn(*args)
        finally:
            self._lock.acquire()

    def _evictable(self, skey: bytes) -> bool:
        return self._dram.entries[skey].pins == 0 and skey not in self._demoting

    def _evict_window(self, skeys: list[bytes]) -> None:
        """Evict chosen victims: free those already on SSD, demote the others (lock released
        during the writes; each one DEMOTING meanwhile)."""
        dram, ssd = self._dram, self._ssd
        writes = []
        for skey in skeys:
            e = dram.entries[skey]
            w = None
            if skey in dram.copies:
                pass  # a peer holds it: dropped, never demoted (spare.py)
            elif ssd is not None and skey not in ssd.entries:
                ns, _ = split_store_key(skey)
                w = ssd.begin_write(skey, e.size_bytes, namespace_id=ns, meta=e.meta)
                if w is not None:
                    w.generation = e.generation  # the same bytes: the same generation
            if w is None:
                dram.remove(skey)
                dram.evictions += 1
                continue
            self._demoting[skey] = _Transit(entry=e)
            writes.append((skey, e, w))
        if not writes:
            return
        assert ssd is not None
        arena = self.arena

        batch = [(w, arena[e.offset : e.offset + e.size_bytes]) for _, e, w in writes]
        try:
            self._unlocked(ssd.write_files, batch)  # several at once (the tier's I/O pool)
        finally:
            doomed: list[bytes] = []
            for skey, e, w in writes:
                t = self._demoting.pop(skey)
                doomed += ssd.end_write(w, keep=not t.removed)
                if t.removed:  # unindexed by remove(); its space was left to us
                    dram.allocator.free(e.offset, e.size_bytes)
                elif e.pins == 0:
                    dram.remove(skey)
                    dram.evictions += 1
                # else: pinned meanwhile; it stays in DRAM (and is on SSD now)
            self._cond.notify_all()
            if doomed:
                self._unlocked(ssd.delete_files, doomed)

    def _allocate(self, size_bytes: int, *, copy: bool = False) -> int:
        """Arena space for ``size_bytes``, evicting blocks if needed (lock held; released
        while demotions write). Copies (remote-fill duplicates) are evicted first.

        Args:
            size_bytes: the block's exact size.
            copy: the space is for a remote-fill copy: evict only what drops no block from
                the pool (other copies, blocks on SSD, demotions the SSD takes without
                evicting; spare.py).

        Raises:
            NoCapacity: the block can never fit beside the pinned, reserved and promoting
                blocks (nothing is evicted then); or, for a copy, no room can be made
                without dropping a block.
            Unavailable: the store was closed while waiting.
        """
        alloc, dram = self._dram.allocator, self._dram
        need = alloc.round_up(size_bytes)
        tries = 0  # window tries that failed (eviction.MAX_WINDOW_TRIES, then plain LRU)
        while True:
            self._check_open()
            off = alloc.allocate(size_bytes)
            if off is not None:
                return off
            blocked = self._reserved_bytes + self._pinned_bytes
            if need > alloc.capacity_bytes - blocked:
                raise NoCapacity(
                    f"DRAM tier cannot fit a {size_bytes}-byte block: capacity "
                    f"{alloc.capacity_bytes} bytes, {self._pinned_bytes} pinned, "
                    f"{self._reserved_bytes} reserved by writes and promotions in progress"
                )
            window = None
            evictable = self._evictable
            if copy:
                spares = spares_pool(dram, self._ssd)
                evictable = lambda k: self._evictable(k) and spares(k)  # noqa: E731
            for skey in candidates(dram, copy=copy, ssd=self._ssd):  # copies, then LRU first
                if not evictable(skey):
                    continue
                if tries >= MAX_WINDOW_TRIES:
                    window = [skey]  # plain LRU: its space merges with later victims'
                else:
                    window = victim_window(dram, skey, need, evictable)
                if window is not None and copy and not window_spares_pool(dram, self._ssd, window):
                    window = None  # the SSD cannot take these demotions as is
                if window is not None:
                    break
                tries += 1
            if window is not None:
                self._evict_window(window)
            elif self._demoting:
                self._cond.wait()  # a demotion in flight will free space
            elif copy:
                raise NoCapacity(
                    f"DRAM tier has no room for a {size_bytes}-byte copy of a peer's block "
                    "without dropping a block the pool holds nowhere else"
                )
            else:
                raise NoCapacity(
                    f"DRAM tier cannot fit a {size_bytes}-byte block: every block is pinned "
                    "or being written (fragmented arena)"
                )

    def _promote(self, skey: bytes) -> DramEntry | KvstoredError | object | None:
        """Read an SSD block into DRAM (lock held; released during the read).

        Returns:
            The new (unpinned) DRAM entry; None when the block is gone or unreadable (a
            miss); NoCapacity when DRAM cannot make room.
        """
        ssd, dram = self._ssd, self._dram
        assert ssd is not None
        sentry = ssd.entries[skey]
        ssd.entries.move_to_end(skey)  # keep it from being evicted by our demotions
        try:
            off = self._allocate(sentry.size_bytes)
        except NoCapacity as exc:
            return exc
        size = sentry.size_bytes
        if skey in dram.entries or skey in self._promoting or ssd.entries.get(skey) is not sentry:
            dram.allocator.free(off, size)  # changed while demotions made room: look again
            return _AGAIN
        t = _Transit(offset=off, size_bytes=size)
        self._promoting[skey] = t
        need = dram.round_up(size)
        self._reserved_bytes += need
        reason = "read_failed"
        try:
            reason = self._unlocked(ssd.read_file, skey, sentry, self.arena[off : off + need])
        finally:
            del self._promoting[skey]
            self._reserved_bytes -= need
            doomed = ssd.end_read(skey, sentry, reason)
            self._cond.notify_all()
            if reason or t.removed or self._closed:
                dram.allocator.free(off, size)
        if doomed:
            self._unlocked(ssd.delete_files, doomed)
        if reason or t.removed:
            return None
        self._check_open()
        entry = DramEntry(off, self._intern_size(size), sentry.info, sentry.generation)
        dram.add(skey, entry)
        ssd.hits += 1
        return entry

    def _promote_many(self, skeys: list[bytes]) -> set[bytes]:
        """Promote the SSD-only blocks among ``skeys`` with their reads in parallel (lock held;
        released during the reads, which go straight into their arena slots).

        Best effort, for a batch get: a block it does not promote (DRAM cannot make room,
        changed meanwhile, unreadable) is left to :meth:`_promote`, which decides what the
        reader sees. Blocks are allocated in order and the batch stops at the first
        allocation that fails, so earlier keys of a prefix win.

        Returns:
            Store keys now in DRAM (unpinned) because of this call.
        """
        ssd, dram = self._ssd, self._dram
        assert ssd is not None
        todo: list[tuple[bytes, SsdEntry, _Transit, int]] = []
        seen: set[bytes] = set()
        # Hold the batch's DRAM hits while making room, as the one-by-one path (which pins
        # each hit before promoting the next key) would: never evict what this get returns.
        held = {k: dram.entries[k] for k in skeys if k in dram.entries}
        for e in held.values():
            self._pin(e)
        try:
            self._make_room_many(skeys)
            for skey in skeys:
                if skey in seen or skey in dram.entries or skey in self._promoting:
                    continue
                sentry = ssd.entries.get(skey)
                if sentry is None:
                    continue
                seen.add(skey)
                ssd.entries.move_to_end(skey)
                try:
                    off = self._allocate(sentry.size_bytes)
                except NoCapacity:
                    break
                size = sentry.size_bytes
                if skey in dram.entries or skey in self._promoting or ssd.entries.get(skey) is not sentry:
                    dram.allocator.free(off, size)  # changed while demotions made room
                    continue
                t = _Transit(offset=off, size_bytes=size)
                self._promoting[skey] = t
                need = dram.round_up(size)
                self._reserved_bytes += need
                todo.append((skey, sentry, t, need))
        except BaseException:  # Unavailable (closed) while making room: nothing was read
            for skey, _, t, need in todo:
                del self._promoting[skey]
                self._reserved_bytes -= need
                dram.allocator.free(t.offset, t.size_bytes)
            self._cond.notify_all()
            raise
        finally:
            for e in held.values():
                self._unpin_entry(e)
        if not todo:
            return set()
        reads = [(k, se, self.arena[t.offset : t.offset + need]) for k, se, t, need in todo]
        reasons = ["read_failed"] * len(todo)
        try:
            reasons = self._unlocked(ssd.read_files, reads)
        finally:
            done = self._finish_promotions(todo, reasons)
        self._check_open()
        return done

    def _make_room_many(self, skeys: list[bytes]) -> None:
        """Evict, in one :meth:`_evict_window` (its demotions written several at once), the
        victims a batch's SSD-only blocks need, before :meth:`_promote_many` allocates them
        one by one (lock held; released during the writes). Best effort: each allocation
        still makes its own room if this fell short (fragmentation, a change meanwhile), so
        this only turns one-block demotion writes (queue depth 1) into one batch.

        Victims are chosen as :meth:`_allocate` would choose them, LRU first (copies first),
        each through :func:`~kvstored.tiers.eviction.victim_window` for one block's size;
        blocks of the batch itself are pinned (held) by the caller, so never victims. The
        batch's SSD entries are made the most recent first, so the demotions' SSD evictions
        take other blocks.
        """
        ssd, dram = self._ssd, self._dram
        assert ssd is not None
        alloc = dram.allocator
        needs: list[int] = []
        for skey in dict.fromkeys(skeys):  # (unique, in order)
            if skey in dram.entries or skey in self._promoting:
                continue
            sentry = ssd.entries.get(skey)
            if sentry is not None:
                ssd.entries.move_to_end(skey)
                needs.append(alloc.round_up(sentry.size_bytes))
        free = alloc.free_bytes
        while needs and free >= needs[0]:  # what fits already (optimistic: free may be split)
            free -= needs.pop(0)
        if len(needs) < 2:
            return  # nothing to batch: _allocate evicts for a single block as before
        chosen: dict[bytes, None] = {}

        def evictable(k: bytes) -> bool:
            return k not in chosen and self._evictable(k)

        tries = 0
        lru = candidates(dram, ssd=ssd)  # copies, then LRU first; one pass for the whole batch
        for need in needs:
            window = None
            for skey in lru:
                if not evictable(skey):
                    continue
                window = victim_window(dram, skey, need, evictable)
                if window is not None:
                    break
                tries += 1
                if tries >= MAX_WINDOW_TRIES:
                    break
            if window is None:
                break  # the per-block allocations take it from here
            chosen.update(dict.fromkeys(window))
        if len(chosen) > 1:
            self._evict_window(list(chosen))

    def _pin(self, entry: DramEntry) -> None:
        raise NotImplementedError

    def _unpin_entry(self, entry: DramEntry) -> None:
        entry.pins -= 1
        if entry.pins == 0:
            self._dram.pinned_blocks -= 1
            self._pinned_bytes -= self._dram.round_up(entry.size_bytes)
            self._cond.notify_all()

    def _finish_promotions(
        self, todo: list[tuple[bytes, SsdEntry, _Transit, int]], reasons: list[str]
    ) -> set[bytes]:
        """Index the promotions of :meth:`_promote_many` that read well; free the others."""
        ssd, dram = self._ssd, self._dram
        assert ssd is not None
        done: set[bytes] = set()
        doomed: list[bytes] = []
        for (skey, sentry, t, need), reason in zip(todo, reasons, strict=True):
            del self._promoting[skey]
            self._reserved_bytes -= need
            doomed += ssd.end_read(skey, sentry, reason)
            if reason or t.removed or self._closed:
                dram.allocator.free(t.offset, t.size_bytes)
                continue
            dram.add(skey, DramEntry(t.offset, self._intern_size(t.size_bytes), sentry.info,
                                     sentry.generation))  # the SSD replica's bytes
            ssd.hits += 1
            done.add(skey)
        self._cond.notify_all()
        if doomed:
            self._unlocked(ssd.delete_files, doomed)
        return done

    def spill_to_ssd(self) -> int:
        """Write every DRAM-only block to the SSD tier (graceful shutdown), LRU first.

        DRAM keeps its copies; each block is DEMOTING while written (lock released), so the
        store keeps serving. Blocks that fail to write are counted in ``put_failures``.

        Returns:
            Number of blocks written (0 without an SSD tier).
        """
        ssd = self._ssd
        if ssd is None:
            return 0
        num = 0
        with self._lock:
            self._check_open()
            todo = [k for k in self._dram.entries if k not in ssd.entries]
            for skey in todo:
                e = self._dram.entries.get(skey)
                if e is None or skey in self._demoting or skey in ssd.entries or self._closed:
                    continue
                w = ssd.begin_write(
                    skey, e.size_bytes, namespace_id=split_store_key(skey)[0], meta=e.meta
                )
                if w is None:
                    continue
                w.generation = e.generation  # the same bytes: the same generation
                t = _Transit(entry=e)
                self._demoting[skey] = t
                try:
                    ok = self._unlocked(
                        ssd.write_file, w, self.arena[e.offset : e.offset + e.size_bytes]
                    )
                finally:
                    del self._demoting[skey]
                    doomed = ssd.end_write(w, keep=not t.removed)
                    if t.removed:
                        self._dram.allocator.free(e.offset, e.size_bytes)
                    self._cond.notify_all()
                if doomed:
                    self._unlocked(ssd.delete_files, doomed)
                num += bool(ok and not t.removed)
        log.info("blocks_spilled", num_blocks=num)
        return num

