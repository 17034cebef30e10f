"""Spill: a node past its high watermark moves its coldest blocks to peers with room.

Puts still land on the engine's own node (shared memory or the node's TCP/gRPC API, no
master round trip on the hot path). The pool's capacity becomes the sum of its nodes
because a node whose *last tier* (SSD when configured, else DRAM) passes
``[cluster] spill_high_watermark`` (on a node with an SSD tier: and whose DRAM does too,
:func:`past_high`: free DRAM counts as pool room, as in the master's placement) moves
blocks out until its last tier is at or below ``spill_low_watermark`` (as measured: a round
whose moves still await the master's index when it ends is continued once they are
confirmed, also below the high watermark, :meth:`Spiller.run_once`), two-phase through
the master::

    victims = store.coldest_blocks(batch): the store's eviction order walked from its cold
              end, bounded (SSD-only blocks first when the last tier is SSD, then DRAM in
              LRU order; chain recency makes chain tails the coldest); no store listing
    one call:   PutStartBatch(victims, writer=me, exclude_writer, max_used_fraction=high,
                              holder_reports; each block counts the earlier ones as landed)
                per block -> generation G, peer P (each item is one PutStart)
                  exists (another node holds it)  -> drop the local block if it is a remote-fill
                                                     copy; an original stays (the other
                                                     replica may be a copy of it)
                  NoCapacity (every peer is full) -> stop: local eviction, as without spill
    hook("put_started")
    per peer:   store.read_for_export: pins the local DRAM copies, reads SSD-only victims
                from their files (checksum verified, never promoted: promoting would demote
                other blocks into the very tier that is full) -> DataPlaneClient(P).put(keys,
                views) under a deadline (the peer reserves as bytes arrive; a broken
                connection aborts its reservations) -> release
    hook("sent")
    the ends:   carried on the next batch's PutStartBatch (the last batch's: a PutEndBatch):
                per block PutEnd(G, commit) if the peer stored it, else PutEnd(G, abort);
                a block leaves here only once its own end was accepted (a move, not a
                second replica) *and* the master indexes the peer's replica: the end's
                answer counts it (the peer's change event came first), else the block
                waits (no victim meanwhile) for a lookup that names the peer's replica
                (:meth:`Spiller.confirm_moved`, every batch and round; at most
                AWAIT_INDEX_S, then the copy just stays). An abort, a refused end
                (NotFound: the write lease lapsed) or a failed call keeps the local copy
                (nothing lost). Until then the batch's blocks are no victims.
    hook("ended")

Why this is safe:

- A block leaves this node only after the peer answered *stored* for it and the master
  accepted the end of exactly that generation; the peer made it visible only once every
  byte arrived. A failure anywhere keeps the local copy.
- The replica on the peer is indexed from the peer's own change event (``holder_reports``):
  it merges into the write's WRITING placeholder (one row per block, holder and tier), and
  PutEnd drops whatever placeholder is left, so the index never counts it twice and never
  names a block the peer does not report. So the local copy goes only once the master
  names the peer's replica (the end's count, else a lookup): before, it went at PutEnd
  while the peer's event was still on the way, and for up to a heartbeat interval the
  master named only this node, which no longer had the block: a read through this node
  (or one that fell back here) missed a block the pool held (issue 17: 3-4 of 100 reads
  through a spilling node). Between the removal and this node's REMOVED event the master
  may still name this node too: a reader here asks again ranking no node first, and one
  elsewhere falls back to the peer's replica (an alternate).
- A writer that dies between PutStart and PutEnd: the master aborts the write after
  ``[master] write_lease_s``; a transfer in flight breaks its connection, so the peer aborts
  its reservations; a later put of the key gets a newer generation.
- No ping-pong: the master places only on peers whose last tier stays at or below the high
  watermark with the block and the whole batch added; a node never spills to itself.

Backpressure (issue 17 §3: the pool never drops a block it has room for): the store asks
:meth:`Spiller.wait_for_room` (installed with ``TieredStore.set_pool_room``) before a local
put or a promotion evicts a block the pool holds nowhere else; it wakes the thread for a
round of at least the bytes asked (also below the high watermark) and answers as soon as a
block left, or when the round moved nothing (no peer has room: the caller evicts), within
``cluster.spill_put_wait_s``. While the master cannot be reached (Unavailable or
DeadlineExceeded on PutStartBatch), batches go for ``MASTER_RETRY_S`` straight to the peer of
the cached ListNodes view (:meth:`Spiller.refresh_peers`) with the most room below the high
watermark, no master call; a block still leaves only once that peer stored it, and masters
learn both replicas from the nodes' events or inventories.

Pool LRU (issue 17 §3: only a full pool drops originals, the coldest cluster-wide first):
when a put's round for room moved nothing (no peer has room: the caller would now evict an
original for good), the spiller looks at its cached peer view, which names each peer's
coldest original's age (heartbeated ``coldest_age_ms``, ListNodes ``coldest_age_s``). If
a peer's is older than ours (``TieredStore.coldest_original_age_s``) by more than
``[cluster] pool_lru_margin_s``, our coldest originals (enough for the bytes asked, at most
a batch) are *handed off* to it: one data-plane PUT with PUT_FLAG_HANDOFF carrying our
coldest age. The peer takes each only if its own coldest original is older than that age,
decided under its store lock (``TieredStore.reserve(handoff_age_s=...)``): it evicts that
colder block to make room. A block it took leaves here (the put finds room); one it refused
stays, and the put evicts it as before. No master call: as for the direct spill, the
master learns the moved replica from both nodes' events. The handed-off block enters the
peer as its most recent block (as a spilled one does). ``pool_lru_enabled = false`` turns
it off.

Runs on one daemon thread (``kvstored-spill``): one master call per batch (not two per
block), sequential with the batch's transfer (overlapping batch N's PutEndBatch with batch
N+1 on a second thread was measured and gave nothing on 2 shared cores; carrying the ends
on the next start saves a call's CPU, docs/cluster.md); store calls are thread-safe;
master calls are blocking gRPC with ``rpc_timeout_s``. Test seam:
``hook(event, **fields)`` at the three points above
(``KVSTORED_TEST_SPILL_HOOK=module:function`` installs one in a daemon).
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from kvstored.errors import (
    DeadlineExceeded,
    ErrorCode,
    KvstoredError,
    NoCapacity,
    NotFound,
    ReplicaNotReady,
    Unavailable,
)
from kvstored.transport.base import PutItem, Transport
from kvstored.transport.master_targets import TermFence
from kvstored.types import BlockInfo, ExportedBlock, StoreStats, Tier, TierStats

log = structlog.get_logger(__name__)

Hook = Callable[..., None]
HOOK_ENV = "KVSTORED_TEST_SPILL_HOOK"
RETRY_AFTER_FAILURE_S = 5.0
"""A block whose move failed is not tried again for this long (no hot loop on one block)."""
PEER_CARRY_S = 30.0
"""A peer of the cached view that a later listing does not name (a new leader it has not
re-registered with yet) stays in the view this long after it was last listed healthy."""
MASTER_RETRY_S = 1.0
"""After the master could not be reached, spill to the cached view this long before asking it
again (a blackholed master costs ``rpc_timeout_s`` per ask)."""


class SpillStore(Protocol):
    """What the spiller needs of the node's store (TieredStore implements it)."""

    def stats(self) -> StoreStats:
        """Counters and per-tier usage now (the spiller reads the last tier's fill ratio)."""

    def coldest_blocks(self, limit: int, *, exclude: Any = ()) -> list[BlockInfo]:
        """Up to ``limit`` unpinned blocks in eviction order, coldest first, skipping
        ``exclude`` and blocks in transit; never pins, touches recency or counts a get."""

    def read_for_export(self, keys: Sequence[bytes], *, namespace_id: bytes = b""
                        ) -> list[ExportedBlock | None]:
        """Per key the block to send elsewhere (DRAM pinned in place, SSD read and verified
        into a private buffer), or None when absent or unreadable; never promotes. The caller
        releases every returned block once with :meth:`release_export`."""

    def release_export(self, blocks: Sequence[ExportedBlock | None]) -> None:
        """Release what :meth:`read_for_export` returned (each block once; None skipped).

        Raises ``NotFound`` for a block released twice."""

    def remove(self, keys: Sequence[bytes], *, namespace_id: bytes = b"") -> list[bool]:
        """Delete blocks from every tier; per key True if removed, False if absent or pinned
        (a pinned block is kept)."""

    def exists(self, keys: Sequence[bytes], *, namespace_id: bytes = b"") -> list[bool]:
        """Per key: stored (committed) in any tier (tells a pinned block from a gone one)."""


class SpillMaster(Protocol):
    """The master's batched two-phase put (:class:`~kvstored.transport.master_rpc.MasterClient`)."""

    def put_start_batch(self, items: Sequence[tuple[bytes, bytes, int]], *,
                        writer_node_id: str = "", exclude_writer: bool = False,
                        max_used_fraction: float = 0.0, headroom_bytes: int = 0,
                        holder_reports: bool = False, timeout_s: float | None = None
                        ) -> list[tuple[bool, int, list[Any]] | KvstoredError]:
        """PutStartBatch: per ``(namespace_id, key, size_bytes)`` item, in order, ``(exists,
        generation, replicas)`` or the error that item got (returned, not raised).

        Raises ``InvalidArgument`` (the whole call: too many items) and the RPC's errors."""

    def put_end_batch(self, items: Sequence[tuple[bytes, bytes, int, bool]], *,
                      timeout_s: float | None = None) -> list[int | KvstoredError]:
        """PutEndBatch: per ``(namespace_id, key, generation, commit)`` write, in order, the
        replicas committed (or dropped), or the item's error (NotFound: a stale end)."""

    def put_end_and_start_batch(
        self, ends: Sequence[tuple[bytes, bytes, int, bool]],
        items: Sequence[tuple[bytes, bytes, int]], *, writer_node_id: str = "",
        exclude_writer: bool = False, max_used_fraction: float = 0.0, headroom_bytes: int = 0,
        holder_reports: bool = False, timeout_s: float | None = None,
    ) -> tuple[list[int | KvstoredError], list[tuple[bool, int, list[Any]] | KvstoredError]]:
        """:meth:`put_end_batch` of ``ends`` then :meth:`put_start_batch` of ``items`` in one
        call; ``(per end, per item)`` as those answer.

        Raises ``InternalError`` when the master answered another number of results (then
        nothing may be assumed ended)."""

    def list_nodes(self) -> dict[str, Any]:
        """ListNodes as a dict (``{"nodes": [{"node_id", "data_address", "health",
        "tiers": [{"tier", "used_bytes", "capacity_bytes"}]}]}``): the spiller's cached view
        of its peers for when the master cannot be reached."""


@dataclass(slots=True)
class SpillCounters:
    """What the spiller did since start.

    Attributes:
        rounds: watermark checks that found the node past its high watermark (or a put
            asking for room) and started a round; a round continued below the high
            watermark until the low one (:meth:`Spiller.run_once`) counts once.
        blocks_moved: blocks now on a peer and dropped here.
        bytes_moved: their bytes.
        blocks_deduplicated: blocks dropped here because another node already held them.
        blocks_failed: moves aborted (the local copy stayed).
        no_capacity: rounds stopped because no peer had room.
        blocks_moved_direct: of ``blocks_moved``, those sent to a peer of the cached view
            while the master could not be reached.
        put_waits: local puts that waited for a spill round before evicting.
        handoffs_sent: blocks offered to a peer with a colder coldest original (pool LRU).
        handoffs_accepted: of those, taken by the peer (it evicted a colder block; ours
            left here).
        handoffs_refused: of those, refused (the peer had no colder block, or the transfer
            failed): ours stayed, to be evicted here.
        blocks_refused_no_room: of ``blocks_failed``, items the peer answered NO_CAPACITY
            (PUT_FLAG_SPARE: its room vanished since its last heartbeat and only dropping
            a sole copy of its own would have made some); the block stayed here, for the
            master's next placement or the pool-LRU hand-off.
        blocks_held_by_peer: of ``blocks_failed``, items the peer answered as held already
            (code 0, not stored now): the local copy stays, for the peer's copy may be on
            its way out (two nodes spilling into each other, issue 17 §3).
    """

    rounds: int = 0
    blocks_moved: int = 0
    bytes_moved: int = 0
    blocks_deduplicated: int = 0
    blocks_failed: int = 0
    no_capacity: int = 0
    blocks_moved_direct: int = 0
    put_waits: int = 0
    handoffs_sent: int = 0
    handoffs_accepted: int = 0
    handoffs_refused: int = 0
    blocks_refused_no_room: int = 0
    blocks_held_by_peer: int = 0


@dataclass(slots=True)
class PeerRoom:
    """One peer of the spiller's cached view (the last ListNodes it got).

    Attributes:
        node_id: the peer.
        data_address: its data plane, ``HOST:PORT``.
        room_bytes: bytes it may still take before its last tier passes the high
            watermark, as of that view, less what this spiller sent it since.
        coldest_age_s: its coldest original's age as of that view (0.0 = none, or a
            master or node older than the field): pool LRU hands blocks to the oldest.
        zone: its failure domain ("" = none declared): a put's replicas placed through
            the view prefer new zones (kvstored/node/put_replicas.py).
        full_room_bytes: as ``room_bytes`` up to the tiers' capacity instead of the
            watermark (a spare-only hand-off's room).
        synced_term: the master term whose listing last named this peer "healthy" (its
            inventory synced into that leader's index); 0 = the newest listing did not (a
            peer carried over a failover, still "syncing" there or not registered yet), or
            a master without terms. A read trusts a ``complete`` lookup of term T to speak
            for this peer only when this is T (kvstored/node/remote.py).
    """

    node_id: str
    data_address: str
    room_bytes: int
    coldest_age_s: float = 0.0
    zone: str = ""
    full_room_bytes: int = 0
    """Bytes it may still take before its tiers are full (their capacity, not the high
    watermark), its ``spare_bytes`` counted as room, as of that view: what a spare-only
    hand-off (:meth:`Spiller.hand_off`) may still find there."""
    synced_term: int = 0


@dataclass(slots=True)
class _Move:
    block: BlockInfo
    generation: int
    address: str
    node_id: str
    ok: bool = False
    no_room: bool = False  # the peer answered NO_CAPACITY (PUT_FLAG_SPARE: no room that drops nothing there)
    indexed: bool = False  # the end's answer counted the peer's replica as indexed already
    handoff: bool = False  # a pool-LRU hand-off (counted in handoffs_*, not blocks_moved)


SPARE_ONLY_AGE_S = 1e9
"""The age a spare-only hand-off offers (about 32 years): no block a peer holds is colder,
so the peer takes the block only from room that drops nothing of its own, never by
evicting an original (``Transit.allocate(handoff_age_s=...)``)."""
AWAIT_INDEX_S = 10.0
"""Longest a moved block's local copy waits for the master to index the peer's replica
(the peer's own change event, one heartbeat at most, sooner once the peer wakes its link on
the PUT); past it the local copy simply stays (a second original: harmless)."""
CONFIRM_WAIT_S = 2.0
"""Longest a round asked for room by a put keeps asking the master to confirm its moves."""
CONFIRM_POLL_S = 0.01
"""Seconds between two such asks (the peer reports its replica at once: a few ms)."""
MAX_AWAITING = 4096
"""Most moved blocks awaiting the master's index at once; past it a round stops moving."""


def last_tier(stats: StoreStats) -> TierStats:
    """The tier a node evicts from for good: SSD when it has one, else DRAM."""
    by_tier = {t.tier: t for t in stats.tiers}
    ssd = by_tier.get(Tier.SSD)
    if ssd is not None and ssd.capacity_bytes > 0:
        return ssd
    return by_tier[Tier.DRAM]


def past_high(stats: StoreStats, high: float) -> bool:
    """Whether a node spills on its own: its last tier is past ``high`` of its capacity and,
    on a node with an SSD tier, its DRAM is too. The same measure as the placement's pool
    room (:func:`pool_room_bytes`), which counts a tiered node's free DRAM: a node whose DRAM
    still has room below the watermark is a spill target, so it must not spill itself, else
    two nodes past their SSD watermark would move blocks into each other's DRAM. (A put
    that finds no room still spills at once: ``run_once(need_bytes=...)``.)"""
    t = last_tier(stats)
    if t.used_bytes <= high * t.capacity_bytes:
        return False
    if t.tier is Tier.SSD:
        dram = next((d for d in stats.tiers if d.tier is Tier.DRAM), None)
        if dram is not None and dram.capacity_bytes and dram.used_bytes <= high * dram.capacity_bytes:
            return False
    return True


def pool_room_bytes(tiers: dict[str, dict[str, Any]], fraction: float) -> int:
    """A peer's pool room in a ListNodes view (``tiers``: tier name -> ``{"used_bytes",
    "capacity_bytes"}``), as the master's placement counts it
    (``Placement.last_tier_room_bytes``): its DRAM below ``fraction`` of capacity, plus on a
    node with an SSD tier its SSD below it, each from 0; never negative here. A tier's
    ``spare_bytes`` (copies, DRAM blocks also on the node's SSD) count as room."""
    dram, ssd = tiers.get("DRAM") or {}, tiers.get("SSD") or {}

    def below(t: dict[str, Any]) -> int:  # what the node can free without a drop is room
        used = int(t.get("used_bytes", 0))
        held = used - min(used, int(t.get("spare_bytes", 0) or 0))
        return int(fraction * int(t.get("capacity_bytes", 0))) - held

    if ssd.get("capacity_bytes"):
        return max(0, below(ssd)) + (max(0, below(dram)) if dram.get("capacity_bytes") else 0)
    return max(0, below(dram))


def hook_from_env() -> Hook | None:
    """The hook named by ``KVSTORED_TEST_SPILL_HOOK=module:function`` (None when unset)."""
    spec = os.environ.get(HOOK_ENV, "")
    if not spec:
        return None
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


class Spiller:
    """Moves a full node's coldest blocks to peers (see the module docstring).

    Args:
        store: the node's block store.
        master: the master's two-phase put.
        transport: ``transport(data_address)`` -> a pooled data-plane client of that peer
            (kept for the spiller's lifetime, closed by :meth:`close`).
        node_id: this node's id (the writer; never a target).
        high_watermark: fraction of the last tier past which the node spills, (0, 1].
        low_watermark: the node spills down to this fraction, below ``high_watermark``.
        batch_blocks: blocks per batch.
        interval_s: seconds between watermark checks (thread mode).
        timeout_s: deadline of one peer's data-plane transfer.
        rpc_timeout_s: deadline of each master call.
        peer_view_s: seconds between refreshes of the cached peer view (ListNodes), used
            while the master cannot be reached and for pool LRU.
        pool_lru: hand our coldest originals to a peer with colder ones when a put's round
            for room found the pool full (module docstring).
        pool_lru_margin_s: how much older a peer's coldest original must be than ours.
        factor_of: ``factor_of(namespace_id, key)`` -> the block's replication factor as
            recorded here (0 or 1 = none; node/put_replicas.py ``ReplicationFactors.get``).
            A moved block's PUT carries it, so the peer's inventory does (a new leader learns
            it again); a block above 1 the peer already held stays here (moving it would
            leave its two replicas on one node).
        hook: ``hook(event, **fields)`` at ``put_started`` (fields: moves), ``sent``
            (moves) and ``ended`` (moves); it may block to hold the spill there.

    Raises:
        InvalidArgument: watermarks not ``0 < low < high <= 1`` or a batch below 1.
    """

    def __init__(
        self,
        store: SpillStore,
        master: SpillMaster,
        transport: Callable[[str], Transport],
        *,
        node_id: str,
        high_watermark: float = 0.90,
        low_watermark: float = 0.80,
        batch_blocks: int = 8,
        interval_s: float = 0.5,
        timeout_s: float = 10.0,
        rpc_timeout_s: float = 5.0,
        peer_view_s: float = 2.0,
        hook: Hook | None = None,
        pool_lru: bool = True,
        pool_lru_margin_s: float = 1.0,
        factor_of: Callable[[bytes, bytes], int] | None = None,
    ) -> None:
        from kvstored.errors import InvalidArgument

        if not 0 < low_watermark < high_watermark <= 1:
            raise InvalidArgument(
                f"spill watermarks must satisfy 0 < low < high <= 1, got low={low_watermark}, "
                f"high={high_watermark}"
            )
        if batch_blocks < 1:
            raise InvalidArgument(f"spill batch_blocks must be >= 1, got {batch_blocks}")
        self.store = store
        self.master = master
        self._transport_factory = transport
        self.node_id = node_id
        self.high = float(high_watermark)
        self.low = float(low_watermark)
        self.batch_blocks = int(batch_blocks)
        self.interval_s = float(interval_s)
        self.timeout_s = float(timeout_s)
        self.rpc_timeout_s = float(rpc_timeout_s)
        self.hook = hook
        self.counters = SpillCounters()
        self._peers: dict[str, Transport] = {}
        self._failed_at: dict[tuple[bytes, bytes], float] = {}
        # moved blocks whose local copy waits for the master to index the peer's replica:
        # (ns, key) -> (the move, time.monotonic() of its accepted end); spill thread only
        self._awaiting: dict[tuple[bytes, bytes], tuple[_Move, float]] = {}
        # a round that has not reached the low watermark yet (run_once; spill thread only)
        self._round_open = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # backpressure (wait_for_room): the loop's progress, under _cv
        self._cv = threading.Condition()
        self._wake = threading.Event()
        self._in_round = False
        self._rounds_done = 0
        self._blocks_left = 0  # blocks that left this node, ever
        self._want_bytes = 0
        self._full_until = 0.0
        # the cached peer view, for spilling while the master cannot be reached
        self.peer_view_s = float(peer_view_s)
        self.peers: list[PeerRoom] = []
        self._seen_healthy: dict[str, float] = {}  # node id -> when last listed healthy
        self._view_at = float("-inf")
        self._master_down_until = 0.0
        self.pool_lru = bool(pool_lru)
        self.factor_of = factor_of
        self.pool_lru_margin_s = float(pool_lru_margin_s)

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        """Start the watermark thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="kvstored-spill", daemon=True)
            self._thread.start()

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the thread (after its current batch) and close the peer connections."""
        self._stop.set()
        self._wake.set()  # the thread may be waiting for a wake-up, not its interval
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        with self._cv:  # a put still waiting for a round evicts now (wait_for_room)
            self._cv.notify_all()
        for t in self._peers.values():
            t.close()
        self._peers.clear()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            with self._cv:
                self._in_round = True
                want, self._want_bytes = self._want_bytes, 0
            left = 0
            try:
                self.refresh_peers()
                left = self.confirm_moved()
                self._progress(left)
                left += self.run_once(need_bytes=want)
                if want and not left and self._awaiting and not self._master_down():
                    # moved; the index confirms them (not while no master answers)
                    left = self._wait_confirmed(time.monotonic() + CONFIRM_WAIT_S)
                if want and not left:  # the pool is full: pool LRU before we evict our own
                    left = self.hand_off(want)
                    if not left and self._awaiting and not self._master_down():
                        left = self._wait_confirmed(time.monotonic() + CONFIRM_WAIT_S)
            except Exception:
                log.exception("spill_round_failed")
            finally:
                with self._cv:
                    self._in_round = False
                    self._rounds_done += 1
                    if want and not left:  # asked for room and none was made: pool full
                        self._full_until = time.monotonic() + self.interval_s
                    self._cv.notify_all()

    def _progress(self, num_left: int) -> None:
        if num_left:
            with self._cv:
                self._blocks_left += num_left
                self._cv.notify_all()

    def wait_for_room(self, need_bytes: int, deadline: float) -> bool:
        """Backpressure for a local put that would evict a block the pool holds nowhere
        else: wake the spill thread for a round that moves at least ``need_bytes`` (even
        below the high watermark) and wait until a block left this node, the round ended
        having moved none (no peer has room: the caller evicts), or ``deadline``.

        Called by the store with its lock released (``TieredStore.set_pool_room``);
        thread-safe; never call it from the spill thread.

        Args:
            need_bytes: bytes the caller needs, > 0.
            deadline: ``time.monotonic()`` value after which it answers False.

        Returns:
            True when blocks left this node (look for room again); False when none will
            (the thread is not running, the pool was found full within the last
            ``interval_s``, or the deadline passed).
        """
        if self._thread is None or self._stop.is_set() or threading.current_thread() is self._thread:
            return False
        if time.monotonic() < self._full_until:
            return False
        self.counters.put_waits += 1
        with self._cv:
            start = self._blocks_left
            ticket = self._rounds_done + (2 if self._in_round else 1)
            self._want_bytes = max(self._want_bytes, int(need_bytes))
            self._wake.set()
            while True:
                if self._blocks_left > start:
                    return True
                if self._rounds_done >= ticket or self._stop.is_set():
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)

    def refresh_peers(self, *, force: bool = False) -> list[PeerRoom]:
        """Refresh the cached peer view from ListNodes (at most every ``peer_view_s``
        unless ``force``; skipped while the master is known unreachable): healthy peers
        and the room each has below the high watermark in its last tier. A failed call
        keeps the old view; a peer of the old view that the listing names "syncing", or
        not at all (for :data:`PEER_CARRY_S`), stays (a new leader's node table fills as
        the nodes come back).

        Returns:
            The view now.
        """
        now = time.monotonic()
        list_nodes = getattr(self.master, "list_nodes", None)
        if list_nodes is None or (not force and (now - self._view_at < self.peer_view_s
                                                 or now < self._master_down_until)):
            return self.peers
        try:
            listing = list_nodes()
        except KvstoredError as exc:
            log.debug("spill_peer_view_failed", error=str(exc))
            return self.peers
        self._view_at = now
        term = int(listing.get("term", 0) or 0)
        view = []
        listed: dict[str, dict[str, Any]] = {}
        for n in listing.get("nodes", []):
            listed[str(n.get("node_id"))] = n
            if n.get("node_id") == self.node_id or n.get("health") != "healthy":
                continue
            tiers = {t["tier"]: t for t in n.get("tiers", [])}
            if not n.get("data_address") or not (tiers.get("SSD") or tiers.get("DRAM")):
                continue
            room = pool_room_bytes(tiers, self.high)
            view.append(PeerRoom(n["node_id"], n["data_address"], max(0, room),
                                 float(n.get("coldest_age_s", 0.0) or 0.0),
                                 str(n.get("zone", "") or ""),
                                 full_room_bytes=pool_room_bytes(tiers, 1.0), synced_term=term))
            self._seen_healthy[n["node_id"]] = now
        # A new leader (or a restarted master) lists its nodes as they come back: a peer
        # still "syncing" there, or not registered yet, is no dead peer. Such a peer of the
        # old view stays in it (its room as last known) until the master calls it healthy,
        # unhealthy or departed, or for PEER_CARRY_S after it was last seen healthy when the
        # master does not list it at all; else a failover emptied the view exactly when no
        # master can place (the fail17 tester's reads missed from the new leader's election on).
        departed = {str(d.get("node_id")) for d in listing.get("departed", [])}
        fresh = {p.node_id for p in view}
        for old in self.peers:
            if old.node_id in fresh or old.node_id in departed:
                continue
            n = listed.get(old.node_id)
            if n is not None and n.get("health") != "syncing":
                continue  # unhealthy or on probation: the master judged it
            if n is None and now - self._seen_healthy.get(old.node_id, now) > PEER_CARRY_S:
                continue
            if n is not None:
                tiers = {t["tier"]: t for t in n.get("tiers", [])}
                if tiers.get("SSD") or tiers.get("DRAM"):
                    old.room_bytes = max(0, pool_room_bytes(tiers, self.high))
                    old.full_room_bytes = pool_room_bytes(tiers, 1.0)
            # carried: this listing's leader does not have its inventory (yet), so its
            # "complete" lookups do not speak for this peer (reads ask it directly)
            old.synced_term = 0
            view.append(old)
        for gone in set(self._seen_healthy) - {p.node_id for p in view}:
            del self._seen_healthy[gone]
        if [p.node_id for p in view] != [p.node_id for p in self.peers]:
            log.info("spill_peer_view", num_peers=len(view),
                     peers=",".join(p.node_id for p in view))
        self.peers = view
        return view

    def _fire(self, event: str, **fields: Any) -> None:
        if self.hook is not None:
            self.hook(event, **fields)

    # ---- policy ------------------------------------------------------------------------
    def used_fraction(self) -> float:
        """Used fraction of the last tier now."""
        t = last_tier(self.store.stats())
        return t.used_bytes / t.capacity_bytes if t.capacity_bytes else 0.0

    def victims(self, need_bytes: int, *, busy: Collection[tuple[bytes, bytes]] = ()
                ) -> list[BlockInfo]:
        """The coldest unpinned blocks, at most a batch, until ``need_bytes`` are covered.

        The store's eviction order from its cold end (``coldest_blocks``: SSD-only blocks
        first when the last tier is SSD, they were demoted longest ago; then remote-fill
        copies (``BlockInfo.copy``: a peer holds them, so PutStart answers *exists* and the
        copy is dropped, never moved); then DRAM blocks in LRU order), bounded: no listing
        of the store. Blocks whose move failed lately and ``busy`` ones (``(namespace_id,
        key)``: a batch whose ends are not yet accepted) are skipped.
        """
        now = time.monotonic()
        if self._failed_at:
            self._failed_at = {k: t for k, t in self._failed_at.items()
                               if now - t < RETRY_AFTER_FAILURE_S}
        skip = set(self._failed_at) | set(busy) if busy else self._failed_at
        if self._awaiting:
            skip = set(skip) | set(self._awaiting)
        out: list[BlockInfo] = []
        covered = 0
        for b in self.store.coldest_blocks(self.batch_blocks, exclude=skip):
            out.append(b)
            covered += b.size_bytes
            if len(out) >= self.batch_blocks or covered >= need_bytes:
                break
        return out

    def run_once(self, need_bytes: int = 0) -> int:
        """Spill batches until the last tier is at or below the low watermark, no peer has
        room, or a batch moves nothing.

        The goal is the low watermark *as measured*: ``need`` counts the batch in flight and
        the moves awaiting the master's index as gone, so when it reaches 0 the batch in
        flight is ended first and the tier measured again (a writer waiting for room may
        have taken it), and a round that ends above the low watermark with moves still
        awaiting stays open: the next call goes on with it once they are confirmed, also
        below the high watermark (issue 17: bench_spill's 4 MiB case stopped at 59 %). A
        round that found no room or moved nothing ends where it is (no hot loop).

        A batch's PutEnds ride on the PutStartBatch of the next batch (one master call per
        batch); its local copies go once that call accepted them, before the next batch is
        sent, and meanwhile they are no victims. The last batch's ends are a PutEndBatch.
        While the master cannot be reached, batches go straight to the peers of the cached
        view (:meth:`refresh_peers`) with room, no master call: the block leaves only once
        the peer stored it, and a master learns both nodes' replicas from their events or
        inventories when it answers again.

        Args:
            need_bytes: a put waits for this much room (:meth:`wait_for_room`): spill at
                least that, also below the high watermark.

        Returns:
            Blocks that left this node (moved or deduplicated).
        """
        stats = self.store.stats()
        t = last_tier(stats)
        continued = self._round_open
        if not t.capacity_bytes or (need_bytes <= 0 and not continued
                                    and not past_high(stats, self.high)):
            return 0
        if not continued:
            self.counters.rounds += 1
        self._round_open = True
        stuck = False  # no room, or a batch moved nothing: the round ends where it is
        total = 0
        freed = 0
        sent: list[_Move] = []  # transferred; their ends go with the next PutStartBatch
        try:
            while not self._stop.is_set():
                if self._awaiting:  # moved blocks the master may index by now: they go
                    left = self.confirm_moved()
                    total += left
                    self._progress(left)
                if len(self._awaiting) >= MAX_AWAITING:
                    break
                t = last_tier(self.store.stats())
                ok_bytes = sum(m.block.size_bytes for m in sent if m.ok)
                awaiting_bytes = sum(m.block.size_bytes for m, _ in self._awaiting.values())
                need = max(t.used_bytes - int(self.low * t.capacity_bytes),
                           need_bytes - freed) - ok_bytes - awaiting_bytes
                busy = {(m.block.namespace_id, m.block.key) for m in sent}
                batch = self.victims(need, busy=busy) if need > 0 else []
                if not batch and sent:
                    # `need` counted the batch in flight as gone; end it (its copies go),
                    # then measure again: a writer may have taken the room meanwhile
                    ending, sent = sent, []
                    ended = self._end(ending)
                    left = self._finish(ending, ended, 0)
                    total += left
                    freed += sum(m.block.size_bytes
                                 for m, ok in zip(ending, ended, strict=True) if ok)
                    self._progress(left)
                    if not any(ended):
                        stuck = True
                        break
                    continue
                if not batch:  # at the goal, or no victim: open only while moves await
                    stuck = need > 0 and not self._awaiting
                    break
                if time.monotonic() < self._master_down_until:
                    left = self._direct(batch)
                    total += left
                    freed += sum(b.size_bytes for b in batch[:left])
                    self._progress(left)
                    if not left:
                        stuck = True
                        break
                    continue
                ending, sent = sent, []
                moves, dropped, full, ended = self._start_writes(batch, ending)
                left = self._finish(ending, ended, dropped) if ending else dropped
                total += left
                freed += sum(m.block.size_bytes for m, ok in zip(ending, ended, strict=True) if ok)
                self._progress(left)
                if time.monotonic() < self._master_down_until and not moves:
                    continue  # the master went away: this batch goes to the cached view
                if moves:
                    self._transfer(moves)
                    sent = moves
                if full or not (any(m.ok for m in moves) or dropped) or (ending and not any(ended)):
                    stuck = True
                    break  # no room, or a batch moved nothing: no hot loop
        finally:
            if sent:
                left = self._finish(sent, self._end(sent), 0)
                total += left
                self._progress(left)
            if self._awaiting:
                left = self.confirm_moved()
                total += left
                self._progress(left)
            # The round's goal is the low watermark as measured, not as projected: a round
            # whose `need` reached 0 counting moves that still await the master's index
            # (their copies are still here) stays open, and the next check goes on with it
            # once they are confirmed, also below the high watermark (a writer may have
            # taken their room meanwhile: issue 17, bench_spill's 4 MiB stop at 59 %).
            t = last_tier(self.store.stats())
            self._round_open = (not stuck and not self._stop.is_set()
                                and t.used_bytes > self.low * t.capacity_bytes)
        return total

    def _wait_confirmed(self, deadline: float) -> int:
        """A put waits for room and this round's blocks are moved but not yet confirmed
        (:meth:`confirm_moved`): ask again every :data:`CONFIRM_POLL_S` until one left, none
        awaits any more, the spiller stops or ``deadline``. Returns the blocks that left."""
        left = 0
        while not left and self._awaiting and time.monotonic() < deadline:
            if self._stop.wait(CONFIRM_POLL_S):
                break
            left = self.confirm_moved()
            self._progress(left)
        return left

    def confirm_moved(self) -> int:
        """Drop the local copies of moved blocks the master now names on their peer.

        A moved block (its PutEnd accepted while the peer's change event had not reached
        the master yet) keeps its local copy until a lookup from here, ranking this node
        last (``avoid``), names the peer's replica; only then can a reader find the block
        elsewhere once it is gone here. One per-key lookup per namespace. A block waiting
        longer than :data:`AWAIT_INDEX_S` keeps its copy for good (a second original) and
        is no victim for a while; one whose lookup failed is asked again next time.

        Returns:
            Blocks that left this node.
        """
        if not self._awaiting:
            return 0
        lookup_each = getattr(self.master, "lookup_each", None)
        now = time.monotonic()
        by_ns: dict[bytes, list[_Move]] = {}
        for fk, (m, at) in list(self._awaiting.items()):
            if now - at > AWAIT_INDEX_S:
                del self._awaiting[fk]
                self._failed(m.block)
                log.info("spill_move_not_indexed", key=m.block.key.hex()[:16], peer=m.node_id,
                         waited_s=round(now - at, 3))
                continue
            by_ns.setdefault(m.block.namespace_id, []).append(m)
        confirmed: dict[bytes, list[_Move]] = {}
        for ns, moves in by_ns.items():
            if lookup_each is None:
                continue
            try:
                got = lookup_each(ns, [m.block.key for m in moves], local_node_id="",
                                  timeout_s=self.rpc_timeout_s, avoid=[self.node_id],
                                  max_alternates=3)
            except KvstoredError as exc:
                log.info("spill_confirm_failed", num_blocks=len(moves), error=str(exc))
                continue
            found = got[0] if got is not None else {}
            for i, rep in found.items():
                named = {rep.node_id, *(a.node_id for a in getattr(rep, "alternates", ()))}
                if moves[i].node_id in named:
                    confirmed.setdefault(ns, []).append(moves[i])
        left = 0
        for ns, moves in confirmed.items():
            since = {m.block.key: self._awaiting.pop((ns, m.block.key), (m, now))[1]
                     for m in moves}
            left += self._remove_moved(ns, moves, since)
        return left

    def _remove_moved(self, ns: bytes, moves: Sequence[_Move],
                      since: dict[bytes, float] | None = None) -> int:
        """Remove the local copies of moved (or handed-off) blocks (their peer's replica
        is indexed).

        A copy the store keeps because a reader pins it now (``remove`` answers False while
        the block is still here) awaits again, its wait counted from ``since`` (per key:
        when the move ended; default now), so the next :meth:`confirm_moved` removes it once
        the pin is gone. Before, it stayed for good: a second original of a block the pool
        already held, room the pool never got back (issue 17 §3: 125 of 144 MiB held with
        some blocks on two nodes, and the writer evicted sole copies).

        Returns:
            Blocks that left this node.
        """
        left = 0
        if not moves:
            return left
        blocks = [m.block for m in moves]
        removed = self.store.remove([b.key for b in blocks], namespace_id=ns)
        kept = [m for m, gone in zip(moves, removed, strict=True) if not gone]
        for m, gone in zip(moves, removed, strict=True):
            if gone:
                left += 1
                if not m.handoff:  # (a hand-off is counted in handoffs_*)
                    self.counters.blocks_moved += 1
                    self.counters.bytes_moved += m.block.size_bytes
        if kept:
            still = self.store.exists([m.block.key for m in kept], namespace_id=ns)
            now = time.monotonic()
            for m, here in zip(kept, still, strict=True):
                if here:  # pinned: removed once the reader lets go
                    self._awaiting[(ns, m.block.key)] = (m, (since or {}).get(m.block.key, now))
        return left

    def _direct(self, batch: Sequence[BlockInfo]) -> int:
        """Move a batch to the cached peer with the most room, no master call (the master
        cannot be reached): as many of its coldest blocks as that room takes (a batch larger
        than the room moves the part that fits: before, it moved nothing, the put waiting for
        room evicted an original for good while the peer still had room for most of the batch;
        issue 17 §3, bench_spill's master-down burst). A block leaves only once the peer
        answered it stored.

        Returns:
            Blocks that left this node (0: no cached peer has room for the batch's coldest
            block, or the transfer failed).
        """
        peer = max(self.peers, key=lambda p: p.room_bytes, default=None)
        room = peer.room_bytes if peer is not None else 0
        part: list[BlockInfo] = []  # the coldest blocks that fit its room (never all or nothing)
        for b in batch:
            if b.size_bytes > room:
                break
            part.append(b)
            room -= b.size_bytes
        if peer is None or not part:
            if not self.counters.no_capacity or self.peers:
                log.info("spill_no_capacity", error="master unreachable; no cached peer has "
                         f"room for a {batch[0].size_bytes}-byte block (peers known: "
                         f"{len(self.peers)})")
            self.counters.no_capacity += 1
            return 0
        moves = [_Move(b, 0, peer.data_address, peer.node_id) for b in part]
        self._transfer(moves)
        done: dict[bytes, list[BlockInfo]] = {}
        for m in moves:
            if m.ok:
                peer.room_bytes -= m.block.size_bytes
                peer.full_room_bytes = max(0, peer.full_room_bytes - m.block.size_bytes)
                done.setdefault(m.block.namespace_id, []).append(m.block)
            else:
                self._failed(m.block)
        if any(m.no_room for m in moves):
            peer.room_bytes = 0  # its room vanished: the next batch tries another cached peer
        left = 0
        for ns, blocks in done.items():
            for b, gone in zip(blocks, self.store.remove([b.key for b in blocks], namespace_id=ns),
                               strict=True):
                if gone:
                    left += 1
                    self.counters.blocks_moved += 1
                    self.counters.blocks_moved_direct += 1
                    self.counters.bytes_moved += b.size_bytes
        self._fire("ended", moves=moves)
        log.info("spill_direct_batch_done", peer=peer.node_id, num_placed=len(moves),
                 num_left=left, used_fraction=round(self.used_fraction(), 3))
        return left

    # ---- pool LRU ----------------------------------------------------------------------
    def handoff_target(self, our_age_s: float) -> PeerRoom | None:
        """The peer of the cached view to hand our coldest originals to: the one whose
        coldest original is the oldest, if older than ``our_age_s`` by more than
        ``pool_lru_margin_s``; None when none is (or pool LRU is off)."""
        if not self.pool_lru or our_age_s <= 0:
            return None
        older = [p for p in self.peers
                 if p.coldest_age_s > our_age_s + self.pool_lru_margin_s]
        return max(older, key=lambda p: (p.coldest_age_s, p.node_id), default=None)

    def hand_off(self, need_bytes: int) -> int:
        """Pool LRU for a put that would now evict an original (module docstring): hand
        our coldest originals, enough for ``need_bytes`` (at most a batch), to the peer
        :meth:`handoff_target` names. Each block the peer took leaves this node once the
        master names the peer's replica (:meth:`confirm_moved`, as a spilled block): until
        then a reader anywhere still finds it here.

        Returns:
            Blocks that left this node (0: no peer is colder, pool LRU is off, the peer
            refused them all, or the master does not name the peer's replicas yet: they
            await :meth:`confirm_moved`).
        """
        age_of = getattr(self.store, "coldest_original_age_s", None)
        if not self.pool_lru or age_of is None:
            return 0
        batch: list[BlockInfo] = []
        covered = 0
        skip = set(self._failed_at) | set(self._awaiting) if self._awaiting else self._failed_at
        for b in self.store.coldest_blocks(self.batch_blocks, exclude=skip):
            if b.copy:
                continue  # a copy is no original: the store evicts it first anyway
            batch.append(b)
            covered += b.size_bytes
            if covered >= need_bytes:
                break
        if not batch:
            return 0
        waiting = set(self._awaiting)  # (the hand-offs below add theirs)
        # First a peer that still has room up to its capacity (the placement's watermark
        # leaves that room unused), asked to take the blocks only where that drops none of
        # its own (SPARE_ONLY_AGE_S): the pool is not full while some node has room.
        num_taken, batch = self._hand_off_spare(batch)
        has_redundant = getattr(self.store, "has_redundant_victims", None)
        peer = None
        if batch and not (has_redundant is not None and has_redundant()):
            # (a redundant replica of ours goes first, another node keeps it: handing a
            # sole copy to a peer could make it drop one of its own sole copies instead)
            ours = float(age_of())
            peer = self.handoff_target(ours)
            if peer is not None:
                got = len(self._hand_off_to(peer, batch, ours))
                num_taken += got
        if num_taken and self._master_down():
            left = self._leave_unindexed(waiting)
        else:
            left = self.confirm_moved() if num_taken else 0
        if peer is not None:
            log.info("pool_lru_handoff", peer=peer.node_id, num_blocks=len(batch),
                     num_taken=got, num_left=left, our_coldest_age_s=round(ours, 3),
                     peer_coldest_age_s=round(peer.coldest_age_s, 3))
        self._progress(left)
        return left

    def _master_down(self) -> bool:
        """Whether the master could not be reached lately (``MASTER_RETRY_S``): then no
        lookup can confirm a move, and batches go to the cached view."""
        return time.monotonic() < self._master_down_until

    def _leave_unindexed(self, before: Collection[tuple[bytes, bytes]]) -> int:
        """The master cannot be reached: the hand-offs that await its index since
        ``before`` (a snapshot of ``_awaiting``) leave now, as a direct move does
        (:meth:`_direct`: a block leaves once the peer stored it; the masters learn the
        peer's replica from its events or inventory). Awaiting a lookup that cannot answer
        held the spill thread :data:`CONFIRM_WAIT_S` (as long as the put's wait) and the
        put then evicted an original for good (issue 17 §3). Returns the blocks that left."""
        by_ns: dict[bytes, list[_Move]] = {}
        for fk in [fk for fk in self._awaiting if fk not in before]:
            m, _ = self._awaiting.pop(fk)
            by_ns.setdefault(fk[0], []).append(m)
        return sum(self._remove_moved(ns, moves) for ns, moves in by_ns.items())

    def _hand_off_spare(self, batch: list[BlockInfo]) -> tuple[int, list[BlockInfo]]:
        """Hand ``batch`` to the peers of the cached view with room up to their capacity
        (``PeerRoom.full_room_bytes``, most first), each asked to take a block only from
        room that drops nothing of its own (free space, copies, blocks on its SSD,
        demotions its SSD takes as is, redundant replicas): the hand-off's age is
        :data:`SPARE_ONLY_AGE_S`, older than any block it holds, so it never evicts an
        original for one. Returns ``(blocks the peers took, the blocks they did not)``; the
        taken ones await :meth:`confirm_moved` (leave once the master names the peer's)."""
        num_taken = 0
        for peer in sorted(self.peers, key=lambda p: (-p.full_room_bytes, p.node_id)):
            if not batch:
                break
            size = batch[0].size_bytes
            if peer.full_room_bytes < size:
                break  # (sorted: no later peer has room either)
            fits: list[BlockInfo] = []
            room = peer.full_room_bytes
            for b in batch:
                if b.size_bytes <= room:
                    fits.append(b)
                    room -= b.size_bytes
            taken_keys = self._hand_off_to(peer, fits, SPARE_ONLY_AGE_S)
            peer.full_room_bytes = max(0, peer.full_room_bytes - sum(
                b.size_bytes for b in fits if (b.namespace_id, b.key) in taken_keys))
            log.info("pool_spare_handoff", peer=peer.node_id, num_blocks=len(fits),
                     num_taken=len(taken_keys))
            num_taken += len(taken_keys)
            batch = [b for b in batch if (b.namespace_id, b.key) not in taken_keys]
        return num_taken, batch

    def _hand_off_to(self, peer: PeerRoom, batch: list[BlockInfo], age_s: float
                     ) -> set[tuple[bytes, bytes]]:
        """One hand-off of ``batch`` to ``peer`` (a PUT per namespace) with ``age_s``; the
        blocks it took await :meth:`confirm_moved` (as hand-off moves). Returns their
        ``(namespace_id, key)``."""
        self.counters.handoffs_sent += len(batch)
        by_ns: dict[bytes, list[BlockInfo]] = {}
        for b in batch:
            by_ns.setdefault(b.namespace_id, []).append(b)
        taken: set[tuple[bytes, bytes]] = set()
        now = time.monotonic()
        for ns, blocks in by_ns.items():
            for b in self._send_handoff(peer, ns, blocks, age_s):
                taken.add((ns, b.key))  # leaves once the master names the peer's replica
                self._awaiting[(ns, b.key)] = (
                    _Move(b, 0, peer.data_address, peer.node_id, ok=True, handoff=True), now)
        self.counters.handoffs_accepted += len(taken)
        self.counters.handoffs_refused += len(batch) - len(taken)
        return taken

    def _send_handoff(self, peer: PeerRoom, ns: bytes, blocks: list[BlockInfo],
                      age_s: float) -> list[BlockInfo]:
        """One hand-off PUT of ``blocks`` (one namespace) to ``peer``; the blocks it took
        (stored now, or held there already)."""
        exported = self.store.read_for_export([b.key for b in blocks], namespace_id=ns)
        taken: list[BlockInfo] = []
        try:
            sent = [(b, e) for b, e in zip(blocks, exported, strict=True) if e is not None]
            if not sent:
                return taken
            out = self._put_by_factor(peer.data_address, ns, [e for _, e in sent],
                                      handoff_age_s=age_s)
            for (b, _), (item, factor) in zip(sent, out, strict=True):
                if item.code == 0 and (item.stored or factor <= 1):
                    taken.append(b)
                elif item.code == 0:  # it holds another replica: ours stays (one node, one)
                    log.info("pool_lru_handoff_peer_holds_replica", peer=peer.node_id,
                             key=b.key.hex()[:16], factor=factor)
                else:
                    log.info("pool_lru_handoff_refused", peer=peer.node_id,
                             key=b.key.hex()[:16], code=item.code, error=item.message)
        except KvstoredError as exc:
            log.warning("pool_lru_handoff_failed", peer=peer.node_id, num_blocks=len(blocks),
                        error=str(exc))
        finally:
            self.store.release_export(exported)
        return taken

    def _put_by_factor(self, address: str, ns: bytes, exported: Sequence[ExportedBlock], *,
                       spare_only: bool = False, handoff_age_s: float | None = None
                       ) -> list[tuple[PutItem, int]]:
        """PUT exported blocks to ``address``, one request per replication factor (a PUT
        carries one), so the peer records each block's factor (:attr:`factor_of`).

        Returns:
            Per block, in order: the peer's answer and the factor it was sent with (0 = none).

        Raises:
            KvstoredError: as the transport's ``put`` (blocks of earlier requests may be
                stored at the peer; none is dropped here on an error).
        """
        factor_of = self.factor_of
        factors = [factor_of(ns, e.key) if factor_of is not None else 0 for e in exported]
        out: list[tuple[PutItem, int] | None] = [None] * len(exported)
        for factor in sorted(set(factors)):
            idx = [i for i, f in enumerate(factors) if f == factor]
            items = [(exported[i].key, exported[i].view, exported[i].meta) for i in idx]
            deadline = time.monotonic() + self.timeout_s
            replicas = factor if factor > 1 else 0
            got = (self._peer(address).put(items, ns, deadline=deadline, replicas=replicas,
                                           handoff_age_s=handoff_age_s)
                   if handoff_age_s is not None else
                   self._peer(address).put(items, ns, deadline=deadline, replicas=replicas,
                                           spare_only=spare_only))
            for i, item in zip(idx, got, strict=True):
                out[i] = (item, factor)
        return [x for x in out if x is not None]

    # ---- one batch ---------------------------------------------------------------------
    def _peer(self, address: str) -> Transport:
        t = self._peers.get(address)
        if t is None:
            t = self._peers[address] = self._transport_factory(address)
        return t

    def _failed(self, b: BlockInfo) -> None:
        self.counters.blocks_failed += 1
        self._failed_at[(b.namespace_id, b.key)] = time.monotonic()

    def _start_writes(self, batch: Sequence[BlockInfo], ending: Sequence[_Move] = ()
                      ) -> tuple[list[_Move], int, bool, list[bool]]:
        """PutStart every block of the batch in one PutStartBatch call, which also carries
        the PutEnds of ``ending`` (the previous batch; per move see :meth:`_accepted`)."""
        # No batch headroom: the master counts each block placed earlier in this batch as
        # landed on its target (bytes placed and not yet ended), so the watermark check of
        # block i already includes blocks 0..i-1. Asking a peer for room for the whole batch
        # on top (twice the batch) refused a peer that had room for part of it, and the
        # writer then evicted blocks the pool had room for.
        headroom = 0
        try:
            ends, outcomes = self.master.put_end_and_start_batch(
                [(m.block.namespace_id, m.block.key, m.generation, m.ok) for m in ending],
                [(b.namespace_id, b.key, b.size_bytes) for b in batch],
                writer_node_id=self.node_id, exclude_writer=True, max_used_fraction=self.high,
                headroom_bytes=headroom, holder_reports=True, timeout_s=self.rpc_timeout_s)
        except (Unavailable, DeadlineExceeded) as exc:  # no master: the cached view next
            log.warning("spill_master_unreachable", error=str(exc), num_peers=len(self.peers))
            self._master_down_until = time.monotonic() + MASTER_RETRY_S
            return [], 0, False, self._accepted(ending, [exc] * len(ending))
        except KvstoredError as exc:  # nothing may be assumed ended: every copy stays
            ends, outcomes = [exc] * len(ending), [exc] * len(batch)
        if outcomes and all(isinstance(o, Unavailable) for o in outcomes):
            # a master that answers but cannot place (a new leader still rebuilding its node
            # table, Placement.rebuilding): as unreachable, the cached view takes the batch
            # instead of a full pool's local eviction
            log.warning("spill_master_unreachable", error=str(outcomes[0]),
                        num_peers=len(self.peers))
            self._master_down_until = time.monotonic() + MASTER_RETRY_S
            return [], 0, False, self._accepted(ending, ends)
        ended = self._accepted(ending, ends)
        moves: list[_Move] = []
        dropped = 0
        full = False
        for b, out in zip(batch, outcomes, strict=True):
            if isinstance(out, NoCapacity):
                if not full:
                    self.counters.no_capacity += 1
                    log.info("spill_no_capacity", error=str(out))
                full = True
                continue
            if isinstance(out, ReplicaNotReady):
                continue  # another write of it is open; try it next round
            if isinstance(out, KvstoredError):
                log.warning("spill_put_start_failed", key=b.key.hex()[:16], error=str(out))
                self._failed(b)
                continue
            exists, gen, replicas = out
            if exists:  # another node holds it already
                # Only a remote-fill copy is dropped for that. The master's spill `exists`
                # counts originals only, but it hears of changes a heartbeat late (the other
                # original may be gone already), and a lost original leaves the pool a copy
                # that every allocation evicts first. An original stays; no victim for a while.
                if b.copy and self.store.remove([b.key], namespace_id=b.namespace_id)[0]:
                    self.counters.blocks_deduplicated += 1
                    dropped += 1
                elif not b.copy:
                    self._failed(b)
                continue
            moves.append(_Move(b, gen, replicas[0].data_address, replicas[0].node_id))
        return moves, dropped, full, ended

    def _send(self, address: str, ns: bytes, group: list[_Move]) -> None:
        """One data-plane PUT of a peer's moves (DRAM copies pinned in place, SSD-only ones
        read from their files; never promoted), released afterwards.

        Sent with PUT_FLAG_SPARE (``spare_only``): the peer takes a block only into room
        that drops no sole copy of its own (free space, its copies, DRAM blocks also on its
        SSD, redundant replicas). A peer whose room vanished since its last heartbeat
        answers NO_CAPACITY instead of trading one of its originals for ours: the move is
        aborted like a failed placement (the block stays here; ``no_room``), counted in
        ``blocks_refused_no_room``, logged at info (an expected race, not a fault)."""
        exported = self.store.read_for_export([m.block.key for m in group], namespace_id=ns)
        try:
            sent = [(m, e) for m, e in zip(group, exported, strict=True) if e is not None]
            if not sent:
                return
            out = self._put_by_factor(address, ns, [e for _, e in sent], spare_only=True)
            num_no_room = 0
            held: list[str] = []
            for (m, _), (item, factor) in zip(sent, out, strict=True):
                # Only a block the peer stored *now* is moved. One it held already (code 0,
                # not stored) stays here: the peer's may be its other replica (factor > 1:
                # moving ours would leave both on one node), or its own copy on its way out
                # (two nodes spilling into each other through the cached view, issue 17 §3:
                # each sent the other the block it had just received, each heard "held
                # already", each removed its copy, and the block was gone from both). At
                # worst ours is a second original (harmless).
                m.ok = item.code == 0 and item.stored
                if item.code == 0 and not item.stored:
                    held.append(f"{m.block.key.hex()[:16]}/{factor}")
                elif item.code == ErrorCode.NO_CAPACITY:
                    m.no_room = True
                    num_no_room += 1
                elif not m.ok:
                    log.warning("spill_item_refused", peer=address, key=m.block.key.hex()[:16],
                                code=item.code, error=item.message)
            if held:
                self.counters.blocks_held_by_peer += len(held)
                log.info("spill_peer_held_already", peer=address, num_blocks=len(held),
                         keys_factors=",".join(held[:8]))
            if num_no_room:
                self.counters.blocks_refused_no_room += num_no_room
                log.info("spill_peer_no_room", peer=address, num_blocks=num_no_room,
                         num_sent=len(sent))
        except KvstoredError as exc:
            log.warning("spill_transfer_failed", peer=address, num_blocks=len(group),
                        error=str(exc))
        finally:
            self.store.release_export(exported)

    def _end(self, moves: Sequence[_Move]) -> list[bool]:
        """PutEnd every move in one PutEndBatch call (per move see :meth:`_accepted`)."""
        try:
            ended = self.master.put_end_batch(
                [(m.block.namespace_id, m.block.key, m.generation, m.ok) for m in moves],
                timeout_s=self.rpc_timeout_s)
        except KvstoredError as exc:
            log.warning("spill_end_failed", num_blocks=len(moves), error=str(exc))
            return [False] * len(moves)
        return self._accepted(moves, ended)

    def _accepted(self, moves: Sequence[_Move], ended: Sequence[int | KvstoredError]
                  ) -> list[bool]:
        """Per move: True only when it was a commit and the master accepted exactly its
        generation (a refused or failed end keeps the local copy)."""
        out = []
        for m, n in zip(moves, ended, strict=True):
            if isinstance(n, KvstoredError):  # NotFound: the write lease lapsed; keep the copy
                log.warning("spill_end_refused" if isinstance(n, NotFound) else "spill_end_failed",
                            key=m.block.key.hex()[:16], generation=m.generation, error=str(n))
                out.append(False)
            else:
                m.indexed = n > 0  # the master counted the peer's replica (its event came)
                out.append(m.ok)
        return out

    def spill_batch(self, batch: Sequence[BlockInfo]) -> tuple[int, bool]:
        """Move one batch on its own: PutStartBatch, transfer, PutEndBatch, removal.

        Returns:
            ``(blocks that left this node, whether the pool had no room)``.
        """
        moves, dropped, full, _ = self._start_writes(batch)
        if not moves:
            return dropped, full
        self._transfer(moves)
        return self._finish(moves, self._end(moves), dropped), full

    def _transfer(self, moves: list[_Move]) -> None:
        """Send placed moves, one data-plane PUT per (peer, namespace)."""
        self._fire("put_started", moves=moves)
        groups: dict[tuple[str, bytes], list[_Move]] = {}
        for m in moves:
            groups.setdefault((m.address, m.block.namespace_id), []).append(m)
        for (address, ns), group in groups.items():
            self._send(address, ns, group)
        self._fire("sent", moves=moves)

    def _finish(self, moves: Sequence[_Move], ended: Sequence[bool], dropped: int) -> int:
        """Only now, for the moves whose end was accepted (``ended``): drop the local copies.

        Returns:
            ``dropped`` + the blocks that left this node.
        """
        left = dropped
        done: dict[bytes, list[_Move]] = {}
        now = time.monotonic()
        for m, ok in zip(moves, ended, strict=True):
            if ok and m.indexed:
                done.setdefault(m.block.namespace_id, []).append(m)
            elif ok:  # the peer's replica is not indexed yet: the copy stays until it is
                self._awaiting[(m.block.namespace_id, m.block.key)] = (m, now)
            else:
                self._failed(m.block)
        for ns, done_moves in done.items():  # only now: the local copies go (a move)
            left += self._remove_moved(ns, done_moves)
        self._fire("ended", moves=moves)
        log.info("spill_batch_done", num_placed=len(moves), num_left=left,
                 used_fraction=round(self.used_fraction(), 3))
        return left


def master_spiller(store: SpillStore, cfg: Any, *, node_id: str,
                   max_block_bytes: int, tls: Any = None,
                   fence: TermFence | None = None,
                   factor_of: Callable[[bytes, bytes], int] | None = None) -> Spiller:
    """A spiller over a real master (``cfg``: the node's ClusterConfig) and TCP peers;
    ``tls`` (a :class:`kvstored.security.tls.TlsFiles`, or None = plaintext): mutual TLS to
    the master and to the peers' data planes; ``fence``: the node's newest term (shared with its
    MasterLink): a placement answered by an older term is refused (StaleTerm)."""
    from kvstored.transport.master_rpc import MasterClient
    from kvstored.transport.tcp import DataPlaneClient

    master = MasterClient(cfg.master_address, timeout_s=cfg.rpc_timeout_s, tls=tls, fence=fence)
    ssl_context = tls.client_context() if tls is not None else None

    def transport(address: str) -> Transport:
        return DataPlaneClient(address, pool_size=cfg.peer_pool_size,
                               max_block_bytes=max_block_bytes, ssl_context=ssl_context)

    spiller = Spiller(
        store, master, transport, node_id=node_id, high_watermark=cfg.spill_high_watermark,
        low_watermark=cfg.spill_low_watermark, batch_blocks=cfg.spill_batch_blocks,
        interval_s=cfg.spill_interval_s, timeout_s=cfg.spill_timeout_s,
        rpc_timeout_s=cfg.rpc_timeout_s, peer_view_s=cfg.spill_peer_view_s,
        hook=hook_from_env(), pool_lru=cfg.pool_lru_enabled,
        pool_lru_margin_s=cfg.pool_lru_margin_s, factor_of=factor_of)
    close = spiller.close

    def close_all(timeout_s: float = 30.0) -> None:
        close(timeout_s)
        master.close()

    spiller.close = close_all  # type: ignore[method-assign]  # the facade's close replaced by one that also closes the master stub
    return spiller


class NoDropCollector:
    """Prometheus collector of what a cluster node did instead of dropping a block, read at
    scrape time (``kvstored_nodrop_*_total``; issue 17 section 3):

    - ``evictions_for_good``: DRAM evictions that may have dropped a block from the pool
      (a local put with no spare victim and no pool room: the pool was full or the wait ran
      out; ``TieredStore.evictions_for_good``);
    - ``promotions_skipped``: SSD hits left on SSD because only dropping an original would
      have made DRAM room (``TieredStore.promotions_skipped``);
    - ``served_from_ssd``: such hits served straight from their SSD file (inline gRPC Get,
      TCP data-plane GET; ``Reads.num_served_from_ssd``); a shared-memory read misses them;
    - ``copies_skipped``: peers' blocks not copied here for lack of room that drops nothing
      (``RemoteReads.num_skipped``; a miss unless streamed through);
    - ``streamed_through``: such blocks an engine's TCP data-plane GET carried without
      caching them (``DataPlaneServer.num_streamed_through``);
    - ``handoffs_taken`` / ``handoffs_declined``: peers' pool-LRU hand-offs this node took
      (evicting a colder original of its own) or refused (``TieredStore.handoffs_taken``,
      ``handoffs_declined``); the sender's side is ``kvstored_spill_handoffs_*``;
    - ``spare_puts_refused``: peers' spill and replica PUT items refused here because only
      dropping a sole copy would have made room (PUT_FLAG_SPARE;
      ``TieredStore.spare_puts_refused``); the sender asks elsewhere or reports fewer
      replicas.

    Args:
        counters: name (one of the above) -> a callable giving its value now.
    """

    def __init__(self, counters: dict[str, Callable[[], int]]) -> None:
        self._counters = dict(counters)

    def describe(self) -> list[Any]:
        return []  # produced at scrape time only

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily

        for name, value in self._counters.items():
            yield CounterMetricFamily(f"kvstored_nodrop_{name}",
                                      NODROP_COUNTERS.get(name, name), value=value())


NODROP_COUNTERS = {
    "evictions_for_good": "DRAM evictions that may have dropped a block from the pool.",
    "promotions_skipped": "SSD hits not promoted: only dropping an original made room.",
    "served_from_ssd": "Skipped promotions served straight from their SSD file.",
    "copies_skipped": "Peers' blocks not copied here: no room that drops nothing.",
    "streamed_through": "Peers' blocks an engine's TCP GET carried without caching them.",
    "handoffs_taken": "Peers' hand-offs taken here, evicting a colder block (pool LRU).",
    "handoffs_declined": "Peers' hand-offs refused here: no block here was colder.",
    "spare_puts_refused": "Peers' spill/replica PUTs refused: only a sole copy made room.",
}
"""The counters :class:`NoDropCollector` exports, with their help text."""


class SpillCollector:
    """Prometheus collector of a spiller's counters (``kvstored_spill_*_total``), read at
    scrape time; register it on the node's registry."""

    def __init__(self, spiller: Spiller) -> None:
        self._spiller = spiller

    def describe(self) -> list[Any]:
        return []  # produced at scrape time only

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily

        c = self._spiller.counters
        for name, doc, value in (
            ("rounds", "Watermark checks that found the node past its high watermark.", c.rounds),
            ("blocks_moved", "Blocks moved to a peer and dropped here.", c.blocks_moved),
            ("bytes_moved", "Bytes of the blocks moved to peers.", c.bytes_moved),
            ("blocks_deduplicated", "Blocks dropped here because another node held them.",
             c.blocks_deduplicated),
            ("blocks_failed", "Moves aborted (the local copy stayed).", c.blocks_failed),
            ("blocks_refused_no_room", "Moves a peer refused: no room there that drops no "
             "sole copy (the block stayed here).", c.blocks_refused_no_room),
            ("blocks_held_by_peer", "Moves whose peer held the block already (the local "
             "copy stayed: the peer's may be on its way out).", c.blocks_held_by_peer),
            ("no_capacity", "Spill rounds stopped because no peer had room.", c.no_capacity),
            ("blocks_moved_direct", "Blocks moved to a cached peer while the master was "
             "unreachable.", c.blocks_moved_direct),
            ("put_waits", "Local puts that waited for a spill round before evicting.",
             c.put_waits),
            ("handoffs_sent", "Blocks offered to a peer with a colder coldest block (pool "
             "LRU).", c.handoffs_sent),
            ("handoffs_accepted", "Hand-offs the peer took (it evicted a colder block).",
             c.handoffs_accepted),
            ("handoffs_refused", "Hand-offs refused (the peer had no colder block or the "
             "transfer failed).", c.handoffs_refused),
        ):
            yield CounterMetricFamily(f"kvstored_spill_{name}", doc, value=value)
