"""Moving blocks between the tiers without holding the store lock during disk I/O.

:class:`Transit` is the store component (built with the :class:`~kvstored.tiers.state.StoreState`)
that the reservations and reads use: allocation with eviction, demotion (DRAM -> SSD),
promotion (SSD -> DRAM) and spill. Every method here but :meth:`Transit.spill_to_ssd` is
called with the store lock held and releases it only around disk I/O
(:meth:`StoreState.unlocked <kvstored.tiers.state.StoreState.unlocked>`).

States of a block (all transitions under the store lock; I/O happens between them)::

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

No disk I/O ever runs under the lock: demotion writes, xxh3, promotion reads, RocksDB writes
and unlinks run with it released, on a block that its transit state keeps stable (a
DEMOTING block is not freed; a PROMOTING block's arena space is in no index). So
lookup_prefix, exists, stats, commit, abort, unpin and DRAM hits never wait for a disk; a get
of an SSD block waits only for its own read (and, when DRAM is full, for the demotions that
make room for it). The lock order is in state.py.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import structlog

from kvstored.errors import KvstoredError, NoCapacity
from kvstored.tiers.dram import DramEntry
from kvstored.tiers.eviction import MAX_WINDOW_TRIES, victim_window
from kvstored.tiers.spare import (
    candidates,
    coldest_original_touched,
    demote_charge,
    spares_pool,
    window_spares_pool,
)
from kvstored.tiers.ssd_format import split_store_key
from kvstored.tiers.state import InTransit

if TYPE_CHECKING:
    from collections.abc import Callable

    from kvstored.tiers.ssd_format import SsdEntry
    from kvstored.tiers.state import StoreState

    PoolRoom = Callable[[int, float], bool]

log = structlog.get_logger(__name__)

class PoolWait:
    """One read's bounded wait on the pool, shared by the promotions of its keys (lock held):
    a batch of SSD hits waits for the spiller once, not once per key."""

    __slots__ = ("until",)

    def __init__(self) -> None:
        self.until: float | None = None
        """Monotonic s the wait ends; None = not started; 0.0 = over (or never allowed)."""


MAX_REDUNDANT_SCAN = 4096
"""Most DRAM blocks (LRU first) an eviction for good looks at for a redundant replica."""

AGAIN = object()
"""What :meth:`Transit.promote` answers when the block changed while it made room: look again."""


class Transit:
    """Eviction, demotion, promotion and spill over one store's state (lock held on entry,
    except :meth:`spill_to_ssd`).

    Args:
        state: the store's shared state.
    """

    def __init__(self, state: StoreState) -> None:
        self._state = state
        self.pool_room: PoolRoom | None = None
        """Asked, with the lock released, before a local put evicts a block the pool holds
        nowhere else (``TieredStore.set_pool_room``): ``pool_room(need_bytes, deadline)``
        makes room elsewhere (the node's spiller) and answers whether it did."""
        self.pool_wait_s = 0.0
        """The most a local put waits on :attr:`pool_room` before it evicts for good."""
        self.waits = 0
        """Allocations that waited on :attr:`pool_room` (``StoreStats``-free counter)."""
        self.evictions_for_good = 0
        """Blocks this node evicted while no spare victim and no pool room was found."""
        self.promotions_skipped = 0
        """Promotions refused because only dropping an original would have made room."""
        self.handoffs_taken = 0
        """Peers' hand-offs (pool LRU) this node took, evicting a colder block of its own."""
        self.handoffs_declined = 0
        """Peers' hand-offs refused: no block here was colder than the one offered."""
        self.spare_puts_refused = 0
        """Peers' spill and replica PUT items refused (``spare_or_redundant``): only
        dropping a sole copy would have made room."""

    def evictable(self, skey: bytes) -> bool:
        """Whether the DRAM block ``skey`` may be evicted now: unpinned and not DEMOTING."""
        st = self._state
        return st.dram.entries[skey].pins == 0 and skey not in st.demoting

    def _spareable(self, spares: Callable[[bytes], bool]) -> Callable[[bytes], bool]:
        """Per block: evictable now, and its eviction drops no block from the pool."""

        def ok(skey: bytes) -> bool:
            return self.evictable(skey) and spares(skey)

        return ok

    def _evict_window(self, skeys: list[bytes], drop: frozenset[bytes] = frozenset()) -> None:
        """Evict chosen victims: free those already on SSD, drop copies and those in ``drop``
        (redundant replicas: another node holds them), demote the others (lock released
        during the writes; each one DEMOTING meanwhile)."""
        st = self._state
        dram, ssd, demoting = st.dram, st.ssd, st.demoting
        writes = []
        for skey in skeys:
            e = dram.entries[skey]
            w = None
            if skey in dram.copies:
                pass  # a peer holds it: dropped, never demoted (spare.py)
            elif skey in drop:
                st.marks.num_dropped += 1  # a redundant replica: dropped, not demoted (its
                # demotion could evict an SSD block; another node keeps this one)
            elif ssd is not None and skey not in ssd.entries:
                ns, _ = split_store_key(skey)
                w = ssd.begin_write(skey, e.size_bytes, namespace_id=ns, meta=e.meta)
                if w is not None:
                    w.generation = e.generation  # the same bytes: the same generation
                    w.touched = e.touched  # and its last use
            if w is None:
                dram.remove(skey)
                dram.evictions += 1
                continue
            demoting[skey] = InTransit(entry=e)
            writes.append((skey, e, w))
        if not writes:
            return
        assert ssd is not None
        arena = st.arena

        batch = [(w, arena[e.offset : e.offset + e.size_bytes]) for _, e, w in writes]
        try:
            st.unlocked(ssd.write_files, batch)  # several at once (the tier's I/O pool)
        finally:
            doomed: list[bytes] = []
            for skey, e, w in writes:
                t = demoting.pop(skey)
                doomed += ssd.end_write(w, keep=not t.removed)
                if t.removed:  # unindexed by remove(); its space was left to us
                    dram.allocator.free(e.offset, e.size_bytes)
                elif e.pins == 0:
                    dram.remove(skey)
                    dram.evictions += 1
                # else: pinned meanwhile; it stays in DRAM (and is on SSD now)
            st.cond.notify_all()
            if doomed:
                st.unlocked(ssd.delete_files, doomed)

    def allocate(self, size_bytes: int, *, copy: bool = False, wait_for_pool: bool = False,
                 promotion: bool = False, pool_wait: PoolWait | None = None,
                 handoff_age_s: float | None = None, ahead: bool = False,
                 spare_or_redundant: bool = False) -> int:
        """Arena space for ``size_bytes``, evicting blocks if needed (lock held; released
        while demotions write and while waiting on :attr:`pool_room`).

        Every allocation first tries victims whose eviction drops no block from the pool
        (copies first, then blocks on SSD, then demotions the SSD takes without evicting;
        spare.py). Only when none frees the space does a local put evict in plain LRU
        order (a DRAM-only block is dropped, a demotion may evict SSD blocks). With
        ``wait_for_pool`` it first waits, at most :attr:`pool_wait_s`, for
        :attr:`pool_room` (the spiller moving blocks to peers) before evicting for good.
        A copy never evicts for good, nor does a promotion on a node in a pool (a
        :attr:`pool_room` installed): both are of blocks the pool already holds (a peer's
        block, this node's SSD block), so making room for them by dropping an original
        would trade a block held nowhere else for one held already. A standalone node
        (no :attr:`pool_room`) is the whole pool: its promotions evict in LRU order, the
        pool's LRU, as they always did.

        Args:
            size_bytes: the block's exact size.
            copy: the space is for a remote-fill copy: evict only what drops no block from
                the pool (never the plain LRU pass), and never wait.
            wait_for_pool: wait on :attr:`pool_room` while no spare victim frees the space
                (a local put or a promotion; never a copy).
            promotion: the space is for a promotion of an SSD block: with a
                :attr:`pool_room` installed, as ``copy``, only spare victims (after the wait
                on the pool, when ``wait_for_pool``); when none frees the space the
                promotion is skipped (NoCapacity) and the block stays on SSD, where the
                node's read paths serve it from (issue 17 §3: the wait for a held spiller
                running out must never cost an original). Without one, as a local put.
            pool_wait: the wait to share with other allocations of one read (a promotion);
                None = this allocation's own.
            handoff_age_s: the space is for a peer's hand-off (pool LRU, node/spill.py): a
                block of that age (seconds since its last use on the peer) the peer would
                otherwise drop. Spare victims first, as any allocation; when none frees the
                space it never waits on the pool: it evicts in LRU order (for good) only if
                this node's coldest original is older than ``handoff_age_s``, decided once,
                here under the lock (so the pool drops the colder block), else NoCapacity.
            ahead: the space is for a reserve-ahead slot granted before any put asks for it
                (a CommitSlots refill): with a :attr:`pool_room` installed, only spare
                victims and never a wait, as ``copy``: a slot that may never be written must
                not drop an original (the put that needs the room evicts, through the pool's
                LRU hand-off, when it comes). Without one, as a local put.
            spare_or_redundant: the space is for a block a peer sends that the pool holds
                elsewhere or has room for elsewhere (a spill PUT, a ``put(replicas=N)``
                replica PUT; PUT_FLAG_SPARE, node/spill.py, node/put_replicas.py): spare
                victims first, then a redundant replica (another live node holds it;
                dropped, not demoted), never a wait on the pool nor an eviction of a sole
                copy (the sender keeps its block and asks elsewhere); else NoCapacity.

        Returns:
            The offset of the allocated space; the caller owns it (and charges it).

        Raises:
            NoCapacity: the block can never fit beside the pinned, reserved and promoting
                blocks (nothing is evicted then); or, for a copy or a promotion, no room
                can be made without dropping a block; or, for a hand-off, no block here is
                colder than the one offered (nothing was evicted for good); or, for
                ``spare_or_redundant``, only dropping a sole copy would make room.
            Unavailable: the store was closed while waiting.
        """
        st = self._state
        dram = st.dram
        alloc = dram.allocator
        need = alloc.round_up(size_bytes)
        tries = 0  # window tries that failed (eviction.MAX_WINDOW_TRIES, then plain LRU)
        spare_tries = 0  # the same for the victims that drop nothing from the pool
        own = pool_wait if pool_wait is not None else PoolWait()  # the bounded wait on the pool
        handoff_decided = False  # a hand-off's age compared with our coldest original
        while True:
            st.check_open()
            off = alloc.allocate(size_bytes)
            if off is not None:
                return off
            blocked = st.reserved_bytes + st.pinned_bytes
            if need > alloc.capacity_bytes - blocked:
                raise NoCapacity(
                    f"DRAM tier cannot fit a {size_bytes}-byte block: capacity "
                    f"{alloc.capacity_bytes} bytes, {st.pinned_bytes} pinned, "
                    f"{st.reserved_bytes} reserved by writes and promotions in progress"
                )
            dram.absorb_reads()  # one-sided reads since the last eviction count as recency
            window, spare_tries = self._spare_window(need, spare_tries)  # drops nothing
            drop: frozenset[bytes] = frozenset()
            # May this allocation evict for good (a local put, a hand-off, a standalone
            # node's promotion)? Then a redundant replica (another live node holds it;
            # tiers/redundant.py) goes before any sole copy, coldest first. A put that may
            # still wait on the pool waits first (a peer with room keeps both replicas).
            for_good = not copy and not ((promotion or ahead) and self.pool_room is not None)
            pool_wait_left = (wait_for_pool and own.until != 0.0 and self.pool_room is not None
                              and self.pool_wait_s > 0)
            if window is None and for_good and (handoff_age_s is not None or not pool_wait_left):
                window, drop = self._redundant_window(need)
                if window is not None and handoff_age_s is not None and not handoff_decided:
                    self.handoffs_taken += 1  # stored by dropping a redundant replica
                    handoff_decided = True
            if window is None and handoff_age_s is not None:
                if not handoff_decided:
                    self._decide_handoff(size_bytes, handoff_age_s)  # raises when refused
                    handoff_decided = True
                window, tries = self._lru_window(need, tries)
                if window is not None:
                    self.evictions_for_good += sum(1 for k in window if self._drops(k))
            elif window is None and not copy and not spare_or_redundant:
                if wait_for_pool and own.until != 0.0:
                    if own.until is None:
                        own.until = time.monotonic() + self.pool_wait_s
                    if self._maybe_wait_for_pool(need, own.until):
                        spare_tries = 0
                        continue  # the pool made room elsewhere: look again
                    own.until = 0.0  # waited (or may not wait): evict for good now
                    if for_good:
                        window, drop = self._redundant_window(need)
                if window is None and (not (promotion or ahead) or self.pool_room is None):
                    # (a pool's promotions and reserve-ahead slots never do)
                    window, tries = self._lru_window(need, tries)
                    if window is not None:
                        self.evictions_for_good += sum(1 for k in window if self._drops(k))
            if window is not None:
                self._evict_window(window, drop)
            elif st.demoting:
                st.cond.wait()  # a demotion in flight will free space
            elif copy:
                raise NoCapacity(
                    f"DRAM tier has no room for a {size_bytes}-byte copy of a peer's block "
                    "without dropping a block the pool holds nowhere else"
                )
            elif spare_or_redundant:
                self.spare_puts_refused += 1
                raise NoCapacity(
                    f"DRAM tier has no room for a peer's {size_bytes}-byte spill or replica "
                    "block without dropping a block the pool holds nowhere else (no free "
                    "space, copy, block also on SSD or redundant replica to evict)"
                )
            elif ahead and self.pool_room is not None:
                raise NoCapacity(
                    f"DRAM tier has no room for a {size_bytes}-byte reserve-ahead slot without "
                    "dropping a block the pool holds nowhere else (a put reserves its own)"
                )
            elif promotion and self.pool_room is not None:
                self.promotions_skipped += 1
                raise NoCapacity(
                    f"DRAM tier has no room to promote a {size_bytes}-byte SSD block without "
                    "dropping a block the pool holds nowhere else; it stays on SSD"
                )
            else:
                raise NoCapacity(
                    f"DRAM tier cannot fit a {size_bytes}-byte block: every block is pinned "
                    "or being written (fragmented arena)"
                )

    def _decide_handoff(self, size_bytes: int, handoff_age_s: float) -> None:
        """Accept a peer's hand-off only if this node's coldest original is older than the
        offered block (``handoff_age_s``); else count it declined and raise NoCapacity
        (lock held: nothing can touch or add a block between this check and the eviction
        that follows it, except while a demotion writes, which only frees space)."""
        st = self._state
        touched = coldest_original_touched(st.dram, st.ssd)
        age = time.monotonic() - touched if touched is not None else 0.0
        if touched is None or age <= handoff_age_s:
            self.handoffs_declined += 1
            raise NoCapacity(
                f"hand-off of a {size_bytes}-byte block refused: its age {handoff_age_s:.3f} s "
                f"is at least this node's coldest original's ({age:.3f} s); the sender keeps "
                "the pool's LRU order by evicting its own"
            )
        self.handoffs_taken += 1

    def _spare_window(self, need: int, tries: int) -> tuple[list[bytes] | None, int]:
        """Victims freeing ``need`` contiguous bytes whose eviction drops no block from the
        pool (spare.py; bounded scan: copies + :data:`~kvstored.tiers.spare.MAX_COPY_SCAN`),
        or None; and the window tries spent so far (lock held)."""
        st = self._state
        dram = st.dram
        evictable = self._spareable(spares_pool(dram, st.ssd))
        for skey in candidates(dram, copy=True, ssd=st.ssd):  # copies, then LRU first
            if not evictable(skey):
                continue
            if tries >= MAX_WINDOW_TRIES:
                window: list[bytes] | None = [skey]  # its space merges with later victims'
            else:
                window = victim_window(dram, skey, need, evictable)
            if window is not None and window_spares_pool(dram, st.ssd, window):
                return window, tries
            tries += 1
        return None, tries

    def _redundant_window(self, need: int) -> tuple[list[bytes] | None, frozenset[bytes]]:
        """Victims freeing ``need`` contiguous bytes that drop no *block* from the pool, some
        of them redundant replicas (tiers/redundant.py: another live node holds them; they
        are dropped, not demoted), the others spare victims; coldest first (the first
        :data:`MAX_REDUNDANT_SCAN` blocks of the LRU order); or ``(None, {})``. The set is
        the window's blocks to drop (lock held)."""
        st = self._state
        dram, ssd, marks = st.dram, st.ssd, st.marks
        if not marks.trusted or not len(marks):
            return None, frozenset()
        entries = dram.entries

        def redundant(skey: bytes) -> bool:
            return marks.is_redundant(skey, entries[skey].generation)

        spares = spares_pool(dram, ssd)

        def ok(skey: bytes) -> bool:
            return self.evictable(skey) and (redundant(skey) or spares(skey))

        for n, skey in enumerate(entries):
            if n >= MAX_REDUNDANT_SCAN:
                break
            if skey in dram.copies or not self.evictable(skey) or not redundant(skey):
                continue
            window = victim_window(dram, skey, need, ok)
            if window is None:
                continue
            drop = frozenset(k for k in window if k not in dram.copies and redundant(k)
                             and (ssd is None or k not in ssd.entries))
            rest = [k for k in window if k not in drop]
            if window_spares_pool(dram, ssd, rest):
                return window, drop
        return None, frozenset()

    def _lru_window(self, need: int, tries: int) -> tuple[list[bytes] | None, int]:
        """Victims in plain LRU order (copies first), which may drop blocks (lock held)."""
        dram = self._state.dram
        for skey in candidates(dram, ssd=self._state.ssd):
            if not self.evictable(skey):
                continue
            if tries >= MAX_WINDOW_TRIES:
                return [skey], tries  # plain LRU: its space merges with later victims'
            window = victim_window(dram, skey, need, self.evictable)
            if window is not None:
                return window, tries
            tries += 1
        return None, tries

    def _drops(self, skey: bytes) -> bool:
        """Whether evicting DRAM block ``skey`` now may drop it from the pool (lock held)."""
        st = self._state
        if skey in st.dram.copies:
            return False
        return st.ssd is None or demote_charge(st.ssd, skey, st.dram) is None

    def _maybe_wait_for_pool(self, need: int, deadline: float) -> bool:
        """Wait (lock released) until :attr:`pool_room` made room elsewhere or ``deadline``
        (monotonic s) passed; True when it made room and the wait is not over."""
        room = self.pool_room
        if room is None or self.pool_wait_s <= 0 or time.monotonic() >= deadline:
            return False
        self.waits += 1
        return bool(self._state.unlocked(room, need, deadline))

    def promote(self, skey: bytes, pool_wait: PoolWait | None = None
                ) -> DramEntry | KvstoredError | object | None:
        """Read an SSD block into DRAM (lock held; released during the read).

        Room comes only from victims whose eviction drops nothing (:meth:`allocate` with
        ``promotion``), after a bounded wait on the pool shared through ``pool_wait``.

        Returns:
            The new (unpinned) DRAM entry; None when the block is gone or unreadable (a
            miss); NoCapacity when DRAM cannot make room; :data:`AGAIN` when the block
            changed while room was made or while it was read (the SSD evicted it and a put
            committed the key again: look it up again).

        Raises:
            Unavailable: the store was closed meanwhile.
        """
        st = self._state
        ssd, dram = st.ssd, st.dram
        assert ssd is not None
        sentry = ssd.entries[skey]
        ssd.entries.move_to_end(skey)  # keep it from being evicted by our demotions
        try:
            off = self.allocate(sentry.size_bytes, wait_for_pool=True, promotion=True,
                                pool_wait=pool_wait)
        except NoCapacity as exc:
            return exc
        size = sentry.size_bytes
        if skey in dram.entries or skey in st.promoting or ssd.entries.get(skey) is not sentry:
            dram.allocator.free(off, size)  # changed while demotions made room: look again
            return AGAIN
        t = InTransit(offset=off, size_bytes=size)
        st.promoting[skey] = t
        need = dram.round_up(size)
        st.reserved_bytes += need
        reason = "read_failed"
        try:
            reason = st.unlocked(ssd.read_file, skey, sentry, st.arena[off : off + need])
        finally:
            del st.promoting[skey]
            st.reserved_bytes -= need
            doomed = ssd.end_read(skey, sentry, reason)
            st.cond.notify_all()
            if reason or t.removed or st.closed:
                dram.allocator.free(off, size)
        if doomed:
            st.unlocked(ssd.delete_files, doomed)
        if reason or t.removed:
            return None
        st.check_open()
        if skey in dram.entries or ssd.entries.get(skey) is not sentry:
            # the SSD evicted the block while we read it and a put committed the key again
            # (in DRAM, or demoted since): ours are older bytes; the newer block wins
            dram.allocator.free(off, size)
            return AGAIN
        entry = DramEntry(off, st.interner.size(size), sentry.info, sentry.generation)
        dram.add(skey, entry)
        ssd.hits += 1
        return entry

    def promote_many(self, skeys: list[bytes], pool_wait: PoolWait | None = None) -> set[bytes]:
        """Promote the SSD-only blocks among ``skeys`` with their reads in parallel (lock held;
        released during the reads, which go straight into their arena slots).

        Best effort, for a batch get: a block it does not promote (DRAM cannot make room,
        changed meanwhile, unreadable) is left to :meth:`promote`, which decides what the
        reader sees. Blocks are allocated in order and the batch stops at the first
        allocation that fails, so earlier keys of a prefix win.

        Returns:
            Store keys now in DRAM (unpinned) because of this call.

        Raises:
            Unavailable: the store was closed meanwhile (nothing of the batch is left
                reserved).
        """
        st = self._state
        ssd, dram = st.ssd, st.dram
        assert ssd is not None
        todo: list[tuple[bytes, SsdEntry, InTransit, int]] = []
        seen: set[bytes] = set()
        # Hold the batch's DRAM hits while making room, as the one-by-one path (which pins
        # each hit before promoting the next key) would: never evict what this get returns.
        held = {k: dram.entries[k] for k in skeys if k in dram.entries}
        for e in held.values():
            st.pin(e)
        try:
            self._make_room_many(skeys)
            for skey in skeys:
                if skey in seen or skey in dram.entries or skey in st.promoting:
                    continue
                sentry = ssd.entries.get(skey)
                if sentry is None:
                    continue
                seen.add(skey)
                ssd.entries.move_to_end(skey)
                try:
                    off = self.allocate(sentry.size_bytes, wait_for_pool=True, promotion=True,
                                        pool_wait=pool_wait)
                except NoCapacity:
                    break
                size = sentry.size_bytes
                if skey in dram.entries or skey in st.promoting or ssd.entries.get(skey) is not sentry:
                    dram.allocator.free(off, size)  # changed while demotions made room
                    continue
                t = InTransit(offset=off, size_bytes=size)
                st.promoting[skey] = t
                need = dram.round_up(size)
                st.reserved_bytes += need
                todo.append((skey, sentry, t, need))
        except BaseException:  # Unavailable (closed) while making room: nothing was read
            for skey, _, t, need in todo:
                del st.promoting[skey]
                st.reserved_bytes -= need
                dram.allocator.free(t.offset, t.size_bytes)
            st.cond.notify_all()
            raise
        finally:
            for e in held.values():
                st.unpin_entry(e)
        if not todo:
            return set()
        arena = st.arena
        reads = [(k, se, arena[t.offset : t.offset + need]) for k, se, t, need in todo]
        reasons = ["read_failed"] * len(todo)
        try:
            reasons = st.unlocked(ssd.read_files, reads)
        finally:
            done = self._finish_promotions(todo, reasons)
        st.check_open()
        return done

    def _make_room_many(self, skeys: list[bytes]) -> None:
        """Evict, in one :meth:`_evict_window` (its demotions written several at once), the
        victims a batch's SSD-only blocks need, before :meth:`promote_many` allocates them
        one by one (lock held; released during the writes). Best effort: each allocation
        still makes its own room if this fell short (fragmentation, a change meanwhile), so
        this only turns one-block demotion writes (queue depth 1) into one batch.

        Victims are only blocks whose eviction drops nothing from the pool (copies, blocks
        on SSD, demotions the SSD takes as is, all of them together; spare.py), LRU first
        (copies first), each through :func:`~kvstored.tiers.eviction.victim_window` for one block's size;
        blocks of the batch itself are pinned (held) by the caller, so never victims. The
        batch's SSD entries are made the most recent first, so the demotions' SSD evictions
        take other blocks.
        """
        st = self._state
        ssd, dram = st.ssd, st.dram
        assert ssd is not None
        alloc = dram.allocator
        needs: list[int] = []
        for skey in dict.fromkeys(skeys):  # (unique, in order)
            if skey in dram.entries or skey in st.promoting:
                continue
            sentry = ssd.entries.get(skey)
            if sentry is not None:
                ssd.entries.move_to_end(skey)
                needs.append(alloc.round_up(sentry.size_bytes))
        free = alloc.free_bytes
        while needs and free >= needs[0]:  # what fits already (optimistic: free may be split)
            free -= needs.pop(0)
        if len(needs) < 2:
            return  # nothing to batch: allocate() evicts for a single block itself
        chosen: dict[bytes, None] = {}
        spares = spares_pool(dram, ssd)

        def evictable(k: bytes) -> bool:  # only victims whose eviction drops nothing
            return k not in chosen and self.evictable(k) and spares(k)

        tries = 0
        dram.absorb_reads()  # one-sided reads since the last eviction count as recency
        lru = candidates(dram, ssd=ssd)  # copies, then LRU first; one pass for the whole batch
        for need in needs:
            window = None
            for skey in lru:
                if not evictable(skey):
                    continue
                window = victim_window(dram, skey, need, evictable)
                if window is not None and not window_spares_pool(dram, ssd, [*chosen, *window]):
                    window = None  # the SSD cannot take all these demotions as is
                if window is not None:
                    break
                tries += 1
                if tries >= MAX_WINDOW_TRIES:
                    break
            if window is None:
                break  # the per-block allocations take it from here (spare first, then LRU)
            chosen.update(dict.fromkeys(window))
        if len(chosen) > 1:
            self._evict_window(list(chosen))

    def _finish_promotions(
        self, todo: list[tuple[bytes, SsdEntry, InTransit, int]], reasons: list[str]
    ) -> set[bytes]:
        """Index the promotions of :meth:`promote_many` that read well; free the others."""
        st = self._state
        ssd, dram = st.ssd, st.dram
        assert ssd is not None
        intern_size = st.interner.size
        done: set[bytes] = set()
        doomed: list[bytes] = []
        for (skey, sentry, t, need), reason in zip(todo, reasons, strict=True):
            del st.promoting[skey]
            st.reserved_bytes -= need
            doomed += ssd.end_read(skey, sentry, reason)
            if (reason or t.removed or st.closed or skey in dram.entries
                    or ssd.entries.get(skey) is not sentry):
                # (a failed read, a removal, or the SSD evicted the block while we read it
                # and a put committed the key again: never index older bytes over it)
                dram.allocator.free(t.offset, t.size_bytes)
                continue
            dram.add(skey, DramEntry(t.offset, intern_size(t.size_bytes), sentry.info,
                                     sentry.generation))  # the SSD replica's bytes
            ssd.hits += 1
            done.add(skey)
        st.cond.notify_all()
        if doomed:
            st.unlocked(ssd.delete_files, doomed)
        return done

    def spill_to_ssd(self) -> int:
        """``TieredStore.spill_to_ssd`` (takes the lock itself; contract there)."""
        st = self._state
        ssd = st.ssd
        if ssd is None:
            return 0
        num = 0
        with st.lock:
            st.check_open()
            dram = st.dram
            todo = [k for k in dram.entries if k not in ssd.entries]
            for skey in todo:
                e = dram.entries.get(skey)
                if e is None or skey in st.demoting or skey in ssd.entries or st.closed:
                    continue
                w = ssd.begin_write(
                    skey, e.size_bytes, namespace_id=split_store_key(skey)[0], meta=e.meta
                )
                if w is None:
                    continue
                w.generation = e.generation  # the same bytes: the same generation
                w.touched = e.touched
                t = InTransit(entry=e)
                st.demoting[skey] = t
                try:
                    ok = st.unlocked(
                        ssd.write_file, w, st.arena[e.offset : e.offset + e.size_bytes]
                    )
                finally:
                    del st.demoting[skey]
                    doomed = ssd.end_write(w, keep=not t.removed)
                    if t.removed:
                        dram.allocator.free(e.offset, e.size_bytes)
                    st.cond.notify_all()
                if doomed:
                    st.unlocked(ssd.delete_files, doomed)
                num += bool(ok and not t.removed)
        log.info("blocks_spilled", num_blocks=num)
        return num
