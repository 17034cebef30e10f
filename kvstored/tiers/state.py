"""StoreState: the one set of mutable state the store's components share.

``TieredStore`` (tiered.py) is a facade over four components, each built with the same
:class:`StoreState` (composed, not inherited: a component owns no store state of its own
beyond its private caches)::

    TieredStore (facade: the public methods, construction, close)
      |-- Reservations  reservations.py  reserve / reserve_many / commit / abort / put / remove
      |-- Reads         reads.py         pin_many / unpin_many / touch / probes / stats
      |-- Exports       export.py        coldest_blocks / read_for_export / release_export
      '-- Transit       transit.py       allocation with eviction, demotion, promotion, spill
                                         (used by Reservations and Reads)
    StoreState          lock + condition, the tiers (DRAM arena, optional SSD), the
                        reservations, the blocks in transit, the byte counters, the counts

Locking. One ``threading.Lock`` (:attr:`StoreState.lock`, not reentrant) guards every field
here and all metadata of both tiers (the SSD tier is given the same lock object). It is the
only lock taken while calling into a tier; the SSD tier's phases never take another. The
change feed's own lock (feed.py) may be taken while it is held, never the other way round
(a drain takes only the feed's lock, so it never waits for the store). No disk I/O ever runs
under it (transit.py: :meth:`StoreState.unlocked`). :attr:`StoreState.cond` (on the same
lock) wakes readers waiting for a promotion and allocators waiting for a demotion or a
release.

Invariants (lock held):

- ``reserved_bytes`` = sum of ``round_up(size)`` over :attr:`StoreState.pending` and the
  promotions in flight (:attr:`StoreState.promoting`); ``pinned_bytes`` = sum of
  ``round_up(size)`` over DRAM entries with ``pins > 0``, and ``dram.pinned_blocks`` their
  number. Allocation refuses (NoCapacity) what could never fit beside those two.
- A store key is in at most one of ``demoting`` / ``promoting``; a DEMOTING block is in the
  DRAM map (until a remove unindexes it: then ``removed`` is set and the demoter frees its
  space); a PROMOTING block owns arena space but is in no DRAM map.
- ``closed`` only goes from False to True (close waits until nothing is in transit).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from kvstored.errors import Unavailable
from kvstored.tiers.redundant import RedundantMarks
from kvstored.tiers.tenants import TenantUsage

if TYPE_CHECKING:
    from kvstored.tiers.base import TierBackend
    from kvstored.tiers.dram import DramEntry, DramTier
    from kvstored.tiers.ssd import SsdTier

T = TypeVar("T")

INTERN_MAX_ENTRIES = 65536
"""Most distinct values each :class:`Interner` table holds (later ones are not shared)."""


class Interner:
    """One shared object per distinct ``(namespace_id, meta)`` pair and per block size, so a
    million entries of one model cost one tuple and one int (bounded tables).

    Not thread-safe: called with the store lock held (or before the store is shared).
    """

    __slots__ = ("_infos", "_sizes")

    def __init__(self) -> None:
        self._infos: dict[tuple[bytes, bytes], tuple[bytes, bytes]] = {}
        self._sizes: dict[int, int] = {}

    def info(self, namespace_id: bytes, meta: bytes) -> tuple[bytes, bytes]:
        """The shared ``(namespace_id, meta)`` tuple equal to this pair."""
        info = (namespace_id, meta)
        got = self._infos.get(info)
        if got is not None:
            return got
        if len(self._infos) < INTERN_MAX_ENTRIES:
            self._infos[info] = info
        return info

    def size(self, size_bytes: int) -> int:
        """The shared int object equal to ``size_bytes``."""
        got = self._sizes.get(size_bytes)
        if got is not None:
            return got
        if len(self._sizes) < INTERN_MAX_ENTRIES:
            self._sizes[size_bytes] = size_bytes
        return size_bytes


class PendingReservation:
    """A reservation's bookkeeping (the caller holds the public ``Reservation``).

    Attributes:
        skey: the block's store key.
        offset: its arena offset (aligned).
        size_bytes: its exact size.
        info: the interned ``(namespace_id, meta)`` pair.
        copy: a remote-fill copy of a peer's block (spare.py).
    """

    __slots__ = ("copy", "info", "offset", "size_bytes", "skey")

    def __init__(self, skey: bytes, offset: int, size_bytes: int, info: tuple[bytes, bytes],
                 copy: bool = False):
        self.skey = skey
        self.offset = offset
        self.size_bytes = size_bytes
        self.info = info
        self.copy = copy


@dataclass(slots=True)
class InTransit:
    """A block between tiers: DEMOTING (``entry`` set) or PROMOTING (``offset`` set)."""

    entry: DramEntry | None = None
    offset: int = -1
    size_bytes: int = 0
    removed: bool = False  # removed while in transit: its copy must not become visible


class StoreState:
    """The store's shared state: lock, condition, tiers, reservations, blocks in transit,
    byte counters and request counts (module docstring: invariants and the lock).

    Every attribute is read and written with :attr:`lock` held, except the references that
    never change after construction (``lock``, ``cond``, ``dram``, ``ssd``, ``tiers``,
    ``interner``, ``max_block_bytes``), which callers may bind outside it.

    Args:
        lock: the store lock (the SSD tier was given the same object).
        dram: the DRAM tier over the arena.
        ssd: the SSD tier, or None when the store has none.
        interner: the tables the tiers' entries share their values through.
        max_block_bytes: the largest block accepted (> 0).

    Attributes:
        arena: a view of the whole arena (``dram.arena.view``); emptied on close.
        pending: reservation id -> its bookkeeping, until committed or aborted.
        reservation_ids: the next reservation ids (1, 2, ...).
        reserved_bytes: arena bytes of reservations and promotions in flight (rounded).
        pinned_bytes: arena bytes of pinned DRAM blocks (rounded).
        demoting: store key -> the DEMOTING block being written to SSD.
        promoting: store key -> the PROMOTING block being read from SSD.
        gets, hits, misses, puts: request counts since start (``StoreStats``).
        closed: the store is closed (every entry point then raises Unavailable).
    """

    __slots__ = (
        "arena", "closed", "cond", "demoting", "dram", "gets", "hits", "interner", "lock",
        "marks", "max_block_bytes", "misses", "pending", "pinned_bytes", "promoting", "puts",
        "reservation_ids", "reserved_bytes", "ssd", "tenants", "tiers",
    )

    def __init__(self, *, lock: threading.Lock, dram: DramTier, ssd: SsdTier | None,
                 interner: Interner, max_block_bytes: int,
                 tenants: TenantUsage | None = None) -> None:
        self.lock = lock
        self.tenants = TenantUsage() if tenants is None else tenants
        """Per-tenant byte counts and quotas (tiers/tenants.py)."""
        self.cond = threading.Condition(lock)
        self.dram = dram
        self.ssd = ssd
        self.tiers: tuple[TierBackend, ...] = (dram,) if ssd is None else (dram, ssd)
        """The tiers, fastest first."""
        self.interner = interner
        self.max_block_bytes = int(max_block_bytes)
        self.arena: memoryview = dram.arena.view
        self.pending: dict[int, PendingReservation] = {}
        self.reservation_ids = itertools.count(1)
        self.reserved_bytes = 0
        self.pinned_bytes = 0
        self.demoting: dict[bytes, InTransit] = {}
        self.promoting: dict[bytes, InTransit] = {}
        self.gets = 0
        self.hits = 0
        self.misses = 0
        self.puts = 0
        self.closed = False
        self.marks = RedundantMarks()
        """This node's redundant-replica marks (tiers/redundant.py): dropped before sole copies."""

    # ---- helpers (lock held) -------------------------------------------------------------
    def check_open(self) -> None:
        """Raise Unavailable once the store is closed (lock held)."""
        if self.closed:
            raise Unavailable("the block store is closed")

    def has(self, skey: bytes) -> bool:
        """Whether a block is committed in any tier (lock held; never waits)."""
        ssd = self.ssd
        return skey in self.dram.entries or (ssd is not None and skey in ssd.entries)

    def pin(self, entry: DramEntry) -> None:
        """Take one pin on a DRAM entry, counting it in the pinned bytes (lock held)."""
        if entry.pins == 0:
            self.dram.pinned_blocks += 1
            self.pinned_bytes += self.dram.round_up(entry.size_bytes)
        entry.pins += 1

    def unpin_entry(self, entry: DramEntry) -> None:
        """Release one pin taken by :meth:`pin`, waking allocators when it was the last one
        (lock held; the caller knows the entry is pinned)."""
        entry.pins -= 1
        if entry.pins == 0:
            self.dram.pinned_blocks -= 1
            self.pinned_bytes -= self.dram.round_up(entry.size_bytes)
            self.cond.notify_all()

    def unlocked(self, fn: Callable[..., T], *args: object) -> T:
        """Run ``fn(*args)`` (disk I/O) with the lock released; re-take it before returning
        (also when ``fn`` raises). Called with the lock held."""
        self.lock.release()
        try:
            return fn(*args)
        finally:
            self.lock.acquire()
