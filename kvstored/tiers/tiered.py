"""TieredStore: the node's block store over a DRAM arena and an optional SSD directory.

No gRPC in here: the node service is a thin adapter over this class.

A facade: its public methods are the store's contract (below and on each method); the work
is done by components built once over one shared :class:`~kvstored.tiers.state.StoreState`
(state.py: the diagram, the lock and the invariants of the shared fields)::

    reserve, reserve_many, commit, commit_many, abort, put,   -> Reservations (reservations.py)
      keep_copies, remove
    pin_many, unpin, unpin_many, uncount_reads, touch_many,   -> Reads (reads.py)
      get, lookup_prefix, exists, stats, list_blocks
    coldest_blocks, read_for_export, release_export           -> Exports (export.py)
    spill_to_ssd (and every eviction, demotion, promotion)    -> Transit (transit.py)

Identity: a block is ``(namespace_id, key)`` (one *store key*, ssd_format.store_key), in
DRAM and on SSD: the same key under two namespaces names two blocks, and every operation
(put, pin, lookup, exists, remove) sees only its own namespace. ``b""`` is a namespace too.

Transfers between the tiers (DEMOTING, PROMOTING) and eviction are in transit.py (module
docstring: the state machine and why no disk I/O runs under the lock). Reading blocks out
for export (spill: coldest first, never promoting) is in export.py.

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

import contextlib
import mmap
import os
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING

from kvstored.errors import InvalidArgument, KvstoredError, NoCapacity, StorageIOError
from kvstored.tenancy import TenantQuota
from kvstored.tiers.dram import DramArena, DramTier
from kvstored.tiers.export import DEFAULT_MAX_SCAN, Exports
from kvstored.tiers.feed import ChangeFeed, ObservedCopies, ObservedEntries
from kvstored.tiers.reads import Reads
from kvstored.tiers.reservations import Reservations
from kvstored.tiers.spare import SpareBytes, coldest_original_touched
from kvstored.tiers.ssd import SsdTier
from kvstored.tiers.ssd_format import store_key
from kvstored.tiers.state import Interner, StoreState
from kvstored.tiers.tenants import TenantUsage
from kvstored.tiers.transit import MAX_REDUNDANT_SCAN, Transit
from kvstored.types import (
    BlockInfo,
    ExportedBlock,
    PinnedBlock,
    Reservation,
    StoreStats,
    Tier,
)

if TYPE_CHECKING:
    from kvstored.config import NodeConfig


class TieredStore:
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

    Attributes:
        change_feed: every change of the tiers' block maps, in order (feed.py).
        arena_path: the arena file's path (None for an anonymous arena).
        arena_file_id: ``(st_dev, st_ino)`` of the mapped arena file, recorded when it was
            created.
        arena_size_bytes: the arena's size.
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
        tenant_quotas: Mapping[str, TenantQuota] | None = None,
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
        lock = threading.Lock()
        interner = Interner()
        try:
            arena = DramArena(dram_size_bytes, arena_dir=arena_dir, node_id=node_id)
        except OSError as exc:
            raise StorageIOError(
                f"cannot create the {dram_size_bytes}-byte DRAM arena in {arena_dir}: "
                f"{exc.strerror or exc}; check node.arena_dir and node.dram_size_bytes"
            ) from exc
        dram = DramTier(arena)
        ssd: SsdTier | None = None
        if ssd_dir is not None and ssd_size_bytes > 0:
            try:
                ssd = SsdTier(
                    ssd_dir, ssd_size_bytes, direct_io=ssd_direct_io,
                    intern_info=interner.info, intern_size=interner.size, lock=lock,
                )
            except BaseException:
                arena.close()
                raise
        # the change feed MasterLink drains (feed.py): the tiers' block maps record changes
        # and keep the per-tenant byte counts (tiers/tenants.py) current
        self.change_feed = ChangeFeed()
        self.tenants = usage = TenantUsage(tenant_quotas)
        dram.entries = dram_map = ObservedEntries(self.change_feed, Tier.DRAM,
                                                  dram.entries.items(), usage)
        dram.copies = ObservedCopies(self.change_feed, dram_map, dram.copies)
        ssd_map: ObservedEntries | None = None
        if ssd is not None:
            ssd.entries = ssd_map = ObservedEntries(self.change_feed, Tier.SSD,
                                                    ssd.entries.items(), usage)
            ssd.tenants = usage
            # an SSD allocation evicts a block DRAM also holds first: that drops nothing
            ssd.duplicated = lambda skey: skey in dram.entries
        self._state = state = StoreState(
            lock=lock, dram=dram, ssd=ssd, interner=interner, max_block_bytes=max_block_bytes,
            tenants=usage,
        )
        self._transit = Transit(state)
        # copies and DRAM blocks also on SSD: room, not use (heartbeated spare_bytes)
        self._spare = spare = SpareBytes(dram, ssd)
        dram_map.on_change, dram_map.on_change_many = spare.recheck, spare.recheck_many
        if ssd_map is not None:
            ssd_map.on_change, ssd_map.on_change_many = spare.recheck, spare.recheck_many
        if ssd is not None:
            ssd.redundant_victim = self._redundant_ssd_victim
        self._reservations = Reservations(state, self._transit)
        self._reads = Reads(state, self._transit)
        self._exports = Exports(state, self._reads)
        self.arena_path: str | None = arena.path
        self.arena_file_id: tuple[int, int] = arena.file_id
        self.arena_size_bytes: int = arena.size_bytes
        self._arena = arena

    def arena_mapping(self) -> mmap.mmap:
        """The writable ``MAP_SHARED`` mapping of the whole arena file: the block bytes,
        then the slot headers and the shared index (kvstored/tiers/slots.py), ``Layout(
        arena_size_bytes).total_bytes`` long. What the node registers as its one RDMA memory
        region (kvstored/node/rdma_node.py); whoever exports it must let go before
        :meth:`close` (else the unmap is left to the garbage collector)."""
        return self._arena.mapping

    @classmethod
    def from_config(
        cls, cfg: NodeConfig, *, tenant_quotas: Mapping[str, TenantQuota] | None = None
    ) -> TieredStore:
        """Build the store from a node's config section (``ssd_size_bytes == 0`` = no SSD)
        and the per-tenant quotas (``KvstoredConfig.tenant_quotas()``)."""
        return cls(
            tenant_quotas=tenant_quotas,
            dram_size_bytes=cfg.dram_size_bytes,
            arena_dir=cfg.arena_dir,
            node_id=cfg.node_id,
            ssd_dir=cfg.ssd_dir if cfg.ssd_size_bytes > 0 else None,
            ssd_size_bytes=cfg.ssd_size_bytes,
            ssd_direct_io=cfg.ssd_direct_io,
            max_block_bytes=cfg.max_block_bytes,
        )

    @property
    def arena(self) -> memoryview:
        """A writable view of the whole arena (block bytes at ``offset``); empty once closed."""
        return self._state.arena

    @property
    def max_block_bytes(self) -> int:
        """The largest block accepted, in bytes."""
        return self._state.max_block_bytes

    # ---- put ---------------------------------------------------------------------------
    def reserve(
        self, key: bytes, size_bytes: int, *, namespace_id: bytes = b"", meta: bytes = b"",
        copy: bool = False, handoff_age_s: float | None = None, spare_only: bool = False,
        spare_or_redundant: bool = False,
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
            handoff_age_s: the block is a peer's hand-off (pool LRU, node/spill.py), that
                many seconds since its last use there: when only an eviction for good makes
                room, it is made only if this node's coldest original
                (:meth:`coldest_original_age_s`) is older, decided under the store lock;
                never waits on the pool (``Transit.allocate``).
            spare_only: the block is a new replica of a block another node holds (a
                master's COPY: repair, drain, hot blocks), committed as an original: room
                is made as for ``copy`` (free space, copies, blocks on SSD, demotions the
                SSD takes as is), never by an eviction for good nor a wait on the pool
                (making one replica by dropping another block is a net loss), not even of
                a redundant replica (that would move a deficit, not mend it); no room is
                NoCapacity (the master asks again later or elsewhere).
            spare_or_redundant: the block is a peer's spill (a move: the sender keeps it
                until this node stored it) or a redundant replica of a ``put(replicas=N)``
                (PUT_FLAG_SPARE on the data plane), committed as an original: room is made
                as for ``spare_only`` and also by dropping a redundant replica here
                (another live node holds it; tiers/redundant.py), never by evicting a sole
                copy nor by a wait on the pool; no such room is NoCapacity (the sender asks
                another peer, or reports fewer replicas). Ignored with ``copy`` or
                ``spare_only`` (those are stricter).

        Returns:
            The reservation, or None when the block is already stored (complete) in either
            tier: an idempotent success with nothing to write.

        Raises:
            KeyInvalid: empty or non-bytes key.
            InvalidArgument: negative size, non-bytes or too long (> 255 bytes) namespace,
                non-bytes meta.
            BlockTooLarge: ``size_bytes > max_block_bytes``.
            NoCapacity: retriable; DRAM is full of pinned blocks and writes in progress, or
                (``copy``, ``spare_only``) no room can be made without dropping a block, or
                (``handoff_age_s``) the hand-off is refused: no block here is colder, or
                (``spare_or_redundant``) only dropping a sole copy would make room.
            Unavailable: the store is closed.
        """
        return self._reservations.reserve(
            key, size_bytes, namespace_id=namespace_id, meta=meta, copy=copy,
            handoff_age_s=handoff_age_s, spare_only=spare_only,
            spare_or_redundant=spare_or_redundant,
        )

    def _redundant_ssd_victim(self) -> bytes | None:
        """The least recent SSD-only block that is a redundant replica (lock held; the first
        :data:`~kvstored.tiers.transit.MAX_REDUNDANT_SCAN` of the SSD's LRU order)."""
        st = self._state
        marks, ssd = st.marks, st.ssd
        if ssd is None or not marks.trusted or not len(marks):
            return None
        dram = st.dram.entries
        for n, (skey, e) in enumerate(ssd.entries.items()):
            if n >= MAX_REDUNDANT_SCAN:
                break
            if skey not in dram and skey not in ssd._writing and marks.is_redundant(  # noqa: SLF001
                    skey, e.generation):
                marks.num_dropped += 1
                return skey
        return None

    def mark_redundant(self, items: Sequence[tuple[bytes, str, int]], *,
                       namespace_id: bytes = b"") -> int:
        """Mark replicas here as redundant: ``(key, keeper node id, generation)`` each, where
        the keeper is a live node known to hold these bytes as an original (tiers/redundant.py).
        A replica that is no longer that generation here (removed, re-put) is not marked,
        nor is anything while the marks are not trusted (:meth:`set_marks_trusted`).
        An eviction for good then drops marked replicas before sole copies (dropped, not
        demoted). Thread-safe (the store lock).

        Returns:
            How many were marked.
        """
        st = self._state
        n = 0
        with st.lock:
            if not st.marks.trusted:
                return 0  # a departure could go unheard now: mark nothing (fail safe)
            for key, keeper, generation in items:
                skey = store_key(namespace_id, key)
                e = st.dram.entries.get(skey)
                se = st.ssd.entries.get(skey) if st.ssd is not None else None
                gens = {x.generation for x in (e, se) if x is not None}
                if generation and gens == {generation}:
                    st.marks.mark(skey, keeper, generation)
                    n += 1
        return n

    def forget_keeper(self, node_id: str) -> int:
        """The node left the pool: replicas marked redundant because it holds them are sole
        copies here again. Returns how many marks went. Thread-safe."""
        with self._state.lock:
            return self._state.marks.forget_keeper(node_id)

    def set_marks_trusted(self, trusted: bool) -> None:
        """Whether redundant marks count now (the node's master link: True while it hears
        the master's departure notices; False clears every mark: fail safe). Thread-safe."""
        st = self._state
        with st.lock:
            if not trusted:
                st.marks.clear()
            st.marks.trusted = bool(trusted)

    def has_redundant_victims(self) -> bool:
        """Whether some block here counts as a redundant replica now (so a put that needs
        room drops one of those before handing its coldest sole copy to a peer). Bounded:
        looks at the marks' first :data:`~kvstored.tiers.transit.MAX_REDUNDANT_SCAN`.
        Thread-safe."""
        st = self._state
        with st.lock:
            marks = st.marks
            if not marks.trusted or not len(marks):
                return False
            for n, skey in enumerate(marks.keys()):
                if n >= MAX_REDUNDANT_SCAN:
                    return False
                e = st.dram.entries.get(skey)
                if e is None and st.ssd is not None:
                    se = st.ssd.entries.get(skey)
                    if se is not None and marks.is_redundant(skey, se.generation):
                        return True
                elif e is not None and e.pins == 0 and marks.is_redundant(skey, e.generation):
                    return True
            return False

    @property
    def num_redundant_dropped(self) -> int:
        """Redundant replicas this node dropped (evicted for good) before any sole copy."""
        return self._state.marks.num_dropped

    def coldest_original_age_s(self) -> float:
        """Seconds since the last use of this node's coldest *original* block (one the pool
        holds nowhere else as far as this node knows: not a remote-fill copy; in a tiered
        store an SSD-only block or a DRAM block, whichever was used longest ago), 0.0 when
        it holds none. What the node heartbeats (``coldest_age_ms``) for pool LRU: a full
        node hands its coldest block to a peer whose coldest is older (node/spill.py).
        Bounded: looks at the cold end of each tier only (tiers/spare.py
        ``coldest_original_touched``). Thread-safe (the store lock)."""
        st = self._state
        with st.lock:
            touched = coldest_original_touched(st.dram, st.ssd)
            now = time.monotonic()
        return 0.0 if touched is None else max(0.0, now - touched)

    def spare_bytes(self) -> int:
        """DRAM bytes this node can free without dropping a block from the pool: its
        remote-fill copies and DRAM blocks also on its SSD (tiers/spare.py ``SpareBytes``,
        kept current as blocks come and go: O(1) here). What the node heartbeats as its
        DRAM tier's ``spare_bytes``: the master's placement counts them as room, so a node
        whose DRAM holds only such blocks is no full node (issue 17 §3). Thread-safe (the
        store lock)."""
        with self._state.lock:
            return self._spare.total

    @property
    def handoffs_taken(self) -> int:
        """Peers' hand-offs this node took, evicting a colder original of its own."""
        return self._transit.handoffs_taken

    @property
    def handoffs_declined(self) -> int:
        """Peers' hand-offs refused: this node held no original colder than the offer."""
        return self._transit.handoffs_declined

    @property
    def spare_puts_refused(self) -> int:
        """Peers' spill and replica PUT items refused here (``reserve(spare_or_redundant=
        True)``): only dropping a sole copy would have made room."""
        return self._transit.spare_puts_refused

    def reserve_many(
        self,
        items: Sequence[tuple[bytes, int, bytes]],
        *,
        namespace_id: bytes = b"",
        may_block: bool = True,
    ) -> list[Reservation | KvstoredError | None] | object:
        """Reserve arena space for a batch of blocks of one namespace (a local put).

        Fill each ``reservation.view`` (outside any lock), then :meth:`commit_many` or
        :meth:`abort` each. A key repeated in the batch is reserved once (later occurrences
        are None: first writer wins within a batch too). The local put also unmarks a
        remote-fill copy of a key it finds stored (as ``reserve(copy=False)``).

        Args:
            items: ``(key, size_bytes, meta)`` per block, already validated by the caller
                (non-empty bytes key, ``0 <= size_bytes <= max_block_bytes``, bytes meta;
                NodeCore.put_item_error); anything else raises, reserving nothing.
            namespace_id: the blocks' namespace.
            may_block: False = never wait (for the event loop): if any block would need an
                eviction (no single free extent holds the batch), nothing is reserved and the
                call answers :data:`~kvstored.tiers.base.NEEDS_IO`; call again with
                ``may_block=True`` from a thread that may block (reservations.py).

        Returns:
            Per item: a Reservation the caller must commit or abort; None when the block is
            stored already (or repeated in the batch); or the item's error (NoCapacity,
            Unavailable once the store closed). Or ``NEEDS_IO`` (``may_block=False``
            only): nothing was reserved or changed.

        Raises:
            InvalidArgument, KeyInvalid: an item the caller did not validate (nothing reserved).
            Unavailable: the store is closed.
        """
        return self._reservations.reserve_many(items, namespace_id=namespace_id, may_block=may_block)

    def set_pool_room(self, pool_room: Callable[[int, float], bool] | None, *,
                      wait_s: float = 2.0) -> None:
        """Install the pool's backpressure (the node's spiller: ``Spiller.wait_for_room``).

        A local put or a promotion that finds no victim whose eviction drops nothing from
        the pool (copies, blocks on SSD, demotions the SSD takes as is) calls
        ``pool_room(need_bytes, deadline)`` with the store lock released, and looks again
        while it answers True, until ``wait_s`` passed; then it evicts in LRU order (the
        pool is full, or the spiller cannot keep up within the bound). None removes it.

        Args:
            pool_room: ``(need_bytes, monotonic deadline) -> made room``; thread-safe, may
                block until the deadline.
            wait_s: the longest one allocation waits, >= 0 (0: never wait).

        Raises:
            InvalidArgument: a negative ``wait_s``.
        """
        if wait_s < 0:
            raise InvalidArgument(f"wait_s must be >= 0 seconds, got {wait_s}")
        with self._state.lock:
            self._transit.pool_room = pool_room
            self._transit.pool_wait_s = float(wait_s)

    @property
    def has_pool_room(self) -> bool:
        """Whether a backpressure hook is installed (:meth:`set_pool_room`): then a local
        put may wait for it, so callers on an event loop pass ``may_block=False``."""
        return self._transit.pool_room is not None and self._transit.pool_wait_s > 0

    @property
    def pool_waits(self) -> int:
        """Allocations that waited on the pool's backpressure (:meth:`set_pool_room`)."""
        return self._transit.waits

    @property
    def promotions_skipped(self) -> int:
        """Promotions skipped (the block left on SSD) because only dropping a block the pool
        holds nowhere else would have made room (a node with a pool hook only)."""
        return self._transit.promotions_skipped

    @property
    def evictions_for_good(self) -> int:
        """DRAM evictions that may have dropped a block from the pool (no spare victim)."""
        return self._transit.evictions_for_good

    def keep_copies(self, blocks: Sequence[tuple[bytes, bytes]]) -> int:
        """Unmark remote-fill copies: each is kept as an original from now on (the master
        asks when a copy became the pool's last replica; master/copies.py). The change
        feed re-reports each one ADDED with ``copy=False``.

        Args:
            blocks: ``(namespace_id, key)`` pairs; absent or non-copy blocks are skipped.

        Returns:
            Copies unmarked.
        """
        return self._reservations.keep_copies(blocks)

    def commit(self, reservation: Reservation) -> bool:
        """Make a reserved block visible (most recent in DRAM). Never waits for disk I/O.

        Returns:
            True if the block is stored now; False if it was committed meanwhile by another
            writer (first commit wins; this reservation's space is freed).

        Raises:
            NotFound: the reservation was already committed or aborted.
        """
        return self._reservations.commit(reservation)

    def commit_many(self, reservations: Sequence[Reservation]) -> list[bool]:
        """Commit a batch (one prefix, head first) so that the head ends up most recent.

        Returns:
            Per reservation, as :meth:`commit`.

        Raises:
            NotFound: one of the reservations is unknown; none of the batch is committed then.
        """
        return self._reservations.commit_many(reservations)

    def reserve_slots(
        self, size_bytes: int, num_slots: int, *, namespace_id: bytes = b"",
        may_block: bool = True, ahead: bool = False,
    ) -> list[Reservation] | object:
        """Reserve keyless slots for reserve-ahead puts (kvstored/node/slots.py).

        Each slot is a pending reservation of ``size_bytes`` rounded up to the arena's
        alignment: counted in ``reserved_bytes`` and in the namespace's tenant's DRAM
        reservations (a tenant quota grants only the slots that fit in it), never evicted,
        invisible to readers. Fill a slot, then :meth:`commit_slots` it under a key, or
        :meth:`abort` it.

        Args:
            size_bytes: the slot size, 1..max_block_bytes.
            num_slots: how many (0 and more).
            namespace_id: the stored namespace id the slots will be committed under.
            may_block: False (the event loop): if the slots do not fit in one free extent,
                reserve nothing and answer :data:`~kvstored.tiers.base.NEEDS_IO`; True: evict
                (as a put) for each slot, and grant fewer when no room can be made.
            ahead: the slots are a refill, granted before any put asks for them: on a node
                in a pool they evict only what drops no block from the pool (never an
                original: the put that needs the room evicts through the pool's LRU when it
                comes; Transit.allocate ``ahead``), and never wait; fewer are granted.

        Returns:
            The slots (``Reservation`` with key ``SLOT_KEY``), fewer than asked under a quota
            or when the arena is full of pinned and reserved space; or NEEDS_IO.

        Raises:
            InvalidArgument: a bad size or count. Unavailable: the store is closed.
        """
        return self._reservations.reserve_slots(
            size_bytes, num_slots, namespace_id=namespace_id, may_block=may_block, ahead=ahead
        )

    def dram_round_up(self, size_bytes: int) -> int:
        """Arena bytes a DRAM allocation of ``size_bytes`` takes (the alignment's multiple)."""
        return self._state.dram.round_up(size_bytes)

    def dram_largest_free_bytes(self) -> int:
        """The largest free DRAM extent now (a lock-free read: a hint, not a promise)."""
        return self._state.dram.allocator.largest_free_bytes

    def commit_slots(
        self, writes: Sequence[tuple[Reservation, bytes, int, bytes]], *, namespace_id: bytes = b"",
    ) -> list[bool]:
        """Commit slots of :meth:`reserve_slots` under keys, last first (one lock).

        Args:
            writes: ``(slot, key, size_bytes written, meta)``; the slot's tail past the
                rounded-up ``size_bytes`` is freed, and a key already stored frees the whole
                slot (first writer wins).

        Returns:
            Per write: True = stored, False = the key was stored already.

        Raises:
            NotFound: a slot is unknown (nothing is committed then).
            InvalidArgument: a write larger than its slot, or an empty key (nothing committed).
        """
        return self._reservations.commit_slots(writes, namespace_id=namespace_id)

    def abort(self, reservation: Reservation) -> None:
        """Drop a reservation and free its space; idempotent (unknown ids are ignored)."""
        self._reservations.abort(reservation)

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
        return self._reservations.put(key, data, namespace_id=namespace_id, meta=meta)

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
        return self._reads.pin_many(
            keys, namespace_id=namespace_id, may_block=may_block, cut_from=cut_from
        )

    def uncount_reads(self, blocks: Sequence[PinnedBlock]) -> None:
        """Take back the gets and hits :meth:`pin_many` counted for ``blocks``: pinned but
        not sent, because the reader asks for them again (past the inline Get's budget), so
        a key is counted once per request. Pins are untouched; the SSD read of a
        promoted block stays counted on the SSD tier (it happened)."""
        self._reads.uncount_reads(blocks)

    def touch_many(
        self, keys: Sequence[bytes], *, namespace_id: bytes = b"", ssd_keys: Collection[bytes] = ()
    ) -> None:
        """Touch blocks last-key-first so ``keys[0]`` ends up the most recent (chain recency).

        For a read split into several ``pin_many`` calls: touching the whole request once at
        the end makes recency follow the request's order, not the order of its chunks. Keys
        in ``ssd_keys`` (read from SSD) are touched on the SSD tier too, as ``pin_many`` does.
        Absent keys are skipped. Never pins, promotes or counts a get.
        """
        self._reads.touch_many(keys, namespace_id=namespace_id, ssd_keys=ssd_keys)

    def unpin(self, block: PinnedBlock) -> None:
        """Release one pin taken by :meth:`pin_many` (once per returned PinnedBlock).

        Raises:
            NotFound: the block is not pinned (released twice, or never pinned).
        """
        self._reads.unpin(block)

    def unpin_many(self, blocks: Sequence[PinnedBlock]) -> list[PinnedBlock]:
        """Release pins taken by :meth:`pin_many` (each returned PinnedBlock once), under one
        lock acquisition, waking waiters once.

        Returns:
            The blocks that were not pinned (released twice, never pinned); the others are
            released. Never raises for them, so one stale block does not keep the rest pinned.
        """
        return self._reads.unpin_many(blocks)

    def get(self, key: bytes, *, namespace_id: bytes = b"") -> tuple[bytes, bytes] | None:
        """Copy one block out: ``(value, meta)``, or None on a miss.

        An SSD hit whose promotion is skipped (only dropping a block, or nothing at all,
        would make room in DRAM) is read straight from its file (:meth:`read_for_export`:
        checksum-verified, not promoted).

        Raises:
            Unavailable: the store is closed.
        """
        try:
            return self._reads.get(key, namespace_id=namespace_id)
        except NoCapacity:
            got = self.read_for_export([key], namespace_id=namespace_id)[0]
            if got is None:
                return None
            try:
                return bytes(got.view), got.meta
            finally:
                self.release_export([got])

    # ---- probes and admin (never pin, never touch recency, not counted, never wait on I/O)
    def lookup_prefix(self, keys: Sequence[bytes], *, namespace_id: bytes = b"") -> list[Tier]:
        """Tiers of the leading present blocks of a prefix in one namespace; stops at the
        first miss. DRAM is reported when a block is in both tiers."""
        return self._reads.lookup_prefix(keys, namespace_id=namespace_id)

    def exists(self, keys: Sequence[bytes], *, namespace_id: bytes = b"") -> list[bool]:
        """Per key: stored (committed) in any tier, in this namespace."""
        return self._reads.exists(keys, namespace_id=namespace_id)

    def remove(self, keys: Sequence[bytes], *, namespace_id: bytes = b"") -> list[bool]:
        """Delete blocks of one namespace from every tier (file deletion outside the lock).

        Returns:
            Per key: True if removed; False if absent or pinned (a pinned block is kept in
            every tier).
        """
        return self._reservations.remove(keys, namespace_id=namespace_id)

    def tenant_usage(self) -> dict[str, dict[str, int]]:
        """Per-tenant usage, quotas (-1 = none) and refusals (``TenantUsage.snapshot``),
        read under the store lock (thread-safe)."""
        with self._state.lock:
            return self.tenants.snapshot()

    def stats(self) -> StoreStats:
        """Counters since start and current usage of each tier (never waits on disk I/O)."""
        return self._reads.stats()

    def count_one_sided_hits(self, num_blocks: int) -> None:
        """Count DRAM hits clients read one-sided (they report them): see
        :meth:`Reads.count_one_sided_hits`."""
        self._reads.count_one_sided_hits(num_blocks)

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
        return self._reads.list_blocks(namespace_id=namespace_id, limit=limit)

    # ---- export (a peer's read, spill; export.py) ----------------------------------------
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
        return self._exports.coldest_blocks(limit, exclude=exclude, max_scan=max_scan)

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
        return self._exports.read_for_export(keys, namespace_id=namespace_id)

    def release_export(self, blocks: Sequence[ExportedBlock | None]) -> None:
        """Release blocks :meth:`read_for_export` returned (each exactly once; None skipped).

        An SSD block's view is reused by a later export once every block of its call is
        released: never read a view after releasing it.

        Raises:
            NotFound: a block released twice.
        """
        self._exports.release_export(blocks)

    # ---- lifecycle ---------------------------------------------------------------------
    def spill_to_ssd(self) -> int:
        """Write every DRAM-only block to the SSD tier (graceful shutdown), LRU first.

        DRAM keeps its copies; each block is DEMOTING while written (lock released), so the
        store keeps serving. Blocks that fail to write are counted in ``put_failures``.

        Returns:
            Number of blocks written (0 without an SSD tier).
        """
        return self._transit.spill_to_ssd()

    def start_prefault(self) -> None:
        """Fault the DRAM arena in from a background thread (see ``DramArena.start_prefault``)."""
        self._state.dram.arena.start_prefault()

    def close(self) -> None:
        """Wait for transfers between tiers, flush and close the SSD index, unmap and unlink
        the arena; idempotent. Views handed out earlier must not be used afterwards."""
        st = self._state
        with st.lock:
            if st.closed:
                return
            st.closed = True
            st.cond.notify_all()
            while st.demoting or st.promoting:
                st.cond.wait()
            st.pending.clear()
            st.tenants.reserved_bytes.clear()
            st.arena = memoryview(b"")
            with contextlib.ExitStack() as closing:  # slowest tier first; each one closed
                for tier in st.tiers:
                    closing.callback(tier.close)

    def __enter__(self) -> TieredStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
