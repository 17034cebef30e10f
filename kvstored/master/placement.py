"""Placement of new replicas and the two-phase put's generations.

``start_put`` chooses nodes for a block and opens a *write* with a fresh generation; its
replicas are indexed WRITING (invisible to lookups). ``end_put`` commits or aborts exactly
that generation::

    start_put(key) -> generation G, replicas WRITING on nodes chosen by the policy
    end_put(key, G, commit) -> COMMITTED (visible)        end_put(key, G_old) -> NotFound
    write lease lapsed      -> WRITING replicas dropped; a later start_put gets G' > G

Policies (candidates: synced, healthy nodes with room in DRAM for the block beside the
bytes already placed on them and not yet committed):

- ``local-first``: the writer's node if it has room, then the others by most free DRAM;
- ``most-free``: by most free DRAM;
- ``random``: a uniform sample (seeded ``random.Random`` injected for tests);

ties go to the lower node id, so orders are exact and testable.

Spill (a node past its high watermark moving its coldest blocks to peers,
kvstored/node/spill.py) asks with ``exclude_writer`` (never the writer's own node),
``max_used_fraction`` and ``headroom_bytes``: a candidate's *pool room* (its DRAM below that
fraction of its capacity; on a node with an SSD tier, its SSD below the fraction plus its
DRAM below the fraction, :meth:`Placement.last_tier_room_bytes`) must cover the block, the
bytes placed there and not yet ended, and the headroom (the spiller's batch). So a peer is a
candidate only well below its own high watermark, and no two nodes send blocks back and
forth. Candidates are then ordered by free bytes of that tier; ``exists`` counts only
replicas on other nodes than the writer's that are originals (a remote-fill copy, which its
holder evicts first, never makes a spilled block "exist"), and a writer answered ``exists`` (it drops its
copy) is remembered for one node lease: its replica then neither counts for another
spiller's ``exists`` nor is a candidate, so two nodes never both drop a block citing each
other's copy.

With ``holder_reports`` the holder's own change event (MasterLink) is the only source of the
replica: the event merges into the WRITING placeholder of that holder (one row per block,
holder and tier), and ``end_put(commit)`` drops whatever placeholder is left instead of
committing it, so a replica is never counted twice and never names a tier or a block the
holder does not report. Not thread-safe: loop only.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from kvstored.errors import (
    InvalidArgument,
    KvstoredError,
    NoCapacity,
    NotFound,
    ReplicaNotReady,
    Unavailable,
)
from kvstored.master.membership import Membership, NodeRecord
from kvstored.master.types import (
    MAX_REPLICAS,
    MAX_SIZE_BYTES,
    PlacedReplica,
    PlacementPolicy,
    PutStartOutcome,
    ReplicaState,
)
from kvstored.types import Tier

log = structlog.get_logger(__name__)

MAX_BATCH_ITEMS = 4096
"""Items of one PutStartBatch / PutEndBatch."""


def _check_batch(num_items: int) -> None:
    if num_items > MAX_BATCH_ITEMS:
        raise InvalidArgument(
            f"{num_items} items in one batched put call; the limit is {MAX_BATCH_ITEMS}")


@dataclass(slots=True)
class _Write:
    generation: int
    deadline_s: float
    size_bytes: int
    holders: tuple[int, ...]
    holder_reports: bool = False


class Placement:
    """Two-phase puts over the membership's nodes.

    Args:
        membership: the nodes and the block index.
        policy: default placement policy.
        write_lease_s: a write not ended within this is aborted (its writer died).
        rng: randomness of the ``random`` policy (seed it in tests).

    Raises:
        InvalidArgument: a write lease that is not positive.
    """

    def __init__(
        self,
        membership: Membership,
        *,
        policy: PlacementPolicy = PlacementPolicy.LOCAL_FIRST,
        write_lease_s: float = 30.0,
        rng: random.Random | None = None,
    ) -> None:
        if not (math.isfinite(write_lease_s) and write_lease_s > 0):
            raise InvalidArgument(f"write_lease_s must be > 0, got {write_lease_s}")
        self.membership = membership
        self.index = membership.index
        self.policy = PlacementPolicy(policy)
        self.write_lease_s = float(write_lease_s)
        self.rng = rng if rng is not None else random.Random()
        self._writes: dict[tuple[bytes, bytes], _Write] = {}
        self._pending_bytes: dict[int, int] = {}
        # holder -> (its last_heartbeat_s when counted, bytes of holder_reports writes
        # committed there since): usage the node has not heartbeated yet
        self._landed: dict[int, tuple[float, int]] = {}
        # (ns, key) -> (holder told "exists" so it drops its copy, until): that holder's
        # replica does not count for another spiller's "exists" meanwhile (its REMOVED
        # event is on the way), so two nodes never both drop a block citing each other
        self._dropping: dict[tuple[bytes, bytes], tuple[int, float]] = {}
        # (ns, key) -> (holders of a committed holder_reports write whose own event has not
        # indexed their replica yet, until): coming, for repair (reporting_holders)
        self._reporting: dict[tuple[bytes, bytes], tuple[frozenset[int], float]] = {}

    # ---- capacity --------------------------------------------------------------------
    def free_dram_bytes(self, rec: NodeRecord) -> int:
        """DRAM the node reported free minus what is placed there and not yet ended."""
        usage = rec.tiers.get(Tier.DRAM)
        free = usage.free_bytes if usage is not None else 0
        return max(0, free - self._pending_bytes.get(rec.holder, 0))

    def _release(self, write: _Write) -> None:
        for h in write.holders:
            left = self._pending_bytes.get(h, 0) - write.size_bytes
            if left > 0:
                self._pending_bytes[h] = left
            else:
                self._pending_bytes.pop(h, None)

    def reclaim_expired_writes(self) -> int:
        """Abort every write whose lease lapsed (a dead writer's space is released).

        Returns:
            Writes aborted.
        """
        now = self.membership.clock()
        while self._reporting:  # insertion order is deadline order (one lease for all)
            k = next(iter(self._reporting))
            if self._reporting[k][1] >= now:
                break
            del self._reporting[k]
        expired = [k for k, w in self._writes.items() if w.deadline_s < now]
        for k in expired:
            w = self._writes.pop(k)
            self.index.abort_generation(k[0], k[1], w.generation)
            self._release(w)
            log.warning("write_lease_expired", key=k[1].hex()[:16], generation=w.generation)
        return len(expired)

    def last_tier_room_bytes(self, rec: NodeRecord, max_used_fraction: float) -> int:
        """Pool room of the node: bytes it may still take before it passes
        ``max_used_fraction`` of its capacity, minus the bytes placed there and not yet
        ended (negative = already past it).

        A DRAM-only node: its DRAM below the fraction. A node with an SSD tier: its SSD
        below the fraction *plus* its DRAM below the fraction, each counted from 0 (an SSD
        past the fraction costs nothing more): free DRAM holds blocks the SSD does not, so
        a block placed there while the SSD is past its watermark is one the pool keeps
        (issue 17 §3: two DRAM 8 + SSD 16 MiB nodes lost blocks once both SSDs were past
        the watermark though both DRAMs had room, docs/cluster.md). Usage is counted as
        :attr:`~kvstored.master.types.TierUsage.held_bytes`: the bytes the node can free
        without dropping a block (remote-fill copies, DRAM blocks also on its SSD) are room
        (issue 17 §3: three DRAM 16 + SSD 32 MiB nodes whose DRAM held only copies and
        promoted SSD blocks looked full, and the writer evicted its own blocks)."""
        dram = rec.tiers.get(Tier.DRAM)
        ssd = rec.tiers.get(Tier.SSD)
        if ssd is not None and ssd.capacity_bytes > 0:
            room = max(0, int(ssd.capacity_bytes * max_used_fraction) - ssd.held_bytes)
            if dram is not None and dram.capacity_bytes > 0:
                room += max(0, int(dram.capacity_bytes * max_used_fraction) - dram.held_bytes)
        elif dram is not None:
            room = int(dram.capacity_bytes * max_used_fraction) - dram.held_bytes
        else:
            return -1
        landed_s, landed = self._landed.get(rec.holder, (0.0, 0))
        if landed_s != rec.last_heartbeat_s:  # heartbeated since: its usage includes them
            landed = 0
        return room - self._pending_bytes.get(rec.holder, 0) - landed

    def rebuilding(self, key: bytes) -> Unavailable | None:
        """Why this master cannot say "no room" for ``key`` now, or None when it can.

        A master whose node table is incomplete (:meth:`Membership.is_complete
        <kvstored.master.membership.Membership.is_complete>` False: a new leader or a
        restarted master before every node re-registered and synced its inventory, and for
        one node lease after its start) knows too few nodes to tell a full pool from nodes
        it has not heard from yet. "No candidate" then is Unavailable (the master's view,
        not the pool, is what is missing), never NoCapacity: a spiller or a put's replicas
        then use the node's cached peer view, as with no master at all, instead of evicting
        or reporting a full pool while peers are nearly empty (the fail17 tester: puts said
        NoCapacity for seconds after a failover).
        """
        if self.membership.is_complete():
            return None
        recs = self.membership.nodes()
        synced = sum(1 for r in recs if r.synced and not r.gap)
        return Unavailable(
            f"the master is still rebuilding its node table after a start or a leader change "
            f"({synced} of {len(recs)} registered nodes synced, every node's inventory and one "
            f"node lease awaited): no placement for block {key.hex()[:16]} yet; ask again, or "
            f"place through the node's cached peer view")

    # ---- policy ----------------------------------------------------------------------
    def order_candidates(
        self, size_bytes: int, writer_node_id: str, policy: PlacementPolicy, *,
        exclude_writer: bool = False, max_used_fraction: float = 0.0, headroom_bytes: int = 0,
        avoid_holders: frozenset[int] = frozenset(),
    ) -> list[NodeRecord]:
        """Nodes that can take a ``size_bytes`` block, in the policy's order.

        Args:
            exclude_writer: leave the writer's own node out (spill).
            max_used_fraction: > 0: a candidate's last tier must stay at or below this
                fraction of its capacity with the block and ``headroom_bytes`` added, and
                candidates are ordered by that room instead of free DRAM.
            headroom_bytes: room a candidate must have beyond the block (the spill batch).
            avoid_holders: holders left out (one dropping its copy of this block).
        """
        live = [r for r in self.membership.nodes()
                if r.synced and not r.gap and r.healthy and not r.draining
                and not (exclude_writer and r.spec.node_id == writer_node_id)
                and r.holder not in avoid_holders]
        if max_used_fraction > 0:
            need = size_bytes + headroom_bytes
            cands = [r for r in live if self.last_tier_room_bytes(r, max_used_fraction) >= need]
            by_free = sorted(cands, key=lambda r: (-self.last_tier_room_bytes(r, max_used_fraction),
                                                   r.spec.node_id))
        else:
            cands = [r for r in live if self.free_dram_bytes(r) >= size_bytes]
            by_free = sorted(cands, key=lambda r: (-self.free_dram_bytes(r), r.spec.node_id))
        if policy is PlacementPolicy.MOST_FREE:
            return by_free
        if policy is PlacementPolicy.LOCAL_FIRST:
            local = [r for r in by_free if r.spec.node_id == writer_node_id]
            return local + [r for r in by_free if r.spec.node_id != writer_node_id]
        ordered = sorted(cands, key=lambda r: r.spec.node_id)
        return self.rng.sample(ordered, len(ordered))

    # ---- two-phase put ---------------------------------------------------------------
    def start_put(
        self,
        namespace_id: bytes,
        key: bytes,
        size_bytes: int,
        *,
        writer_node_id: str = "",
        num_replicas: int = 1,
        policy: PlacementPolicy | None = None,
        exclude_writer: bool = False,
        max_used_fraction: float = 0.0,
        headroom_bytes: int = 0,
        holder_reports: bool = False,
        replicas: int = 0,
    ) -> PutStartOutcome:
        """Open a write of one block: choose nodes, index WRITING replicas, new generation.

        Idempotent for committed blocks (``exists=True``). The caller must ``end_put`` the
        returned generation within ``write_lease_s``, else the write is aborted.

        Args:
            num_replicas: replicas wanted (1..8); fewer are placed when fewer nodes have room.
            exclude_writer, max_used_fraction, headroom_bytes: see :meth:`order_candidates`
                (spill); with ``exclude_writer`` only originals (no remote-fill copy) on
                other nodes count for ``exists``.
            holder_reports: the holders report the replica by their own events; the
                commit then only closes the write (see the module docstring).
            replicas: the block's wanted replication factor (0..8, 0 = the default 1),
                recorded in the index (:meth:`BlockIndex.record_replication_factor
                <kvstored.master.index.BlockIndex.record_replication_factor>`) whether the
                block exists or is placed now; it never lowers a recorded factor.

        Raises:
            InvalidArgument: empty key, size, replica count or factor out of range, a
                ``max_used_fraction`` outside [0, 1] or a negative headroom.
            ReplicaNotReady: another write of this block is in progress (retriable).
            NoCapacity: no node has room for the block (retriable).
            Unavailable: no candidate while the node table is incomplete (:meth:`rebuilding`).
        """
        if not key:
            raise InvalidArgument("key must not be empty")
        if not 0 <= size_bytes <= MAX_SIZE_BYTES:
            raise InvalidArgument(f"size_bytes must be in [0, {MAX_SIZE_BYTES}], got {size_bytes}")
        if not 1 <= num_replicas <= MAX_REPLICAS:
            raise InvalidArgument(f"num_replicas must be in 1..{MAX_REPLICAS}, got {num_replicas}")
        if not 0 <= replicas <= MAX_REPLICAS:
            raise InvalidArgument(f"replicas (the wanted replication factor) must be in "
                                  f"0..{MAX_REPLICAS} (0 = the default 1), got {replicas}")
        if not (0.0 <= max_used_fraction <= 1.0):
            raise InvalidArgument(f"max_used_fraction must be in [0, 1], got {max_used_fraction}")
        if headroom_bytes < 0:
            raise InvalidArgument(f"headroom_bytes must be >= 0, got {headroom_bytes}")
        self.reclaim_expired_writes()
        if replicas > 1:  # an indexed block learns it now (even when it "exists")
            self.index.record_replication_factor(namespace_id, key, replicas)
        readable = self.index.replicas(namespace_id, key, readable_only=True)
        avoid: frozenset[int] = frozenset()
        if exclude_writer and readable:
            writer = self.membership.node(writer_node_id)
            readable = [r for r in readable
                        if not r.copy and (writer is None or r.holder != writer.holder)]
            now = self.membership.clock()
            dropping = self._dropping.get((namespace_id, key))
            if dropping is not None and dropping[1] > now:
                readable = [r for r in readable if r.holder != dropping[0]]
                avoid = frozenset((dropping[0],))
            if readable and writer is not None:
                if len(self._dropping) > 65536:  # bounded: forget the lapsed grants
                    self._dropping = {k: v for k, v in self._dropping.items() if v[1] > now}
                self._dropping[(namespace_id, key)] = (writer.holder,
                                                       now + self.membership.node_lease_s)
        if readable:
            return PutStartOutcome(True, 0, ())
        if (namespace_id, key) in self._writes:
            raise ReplicaNotReady(
                f"block {key.hex()[:16]} is being written (generation "
                f"{self._writes[(namespace_id, key)].generation}); retry after it ends"
            )
        chosen = self.order_candidates(
            size_bytes, writer_node_id, policy or self.policy, exclude_writer=exclude_writer,
            max_used_fraction=max_used_fraction, headroom_bytes=headroom_bytes,
            avoid_holders=avoid)
        chosen = chosen[:num_replicas]
        if not chosen and (why := self.rebuilding(key)) is not None:
            raise why
        if not chosen:
            room = (f"room below {max_used_fraction:.0%} of its last tier for {size_bytes} "
                    f"+ {headroom_bytes} bytes" if max_used_fraction > 0
                    else f"{size_bytes} bytes of DRAM free")
            other = " other than the writer's" if exclude_writer else ""
            raise NoCapacity(
                f"no registered, healthy node{other} has {room} for block {key.hex()[:16]}"
            )
        gen = self.membership.generations.next()
        placed = []
        for rec in chosen:
            self.index.add_replica(namespace_id, key, holder=rec.holder, tier=Tier.DRAM,
                                   size_bytes=size_bytes, generation=gen,
                                   state=ReplicaState.WRITING)
            self._pending_bytes[rec.holder] = self._pending_bytes.get(rec.holder, 0) + size_bytes
            placed.append(PlacedReplica(rec.spec.node_id, rec.spec.epoch, rec.holder, Tier.DRAM,
                                        rec.spec.data_address))
        if replicas > 1:  # a new block: its WRITING rows made it indexed
            self.index.record_replication_factor(namespace_id, key, replicas)
        self._writes[(namespace_id, key)] = _Write(
            gen, self.membership.clock() + self.write_lease_s, size_bytes,
            tuple(r.holder for r in chosen), holder_reports,
        )
        return PutStartOutcome(False, gen, tuple(placed))

    def start_replicas(
        self,
        namespace_id: bytes,
        key: bytes,
        size_bytes: int,
        *,
        writer_node_id: str,
        replicas: int,
        num_replicas: int = MAX_REPLICAS,
        policy: PlacementPolicy | None = None,
        max_used_fraction: float = 0.0,
        headroom_bytes: int = 0,
        exclude_writer: bool = True,
        holder_reports: bool = True,
    ) -> PutStartOutcome:
        """Top a block up to ``replicas`` (its replication factor): open a write of the
        replicas it lacks, on nodes that hold none, new failure domains first.

        The writer's node counts as a holder (it wrote the block, its own replica may not be
        indexed yet), and so does every node with a readable original (a remote-fill copy
        does not count: its holder evicts it first). Candidates are the policy's
        (:meth:`order_candidates`, never the writer's node, nor a holder's); among them
        nodes whose zone (``NodeSpec.zone``) no holder has come first, in policy order,
        then the others (a second replica in the same zone still survives the loss of a
        node). The factor is recorded (:meth:`BlockIndex.record_replication_factor
        <kvstored.master.index.BlockIndex.record_replication_factor>`). End the write with
        :meth:`end_put` as any other.

        Args:
            writer_node_id: the node that holds the block and writes the replicas.
            replicas: the factor wanted, 1..8; the block's recorded factor if higher.
            num_replicas: most replicas placed by this call.
            max_used_fraction, headroom_bytes: see :meth:`order_candidates`.
            exclude_writer, holder_reports: as :meth:`start_put` (the writer never gets a
                second replica; the holders report theirs).

        Returns:
            ``exists`` when the block has its factor already (``num_held`` holders);
            else the write (possibly fewer replicas than it lacks: fewer nodes have room),
            with ``num_held``; no replicas and generation 0 when no candidate has room
            (nothing is opened: the caller reports ``num_held`` of the factor).

        Raises:
            InvalidArgument: empty key, size or factor out of range, no writer.
            ReplicaNotReady: another write of this block is open (retriable).
            Unavailable: no candidate while the node table is incomplete (:meth:`rebuilding`).
        """
        if not key:
            raise InvalidArgument("key must not be empty")
        if not writer_node_id:
            raise InvalidArgument("a replica top-up needs the writer's node id (writer_node_id)")
        if not 1 <= replicas <= MAX_REPLICAS:
            raise InvalidArgument(f"replicas (the wanted replication factor) must be in "
                                  f"1..{MAX_REPLICAS}, got {replicas}")
        if not 1 <= num_replicas <= MAX_REPLICAS:
            raise InvalidArgument(f"num_replicas must be in 1..{MAX_REPLICAS}, got {num_replicas}")
        if not 0 <= size_bytes <= MAX_SIZE_BYTES:
            raise InvalidArgument(f"size_bytes must be in [0, {MAX_SIZE_BYTES}], got {size_bytes}")
        self.reclaim_expired_writes()
        self.index.record_replication_factor(namespace_id, key, replicas)
        factor = max(replicas, self.index.replication_factor(namespace_id, key))
        writer = self.membership.node(writer_node_id)
        holders = {writer.holder} if writer is not None else set()
        zones = {writer.spec.zone} if writer is not None and writer.spec.zone else set()
        for r in self.index.replicas(namespace_id, key, readable_only=True):
            rec = self.membership.record_of_holder(r.holder)
            if r.copy or rec is None:
                continue
            holders.add(r.holder)
            if rec.spec.zone:
                zones.add(rec.spec.zone)
        num_held = len(holders) if writer is not None else len(holders) + 1
        missing = factor - num_held
        if missing <= 0:
            return PutStartOutcome(True, 0, (), num_held)
        if (namespace_id, key) in self._writes:
            raise ReplicaNotReady(
                f"block {key.hex()[:16]} is being written (generation "
                f"{self._writes[(namespace_id, key)].generation}); retry after it ends"
            )
        cands = self.order_candidates(
            size_bytes, writer_node_id, policy or self.policy, exclude_writer=exclude_writer,
            max_used_fraction=max_used_fraction, headroom_bytes=headroom_bytes,
            avoid_holders=frozenset(holders))
        chosen: list[NodeRecord] = []
        for rec in cands:  # new zones first, one replica per new zone; policy order within
            if rec.spec.zone and rec.spec.zone not in zones:
                chosen.append(rec)
                zones.add(rec.spec.zone)
        chosen += [r for r in cands if r not in chosen]
        chosen = chosen[: min(missing, num_replicas)]
        if not chosen and (why := self.rebuilding(key)) is not None:
            raise why  # too few nodes known yet to say the pool has no room
        if not chosen:  # nothing opened; the holders it has are the answer
            return PutStartOutcome(False, 0, (), num_held)
        gen = self.membership.generations.next()
        placed = []
        for rec in chosen:
            self.index.add_replica(namespace_id, key, holder=rec.holder, tier=Tier.DRAM,
                                   size_bytes=size_bytes, generation=gen,
                                   state=ReplicaState.WRITING)
            self._pending_bytes[rec.holder] = self._pending_bytes.get(rec.holder, 0) + size_bytes
            placed.append(PlacedReplica(rec.spec.node_id, rec.spec.epoch, rec.holder, Tier.DRAM,
                                        rec.spec.data_address))
        self.index.record_replication_factor(namespace_id, key, factor)
        self._writes[(namespace_id, key)] = _Write(
            gen, self.membership.clock() + self.write_lease_s, size_bytes,
            tuple(r.holder for r in chosen), holder_reports,
        )
        return PutStartOutcome(False, gen, tuple(placed), num_held)

    def end_put(self, namespace_id: bytes, key: bytes, generation: int, *, commit: bool) -> int:
        """Commit (or abort) exactly the write ``generation`` of a block.

        Returns:
            Replicas committed (or dropped). A commit can return 0 when every chosen node
            left meanwhile: the block is then not stored. For a ``holder_reports`` write a
            commit drops the placeholders left and returns the replicas the holders have
            reported so far (0 when their events are still on the way).

        Raises:
            NotFound: no write of this generation is open (it ended, its lease lapsed, or a
                newer write replaced it): a stale end never finalises another write.
        """
        self.reclaim_expired_writes()
        w = self._writes.get((namespace_id, key))
        if w is None or w.generation != generation:
            current = f"the open write is generation {w.generation}" if w else "no write is open"
            raise NotFound(
                f"write generation {generation} of block {key.hex()[:16]} is not open "
                f"({current}); a late {'commit' if commit else 'abort'} is refused"
            )
        del self._writes[(namespace_id, key)]
        self._release(w)
        if w.holder_reports:
            dropped = self.index.abort_generation(namespace_id, key, generation)
            if not commit:
                return dropped
            for h in w.holders:  # count them until the holder heartbeats its new usage
                rec = self.membership.record_of_holder(h)
                if rec is not None:
                    at, landed = self._landed.get(h, (rec.last_heartbeat_s, 0))
                    if at != rec.last_heartbeat_s:
                        landed = 0
                    self._landed[h] = (rec.last_heartbeat_s, landed + w.size_bytes)
            holders = set(w.holders)
            rows = self.index.replicas(namespace_id, key, readable_only=True)
            awaited = frozenset(holders - {r.holder for r in rows})
            if awaited:  # their events are on the way: repair counts them as coming
                self._reporting.pop((namespace_id, key), None)  # (re-inserted: at the end)
                self._reporting[(namespace_id, key)] = (
                    awaited, self.membership.clock() + self.write_lease_s)
            return sum(1 for r in rows if r.holder in holders)
        if commit:
            return self.index.commit_generation(namespace_id, key, generation)
        return self.index.abort_generation(namespace_id, key, generation)

    def reporting_holders(self, namespace_id: bytes, key: bytes) -> frozenset[int]:
        """Holders whose ``holder_reports`` write of the block committed (:meth:`end_put`)
        while their own change event, which indexes the replica, was still on the way; at
        most ``write_lease_s`` after the commit, and only until the replica is indexed.

        Repair counts them as replicas coming: a COPY issued in that window would make one
        original too many, and the DROP trimming it goes to the fullest node, often the
        writer (issue 17's whole-system test: node a without A's blocks).
        """
        entry = self._reporting.get((namespace_id, key))
        if entry is None:
            return frozenset()
        holders, until = entry
        if self.membership.clock() > until:
            del self._reporting[(namespace_id, key)]
            return frozenset()
        left = holders - {r.holder for r in self.index.replicas(namespace_id, key)
                          if r.state is ReplicaState.COMMITTED}
        if not left:
            del self._reporting[(namespace_id, key)]
        elif left != holders:
            self._reporting[(namespace_id, key)] = (left, until)
        return left

    def start_put_batch(
        self, items: Sequence[tuple[bytes, bytes, int]], *,
        factors: Sequence[int] | None = None, top_up: bool = False, **options: Any
    ) -> list[PutStartOutcome | KvstoredError]:
        """:meth:`start_put` of each ``(namespace_id, key, size_bytes)``, in order.

        Each item is exactly one ``start_put`` with the same ``options`` (its own
        generation, its own ``exists`` and capacity check, seeing the items placed before
        it); one item's error never stops the others.

        Args:
            items: the blocks, at most :data:`MAX_BATCH_ITEMS`.
            factors: per item, its wanted replication factor (``start_put``'s
                ``replicas``); None = 0 for every item.
            top_up: each item is a :meth:`start_replicas` (``factors`` its ``replicas``;
                0 = 1) instead of a :meth:`start_put`; ``options`` then take
                ``writer_node_id``, ``num_replicas``, ``policy``, ``max_used_fraction``,
                ``headroom_bytes``, ``exclude_writer`` and ``holder_reports``.
            options: keyword arguments of :meth:`start_put` (``writer_node_id``...).

        Returns:
            Per item: the outcome, or the error ``start_put`` raised for it (NoCapacity,
            ReplicaNotReady, InvalidArgument...).

        Raises:
            InvalidArgument: more than :data:`MAX_BATCH_ITEMS` items, or ``factors`` not
                one per item.
        """
        _check_batch(len(items))
        if factors is not None and len(factors) != len(items):
            raise InvalidArgument(f"factors must have one entry per item; got {len(factors)} "
                                  f"for {len(items)} items")
        out: list[PutStartOutcome | KvstoredError] = []
        for i, (ns, key, size) in enumerate(items):
            try:
                if top_up:
                    out.append(self.start_replicas(
                        ns, key, size, replicas=max(1, factors[i] if factors else 0), **options))
                    continue
                out.append(self.start_put(ns, key, size, replicas=factors[i] if factors else 0,
                                          **options))
            except KvstoredError as exc:
                out.append(exc)
        return out

    def end_put_batch(
        self, items: Sequence[tuple[bytes, bytes, int, bool]]
    ) -> list[int | KvstoredError]:
        """:meth:`end_put` of each ``(namespace_id, key, generation, commit)``, in order.

        Returns:
            Per item: the replicas committed (or dropped), or the error ``end_put`` raised
            (NotFound: a stale end, refused and changing nothing).

        Raises:
            InvalidArgument: more than :data:`MAX_BATCH_ITEMS` items.
        """
        _check_batch(len(items))
        out: list[int | KvstoredError] = []
        for ns, key, gen, commit in items:
            try:
                out.append(self.end_put(ns, key, gen, commit=commit))
            except KvstoredError as exc:
                out.append(exc)
        return out

    @property
    def num_open_writes(self) -> int:
        """Writes started and not yet ended or reclaimed."""
        return len(self._writes)
