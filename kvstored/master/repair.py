"""Repair, drain and hot-block replication: the master keeps each block's replicas.

Every rule below ends in COPY (or DROP) commands on the master's one command queue
(kvstored/master/commands.py), which the target node executes by pulling the block from a
surviving replica over the data plane (kvstored/node/replicate.py). Nothing here moves a byte.

What a block wants: ``factor`` originals (its replication factor, :class:`FactorSource`:
the index's, from ``put(replicas=N)`` and the holders' reports, or ``SetReplication``'s;
1 when nothing was asked) on *live* nodes: registered, synced, no event gap, healthy and not
draining. What it has: its readable COMMITTED originals on such nodes (a remote-fill copy is
evicted first, so it never counts; a draining node's replica does not count, it is leaving)::

    deficit = factor - originals on live nodes - COPY commands in flight for it
              - replicas coming: WRITING on a live node, or committed there by a write
                whose holder's own event has not indexed them yet (Placement.
                reporting_holders, at most the write lease after the commit)
    deficit > 0 and a readable source (any readable COMMITTED replica, a draining node's
    included: it serves until it leaves) -> COPY to a target:
        live, no original of the block, room in its last tier (<= 95 % used with the block),
        a node already holding a remote-fill copy first (it keeps that copy: no transfer;
        it still needs the room, since the copy's evictable space becomes an original's),
        then a zone no replica is in yet (when nodes declare zones), then the most room

    originals on live nodes > factor + hot extras (a dead node came back, a hot block
    cooled, a factor set lower) -> one DROP (:meth:`Repair._maybe_drop`), only when
        no COPY and no DROP of the block is in flight (a DROP counts until the dropped
        replica leaves the index, or for the command's life: its ack may come first),
        every replica of it is COMMITTED and indexed (no write or move landing),
        and never below max(1, wanted) originals: the last replica is never dropped;
    it goes to the node whose tier holding it is fullest (its last heartbeat), never to
    a draining one (its replica does not count); the node keeps a pinned block (its
    store's remove refuses it) and the background pass asks again later. DROPs are fenced
    by term like every command; they move no byte, so the rate limit does not pace them.

Which blocks are looked at:
  - a node leaving (lease lapsed, SIGKILL, unregister): its blocks whose factor is above 1
    (:meth:`Repair.on_node_left`, from the membership's drop, before its rows are unlinked);
  - a factor being set (:meth:`Repair.set_factor`): those keys;
  - a draining node (:meth:`Repair.drain`): every block it holds, factor 1 included;
  - a background pass over every key whose factor is above 1, ``scan_keys_per_tick`` a
    tick, so a deficit no event announced (a failed copy, a source that was busy) is found,
    and a surplus (a node that came back with its replicas);
  - a hot block not hot for two windows (its extra replicas are no longer wanted).

Rate: copy commands are paced by a token bucket of ``repair_bytes_per_s`` (one second of
burst; a block larger than that goes alone once the bucket is full), shared by repair,
drain and hot blocks, so re-replication never takes more than that share of the data plane.
Blocks not issued for lack of tokens stay queued (``num_waiting``) and go on a later tick.

Drain: a draining node is not placed on (placement skips it) and is no repair target; once
every block it holds has an original on a live node, it is sent LEAVE and unregisters. A
read of a block mid-move is served by the draining node until it leaves (its replicas stay
readable), so no engine read fails because of a drain.

Hot blocks (Mooncake's dynamic replication of hot KV blocks; ../shared/REFERENCES.md): the
master learns remote reads from lookups (:meth:`Repair.note_lookup`): a node's LookupPrefix
names, for each block, its best replica; one on another node is a remote read that node is
about to make. (ReportTransfer carries no keys, only a peer's health; lookups name the key
and the reader, at no extra RPC.) A block looked up remotely more than
``hot_reads_per_window`` times within ``hot_window_s`` gets one more original on the
reading node (a COPY to it), at most ``hot_max_extra_replicas`` beyond its factor.

Not thread-safe: the master's event loop only. Time comes from the injected clock.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import structlog

from kvstored.errors import InvalidArgument, NotFound
from kvstored.master.commands import CommandKind, CommandQueue, CopySource
from kvstored.master.types import MAX_REPLICAS, Replica, ReplicaState
from kvstored.types import Tier

if TYPE_CHECKING:
    from kvstored.master.index import BlockIndex
    from kvstored.master.membership import Membership, NodeRecord
    from kvstored.master.placement import Placement

log = structlog.get_logger(__name__)

MAX_REPLICATION_FACTOR = MAX_REPLICAS
"""The most replicas a block may ask for (the index's limit)."""
REPAIR_MAX_USED_FRACTION = 0.95
"""A repair target's last tier stays at or below this fraction of its capacity with the copy."""
MAX_HOT_TRACKED = 65536
"""Blocks whose remote lookups are counted at once (the oldest windows are forgotten first)."""

BlockId = tuple[bytes, bytes]  # (namespace_id, key)


class FactorSource(Protocol):
    """Where the master keeps each block's wanted replication factor.

    The put path (``put(replicas=N)``) records it; until then :class:`ReplicationFactors`
    holds what ``SetReplication`` set.
    """

    def factor_of(self, namespace_id: bytes, key: bytes) -> int:
        """The wanted number of replicas of a block (1 when nothing was asked)."""
        ...

    def keys_above_one(self) -> Iterable[BlockId]:
        """Every block whose factor is above 1 (the background pass walks them)."""
        ...


class ReplicationFactors:
    """Replication factors set per key (a dict; only factors above 1 are kept)."""

    def __init__(self) -> None:
        self._factors: dict[BlockId, int] = {}

    def factor_of(self, namespace_id: bytes, key: bytes) -> int:
        """See :meth:`FactorSource.factor_of`."""
        return self._factors.get((namespace_id, key), 1)

    def keys_above_one(self) -> Iterable[BlockId]:
        """See :meth:`FactorSource.keys_above_one` (a snapshot list)."""
        return list(self._factors)

    def set(self, namespace_id: bytes, keys: Iterable[bytes], factor: int) -> int:
        """Record ``factor`` for each key (1 forgets it).

        Returns:
            Keys set.

        Raises:
            InvalidArgument: ``factor`` outside 1..:data:`MAX_REPLICATION_FACTOR`.
        """
        if not 1 <= factor <= MAX_REPLICATION_FACTOR:
            raise InvalidArgument(
                f"replicas must be 1..{MAX_REPLICATION_FACTOR}, got {factor}")
        n = 0
        for k in keys:
            if factor == 1:
                self._factors.pop((namespace_id, k), None)
            else:
                self._factors[(namespace_id, k)] = factor
            n += 1
        return n

    def __len__(self) -> int:
        return len(self._factors)


class IndexFactors:
    """The factors the block index records (``put(replicas=N)``, the holders' inventories and
    events: ``BlockIndex.replication_factor``), raised by what ``SetReplication`` set.

    ``SetReplication`` records its factor in the index too (so ``kvstorectl where`` shows
    it); the index never lowers a factor, so the admin table is what can (1 = forget).
    """

    def __init__(self, index: BlockIndex) -> None:
        self.index = index
        self.admin = ReplicationFactors()

    def factor_of(self, namespace_id: bytes, key: bytes) -> int:
        """See :meth:`FactorSource.factor_of`."""
        return max(1, self.index.replication_factor(namespace_id, key),
                   self.admin.factor_of(namespace_id, key))

    def factors_of(self, namespace_id: bytes, keys: list[bytes]) -> list[int]:
        """:meth:`factor_of` of many keys of one namespace (the index's, vectorized)."""
        got = self.index.replication_factors(namespace_id, keys).tolist()
        if len(self.admin):
            got = [max(f, self.admin.factor_of(namespace_id, k)) for f, k in zip(got, keys,
                                                                              strict=True)]
        return [max(1, int(f)) for f in got]

    def keys_above_one(self) -> Iterable[BlockId]:
        """See :meth:`FactorSource.keys_above_one` (index blocks, then admin-only ones)."""
        found = self.index.blocks_above_factor(1)
        seen = set(found)
        return found + [b for b in self.admin.keys_above_one() if b not in seen]

    def set(self, namespace_id: bytes, keys: Iterable[bytes], factor: int) -> int:
        """See :meth:`ReplicationFactors.set`; an indexed block's index factor is raised too."""
        keys = list(keys)
        n = self.admin.set(namespace_id, keys, factor)
        for k in keys:
            self.index.record_replication_factor(namespace_id, k, factor)
        return n


@dataclass(frozen=True, slots=True)
class RepairSettings:
    """The ``[master]`` keys of repair (see kvstored/config.py for each one's meaning).

    Raises:
        InvalidArgument: a non-positive rate or window, or a negative threshold or cap.
    """

    repair_bytes_per_s: int = 256 << 20
    hot_reads_per_window: int = 0
    hot_window_s: float = 10.0
    hot_max_extra_replicas: int = 2
    scan_keys_per_tick: int = 4096

    def __post_init__(self) -> None:
        if self.repair_bytes_per_s <= 0:
            raise InvalidArgument(
                f"repair_bytes_per_s must be > 0, got {self.repair_bytes_per_s}")
        if not self.hot_window_s > 0:
            raise InvalidArgument(f"hot_window_s must be > 0, got {self.hot_window_s}")
        if self.hot_reads_per_window < 0 or self.hot_max_extra_replicas < 0:
            raise InvalidArgument(
                "hot_reads_per_window and hot_max_extra_replicas must be >= 0, got "
                f"{self.hot_reads_per_window} and {self.hot_max_extra_replicas}")
        if self.scan_keys_per_tick < 1:
            raise InvalidArgument(f"scan_keys_per_tick must be >= 1, got {self.scan_keys_per_tick}")


@dataclass(frozen=True, slots=True)
class DrainProgress:
    """Where a drain stands.

    Attributes:
        node_id: the draining node.
        num_blocks: blocks the master indexes on it.
        num_blocks_to_move: of those, blocks with no original on a live node yet.
        num_copies_issued: copy commands queued for its blocks so far.
        leave_sent: every block is re-homed: LEAVE is queued for the node.
    """

    node_id: str
    num_blocks: int
    num_blocks_to_move: int
    num_copies_issued: int
    leave_sent: bool


@dataclass(slots=True)
class _Drain:
    epoch: int
    num_copies_issued: int = 0
    leave_sent: bool = False
    last: DrainProgress | None = None


class _Bucket:
    """A token bucket of bytes: ``rate`` per second, one second of burst."""

    def __init__(self, rate: int, now: float) -> None:
        self.rate = float(rate)
        self.tokens = float(rate)
        self.at = now

    def take(self, size_bytes: int, now: float) -> bool:
        self.tokens = min(self.rate, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= size_bytes or (self.tokens >= self.rate and size_bytes > self.rate):
            self.tokens -= size_bytes  # a block larger than a second's worth goes alone
            return True
        return False


def _used_fraction(rec: NodeRecord, tier: Tier) -> float:
    """How full the node's tier is (its last heartbeat; 1.0 when it reported none)."""
    usage = rec.tiers.get(tier)
    if usage is None or usage.capacity_bytes <= 0:
        return 1.0
    return usage.used_bytes / usage.capacity_bytes


class Repair:
    """Keeps blocks at their replication factor, drains nodes, replicates hot blocks.

    Args:
        membership: the term's membership (nodes, index, clock).
        placement: the term's placement (room on a node).
        commands: the master's command queue (COPY and LEAVE go there).
        settings: rate, hot-block thresholds, scan budget.
        factors: the blocks' replication factors (None: :class:`IndexFactors` over the
            membership's index).
        zone_of: a node's failure domain ("" = none declared; default: the zone it
            registered with, ``kvstored node --zone``).
    """

    def __init__(
        self,
        membership: Membership,
        placement: Placement,
        commands: CommandQueue,
        settings: RepairSettings | None = None,
        *,
        factors: FactorSource | None = None,
        zone_of: Callable[[NodeRecord], str] = lambda rec: rec.spec.zone,
    ) -> None:
        self.membership = membership
        self.index = membership.index
        self.placement = placement
        self.commands = commands
        self.settings = settings if settings is not None else RepairSettings()
        self.factors: FactorSource = (factors if factors is not None
                                      else IndexFactors(membership.index))
        self.zone_of = zone_of
        self.clock = membership.clock
        self._bucket = _Bucket(self.settings.repair_bytes_per_s, self.clock())
        self._dirty: OrderedDict[BlockId, None] = OrderedDict()  # to check first, in order
        self._scan: Iterator[BlockId] | None = None
        self._drains: dict[str, _Drain] = {}
        self._hot: OrderedDict[BlockId, tuple[float, int]] = OrderedDict()  # window start, reads
        self._hot_extra: dict[BlockId, int] = {}
        self._hot_wanted: deque[tuple[BlockId, str]] = deque(maxlen=MAX_HOT_TRACKED)
        # counters since this master started (kvstored.master.metrics)
        self.num_copies_issued = 0
        self.num_bytes_issued = 0
        self.num_copies_acked = 0
        self.num_rate_limited = 0
        self.num_no_source = 0
        self.num_no_target = 0
        self.num_hot_copies = 0
        self.num_drops_issued = 0
        self.num_drops_deferred = 0  # a surplus left for later (a copy, drop or write in flight)
        self._hot_at: dict[BlockId, float] = {}  # when a block last got a hot extra replica
        self._drops: dict[BlockId, tuple[str, int, float]] = {}  # node, holder, until
        self.num_under_replicated = 0  # blocks found short in the last tick (a gauge)

    # ---- inputs --------------------------------------------------------------------------
    def set_factor(self, namespace_id: bytes, keys: Iterable[bytes], factor: int) -> int:
        """Set the wanted replication factor of keys (the admin path; see :class:`ReplicationFactors`).

        Returns:
            Keys set.

        Raises:
            InvalidArgument: a factor out of range, or a factor source that cannot be set.
        """
        setter = getattr(self.factors, "set", None)
        if setter is None:
            raise InvalidArgument("this master's replication factors are set by the put path")
        keys = list(keys)
        n = int(setter(namespace_id, keys, factor))
        for k in keys:
            self._dirty[(namespace_id, k)] = None
        return n

    def on_node_left(self, rec: NodeRecord) -> None:
        """A node left (lease lapsed, unregistered, new epoch): check its blocks whose factor
        is above 1 first. Called before its rows are unlinked (they are listed here)."""
        self._drains.pop(rec.spec.node_id, None)
        by_ns: dict[bytes, set[bytes]] = {}
        for ns, key, _tier in self.index.holder_keys(rec.holder):
            by_ns.setdefault(ns, set()).add(key)
        many = getattr(self.factors, "factors_of", None)
        for ns, key_set in by_ns.items():
            keys = sorted(key_set)
            factors = (many(ns, keys) if many is not None
                       else [self.factors.factor_of(ns, k) for k in keys])
            for k, f in zip(keys, factors, strict=True):
                if f > 1:
                    self._dirty[(ns, k)] = None

    def on_commands_acked(self, acked: Iterable[object]) -> None:
        """Count acknowledged COPY commands (their replicas arrive through events)."""
        self.num_copies_acked += sum(1 for c in acked
                                     if getattr(c, "kind", None) is CommandKind.COPY)

    def note_lookup(self, asker: str, namespace_id: bytes,
                    answered: Iterable[tuple[bytes, str]]) -> None:
        """Count remote reads for hot-block replication (no-op when it is off).

        Args:
            asker: the node that looked up (``local_node_id``; "" = not a node: ignored).
            answered: ``(key, node id of the best replica named)`` per block answered.
        """
        s = self.settings
        if not s.hot_reads_per_window or not asker:
            return
        now = self.clock()
        for key, holder_node in answered:
            if holder_node == asker:
                continue
            b = (namespace_id, key)
            start, n = self._hot.pop(b, (now, 0))
            if now - start > s.hot_window_s:
                start, n = now, 0
            n += 1
            self._hot[b] = (start, n)
            if len(self._hot) > MAX_HOT_TRACKED:
                self._hot.popitem(last=False)
            if n > s.hot_reads_per_window:
                if b in self._hot_at:
                    self._hot_at[b] = now  # still hot: its extras stay
                self._hot[b] = (now, 0)  # a new window: at most one extra replica per window
                self._hot_wanted.append((b, asker))

    # ---- drain ---------------------------------------------------------------------------
    def drain(self, node_id: str) -> DrainProgress:
        """Start (or report) a node's drain: nothing is placed on it any more, its blocks are
        copied to live nodes where they have no other original, then it is sent LEAVE.

        Idempotent: asking again answers the progress.

        Raises:
            NotFound: the node is not registered (it may have left already).
        """
        rec = self.membership.node(node_id)
        if rec is None:
            raise NotFound(f"node {node_id!r} is not registered (drained already, or never joined)")
        d = self._drains.get(node_id)
        if d is None or d.epoch != rec.spec.epoch:
            d = self._drains[node_id] = _Drain(rec.spec.epoch)
            rec.draining = True
            log.info("node_drain_started", node_id=node_id, epoch=rec.spec.epoch,
                     num_replicas=self.index.num_holder_replicas(rec.holder))
            self._step_drain(rec, d)
        return d.last or self._step_drain(rec, d)

    def is_draining(self, node_id: str) -> bool:
        """Whether ``node_id`` is being drained."""
        return node_id in self._drains

    def _step_drain(self, rec: NodeRecord, d: _Drain) -> DrainProgress:
        to_move = 0
        blocks = {(ns, key) for ns, key, _ in self.index.holder_keys(rec.holder)}
        for b in sorted(blocks):
            if self._live_originals(b) < 1:
                to_move += 1
                if self._maybe_copy(b, wanted=max(1, self.factors.factor_of(*b))):
                    d.num_copies_issued += 1
        if to_move == 0 and not d.leave_sent:
            self.commands.add(rec.spec.node_id, rec.spec.epoch, CommandKind.LEAVE)
            d.leave_sent = True
            log.info("node_drain_leave_sent", node_id=rec.spec.node_id, num_blocks=len(blocks))
        d.last = DrainProgress(rec.spec.node_id, len(blocks), to_move, d.num_copies_issued,
                               d.leave_sent)
        return d.last

    # ---- the tick ------------------------------------------------------------------------
    def tick(self) -> int:
        """One step: drains, blocks marked dirty, hot blocks, then a slice of the background pass.

        Returns:
            COPY commands queued by this tick.
        """
        before = self.num_copies_issued
        for node_id, d in list(self._drains.items()):
            rec = self.membership.node(node_id)
            if rec is None or rec.spec.epoch != d.epoch:
                self._drains.pop(node_id, None)  # it left (or restarted): drain over
                continue
            self._step_drain(rec, d)
        short = 0
        self._cool_hot_blocks()
        while self._dirty:
            b = next(iter(self._dirty))
            deficit = self._deficit(b)
            if deficit > 0 and not self._maybe_copy(b, wanted=self.factors.factor_of(*b)):
                short += 1
                if self._limited:
                    break  # out of tokens: keep it (and the rest) for the next tick
            elif deficit < 0:
                self._maybe_drop(b)
            self._dirty.pop(b, None)
        while self._hot_wanted and not self._limited:
            b, reader = self._hot_wanted.popleft()
            self._maybe_hot_copy(b, reader)
        budget = self.settings.scan_keys_per_tick
        while budget > 0 and not self._limited:
            if self._scan is None:
                self._scan = iter(self.factors.keys_above_one())
            nb = next(self._scan, None)
            if nb is None:
                self._scan = None
                break
            budget -= 1
            deficit = self._deficit(nb)
            if deficit > 0 and not self._maybe_copy(nb, wanted=self.factors.factor_of(*nb)):
                short += 1
            elif deficit < 0:
                self._maybe_drop(nb)
        self.num_under_replicated = short + len(self._dirty)
        self._limited = False
        return self.num_copies_issued - before

    _limited = False  # the bucket ran dry during this tick

    @property
    def num_waiting(self) -> int:
        """Blocks marked to check that have not been looked at yet (rate-limited)."""
        return len(self._dirty)

    # ---- helpers -------------------------------------------------------------------------
    def _is_live(self, rec: NodeRecord | None) -> bool:
        return (rec is not None and rec.synced and not rec.gap and rec.healthy
                and not rec.draining)

    def _rows(self, b: BlockId) -> list[tuple[Replica, NodeRecord]]:
        out = []
        for r in self.index.replicas(*b):
            rec = self.membership.record_of_holder(r.holder)
            if rec is not None:
                out.append((r, rec))
        return out

    def _live_originals(self, b: BlockId) -> int:
        dropping = set(self._dropping(b))
        return len({rec.spec.node_id for r, rec in self._rows(b)
                    if not r.copy and r.state is ReplicaState.COMMITTED
                    and self.index.is_readable(r.holder) and self._is_live(rec)
                    and rec.spec.node_id not in dropping})

    def _dropping(self, b: BlockId) -> list[str]:
        """The node a DROP of ``b`` went to, while that replica is still indexed (its ack
        may come before its REMOVED event) and for at most the command's life (a pinned
        block the node kept, or a command given up, counts again after that)."""
        d = self._drops.get(b)
        if d is None:
            return []
        node_id, holder, until = d
        if self.clock() > until or all(r.holder != holder for r in self.index.replicas(*b)):
            del self._drops[b]
            return []
        return [node_id]

    def _wanted(self, b: BlockId) -> int:
        return self.factors.factor_of(*b) + self._hot_extra.get(b, 0)

    def _maybe_drop(self, b: BlockId) -> bool:
        """Queue one DROP of block ``b`` if it has more live originals than it wants (its
        factor plus hot extras). Never while a COPY or DROP of it is in flight, or while any
        replica of it is not COMMITTED (a write or a move is landing), never on a draining
        node (its replicas do not count), and never below one original: it only trims
        above ``wanted`` >= 1. Returns whether one was queued."""
        if self._in_flight(b) or self._dropping(b) or self.commands.nodes_with(
                CommandKind.DROP, *b):
            self.num_drops_deferred += 1
            return False
        rows = self._rows(b)
        if any(r.state is not ReplicaState.COMMITTED for r, _ in rows) or self._reporting(b):
            self.num_drops_deferred += 1
            return False
        live = [(r, rec) for r, rec in rows
                if not r.copy and self.index.is_readable(r.holder) and self._is_live(rec)]
        if len({rec.spec.node_id for _, rec in live}) <= max(1, self._wanted(b)):
            return False
        # the fullest tier gives its replica back (SSD before DRAM on a tie: DRAM serves
        # faster); a spiller moving the block away is the fullest, so it is its replica
        r, rec = min(live, key=lambda x: (
            -_used_fraction(x[1], x[0].tier), x[0].tier is Tier.DRAM, x[1].spec.node_id))
        self.commands.add(rec.spec.node_id, rec.spec.epoch, CommandKind.DROP, b[0], b[1])
        self._drops[b] = (rec.spec.node_id, rec.holder, self.clock()
                          + self.commands.resend_after_s * self.commands.max_sends)
        self.num_drops_issued += 1
        log.debug("repair_drop_queued", key=b[1].hex()[:16], node_id=rec.spec.node_id,
                  num_originals=len(live), wanted=self._wanted(b))
        return True

    def _in_flight(self, b: BlockId) -> list[str]:
        return self.commands.nodes_with(CommandKind.COPY, *b)

    def _deficit(self, b: BlockId) -> int:
        """Originals short of the block's factor (negative: maybe a surplus, _maybe_drop
        weighs hot extras). A replica being written (a put's own second replica, WRITING on
        a live node) counts as coming: a COPY for it would make a third original, and the
        DROP that trims it then took the writer's own (the fullest node). So does one whose
        write committed while its holder's event, which indexes it, is on the way
        (:meth:`Placement.reporting_holders`)."""
        writing = {rec.spec.node_id for r, rec in self._rows(b)
                   if r.state is ReplicaState.WRITING and not r.copy and self._is_live(rec)}
        return (self.factors.factor_of(*b) - self._live_originals(b) - len(self._in_flight(b))
                - len(writing | self._reporting(b)))

    def _reporting(self, b: BlockId) -> set[str]:
        """Live nodes whose committed replica of ``b`` is not indexed yet (its event is on
        the way): coming, never a COPY target."""
        out = set()
        for h in self.placement.reporting_holders(*b):
            rec = self.membership.record_of_holder(h)
            if rec is not None and self._is_live(rec):
                out.add(rec.spec.node_id)
        return out

    def _cool_hot_blocks(self) -> None:
        """A hot block not hot again for two windows gives its extra replicas back: its
        extra count is forgotten and it is checked (a surplus -> DROP)."""
        if not self._hot_at:
            return
        now, window = self.clock(), self.settings.hot_window_s
        for b in [b for b, at in self._hot_at.items() if now - at > 2 * window]:
            del self._hot_at[b]
            self._hot_extra.pop(b, None)
            self._dirty[b] = None

    def _maybe_copy(self, b: BlockId, *, wanted: int, reader: str = "") -> bool:
        """Queue one COPY of block ``b`` if it has fewer than ``wanted`` live originals plus
        copies in flight (to ``reader`` when given, else the best target). Returns whether
        one was queued (False: nothing needed, no source, no target, or no tokens)."""
        rows = self._rows(b)
        flying = self._in_flight(b)
        live = {rec.spec.node_id for r, rec in rows
                if not r.copy and r.state is ReplicaState.COMMITTED
                and self.index.is_readable(r.holder) and self._is_live(rec)}
        live -= set(self._dropping(b))  # a replica being dropped is gone already
        if len(live) + len(flying) >= wanted:
            return False
        sources = [(r, rec) for r, rec in rows
                   if r.state is ReplicaState.COMMITTED and self.index.is_readable(r.holder)
                   and rec.healthy]
        if not sources:
            self.num_no_source += 1
            return False
        r, src = min(sources, key=lambda x: (x[0].copy, x[0].tier is not Tier.DRAM,
                                             x[1].load, x[1].spec.node_id))
        has = (live | set(flying) | {rec.spec.node_id for rr, rec in rows if not rr.copy}
               | self._reporting(b))
        copies = {rec.spec.node_id for rr, rec in rows if rr.copy}
        used_zones = {self.zone_of(rec) for rr, rec in rows
                      if rec.spec.node_id in live} - {""}
        cands = [rec for rec in self.membership.nodes()
                 if self._is_live(rec) and rec.spec.node_id not in has
                 and (not reader or rec.spec.node_id == reader)
                 # a copy kept in place takes no new bytes, but evictable space becomes an
                 # original's: the node needs the room as much as for a transfer
                 and self.placement.last_tier_room_bytes(
                     rec, REPAIR_MAX_USED_FRACTION) >= r.size_bytes]
        if not cands:
            self.num_no_target += 1
            return False
        target = min(cands, key=lambda rec: (
            rec.spec.node_id not in copies, self.zone_of(rec) in used_zones and bool(used_zones),
            -self.placement.last_tier_room_bytes(rec, REPAIR_MAX_USED_FRACTION),
            rec.spec.node_id))
        cost = 0 if target.spec.node_id in copies else r.size_bytes  # a kept copy moves nothing
        if cost and not self._bucket.take(cost, self.clock()):
            self.num_rate_limited += 1
            self._limited = True
            return False
        self.commands.add(target.spec.node_id, target.spec.epoch, CommandKind.COPY, b[0], b[1],
                          CopySource(src.spec.node_id, src.spec.epoch, src.spec.data_address,
                                     r.size_bytes, r.generation))
        self.num_copies_issued += 1
        self.num_bytes_issued += cost
        log.debug("repair_copy_queued", key=b[1].hex()[:16], source=src.spec.node_id,
                  target=target.spec.node_id, size_bytes=r.size_bytes)
        return True

    def _maybe_hot_copy(self, b: BlockId, reader: str) -> None:
        extra = self._hot_extra.get(b, 0)
        if extra >= self.settings.hot_max_extra_replicas:
            return
        factor = self.factors.factor_of(*b)
        if self._maybe_copy(b, wanted=factor + extra + 1, reader=reader):
            self._hot_extra[b] = extra + 1
            self._hot_at[b] = self.clock()
            self.num_hot_copies += 1
            log.info("hot_block_replicated", key=b[1].hex()[:16], reader=reader,
                     num_extra=extra + 1)


__all__ = ["MAX_REPLICATION_FACTOR", "DrainProgress", "FactorSource", "IndexFactors", "Repair",
           "RepairSettings", "ReplicationFactors"]
