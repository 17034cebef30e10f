"""The store's write side: reservations, commits, aborts, puts, removals, copy marks.

:class:`Reservations` is the store component (built with the
:class:`~kvstored.tiers.state.StoreState` and the :class:`~kvstored.tiers.transit.Transit`
that makes room) behind ``TieredStore.reserve`` / ``reserve_many`` / ``commit`` /
``commit_many`` / ``abort`` / ``put`` / ``keep_copies`` / ``remove``; the contracts are on
the facade (tiered.py). A reservation owns arena space (counted in ``reserved_bytes``) and
is invisible to readers until committed; the first commit of a block wins, a later one
frees its space.

A whole put batch under one lock (the shared-memory put's hot path). ``reserve(key, ...)``
costs a lock, the argument checks and two sorted-container updates of the allocator per
block; a batch of 16 small blocks spent ~150 us there. :meth:`Reservations.reserve_many`
takes the lock once, checks the arguments once, and carves the batch out of **one** free
extent when the arena has one large enough (one allocator update instead of one per block)::

    one extent of sum(round_up(size_i)) bytes, best fit:
    | b0 (4K) | b1 (8K)     | b2 (4K) | ...      each block aligned at 4096, as if allocated
    base      base+4K       base+12K             alone; each is freed on its own later

The allocator keeps no per-allocation state (tiers/allocator.py), so a block carved out of
a batch extent is freed, evicted and coalesced exactly like one allocated alone. When no
single extent fits, each block is allocated on its own (``Transit.allocate``: eviction,
demotion). ``may_block=False`` (the event loop) never waits for disk I/O: if any block would
need an eviction, nothing is reserved and the call answers :data:`NEEDS_IO`. The lock is held
while carving; released only by the allocation's demotions (transit.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvstored.errors import (
    BlockTooLarge,
    InvalidArgument,
    KeyInvalid,
    KvstoredError,
    NotFound,
)
from kvstored.tiers.base import NEEDS_IO, check_bytes, check_key
from kvstored.tiers.dram import DramEntry
from kvstored.tiers.ssd_format import store_key, touch_time
from kvstored.tiers.state import PendingReservation
from kvstored.types import Reservation, Tier

SLOT_KEY = b"\x00kvstored-slot"
"""The placeholder key of a keyless slot (reserve-ahead puts): never a block's key, since
a slot's pending reservation is never looked up by key and is committed under a real one."""

if TYPE_CHECKING:
    from kvstored.tiers.state import StoreState
    from kvstored.tiers.transit import Transit


def _take_pending(st: StoreState, reservation: Reservation) -> PendingReservation:
    pending = st.pending.pop(reservation.reservation_id, None)
    if pending is None:
        raise NotFound(
            f"reservation {reservation.reservation_id} is unknown: already committed or "
            "aborted"
        )
    st.reserved_bytes -= st.dram.round_up(pending.size_bytes)
    st.tenants.unreserve(pending.skey, pending.size_bytes)
    return pending


def _commit_locked(st: StoreState, pending: PendingReservation,
                   added: list[DramEntry] | None = None) -> bool:
    """Commit one pending reservation (lock held). ``added``: the new entry is appended to
    it unpublished; the caller publishes the list (``DramTier.publish``) before it releases
    the lock."""
    dram = st.dram
    if st.has(pending.skey):
        dram.allocator.free(pending.offset, pending.size_bytes)
        if not pending.copy:
            dram.copies.pop(pending.skey, None)
        return False
    if pending.copy:  # marked first: the entry's one ADDED event says copy (feed.py)
        dram.copies[pending.skey] = None
    entry = DramEntry(pending.offset, pending.size_bytes, pending.info)
    dram.add(pending.skey, entry, publish=added is None)
    if added is not None:
        added.append(entry)
    st.puts += 1
    return True


class Reservations:
    """The write side of one store (module docstring; contracts on ``TieredStore``).

    Args:
        state: the store's shared state.
        transit: allocates arena space, evicting and demoting as needed.
    """

    def __init__(self, state: StoreState, transit: Transit) -> None:
        self._state = state
        self._transit = transit

    def reserve(
        self, key: bytes, size_bytes: int, *, namespace_id: bytes = b"", meta: bytes = b"",
        copy: bool = False, handoff_age_s: float | None = None, spare_only: bool = False,
        spare_or_redundant: bool = False,
    ) -> Reservation | None:
        """``TieredStore.reserve`` (contract there)."""
        st = self._state
        key = check_key(key)
        namespace_id = check_bytes("namespace_id", namespace_id)
        meta = check_bytes("meta", meta)
        if not isinstance(size_bytes, int) or size_bytes < 0:
            raise InvalidArgument(f"size_bytes must be an int >= 0, got {size_bytes!r}")
        if size_bytes > st.max_block_bytes:
            raise BlockTooLarge(
                f"block of {size_bytes} bytes exceeds max_block_bytes={st.max_block_bytes}; "
                "raise node.max_block_bytes or use smaller blocks"
            )
        skey = store_key(namespace_id, key)
        with st.lock:
            st.check_open()
            if st.has(skey):
                if not copy:
                    st.dram.copies.pop(skey, None)  # written here too: no mere duplicate
                return None
            tenant = st.tenants.tenant_of_namespace(namespace_id)
            st.tenants.check_dram(tenant, size_bytes)  # before allocating: never evicts for it
            offset = self._transit.allocate(
                size_bytes, copy=copy or spare_only,
                wait_for_pool=(not (copy or spare_only or spare_or_redundant)
                               and handoff_age_s is None),
                handoff_age_s=handoff_age_s,
                spare_or_redundant=spare_or_redundant and not (copy or spare_only))
            st.tenants.reserve(tenant, size_bytes)
            rid = next(st.reservation_ids)
            interner = st.interner
            st.pending[rid] = PendingReservation(
                skey, offset, interner.size(size_bytes), interner.info(namespace_id, meta),
                copy,
            )
            st.reserved_bytes += st.dram.round_up(size_bytes)
            view = st.arena[offset : offset + size_bytes]
        return Reservation(
            key=key, offset=offset, size_bytes=size_bytes, view=view, reservation_id=rid
        )

    def reserve_many(
        self,
        items: Sequence[tuple[bytes, int, bytes]],
        *,
        namespace_id: bytes = b"",
        may_block: bool = True,
    ) -> list[Reservation | KvstoredError | None] | object:
        """``TieredStore.reserve_many`` (contract there; the batch carving: module docstring)."""
        if type(namespace_id) is not bytes:
            raise InvalidArgument(f"namespace_id must be bytes, got {type(namespace_id).__name__}")
        st = self._state
        limit = st.max_block_bytes
        for i, (key, size, meta) in enumerate(items):
            if type(key) is not bytes or not key:
                raise KeyInvalid(f"item #{i}: a block key is non-empty bytes; got {key!r:.40}")
            if type(meta) is not bytes:
                raise InvalidArgument(f"item #{i}: meta must be bytes, got {type(meta).__name__}")
            if type(size) is not int or not 0 <= size <= limit:
                raise InvalidArgument(f"item #{i}: size_bytes must be an int in 0..{limit}, got {size!r}")
        n = len(items)
        skeys = [store_key(namespace_id, key) for key, _, _ in items]
        out: list[Reservation | KvstoredError | None] = [None] * n
        dram = st.dram
        align = dram.allocator.alignment_bytes
        mask = ~(align - 1)
        with st.lock:
            st.check_open()
            has = st.has
            todo: list[int] = []
            stored: list[bytes] = []
            seen: set[bytes] = set()
            total = 0
            for i, skey in enumerate(skeys):
                if skey in seen:
                    continue
                seen.add(skey)
                if has(skey):
                    stored.append(skey)
                    continue
                todo.append(i)
            usage = st.tenants
            tenant = usage.tenant_of_namespace(namespace_id)
            refused: list[int] = []
            if tenant in usage.quotas:  # over the quota: refused before allocating (never evicts)
                granted, kept = 0, []
                for i in todo:
                    err = usage.over_dram(tenant, items[i][1], extra_bytes=granted)
                    if err is None:
                        granted += items[i][1]
                        kept.append(i)
                    else:
                        out[i] = err
                        refused.append(i)
                todo = kept
            for i in todo:
                total += ((items[i][1] or 1) + align - 1) & mask
            base = dram.allocator.allocate(total) if todo else 0
            if base is None and not may_block:
                for i in refused:
                    out[i] = None
                return NEEDS_IO  # nothing changed
            for _ in refused:
                usage.note_refusal(tenant, Tier.DRAM)
            copies = dram.copies
            if copies:
                for skey in stored:
                    copies.pop(skey, None)  # written here too: no mere duplicate
            if not todo:
                return out
            if base is not None:
                st.reserved_bytes += total
            interner = st.interner
            intern_size, intern_info = interner.size, interner.info
            info = intern_info(namespace_id, b"")
            reservations, ids, arena = st.pending, st.reservation_ids, st.arena
            allocate = self._transit.allocate
            offset = 0 if base is None else base
            for i in todo:
                key, size, meta = items[i]
                if base is not None:
                    off = offset
                    offset += ((size or 1) + align - 1) & mask
                else:
                    try:
                        off = allocate(size, wait_for_pool=True)
                    except KvstoredError as exc:  # NoCapacity; Unavailable once closed
                        out[i] = exc
                        continue
                    st.reserved_bytes += ((size or 1) + align - 1) & mask
                usage.reserve(tenant, size)
                rid = next(ids)
                reservations[rid] = PendingReservation(
                    skeys[i], off, intern_size(size),
                    intern_info(namespace_id, meta) if meta else info,
                )
                out[i] = Reservation(key, off, size, arena[off : off + size], rid)
        return out

    def reserve_slots(
        self, size_bytes: int, num_slots: int, *, namespace_id: bytes, may_block: bool,
        ahead: bool = False,
    ) -> list[Reservation] | object:
        """``TieredStore.reserve_slots`` (contract there)."""
        st = self._state
        if type(size_bytes) is not int or not 0 < size_bytes <= st.max_block_bytes:
            raise InvalidArgument(
                f"slot size must be an int in 1..{st.max_block_bytes} bytes, got {size_bytes!r}"
            )
        if type(num_slots) is not int or num_slots < 0:
            raise InvalidArgument(f"num_slots must be an int >= 0, got {num_slots!r}")
        skey = store_key(namespace_id, SLOT_KEY)
        size = st.dram.round_up(size_bytes)
        out: list[Reservation] = []
        with st.lock:
            st.check_open()
            usage = st.tenants
            tenant = usage.tenant_of_namespace(namespace_id)
            n = num_slots
            if tenant in usage.quotas:  # a slot is charged like a reservation: within quota
                n = 0
                while n < num_slots and usage.over_dram(tenant, size, extra_bytes=n * size) is None:
                    n += 1
            if n == 0:
                return out
            base = st.dram.allocator.allocate(n * size)
            if base is None and not may_block:
                return NEEDS_IO
            interner = st.interner
            info = interner.info(namespace_id, b"")
            isize = interner.size(size)
            pending, ids, arena = st.pending, st.reservation_ids, st.arena
            if base is not None:  # one free extent: no wait, counted once for the batch
                for k in range(n):
                    off = base + k * size
                    rid = next(ids)
                    pending[rid] = PendingReservation(skey, off, isize, info)
                    out.append(Reservation(SLOT_KEY, off, size, arena[off : off + size], rid))
                st.reserved_bytes += size * n
                usage.reserve(tenant, size * n)
                return out
            for _ in range(n):  # an eviction per slot (it may wait for the pool: counted as it goes)
                try:
                    off = self._transit.allocate(size, wait_for_pool=not ahead, ahead=ahead)
                except KvstoredError:  # NoCapacity: grant fewer (a put then reserves)
                    break
                st.reserved_bytes += size
                usage.reserve(tenant, size)
                rid = next(ids)
                pending[rid] = PendingReservation(skey, off, isize, info)
                out.append(Reservation(SLOT_KEY, off, size, arena[off : off + size], rid))
        return out

    def commit_slots(
        self, writes: Sequence[tuple[Reservation, bytes, int, bytes]], *, namespace_id: bytes,
    ) -> list[bool]:
        """``TieredStore.commit_slots`` (contract there)."""
        st = self._state
        dram = st.dram
        with st.lock:
            pending = st.pending
            for r, key, size, _meta in writes:
                if r.reservation_id not in pending:
                    raise NotFound(f"slot {r.reservation_id} is unknown: already committed or aborted")
                if not 0 <= size <= r.size_bytes or not key:
                    raise InvalidArgument(
                        f"a write of {size} bytes into a slot of {r.size_bytes} bytes (key "
                        f"{key!r:.40}): a slot holds at most its size, under a non-empty key"
                    )
            if len({r.reservation_id for r, *_ in writes}) != len(writes):
                raise NotFound("a slot is written twice in one commit: the second is already committed")
            out = [False] * len(writes)
            interner = st.interner
            allocator = dram.allocator
            entries = dram.entries
            ssd_entries = None if st.ssd is None else st.ssd.entries
            tag = store_key(namespace_id, b"")  # every write's store key: tag + key
            infos: dict[bytes, tuple[bytes, bytes]] = {}
            unreserved: dict[bytes, int] = {}  # a slot's store key -> bytes (one tenant each)
            new: list[tuple[bytes, DramEntry]] = []  # added and published together below
            fresh: set[bytes] = set()
            reserved = 0
            round_up = allocator.round_up
            sizes: dict[int, int] = {}  # size -> its interned int (a batch has one or few sizes)
            rounded: dict[int, int] = {}  # size -> the arena bytes it takes
            now = touch_time()  # one stamp for the batch (entries share it within 1 ms anyway)
            try:
                for i in range(len(writes) - 1, -1, -1):  # last first: the head ends most recent
                    r, key, size, meta = writes[i]
                    slot = pending.pop(r.reservation_id)  # _take_pending, summed below (checked above)
                    ssize = slot.size_bytes
                    got = rounded.get(ssize)
                    if got is None:
                        got = rounded[ssize] = round_up(ssize)
                    reserved += got
                    unreserved[slot.skey] = unreserved.get(slot.skey, 0) + ssize
                    used = rounded.get(size)
                    if used is None:
                        used = rounded[size] = round_up(size)
                    if used < r.size_bytes:  # the slot's tail goes back to the free space
                        allocator.free(slot.offset + used, r.size_bytes - used)
                    skey = tag + key
                    if skey in fresh or skey in entries or (ssd_entries is not None and skey in ssd_entries):
                        allocator.free(slot.offset, size)  # stored already: first writer wins
                        dram.copies.pop(skey, None)  # a local put of the key: not a copy now
                        continue
                    info = infos.get(meta)
                    if info is None:
                        info = infos[meta] = interner.info(namespace_id, meta)
                    isize = sizes.get(size)
                    if isize is None:
                        isize = sizes[size] = interner.size(size)
                    new.append((skey, DramEntry(slot.offset, isize, info, 0, now)))
                    fresh.add(skey)
                    out[i] = True
            finally:
                st.reserved_bytes -= reserved
                for skey, n in unreserved.items():
                    st.tenants.unreserve(skey, n)
                # (before the lock is released: one publish for the batch; the keys were
                # checked distinct and absent above, under this lock)
                dram.add_many(new, checked_new=True)
                st.puts += len(new)
            st.cond.notify_all()
            return out

    def keep_copies(self, blocks: Sequence[tuple[bytes, bytes]]) -> int:
        """``TieredStore.keep_copies`` (contract there)."""
        st = self._state
        n = 0
        with st.lock:
            copies = st.dram.copies
            for namespace_id, key in blocks:
                n += copies.pop(store_key(namespace_id, key), False) is None
        return n

    def commit(self, reservation: Reservation) -> bool:
        """``TieredStore.commit`` (contract there)."""
        st = self._state
        with st.lock:
            return _commit_locked(st, _take_pending(st, reservation))

    def commit_many(self, reservations: Sequence[Reservation]) -> list[bool]:
        """``TieredStore.commit_many`` (contract there): committed last-first, so the head
        of the batch ends up the most recent."""
        st = self._state
        with st.lock:
            pending = st.pending
            for r in reservations:
                if r.reservation_id not in pending:
                    raise NotFound(
                        f"reservation {r.reservation_id} is unknown: already committed or aborted"
                    )
            out = [False] * len(reservations)
            added: list[DramEntry] = []
            try:
                for i in range(len(reservations) - 1, -1, -1):
                    out[i] = _commit_locked(st, _take_pending(st, reservations[i]), added)
            finally:
                st.dram.publish(added)  # before the lock is released: one native call
            return out

    def abort(self, reservation: Reservation) -> None:
        """``TieredStore.abort`` (contract there)."""
        st = self._state
        with st.lock:
            pending = st.pending.pop(reservation.reservation_id, None)
            if pending is None:
                return
            st.reserved_bytes -= st.dram.round_up(pending.size_bytes)
            st.tenants.unreserve(pending.skey, pending.size_bytes)
            st.dram.allocator.free(pending.offset, pending.size_bytes)
            st.cond.notify_all()

    def put(
        self,
        key: bytes,
        data: bytes | bytearray | memoryview,
        *,
        namespace_id: bytes = b"",
        meta: bytes = b"",
    ) -> bool:
        """``TieredStore.put`` (contract there): reserve, copy, commit."""
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

    def remove(self, keys: Sequence[bytes], *, namespace_id: bytes = b"") -> list[bool]:
        """``TieredStore.remove`` (contract there). A block in transit is marked ``removed``
        (its transfer then frees it, never makes it visible); SSD files are deleted with
        the lock released."""
        st = self._state
        namespace_id = check_bytes("namespace_id", namespace_id)
        skeys = [store_key(namespace_id, check_key(k)) for k in keys]
        out: list[bool] = []
        doomed: list[bytes] = []
        with st.lock:
            st.check_open()
            dram, ssd = st.dram, st.ssd
            for skey in skeys:
                entry = dram.entries.get(skey)
                if entry is not None and entry.pins > 0:
                    out.append(False)
                    continue
                removed = False
                if entry is not None:
                    t = st.demoting.get(skey)
                    if t is not None and t.entry is entry:
                        dram.forget(skey)  # the demoter frees the space when its write ends
                        t.removed = True
                    else:  # (a demotion of an older, removed block of the key frees only that one)
                        dram.remove(skey)
                    removed = True
                t = st.promoting.get(skey)
                if t is not None:
                    t.removed = True
                if ssd is not None:
                    dropped = ssd.drop(skey)
                    doomed += dropped
                    removed = removed or bool(dropped)
                out.append(removed)
            st.cond.notify_all()
        if doomed and ssd is not None:
            ssd.delete_files(doomed)
        return out
