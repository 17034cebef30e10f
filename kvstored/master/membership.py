"""Membership: nodes, their epochs, node leases, data-plane health and inventory reconcile.

A node *registers* once per daemon start with its ``epoch`` (the daemon's start time in ns:
a restart always has a larger one), then sends its whole *inventory* (``sync_inventory``,
chunked), then *heartbeats* (lease renewal, usage, load) and reports *ordered events*
(``seq`` 1, 2, 3... per epoch, continuing after the seq its last inventory included).

Each (node, epoch, inventory sync) owns one *holder* of the :class:`BlockIndex`; the index
serves a holder's replicas only while it is *readable*::

    readable = lease not lapsed AND inventory synced AND no event gap AND healthy

    register(epoch E)      new record, holder H1 (unreadable)  ->  an older epoch's holder
                           is retired at once (its DRAM is gone; its SSD blocks come back
                           with E's inventory)
    sync(last chunk)       H2 gets every block, then swaps in: old holder retired, H2 readable
    event seq = last+1     applied to the current holder
    event seq > last+1     gap: holder unreadable until the next full sync (RESYNC)
    lease lapsed           record dropped, holder retired (its rows GC'd later)
    N transfer failures    unhealthy: unreadable and not placed on (master/health.py: the
                           circuit breaker, its probation and the registration checks)

Generations: a replica is indexed under the generation its holder reported for it (the
node's store stamps one per replica it adds, unique per epoch; kvstored/tiers/feed.py),
which is what the node's data plane sends with the block, so a reader verifies a copy by
comparing the two. A later event for the same replica replaces the generation (the holder
is the authority on what it holds). A BlockRef without one gets a fresh master generation.

Copies: ``BlockRef.copy`` marks a remote-fill copy (indexed per replica); an ADDED event of
an indexed replica sets or clears it. A REMOVED event that leaves a block only copies
queues a promotion for one copy holder (master/copies.py; sent on its Heartbeat answer),
and so does :meth:`Membership.collect_garbage` unlinking a retired holder's original (a
node that died, left, restarted or resynced without the block: no REMOVED event).

Epoch fencing: a holder belongs to exactly one (node, epoch); expiry of an old epoch only
ever retires that epoch's holder, so it can never erase blocks a newer epoch reported. A
registration with an epoch older than the live one is refused (a stale daemon).

Restart or duplicate: a newer epoch of a live node is a restart if it has the gRPC or the
data address of the live epoch (the old process is gone: it held that port), else a
*duplicate candidate* (:meth:`duplicate_of`, rule in master/health.py): the servicer probes
the live epoch's data port and, if it answers, the registration is refused (AlreadyExists);
the live one stays.

Time comes from an injected clock; every public method first expires lapsed leases, so no
answer is ever based on a node whose lease lapsed. Not thread-safe: loop only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import structlog

from kvstored.clock import Clock
from kvstored.errors import InvalidArgument, NotFound
from kvstored.master import health
from kvstored.master.commands import CommandKind, CommandQueue
from kvstored.master.copies import Promotions, copy_to_promote
from kvstored.master.departed import EXPIRED, LEFT, DepartedNodes
from kvstored.master.generations import Generations
from kvstored.master.index import BlockIndex
from kvstored.master.types import (
    BlockColumns,
    BlockEvent,
    BlockRef,
    EventColumns,
    EventKind,
    NodeAction,
    NodeHealth,
    NodeSpec,
    RegisterOutcome,
    TierUsage,
)
from kvstored.types import Tier

log = structlog.get_logger(__name__)

_NODE_TIERS = frozenset({Tier.DRAM, Tier.SSD})  # (a constant: enum reads cost ~2 us each)
_ADDED = int(EventKind.ADDED)
_KINDS = frozenset({int(EventKind.ADDED), int(EventKind.REMOVED)})
_REMOVED = int(EventKind.REMOVED)


@dataclass(slots=True)
class _PendingSync:
    sync_id: int
    holder: int


@dataclass(slots=True)
class NodeRecord:
    """The master's view of one registered node (mutable; owned by :class:`Membership`)."""

    spec: NodeSpec
    holder: int
    registered_s: float
    last_heartbeat_s: float
    tiers: dict[Tier, TierUsage]
    load: float = 0.0
    applied_seq: int = 0
    synced: bool = False
    gap: bool = False
    consecutive_failures: int = 0
    healthy: bool = True
    probation: bool = False  # unhealthy, but readable again to try it (half-open breaker)
    unhealthy_since_s: float = 0.0  # when it was (last) marked unhealthy
    retry_s: float = 0.0  # unhealthy this long (while heartbeating) -> probation
    pending: _PendingSync | None = field(default=None, repr=False)
    draining: bool = False  # kvstorectl drain: not placed on, its blocks re-homed (repair.py)
    coldest_age_s: float = 0.0  # its coldest original's age at last_heartbeat_s (0: none)

    def coldest_age_now_s(self, now_s: float) -> float:
        """The node's coldest original's age now (pool LRU): as heartbeated plus the time
        since that heartbeat; 0.0 when it reported none."""
        if self.coldest_age_s <= 0:
            return 0.0
        return self.coldest_age_s + max(0.0, now_s - self.last_heartbeat_s)

    @property
    def health(self) -> NodeHealth:
        """SYNCING until the inventory is complete, then HEALTHY or UNHEALTHY (also while
        on probation: ``probation`` says so)."""
        if not self.healthy:
            return NodeHealth.UNHEALTHY
        return NodeHealth.SYNCING if not self.synced or self.gap else NodeHealth.HEALTHY


class Membership:
    """Registered nodes, their leases and health, kept in step with the :class:`BlockIndex`.

    Args:
        index: the block index whose holders this membership owns.
        clock: monotonic seconds (inject :class:`~kvstored.clock.FakeClock` in tests).
        generations: source of generations for replicas a node reports without one (an
            older node: BlockRef.generation 0); a node's own generation is indexed as sent.
        node_lease_s: a node that has not heartbeated for this long leaves the cluster.
        unhealthy_after_failures: consecutive data-plane failures that make a node unhealthy.
        rejoin_grace_s: seconds after construction during which :meth:`is_complete` is False
            whatever is synced: a restarted master does not know which nodes are still to
            re-register (each does within one heartbeat, a third of a lease at most), so its
            lookups must not claim a complete answer meanwhile (the daemon passes one node
            lease when ``data_dir`` shows an earlier start; 0 = none).
        unhealthy_retry_s: an unhealthy node heartbeating this long after it was marked is
            put on probation (a circuit breaker's half-open state: readable, not placed on,
            master/health.py); None = one node lease. (Only a transfer heals, and no one
            transfers with a node the master does not name.)
        unhealthy_retry_max_s: cap of the retry time, doubled by each failure on probation
            (None = 8 x ``unhealthy_retry_s``); healing resets it.

    Raises:
        InvalidArgument: a non-positive lease or failure count, a negative retry time.
    """

    def __init__(
        self,
        index: BlockIndex,
        clock: Clock,
        generations: Generations,
        *,
        node_lease_s: float = 10.0,
        unhealthy_after_failures: int = 3,
        rejoin_grace_s: float = 0.0,
        unhealthy_retry_s: float | None = None,
        unhealthy_retry_max_s: float | None = None,
    ) -> None:
        if not (math.isfinite(node_lease_s) and node_lease_s > 0):
            raise InvalidArgument(f"node_lease_s must be > 0, got {node_lease_s}")
        if unhealthy_after_failures < 1:
            raise InvalidArgument(
                f"unhealthy_after_failures must be >= 1, got {unhealthy_after_failures}"
            )
        retry_s = node_lease_s if unhealthy_retry_s is None else unhealthy_retry_s
        retry_max_s = 8 * retry_s if unhealthy_retry_max_s is None else unhealthy_retry_max_s
        if not (math.isfinite(retry_s) and retry_s >= 0 and math.isfinite(retry_max_s)):
            raise InvalidArgument(f"unhealthy_retry_s must be >= 0, got {unhealthy_retry_s}")
        self.unhealthy_retry_s = float(retry_s)
        self.unhealthy_retry_max_s = max(float(retry_s), float(retry_max_s))
        self.index = index
        self.clock = clock
        self.generations = generations
        self.node_lease_s = float(node_lease_s)
        self.unhealthy_after_failures = int(unhealthy_after_failures)
        self._nodes: dict[str, NodeRecord] = {}
        self._by_holder: dict[int, NodeRecord] = {}
        self.departed = DepartedNodes()  # the admin view's nodes that left (never consulted)
        # the one command queue to nodes (master/commands.py); promotions are one kind
        self.commands = CommandQueue(clock, self.node_lease_s)
        self.promotions = Promotions(self.commands, self._epoch_of)  # (master/copies.py)
        # called with a node's record when it leaves (lease lapsed, unregistered, or a new
        # epoch superseded it), before its holder is retired (its rows still listed)
        self.on_left: list[Callable[[NodeRecord], None]] = []
        # counters since this master started (exported by kvstored.master.metrics)
        self.num_lease_expiries = 0
        self.num_unhealthy_marks = 0
        self.num_inventory_syncs = 0
        self.num_event_gaps = 0
        self._incomplete_until_s = self.clock() + max(0.0, float(rejoin_grace_s))
        self._oldest_heartbeat_s = math.inf  # <= every live node's last_heartbeat_s
        self._complete: bool | None = None  # is_complete() cached until a node changes
        self.holders_version = 0
        """Bumped whenever the map holder -> node record changes (a registration, a sync's
        swap, a holder retired): what a holder's node is (and its spec: a record's spec is
        never replaced) stays the same while this does (the LookupPrefix answers' node
        entries are cached on it, :class:`~kvstored.master.service.MasterServicer`)."""

    # ---- helpers ---------------------------------------------------------------------
    def _refresh(self, rec: NodeRecord) -> None:
        self._complete = None  # every change of synced / gap goes through here or _drop
        self.index.set_readable(rec.holder,
                                rec.synced and not rec.gap and (rec.healthy or rec.probation))

    def _retire(self, holder: int) -> None:
        self.index.retire_holder(holder)  # first: its observer may ask whose holder it was
        self._by_holder.pop(holder, None)
        self.holders_version += 1

    def _epoch_of(self, node_id: str) -> int | None:
        rec = self._nodes.get(node_id)
        return rec.spec.epoch if rec is not None else None

    def _left(self, rec: NodeRecord) -> None:
        self.commands.forget(rec.spec.node_id)
        self._announce_left(rec)
        for fn in self.on_left:
            fn(rec)

    def _announce_left(self, rec: NodeRecord) -> None:
        """Queue PEER_LEFT to every other live node: replicas they marked redundant because
        this node keeps them are sole copies again (kvstored/tiers/redundant.py). Queued
        before the repair's COPYs for the node's blocks (those go on a later tick)."""
        gone = rec.spec.node_id
        for node_id, other in list(self._nodes.items()):
            if node_id != gone:
                self.commands.add(node_id, other.spec.epoch, CommandKind.PEER_LEFT,
                                  b"", gone.encode())

    def _drop(self, rec: NodeRecord, reason: str) -> None:
        self._left(rec)
        self.departed.add(rec.spec.node_id, rec.spec, reason, self.clock(),
                          self.index.num_holder_replicas(rec.holder))
        self._complete = None
        self._retire(rec.holder)
        if rec.pending is not None:
            self._retire(rec.pending.holder)
            rec.pending = None
        del self._nodes[rec.spec.node_id]

    def _live(self, node_id: str, epoch: int) -> NodeRecord | None:
        """The record of (node, epoch) if registered and its lease has not lapsed."""
        self.expire_lapsed()
        rec = self._nodes.get(node_id)
        if rec is None or rec.spec.epoch != epoch:
            return None
        return rec

    # ---- leases ----------------------------------------------------------------------
    def expire_lapsed(self) -> list[str]:
        """Drop every node whose lease lapsed (their replicas leave the index at once).

        Returns:
            The node ids dropped, sorted.
        """
        now = self.clock()
        # heartbeats only move last_heartbeat_s forward, so the oldest one seen by the last
        # scan bounds them all: nothing can have lapsed before it does (O(1) per call, not
        # O(nodes): every RPC calls this, so a scan each time was O(nodes^2) per second)
        if now - self._oldest_heartbeat_s <= self.node_lease_s:
            return []
        gone = sorted(n for n, r in self._nodes.items()
                      if now - r.last_heartbeat_s > self.node_lease_s)
        lapsed = set(gone)
        self._oldest_heartbeat_s = min(
            (r.last_heartbeat_s for n, r in self._nodes.items() if n not in lapsed), default=now)
        for node_id in gone:
            rec = self._nodes[node_id]
            log.warning("node_lease_expired", node_id=node_id, epoch=rec.spec.epoch,
                        num_replicas=self.index.num_holder_replicas(rec.holder),
                        silent_s=round(now - rec.last_heartbeat_s, 3))
            self._drop(rec, EXPIRED)
            self.num_lease_expiries += 1
        return gone

    # ---- registration ----------------------------------------------------------------
    def duplicate_of(self, spec: NodeSpec) -> NodeRecord | None:
        """The live record ``spec`` may duplicate: a newer epoch of the same node id, while
        the live epoch's lease runs, with neither of its addresses (else it is a restart:
        the old process must be gone, it held the port). None when it cannot be one."""
        self.expire_lapsed()
        old = self._nodes.get(spec.node_id)
        return old if old is not None and health.may_duplicate(old.spec, spec) else None

    def register(self, spec: NodeSpec, *, live_epoch_answering: int = 0) -> RegisterOutcome:
        """Register one daemon start of a node (a new epoch supersedes the older one).

        Registering the live epoch again (a reconnect) keeps its replicas readable until
        the next inventory sync replaces them.

        Args:
            live_epoch_answering: the epoch of :meth:`duplicate_of`'s record when the caller
                found its daemon still answering on its data address (0: not probed, or
                nothing answered): if that epoch is still the live one and ``spec`` is still
                a duplicate candidate, the registration is refused.

        Raises:
            InvalidArgument: empty or too long node id, epoch not positive, malformed
                address, bad tier, or an epoch older than the node's live one.
            AlreadyExists: another live daemon holds the node id (see above).
        """
        tiers = health.check_spec(spec)
        dup = self.duplicate_of(spec)
        if dup is not None and live_epoch_answering and dup.spec.epoch == live_epoch_answering:
            raise health.duplicate_refused(dup.spec, spec, self.lease_left_s(dup))
        now = self.clock()
        old = self._nodes.get(spec.node_id)
        superseded = False
        if old is not None:
            if spec.epoch < old.spec.epoch:
                raise InvalidArgument(
                    f"node {spec.node_id!r} registered with epoch {spec.epoch}, older than its "
                    f"live epoch {old.spec.epoch}: a stale daemon; restart it"
                )
            if old.pending is not None:
                self._retire(old.pending.holder)
                old.pending = None
            if spec.epoch > old.spec.epoch:
                superseded = True
                log.info("node_epoch_superseded", node_id=spec.node_id,
                         old_epoch=old.spec.epoch, epoch=spec.epoch,
                         num_replicas=self.index.num_holder_replicas(old.holder))
                self._left(old)
                self._retire(old.holder)
                holder = self.index.add_holder()
            else:
                holder = old.holder  # same daemon reconnecting: keep serving until resync
            del self._nodes[spec.node_id]
        else:
            holder = self.index.add_holder()
        same = old is not None and not superseded  # the live daemon reconnecting
        self._oldest_heartbeat_s = min(self._oldest_heartbeat_s, now)
        prev = old if same else None
        rec = NodeRecord(spec=spec, holder=holder, registered_s=now, last_heartbeat_s=now,
                         tiers=tiers, synced=prev is not None and prev.synced,
                         applied_seq=prev.applied_seq if prev is not None else 0,
                         gap=prev is not None and prev.gap)
        self._nodes[spec.node_id] = rec
        self._by_holder[holder] = rec
        self.holders_version += 1
        self.departed.forget(spec.node_id)
        self._refresh(rec)
        log.info("node_registered", node_id=spec.node_id, epoch=spec.epoch,
                 grpc=spec.grpc_address, data=spec.data_address)
        return RegisterOutcome(self.node_lease_s, superseded)

    def unregister(self, node_id: str, epoch: int) -> bool:
        """A node leaves cleanly: its replicas drop from the index at once.

        Returns:
            False if (node, epoch) was not registered (idempotent).
        """
        rec = self._live(node_id, epoch)
        if rec is None:
            return False
        self._drop(rec, LEFT)
        log.info("node_unregistered", node_id=node_id, epoch=epoch)
        return True

    # ---- heartbeats and inventory ----------------------------------------------------
    def heartbeat(
        self, node_id: str, epoch: int, *, tiers: Sequence[TierUsage] = (), load: float = 0.0,
        last_seq: int = 0, coldest_age_ms: int = 0,
    ) -> NodeAction:
        """Renew a node's lease and record its usage, load and the age of its coldest
        original block (``coldest_age_ms``, 0 = none; pool LRU, node/spill.py).

        Returns:
            REREGISTER for an unknown (node, epoch) or a lapsed lease; RESYNC when the
            node sent events the master never applied (``last_seq`` ahead) or a gap is
            open; NONE otherwise.
        """
        rec = self._live(node_id, epoch)
        if rec is None:
            return NodeAction.REREGISTER
        rec.last_heartbeat_s = self.clock()
        for t in tiers:
            if t.tier in _NODE_TIERS:
                rec.tiers[t.tier] = t
        rec.load = load if math.isfinite(load) and load >= 0 else 0.0
        rec.coldest_age_s = max(0, int(coldest_age_ms)) / 1000.0
        self.index.set_load(rec.holder, rec.load)
        if rec.synced and not rec.gap and last_seq > rec.applied_seq:
            self._open_gap(rec, last_seq)
        if health.on_heartbeat(rec):  # on probation now: readable again
            self._refresh(rec)
        if rec.gap or (not rec.synced and rec.pending is None):
            return NodeAction.RESYNC
        return NodeAction.NONE

    def _open_gap(self, rec: NodeRecord, seen_seq: int) -> None:
        rec.gap = True
        self.num_event_gaps += 1
        self._refresh(rec)
        log.warning("node_event_gap", node_id=rec.spec.node_id, epoch=rec.spec.epoch,
                    applied_seq=rec.applied_seq, seen_seq=seen_seq)

    def sync_inventory(
        self, node_id: str, epoch: int, *, sync_id: int,
        blocks: Sequence[BlockRef] | BlockColumns, last_chunk: bool, seq: int = 0,
    ) -> tuple[NodeAction, int]:
        """Receive one chunk of a node's whole inventory; the last chunk swaps it in.

        Chunks of one sync share ``sync_id``; a new ``sync_id`` abandons an unfinished one.
        Until the last chunk the node's previous replicas (if any) stay as they were.

        Args:
            seq: on the last chunk, the event seq the snapshot includes (the next event
                must be ``seq + 1``).

        Returns:
            ``(action, num_replicas)``: REREGISTER for an unknown (node, epoch); on the
            last chunk, the replicas now indexed for the node.

        Raises:
            InvalidArgument: a block with a bad tier or size (nothing of this chunk is kept;
                the sync must restart).
        """
        rec = self._live(node_id, epoch)
        if rec is None:
            return NodeAction.REREGISTER, 0
        rec.last_heartbeat_s = self.clock()  # a long sync is a sign of life
        if rec.pending is None or rec.pending.sync_id != sync_id:
            if rec.pending is not None:
                self._retire(rec.pending.holder)
            rec.pending = _PendingSync(sync_id, self.index.add_holder())
        pending = rec.pending
        cols = blocks if isinstance(blocks, BlockColumns) else BlockColumns.of(blocks)
        gen = self.generations.next()
        try:
            for ns, ix in cols.by_namespace().items():
                gens = cols.generations[ix]
                gens[gens == 0] = gen  # the holder's generation, if sent
                factors = cols.replicas[ix]
                self.index.add_replicas_bulk(
                    ns, [cols.keys[i] for i in ix.tolist()], holder=pending.holder,
                    tiers=cols.tiers[ix], sizes=cols.sizes[ix], generation=gens,
                    copies=cols.copies[ix], factors=factors if factors.any() else None,
                )
        except InvalidArgument:
            self._retire(pending.holder)
            rec.pending = None
            raise
        if not last_chunk:
            return NodeAction.NONE, 0
        old = rec.holder
        rec.holder = pending.holder
        rec.pending = None
        self._by_holder[rec.holder] = rec
        self.holders_version += 1
        self._retire(old)
        rec.applied_seq = seq
        rec.synced = True
        rec.gap = False
        self.index.set_load(rec.holder, rec.load)
        self._refresh(rec)
        num = self.index.num_holder_replicas(rec.holder)
        self.num_inventory_syncs += 1
        log.info("node_inventory_synced", node_id=node_id, epoch=epoch, num_replicas=num, seq=seq)
        return NodeAction.NONE, num

    def report_events(
        self, node_id: str, epoch: int, events: Sequence[BlockEvent] | EventColumns
    ) -> tuple[NodeAction, int]:
        """Apply a node's ordered events; a gap hides its replicas until a resync.

        Events at or below the applied seq are duplicates and ignored. The events are
        applied in runs of distinct blocks, each run vectorized (one batch of ADDED and one
        of REMOVED per namespace: :meth:`BlockIndex.add_replicas_batch`,
        :meth:`BlockIndex.remove_replicas_batch`); a block repeated in the batch starts a new
        run, so the outcome is the one of applying each event in order.

        Returns:
            ``(action, applied_seq)``: REREGISTER for an unknown (node, epoch), RESYNC
            when the node is unsynced or a gap opened (then nothing after the gap is
            applied), else NONE.

        Raises:
            InvalidArgument: an event kind other than ADDED or REMOVED (nothing applied).
        """
        rec = self._live(node_id, epoch)
        if rec is None:
            return NodeAction.REREGISTER, 0
        if not rec.synced or rec.gap:
            return NodeAction.RESYNC, rec.applied_seq
        cols = events if isinstance(events, EventColumns) else EventColumns.of(events)
        applied = rec.applied_seq
        take: list[int] = []
        gap_seq = 0
        seqs, n = cols.seqs, len(cols.seqs)
        # the usual batch: the next seqs in order, distinct blocks (checked by C-level list,
        # set and zip builtins, not a Python loop per event)
        # (C's reader says whether they are consecutive and distinct: parse_events)
        if n and seqs[0] == applied + 1 and (
                cols.consecutive if cols.consecutive is not None
                else seqs == list(range(applied + 1, applied + n + 1))):
            take = list(range(n))
            applied += n
        else:
            for i, q in enumerate(seqs):
                if q <= applied:
                    continue
                if q != applied + 1:
                    gap_seq = q
                    break
                take.append(i)
                applied = q
        kinds = cols.kinds
        if len(take) != n or not (cols.kinds_checked or set(kinds) <= _KINDS):
            for i in take:
                if kinds[i] != _ADDED and kinds[i] != _REMOVED:
                    raise InvalidArgument(f"event {cols.seqs[i]}: kind must be ADDED or "
                                          f"REMOVED, got {kinds[i]!r}")
        nss, keys = cols.blocks.namespace_ids, cols.blocks.keys
        if len(take) == n and (cols.distinct if cols.distinct is not None
                               else len(set(zip(nss, keys, strict=True))) == n):
            if take:
                self._apply_run(node_id, rec, cols, take)
        else:
            run: list[int] = []
            seen: set[tuple[bytes, bytes]] = set()
            for i in take:
                nk = (nss[i], keys[i])
                if nk in seen:
                    self._apply_run(node_id, rec, cols, run)
                    run, seen = [], set()
                seen.add(nk)
                run.append(i)
            if run:
                self._apply_run(node_id, rec, cols, run)
        rec.applied_seq = applied
        if gap_seq:
            self._open_gap(rec, gap_seq)
            return NodeAction.RESYNC, rec.applied_seq
        return NodeAction.NONE, rec.applied_seq

    def _apply_run(self, node_id: str, rec: NodeRecord, cols: EventColumns,
                   run: list[int]) -> None:
        """Apply events ``run`` of ``cols`` (distinct blocks, in order) to ``rec``'s holder:
        one C call for a run of one namespace (:meth:`BlockIndex.apply_events_native`), else
        (no extension, or a run C leaves to Python) the vectorized batch methods."""
        bc = cols.blocks
        nss = bc.namespace_ids
        whole = len(run) == len(cols)  # every event (run is increasing): no gather per event
        ns0 = nss[run[0]]
        one_ns = (nss.count(ns0) == len(nss)) if whole else all(nss[i] == ns0 for i in run)
        if one_ns:
            got = self.index.apply_events_native(ns0, cols, run, holder=rec.holder,
                                                 next_generation=self.generations.peek())
            if got is not None:
                gens_taken, promote, _ = got
                if gens_taken:
                    self.generations.next_many(gens_taken)
                if self.commands.num_pending(node_id):  # promotions asked of it are done
                    for i in run:
                        if cols.kinds[i] == _REMOVED or not bc.copies[i]:
                            self.promotions.settle(node_id, ns0, bc.keys[i])
                for i, holder in promote:
                    owner = self._by_holder.get(holder)
                    if owner is not None:
                        self.promotions.add(owner.spec.node_id, ns0, bc.keys[i])
                return
        run_arr = np.asarray(run, dtype=np.int64)
        gens = bc.generations[run_arr]
        kind_arr = np.asarray(cols.kinds if whole else [cols.kinds[i] for i in run],
                              dtype=np.int64)
        # the holder's generation when it sent one (what its data plane sends with the
        # block: a reader verifies its copy against it), else a fresh one (in event order)
        fresh = np.flatnonzero((gens == 0) & (kind_arr == _ADDED))
        if len(fresh):
            gens[fresh] = self.generations.next_many(len(fresh))
        if one_ns:
            groups = {ns0: np.arange(len(run), dtype=np.int64)}
        else:
            by: dict[bytes, list[int]] = {}
            for j, i in enumerate(run):
                by.setdefault(nss[i], []).append(j)
            groups = {ns: np.asarray(js, dtype=np.int64) for ns, js in by.items()}
        for ns_id, j_arr in groups.items():
            for kind in (_ADDED, _REMOVED):
                sel = j_arr[kind_arr[j_arr] == kind]
                if len(sel) == 0:
                    continue
                ev = run_arr[sel]
                keys = [bc.keys[i] for i in ev.tolist()]
                if kind == _ADDED:
                    copies = bc.copies[ev]
                    self.index.add_replicas_batch(
                        ns_id, keys, holder=rec.holder, tiers=bc.tiers[ev],
                        sizes=bc.sizes[ev], generations=gens[sel],
                        replace_generation=bc.generations[ev] != 0, copies=copies,
                        factors=bc.replicas[ev])
                    # a promotion asked of this node, if any, is done
                    if self.commands.num_pending(node_id):
                        for k, c in zip(keys, copies.tolist(), strict=True):
                            if not c:
                                self.promotions.settle(node_id, ns_id, k)
                else:
                    if self.commands.num_pending(node_id):
                        for k in keys:  # its copy is gone
                            self.promotions.settle(node_id, ns_id, k)
                    gone = self.index.remove_replicas_batch(ns_id, keys, holder=rec.holder,
                                                            tiers=bc.tiers[ev])
                    removed = [k for k, g in zip(keys, gone.tolist(), strict=True) if g]
                    if removed:
                        self._promote_copies(ns_id, removed)

    def _promote_copies(self, namespace_id: bytes, keys: list[bytes]) -> None:
        """Blocks lost a replica: for each left with copies only, ask one holder to keep its
        copy (master/copies.py)."""
        for key, holder in zip(keys, self.index.copy_holders_to_promote(namespace_id, keys),
                               strict=True):
            owner = self._by_holder.get(holder) if holder is not None else None
            if owner is not None:
                self.promotions.add(owner.spec.node_id, namespace_id, key)

    def _promote_if_only_copies(self, namespace_id: bytes, key: bytes) -> None:
        """A block lost a replica: if only copies remain, ask one holder to keep its copy."""
        holder = copy_to_promote(self.index, namespace_id, key)
        owner = self._by_holder.get(holder) if holder is not None else None
        if owner is not None:
            self.promotions.add(owner.spec.node_id, namespace_id, key)

    def collect_garbage(self, max_rows: int = 65536) -> int:
        """Unlink up to ``max_rows`` rows of retired holders (:meth:`BlockIndex.collect_garbage`),
        queueing a promotion for each block whose last original went with them.

        Returns:
            Rows unlinked.
        """
        return self.index.collect_garbage(max_rows,
                                          on_only_copies=self._promote_if_only_copies)

    # ---- health ----------------------------------------------------------------------
    def report_transfer(self, node_id: str, epoch: int, *, ok: bool) -> NodeHealth:
        """Record one data-plane transfer with a node (``unhealthy_after_failures``
        consecutive failures make it unhealthy; a success heals it; a failure while on
        probation makes it unhealthy again at once, its retry time doubled up to the cap).

        A report about another epoch than the live one is ignored.

        Raises:
            NotFound: the node is not registered.
        """
        self.expire_lapsed()
        rec = self._nodes.get(node_id)
        if rec is None:
            raise NotFound(f"node {node_id!r} is not registered")
        if rec.spec.epoch != epoch:
            return rec.health
        if health.on_transfer(rec, ok=ok, now_s=self.clock(),
                              unhealthy_after_failures=self.unhealthy_after_failures,
                              retry_s=self.unhealthy_retry_s,
                              retry_max_s=self.unhealthy_retry_max_s):
            self.num_unhealthy_marks += 1
        self._refresh(rec)
        return rec.health

    # ---- views -----------------------------------------------------------------------
    def nodes(self) -> list[NodeRecord]:
        """Live nodes, sorted by node id (records are the master's own: do not mutate)."""
        self.expire_lapsed()
        return [self._nodes[n] for n in sorted(self._nodes)]

    def node(self, node_id: str) -> NodeRecord | None:
        """The live record of a node, or None."""
        self.expire_lapsed()
        return self._nodes.get(node_id)

    def lookup_view(self, local_node_id: str, avoid_node_ids: Sequence[str]
                    ) -> tuple[NodeRecord | None, list[int], bool]:
        """What one LookupPrefix asks of the membership, with one lease scan
        (:meth:`expire_lapsed`) instead of one per question.

        Args:
            local_node_id: the asker's node id ("" = none).
            avoid_node_ids: nodes the asker suspects (unknown ones are skipped).

        Returns:
            ``(the asker's live record or None, the holders of the live avoided nodes,
            :meth:`is_complete`)``.
        """
        self.expire_lapsed()
        nodes = self._nodes
        local = nodes.get(local_node_id) if local_node_id else None
        avoid = ([rec.holder for rec in map(nodes.get, avoid_node_ids) if rec is not None]
                 if avoid_node_ids else [])
        if self.clock() < self._incomplete_until_s:
            return local, avoid, False
        complete = self._complete
        if complete is None:
            complete = self._complete = all(r.synced and not r.gap for r in nodes.values())
        return local, avoid, complete

    def record_of_holder(self, holder: int) -> NodeRecord | None:
        """The node owning a holder (None once the holder was retired)."""
        return self._by_holder.get(holder)

    def lease_left_s(self, rec: NodeRecord) -> float:
        """Seconds until the node's lease lapses (0 if it already has)."""
        return max(0.0, rec.last_heartbeat_s + self.node_lease_s - self.clock())

    def is_complete(self) -> bool:
        """True when every live node's inventory is synced without a gap, and the rejoin
        grace is over (a restarted master cannot know which nodes have yet to come back)."""
        if self.clock() < self._incomplete_until_s:
            return False
        self.expire_lapsed()
        if self._complete is None:  # (cached: LookupPrefix asks on every call)
            self._complete = all(r.synced and not r.gap for r in self._nodes.values())
        return self._complete
