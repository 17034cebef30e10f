"""Reads across the pool: a node finds blocks it lacks through the master, fetches them from
the peer that holds them over the data plane into its own DRAM, then serves them locally.

::

    PinBlocks/Get(keys) --local miss--> claim the missing blocks (single-flight: a block
           another request is copying already is waited for, not copied twice)
        -> master LookupPrefix(claimed keys, every_key, local_node_id=self): per key
        -> best replica per block (node, epoch, tier, size, generation, data address)
        -> per peer, peers in parallel: DataPlaneClient.get(keys, deadline)
              (the peer pins, sends each block with the generation of the replica it
              pinned, unpins; never with GET_FLAG_FILL_FROM_PEERS: the peer asks nobody;
              with GET_FLAG_PEER_EXPORT: it neither promotes nor touches what it sends)
              each payload is received straight into a local reservation (sink)
        -> verify each copy: the generation the peer sent equals the one the master named
           -> good, no master call (the holder stamps one per replica incarnation, unique
           per epoch, and the master indexes the replica under it). Otherwise master
           LookupPrefix(keys, local_node_id=peer): a peer that sent 0 (an older node)
           must still be (node, epoch, generation) as named before the copy; one that
           sent another generation (it replaced the block since the lookup) is good only
           if the master names that very replica by now. Else the copy is aborted
        -> commit the verified reservations (a normal put on the local store)
    LookupPrefix/Exists (probes): the local answer, extended by the master's answer, and
        where the master cannot speak for a peer (below: no master, rebuilding, or a term
        that has not listed the peer healthy) by a data-plane probe of the cached view's
        peers (GET_FLAG_PROBE: presence and tier only); never pins, renews or fetches.

Correctness: a copy becomes visible only if (a) the data plane delivered every byte of it
(the peer pinned the block for the whole send; a torn block's reservation is aborted, while
the blocks of a failed transfer that had arrived whole are verified and kept) and
(b) the generation of the replica the peer pinned is the one the master names for (peer,
epoch). The holder's store stamps a new generation on every replica it adds (a remove and
re-put, a copy-in, a restart are new ones; a promotion or demotion keeps the source tier's,
the same bytes: kvstored/tiers/feed.py) and reports it, so a source that replaced the block
between the lookup and its pin sends another generation and is dropped, even before the
master heard of the change. A source that sends 0 does not know its generations (an older
node): the master is asked after the copy, as far as it knows (it learns of a node's changes
within one heartbeat interval; block keys are content hashes, so a key put again carries the
same bytes); a block it names then under a new generation on the same epoch of the same
source (that node's pin promoted it from SSD: a new master generation) is copied once more
against the new name, under the same check.

Failure: every master call and every transfer runs under the caller's deadline (at most
``remote_fetch_timeout_s``); a dead or blackholed peer is a miss, never a hang. Each failed
transfer is reported to the master (ReportTransfer), which marks the peer unhealthy after
``unhealthy_after_failures`` consecutive failures, so later lookups choose another replica.
The first success after a failure is reported too (it heals the peer).

Fallback: a read's lookup asks for up to :data:`MAX_FALLBACKS` *alternates* per block (the
block's other readable replicas on distinct nodes, ranked). A block whose transfer failed
(connect refused or reset, no answer in time, the peer refused the request) is copied from
its next alternate within the same request, at most ``MAX_FALLBACKS`` rounds, under the same
deadline (each transfer keeps the whole time left: a slow but healthy holder is never cut
short; without hedging, a blackholed one therefore uses up this read's deadline, a miss as
before, and is avoided by the next reads). Every copy is verified against the generation of the replica
it came from, exactly as above: a block that fails on every holder is a miss, never other
bytes. A holder that failed is *suspect* for ``suspect_holder_s``
(kvstored/node/suspects.py): lookups send it as ``avoid`` (the master ranks it last) and
the reader tries the other holders first; a success clears it. Without
this a SIGKILLed holder's blocks were misses for every reader until the master noticed the
death (up to one node lease), although another replica was alive.

Hedging (``hedge_after_s``, ``[cluster] hedge_after_ms``; a backup request after a delay,
Dean and Barroso, "The Tail at Scale", CACM 2013): a transfer whose holder has announced no
block for the hedge delay (a SIGSTOPped process accepts the connection and never answers)
has its blocks asked of their next holder too. Each transfer receives into its own
reservations; the first verified copy of a block commits it (:class:`_Race`), any other is
discarded (no slot is given for a settled block, its reservations are aborted, never
committed), and nothing commits once the read returned. The read returns as soon as every
block is settled or failed everywhere; the silent transfer is left to end by the deadline,
and its holder becomes suspect. The master's COPY commands (:meth:`RemoteReads.copy_from`)
take the same path, with the other holders of a block asked of the master when its named
source fails or stays silent.

Limits: a read is per key, like the get that asks for it: it looks up its missing keys with
one per-key master lookup (``lookup_each``), so a block after a cluster-wide miss is copied
too (only ``lookup_prefix`` is a prefix operation); with a master too old for it, in runs
past the misses (one longest-prefix lookup per run, within the deadline). An Exists probe
does the same, at most ``exists_max_runs`` lookups for an older master. Two requests missing
the same block at once copy it once: the second waits for the first's copy, at most until its
own deadline (:mod:`.flights`).

No master to ask (a failover: the leader SIGKILLed, followers answering NotLeader, an older
term's answer refused) or a master that cannot yet tell (a new leader still rebuilding its
index: ``complete = false``): a block the master names nobody for is asked of the peers of
the node's cached view (the spiller's last ListNodes; at most ``max_view_peers``, suspects
last, in parallel, within the read's deadline), one data-plane GET per peer with
``GET_FLAG_PEER_EXPORT``. The first peer that announces a block gets it (the others' copies
are skipped). Such a copy is verified by its holder instead of the master: the peer pinned
a committed replica for the send and sent its generation (a peer that sends 0, an older
node, is not used), the data plane delivered every byte (a torn block is aborted), and keys
are content hashes, so the one block a node commits under a key is that key's bytes; there
is no earlier lookup whose name could have gone stale. Committed as a remote-fill copy like
any other (the new leader learns it from this node's events).

A ``complete`` answer speaks only for the nodes whose inventories its leader holds: a new
leader (or a restarted master) says complete once the nodes that registered with it have
synced and its rejoin grace (one node lease) ran out, which says nothing of a live node
still on its way to it (loaded, or slow to follow the failover: fail17's misses after
``complete=true``). Each peer of the cached view records the term whose ListNodes last
named it healthy (``PeerRoom.synced_term``); a complete answer of term T is trusted for a
peer only when that is T, and the peers it is not trusted for are asked like above
(:meth:`RemoteReads.view_peers`). A read while the master is up and complete and every
peer of the view was listed healthy by that term never fans out (a true miss costs no
peer calls).

Thread-safe: called from the node's store executor threads (blocking).
"""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from kvstored.errors import DeadlineExceeded, KvstoredError, NoCapacity, TransferFailed, Unavailable
from kvstored.node.flights import Flights
from kvstored.node.suspects import MAX_SUSPECTS, Suspects
from kvstored.transport.base import GetItem, Transport, completed_items

if TYPE_CHECKING:
    from kvstored.node.spill import PeerRoom
from kvstored.transport.master_rpc import ClusterReplica, MasterClient
from kvstored.transport.master_targets import TermFence
from kvstored.transport.tcp import DataPlaneClient

if TYPE_CHECKING:
    from kvstored.security.tls import TlsFiles
from kvstored.types import Reservation, Tier

if TYPE_CHECKING:
    from kvstored.node.core import NodeCore

log = structlog.get_logger(__name__)

LookupFn = Callable[[bytes, Sequence[bytes], str, float], list[ClusterReplica]]
"""``lookup(namespace_id, keys, local_node_id, timeout_s)`` -> best replica per leading block."""
LookupEachFn = Callable[[bytes, Sequence[bytes], str, float, Sequence[str], int],
                        "dict[int, ClusterReplica] | None"]
"""``lookup_each(namespace_id, keys, local_node_id, timeout_s, avoid, max_alternates)`` ->
{key index: best replica} of every key present cluster-wide (each with up to
``max_alternates`` alternates, the ``avoid`` nodes ranked last), or None when the master
cannot answer per key (older)."""
ReportFn = Callable[[str, int, bool, float], None]
"""``report(peer node_id, peer epoch, ok, timeout_s)``: one transfer's outcome."""

_TRANSFER_ERRORS = (Unavailable, DeadlineExceeded, TransferFailed)
_MIN_RPC_S = 0.05
MAX_FALLBACKS = 3
"""Most other holders one read tries for a block whose holder failed (rounds of fallback
per request; also the alternates asked per block)."""
MAX_VIEW_PEERS = 8
"""Most peers of the cached view one read asks when no master can tell (bounded fan-out)."""
DEFAULT_SUSPECT_HOLDER_S = 5.0
"""Seconds a failed holder stays suspect when the caller passes no :class:`Suspects`."""

Peer = tuple[str, int, str]
"""(node id, epoch, data address) of a source."""


class Found(dict[int, ClusterReplica]):
    """A per-key lookup's answer ({key index: replica}) with the master's ``complete``
    flag (False: a new leader or a restarted master still rebuilding its index, so a key
    it names nobody for may still be held) and the answering leader's ``term`` (0: a
    master without terms). A plain dict answer counts as complete, of term 0."""

    def __init__(self, found: dict[int, ClusterReplica], *, complete: bool,
                 term: int = 0) -> None:
        super().__init__(found)
        self.complete = complete
        self.term = int(term)


class Prefix(list[ClusterReplica]):
    """A longest-prefix lookup's answer (the best replica of each leading block) with the
    master's ``complete`` flag and the answering leader's ``term``, as :class:`Found`. A
    plain list answer counts as complete, of term 0."""

    def __init__(self, found: Sequence[ClusterReplica], *, complete: bool,
                 term: int = 0) -> None:
        super().__init__(found)
        self.complete = complete
        self.term = int(term)


@dataclass(frozen=True, slots=True)
class FetchResult:
    """What one :meth:`RemoteReads.fill` did (counts of blocks).

    Attributes:
        num_found: missing blocks the master named a replica for.
        num_fetched: blocks copied, verified and committed locally.
        num_dropped: copies aborted because the source's replica changed or vanished.
        num_failed: blocks whose transfer failed (peer dead, slow, or the deadline passed).
        num_waited: missing blocks another request was copying already; this one waited
            for that copy (until its own deadline) instead of copying them again.
        num_fallbacks: copies tried again on another holder after a holder failed (a block
            tried on three holders counts 2); ``num_failed`` counts only the blocks that
            failed on every holder tried.
        num_hedged: hedged copies sent: blocks asked of another holder as well because
            their holder had not answered within ``hedge_after_s`` (:class:`RemoteReads`).
        num_hedge_won: hedged blocks the other holder's copy served (its copy committed
            first; the stalled holder's copy is discarded).
    """

    num_found: int = 0
    num_fetched: int = 0
    num_dropped: int = 0
    num_failed: int = 0
    num_waited: int = 0
    num_fallbacks: int = 0
    num_hedged: int = 0
    num_hedge_won: int = 0


class _Through:
    """Blocks a read carries in its reply without caching them (``RemoteReads.fill``'s
    ``through``), under a byte budget; thread-safe (peers are copied in parallel).

    ``sizes`` not None: mark only (a reply that cannot carry bytes: PinBlocks): no block
    is received; each one's size lands in ``sizes`` and ``out[key]`` is None."""

    def __init__(self, out: dict[bytes, tuple[bytes, bytes] | None], budget_bytes: int,
                 sizes: dict[bytes, int] | None = None, *, cache: bool = True) -> None:
        self.out = out
        self.cache = cache  # False: every block received goes here, none into the store
        self.left = int(budget_bytes)
        self.taken = False
        self.sizes = sizes
        self.lock = threading.Lock()

    def take(self, key: bytes, size_bytes: int) -> bool:
        """Reserve ``size_bytes`` of the budget (the first block always fits, as in the
        inline Get); False when it does not fit (or marking only), and ``out[key]`` is then
        None (the reply asks the client to fetch it in another call)."""
        with self.lock:
            if self.sizes is not None:
                self.sizes[key] = size_bytes
                self.out.setdefault(key, None)
                return False
            if self.taken and size_bytes > self.left:
                self.out.setdefault(key, None)
                return False
            self.left -= size_bytes
            self.taken = True
            return True

    def setdefault_found(self, key: bytes) -> None:
        """Mark ``key`` as found in the pool (the reply may ask for it again)."""
        with self.lock:
            self.out.setdefault(key, None)

    def put(self, key: bytes, value: bytes, meta: bytes) -> None:
        with self.lock:
            if self.out.get(key) is None:  # the first verified copy wins (a hedged block)
                self.out[key] = (value, meta)


class _Race:
    """The transfers of one read that may carry the same block (a hedged block is asked of
    two holders at once): the first transfer to commit a block's verified copy settles it;
    every other copy of it is discarded (its sink receives nothing more, its reservation is
    aborted, never committed). Each transfer writes only into its own reservations, so a
    losing transfer never touches a slot the winner committed. :meth:`close` (the read
    returned) settles everything: a transfer still running after that commits nothing.

    Thread-safe: the transfers run on the racer threads; the read's thread waits on them.
    Lock order: the race's lock, then the store's (commit under it).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.won: dict[bytes, int] = {}  # key -> the job that settled it
        self.num_committed = 0  # blocks committed by the jobs of this read
        self.is_open = True

    def is_settled(self, key: bytes) -> bool:
        """True once ``key`` was committed by one of the read's transfers, or the read ended."""
        with self.lock:
            return not self.is_open or key in self.won

    def close(self) -> None:
        """The read returned: nothing commits any more."""
        with self.lock:
            self.is_open = False


@dataclass(slots=True, eq=False)
class _Job:
    """One transfer of a racing read: one batch from one holder (see ``_fill_racing``)."""

    job_id: int
    peer: Peer
    items: list[tuple[bytes, ClusterReplica]]
    progress: float  # time.monotonic() of the last payload announced (or of the start)
    hedge_of: _Job | None = None  # the stalled job this one backs up
    hedged: bool = False  # a backup was sent for it already (at most one per job)


@dataclass(slots=True)
class _KeyState:
    """One block of a racing read: its holders in order and its transfers in flight."""

    holders: list[ClusterReplica]
    next: int = 0  # index of the next holder to ask
    running: list[_Job] = field(default_factory=list)  # its transfers in flight
    extended: bool = False  # more holders were asked of the master already
    tried: set[str] = field(default_factory=set)  # node ids asked


class RemoteReads:
    """The node's reads of other nodes' blocks (see the module docstring).

    Args:
        core: the local node (store, validation, drain accounting).
        node_id: this node's id (its own replicas are never fetched).
        lookup: the master's cluster-wide longest-prefix lookup (see :data:`LookupFn`).
        report: reports a transfer outcome to the master (see :data:`ReportFn`).
        fetch_timeout_s: most seconds one fill may take (the caller's deadline may be less).
        transport_for: a Transport to a peer's data address (default: a pooled
            :class:`DataPlaneClient` per address, ``pool_size`` idle connections each).
        pool_size: idle data-plane connections kept per peer.
        report_timeout_s: deadline of one ReportTransfer call (reports are sent from one
            background thread, in order, so they never cost the reader's deadline).
        exists_max_runs: most master lookups one Exists probe makes (each run after a
            cluster-wide miss costs one) when there is no ``lookup_each`` or the master is
            too old for it (a read then looks up runs until its deadline: it is per key).
        lookup_each: the master's per-key lookup (see :data:`LookupEachFn`): a read and an
            Exists probe then ask once for every key, whatever the misses between them.
        before_verify: test hook, called after the copies arrived and before they are
            verified (e.g. a threading.Event wait that lets a test change the source).
        before_copy: test hook, called after the lookup and before the data-plane GET of
            each peer batch (a test changes the source's block there).
        max_parallel_peers: peers copied from at once (each on its own connection).
        on_wait: test hook of the single-flight (see :class:`~.flights.Flights`).
        ssl_context: TLS client context of the default peer transport (mutual TLS to every
            peer's data plane; kvstored/security/tls.py); None = plaintext.
        suspects: the holders whose transfers failed lately (sent as ``avoid``, tried
            last); None = a private one of :data:`DEFAULT_SUSPECT_HOLDER_S`.
        max_fallbacks: other holders tried per block after its holder failed (0 = no
            fallback: a failed block is a miss, as before).
        hedge_after_s: seconds a holder may stay silent (no block announced since the
            request, or since its last block) before the same copy is also asked of the
            block's next holder, the first verified copy winning (``[cluster]
            hedge_after_ms``; 0 = off: a stalled holder costs the read its deadline).
        before_repair_copy: test hook of a COPY command's transfer (``copy_from``), called
            with the source's node id before its first data-plane GET (the
            ``remote_copy_before_copy`` fault hook in a real node).
        peer_view: the node's cached peer view (the spiller's, ``Spiller.peers``): asked
            when no master can tell where a block is (module docstring); None = never.
        max_view_peers: most peers of that view one read asks.

    Raises:
        ValueError: ``max_fallbacks`` or ``hedge_after_s`` negative.
    """

    def __init__(
        self,
        core: NodeCore,
        *,
        node_id: str,
        lookup: LookupFn,
        report: ReportFn,
        fetch_timeout_s: float = 2.0,
        transport_for: Callable[[str], Transport] | None = None,
        pool_size: int = 4,
        report_timeout_s: float = 2.0,
        exists_max_runs: int = 8,
        before_verify: Callable[[], None] | None = None,
        before_copy: Callable[[], None] | None = None,
        max_parallel_peers: int = 4,
        on_wait: Callable[[int], None] | None = None,
        lookup_each: LookupEachFn | None = None,
        ssl_context: ssl.SSLContext | None = None,
        suspects: Suspects | None = None,
        max_fallbacks: int = MAX_FALLBACKS,
        hedge_after_s: float = 0.0,
        before_repair_copy: Callable[[str], None] | None = None,
        peer_view: Callable[[], Sequence[PeerRoom]] | None = None,
        max_view_peers: int = MAX_VIEW_PEERS,
    ) -> None:
        self.peer_view = peer_view
        self.max_view_peers = int(max_view_peers)
        self.num_view_fetched = 0  # blocks found on a peer of the cached view (no master)
        self.num_view_probed = 0  # probed keys a peer of the cached view said it holds
        if max_fallbacks < 0:
            raise ValueError(f"max_fallbacks must be >= 0, got {max_fallbacks}")
        if hedge_after_s < 0:
            raise ValueError(f"hedge_after_s must be >= 0 seconds (0 = off), got {hedge_after_s}")
        self.hedge_after_s = float(hedge_after_s)
        self.before_repair_copy = before_repair_copy
        # the transfers of racing reads and COPYs: a read leaves a stalled holder's transfer
        # behind (it ends at the read's deadline), so there are more threads than peers
        self._racers = ThreadPoolExecutor(max(8, 8 * max(1, max_parallel_peers)),
                                          thread_name_prefix="kvstored-peer-race")
        self._job_ids = 0
        self.core = core
        self.suspects = suspects if suspects is not None else Suspects(DEFAULT_SUSPECT_HOLDER_S)
        self.max_fallbacks = max_fallbacks
        self.ssl_context = ssl_context
        self.lookup_each = lookup_each
        self.node_id = node_id
        self.lookup = lookup
        self.report = report
        self.fetch_timeout_s = fetch_timeout_s
        self.pool_size = pool_size
        self.before_verify = before_verify
        self.before_copy = before_copy
        self.flights = Flights(on_wait)
        self._copiers = ThreadPoolExecutor(max(1, max_parallel_peers),
                                           thread_name_prefix="kvstored-peer-copy")
        self.report_timeout_s = report_timeout_s
        self.exists_max_runs = exists_max_runs
        self._reporter = ThreadPoolExecutor(1, thread_name_prefix="kvstored-transfer-report")
        self._transport_for = transport_for or self._pooled
        self._peers: dict[str, DataPlaneClient] = {}
        self._failed: set[tuple[str, int]] = set()  # peers whose last transfer failed
        self._lock = threading.Lock()
        self.num_fetched = 0
        self.num_dropped = 0
        self.num_failed = 0
        self.num_fallbacks = 0
        self.num_hedged = 0
        self.num_hedge_won = 0
        self.num_skipped = 0  # copies skipped: no room without dropping a block (a miss)

    def _pooled(self, address: str) -> DataPlaneClient:
        with self._lock:
            t = self._peers.get(address)
            if t is None:
                t = self._peers[address] = DataPlaneClient(
                    address, pool_size=self.pool_size,
                    max_block_bytes=self.core.cfg.max_block_bytes,
                    peer_export=True,  # the peer sends without promoting or touching
                    ssl_context=self.ssl_context,
                )
            return t

    def close(self) -> None:
        """Close every pooled peer connection (idempotent)."""
        with self._lock:
            peers, self._peers = self._peers, {}
        for t in peers.values():
            t.close()
        self._reporter.shutdown(wait=False, cancel_futures=True)
        self._copiers.shutdown(wait=False, cancel_futures=True)
        self._racers.shutdown(wait=False, cancel_futures=True)

    def deadline(self, remaining_s: float | None) -> float:
        """Absolute ``time.monotonic()`` deadline: the caller's time left, at most
        ``fetch_timeout_s`` (``remaining_s`` None = no caller deadline)."""
        budget = self.fetch_timeout_s
        if remaining_s is not None:
            budget = min(budget, max(0.0, remaining_s * 0.8))
        return time.monotonic() + budget

    # ---- finding replicas ----------------------------------------------------------------
    def find(
        self, namespace_id: bytes, keys: Sequence[bytes], *, deadline: float,
        local_node_id: str | None = None, max_runs: int = 1,
    ) -> dict[int, ClusterReplica]:
        """The master's best replica of each of ``keys`` it knows, by index (never pins).

        Looks up runs: the longest present prefix of the keys left, then skips the first
        cluster-wide miss and goes on, at most ``max_runs`` lookups (1 = prefix semantics: a
        block after a cluster-wide miss is not looked for), until the keys or the deadline
        run out. A master that cannot be reached answers nothing (a miss, logged).
        """
        out: dict[int, ClusterReplica] = {}
        start = runs = 0
        me = self.node_id if local_node_id is None else local_node_id
        while start < len(keys) and runs < max_runs:
            runs += 1
            left = deadline - time.monotonic()
            if left < _MIN_RPC_S:
                break
            try:
                got = self.lookup(namespace_id, keys[start:], me, left)
            except KvstoredError as exc:
                log.info("remote_lookup_failed", error=str(exc))
                break
            for j, rep in enumerate(got):
                out[start + j] = rep
            start += len(got) + 1
        return out

    def find_each(
        self, namespace_id: bytes, keys: Sequence[bytes], *, deadline: float,
        local_node_id: str | None = None,
    ) -> dict[int, ClusterReplica]:
        """The master's best replica of every one of ``keys`` present cluster-wide, by index
        (never pins): a read is per key, so a cluster-wide miss hides nothing after it.

        One per-key lookup (``lookup_each``); a master that cannot answer per key (older, or
        no ``lookup_each``) is asked in runs past the misses (:meth:`find`, one lookup per
        run, until the keys or the deadline run out). A master that cannot be reached
        answers nothing (a miss, logged). ``local_node_id`` ranks that node's replicas first
        (default: this node's; "" = none, so an original elsewhere beats a copy here).
        Each replica carries up to ``max_fallbacks`` alternates; the suspects are sent as
        ``avoid``.
        """
        return self._find_each(namespace_id, keys, deadline=deadline,
                               local_node_id=local_node_id)[0]

    def _find_each(
        self, namespace_id: bytes, keys: Sequence[bytes], *, deadline: float,
        local_node_id: str | None = None,
    ) -> tuple[dict[int, ClusterReplica], bool, int]:
        """:meth:`find_each`, whether the answer is the master's whole word (False when no
        master answered: unreachable, NotLeader, a stale term; or it said ``complete =
        false``: rebuilding, so a key it names nobody for may be held) and the answering
        leader's term (0: unknown, or a master without terms)."""
        left = deadline - time.monotonic()
        local = self.node_id if local_node_id is None else local_node_id
        if self.lookup_each is not None and left >= _MIN_RPC_S:
            try:
                found = self.lookup_each(namespace_id, keys, local, left,
                                         self.suspects.current(), self.max_fallbacks)
            except KvstoredError as exc:
                log.info("remote_lookup_failed", error=str(exc))
                return {}, False, 0
            if found is not None:
                return (found, bool(getattr(found, "complete", True)),
                        int(getattr(found, "term", 0)))
        return self.find(namespace_id, keys, deadline=deadline, max_runs=len(keys)), True, 0

    def view_peers(self, *, sure: bool, term: int) -> list[PeerRoom]:
        """The peers of the cached view to ask for blocks a lookup named nobody for (never
        this node; suspects last; at most ``max_view_peers``).

        ``sure`` False (no master could tell): every peer of the view. ``sure`` True (a
        ``complete`` answer of leader ``term``): only the peers that leader's own listing
        has not named healthy (``PeerRoom.synced_term != term``): a new leader's
        ``complete`` covers the nodes that registered with it, and says nothing of a live
        peer still on its way to it (the fail17 miss: a node that re-registered after the
        new leader's rejoin grace ran out). A complete answer of term 0 (a master without
        terms, or a stub) asks nobody, as before; so does a view every peer of which was
        listed healthy under ``term``: a true miss then costs no peer call. With ``sure``
        a suspect peer (a transfer or probe with it failed within ``suspect_holder_s``) is
        not asked either: a peer that died with the old leader stays in the view for
        ``PEER_CARRY_S`` (the new leader never lists it departed), and a dead host's
        connect may take a read's whole deadline.
        """
        if self.peer_view is None or (sure and term <= 0):
            return []
        suspect = set(self.suspects.current()) if sure else set()
        by_id = {p.node_id: p for p in self.peer_view()
                 if p.node_id != self.node_id and p.data_address
                 and not (sure and (p.synced_term == term or p.node_id in suspect))}
        return [by_id[n] for n in self.suspects.order(by_id)][: self.max_view_peers]

    def extend_prefix(
        self, namespace_id: bytes, keys: Sequence[bytes], local: list[Tier], *,
        remaining_s: float | None = None,
    ) -> list[Tier]:
        """A probe's longest prefix: ``local`` (the node's own answer) extended by the
        cluster's (per block, the tier of the best replica); never pins or fetches."""
        if len(local) >= len(keys):
            return local
        deadline = self.deadline(remaining_s)
        left = deadline - time.monotonic()
        if left < _MIN_RPC_S:
            return local
        try:  # the cluster's prefix of the keys after the local one (the master may lag)
            got = self.lookup(namespace_id, keys[len(local):], self.node_id, left)
        except KvstoredError as exc:
            log.info("remote_lookup_failed", error=str(exc))
            return local + self._prefix_on_view(namespace_id, keys[len(local):], deadline,
                                                sure=False, term=0)
        out = list(local)
        for r in got:
            if r.node_id == self.node_id:
                break  # names us, but we lack it: the master has not heard of the eviction
            out.append(r.tier)
        if len(got) > len(out) - len(local):  # stopped at a stale "us": ask past it
            out += self._prefix_elsewhere(namespace_id, keys[len(out):], deadline)
        if len(out) < len(keys):  # the master's word may not cover every peer (view_peers)
            out += self._prefix_on_view(namespace_id, keys[len(out):], deadline,
                                        sure=bool(getattr(got, "complete", True)),
                                        term=int(getattr(got, "term", 0)))
        return out

    def _prefix_on_view(self, namespace_id: bytes, keys: Sequence[bytes], deadline: float, *,
                        sure: bool, term: int) -> list[Tier]:
        """The leading run of ``keys`` that the peers :meth:`view_peers` names hold (one
        probe per peer, :meth:`probe_view`); [] when there are none to ask."""
        peers = self.view_peers(sure=sure, term=term) if keys else []
        if not peers:
            return []
        held = self.probe_view(namespace_id, keys, deadline, peers)
        out: list[Tier] = []
        for i in range(len(keys)):
            if i not in held:
                break
            out.append(held[i])
        return out

    def probe_view(self, namespace_id: bytes, keys: Sequence[bytes], deadline: float,
                   peers: Sequence[PeerRoom]) -> dict[int, Tier]:
        """Which of ``keys`` ``peers`` hold: one data-plane probe per peer (GET_FLAG_PROBE:
        nothing pinned, read, promoted or touched there), peers in parallel, within
        ``deadline``. A peer that fails (dead, silent, an older node that refuses the flag)
        answers nothing and becomes suspect. Never pins or fetches anything here.

        Returns:
            ``{index into keys: tier}`` of every key some peer holds (DRAM if any holds it
            there).
        """
        if not peers or not keys or deadline - time.monotonic() < _MIN_RPC_S:
            return {}

        def ask(peer: PeerRoom) -> list[Tier | None]:
            try:
                return self._pooled(peer.data_address).probe(keys, namespace_id,
                                                             deadline=deadline)
            except KvstoredError as exc:
                self.suspects.mark(peer.node_id)
                log.info("remote_view_probe_failed", peer=peer.node_id, error=str(exc))
                return []

        held: dict[int, Tier] = {}
        try:
            futures = [self._racers.submit(ask, p) for p in peers]
        except RuntimeError:  # closed
            return {}
        for fut in futures:
            try:
                got = fut.result(timeout=max(0.0, deadline - time.monotonic()) + _MIN_RPC_S)
            except Exception:  # noqa: BLE001 (late or broken: that peer answers nothing)
                log.info("remote_view_probe_late")
                continue
            for i, tier in enumerate(got):
                if tier is not None and held.get(i) is not Tier.DRAM:
                    held[i] = tier
        with self._lock:
            self.num_view_probed += len(held)
        log.info("remote_view_probe_done", num_keys=len(keys), num_held=len(held),
                 peers=",".join(p.node_id for p in peers))
        return held

    def _prefix_elsewhere(self, namespace_id: bytes, keys: Sequence[bytes],
                          deadline: float) -> list[Tier]:
        """The leading run of ``keys`` that the master knows on another node than this one
        (one per-key lookup that avoids this node: it ranks last, named only where it is the
        only holder the master knows). The master names this node for a block it no longer
        holds until its removal event arrives (one heartbeat; also while a repair or a
        re-sync is under way); a replica elsewhere then still counts. [] when the master
        cannot answer per key or is unreachable."""
        left = deadline - time.monotonic()
        if self.lookup_each is None or left < _MIN_RPC_S or not keys:
            return []
        try:
            found = self.lookup_each(namespace_id, keys, "", left, (self.node_id,), 0)
        except KvstoredError as exc:
            log.info("remote_lookup_failed", error=str(exc))
            return []
        out: list[Tier] = []
        for i in range(len(keys)):
            rep = (found or {}).get(i)
            if rep is None or rep.node_id == self.node_id:
                break
            out.append(rep.tier)
        return out

    def exists(
        self, namespace_id: bytes, keys: Sequence[bytes], present: list[bool],
        tiers: list[Tier | None], *, remaining_s: float | None = None,
    ) -> tuple[list[bool], list[Tier | None]]:
        """A probe's per-key presence: the local answer, keys absent here looked up in the
        cluster (never pins or fetches). ``tiers`` is [] when the caller did not ask."""
        missing = [i for i, p in enumerate(present) if not p]
        if not missing:
            return present, tiers
        deadline = self.deadline(remaining_s)
        ask = [keys[i] for i in missing]
        found: dict[int, ClusterReplica] | None = None
        sure, term = True, 0  # whether the master's answer is its whole word (view_peers)
        left = deadline - time.monotonic()
        if self.lookup_each is not None and left >= _MIN_RPC_S:
            try:
                found = self.lookup_each(namespace_id, ask, self.node_id, left, (), 0)
            except KvstoredError as exc:
                log.info("remote_lookup_failed", error=str(exc))
                found, sure = {}, False
            else:
                sure = bool(getattr(found, "complete", True))
                term = int(getattr(found, "term", 0))
        if found is None:  # no per-key lookup (an older master): runs past the misses
            found = self.find(namespace_id, ask, deadline=deadline, max_runs=self.exists_max_runs)
        present = list(present)
        tiers = list(tiers)
        stale = [j for j, rep in found.items() if rep.node_id == self.node_id]
        if stale and self.lookup_each is not None:
            # names us, but we lack it (the master lags one heartbeat): ask again avoiding
            # this node, so a replica elsewhere still counts
            left = deadline - time.monotonic()
            if left >= _MIN_RPC_S:
                try:
                    again = self.lookup_each(namespace_id, [ask[j] for j in stale], "", left,
                                             (self.node_id,), 0) or {}
                except KvstoredError as exc:
                    log.info("remote_lookup_failed", error=str(exc))
                    again = {}
                found = dict(found)
                for n, rep in again.items():
                    found[stale[n]] = rep
        for j, rep in found.items():
            if rep.node_id == self.node_id:
                continue  # names us, but we lack it: stale, and no other holder is known
            present[missing[j]] = True
            if tiers:
                tiers[missing[j]] = rep.tier
        unknown = [j for j in range(len(ask)) if not present[missing[j]]]
        peers = self.view_peers(sure=sure, term=term) if unknown else []
        if peers:  # no master could tell, or its word does not cover these peers
            held = self.probe_view(namespace_id, [ask[j] for j in unknown], deadline, peers)
            for n, tier in held.items():
                present[missing[unknown[n]]] = True
                if tiers:
                    tiers[missing[unknown[n]]] = tier
        return present, tiers

    # ---- fetching ----------------------------------------------------------------------
    def fill(
        self, keys: Sequence[bytes], namespace_id: bytes, *, remaining_s: float | None = None,
        through: dict[bytes, tuple[bytes, bytes] | None] | None = None,
        through_budget_bytes: int = 0, through_sizes: dict[bytes, int] | None = None,
        cache: bool = True,
    ) -> FetchResult:
        """Copy the blocks of ``keys`` this node lacks from their peers into its DRAM.

        Best effort under the deadline: whatever could not be found, copied or verified is
        simply not there afterwards (the caller's read then misses). Never raises for a
        peer's or the master's failure; invalid keys are left to the caller's validation.

        Args:
            through: a read that carries the bytes in its reply (the inline gRPC Get): a
                block with no room here (its copy would drop a block from the pool) is
                received into a private buffer instead, verified the same way, and put in
                ``through[key] = (value, meta)``, never cached; None = such a block is a miss.
            through_budget_bytes: the most bytes put in ``through`` by this call.
            through_sizes: mark only (with ``through``; a reply that cannot carry bytes:
                PinBlocks): such a block is not received at all; ``through[key]`` is None
                and ``through_sizes[key]`` its size in bytes, so the reader reads it again by
                a call that streams it through (the inline Get).
            cache: False (with ``through``, bytes carried): no block is kept here; every
                one received goes to ``through`` (under the budget), never into the store.
                For a read that must send a block it found in the pool and then lost
                before it pinned it (a copy the spiller or a put's eviction dropped, a
                block moved to a peer): bytes in private memory cannot be dropped again.

        Returns:
            The counts of what happened (:class:`FetchResult`).

        Raises:
            ValueError: ``cache`` False without ``through`` or with ``through_sizes``.
        """
        if not cache and (through is None or through_sizes is not None):
            raise ValueError("fill(cache=False) needs through (a dict for the bytes) and no "
                             f"through_sizes; got through={'None' if through is None else 'a dict'}"
                             f", through_sizes={'None' if through_sizes is None else 'a dict'}")
        deadline = self.deadline(remaining_s)
        t0 = time.monotonic()
        core = self.core
        try:
            present, _ = core.exists(keys, namespace_id)
        except KvstoredError:
            return FetchResult()
        missing = [i for i, p in enumerate(present) if not p]
        if not missing:
            return FetchResult()
        flight_keys = [(namespace_id, keys[i]) for i in missing]
        mine, theirs = self.flights.claim(flight_keys)
        claimed = [flight_keys[j] for j in mine]
        # found in the pool by another request (its copy, waited for or committed since our
        # check): marked in ``through`` once here, like our own finds, so a read that loses
        # it before its pin reads it again (``through[key]`` None) instead of missing it
        others = [fk for j, fk in enumerate(flight_keys) if j not in set(mine)]
        fetched = dropped = failed = num_found = fallbacks = hedged = hedge_won = 0
        t_found = t0
        try:
            if claimed:  # a request that held the claim may have committed meanwhile
                still, _ = core.exists([k for _, k in claimed], namespace_id)
                done = [fk for fk, p in zip(claimed, still, strict=True) if p]
                others += done
                self.flights.release(done)
                mine = [j for j, p in zip(mine, still, strict=True) if not p]
                claimed = [flight_keys[j] for j in mine]
            mine_keys = [keys[missing[j]] for j in mine]
            found, sure, term = (self._find_each(namespace_id, mine_keys, deadline=deadline)
                                 if mine_keys else ({}, True, 0))
            ours = [j for j, rep in found.items() if rep.node_id == self.node_id]
            if ours and through is not None:
                # the master still names our own copy, evicted here within the last
                # heartbeat: ask again ranking no node first (an original elsewhere wins)
                again = self.find_each(namespace_id, [mine_keys[j] for j in ours],
                                       deadline=deadline, local_node_id="")
                for n, rep in again.items():
                    found[ours[n]] = rep
            num_found = len(found)
            if through is not None:  # found in the pool: the reply may ask for it again
                for j in found:
                    through.setdefault(mine_keys[j], None)
            t_found = time.monotonic()
            # ours (evicted or in flux here) are never fetched from ourselves: such a block
            # is copied from its next holder, or missed when it has none
            plan = {mine_keys[j]: self._holders_of(rep) for j, rep in found.items()}
            thr = None if through is None else _Through(through, through_budget_bytes,
                                                        through_sizes, cache=cache)
            if self.hedge_after_s > 0:
                fetched, dropped, failed, fallbacks, hedged, hedge_won = self._fill_racing(
                    plan, namespace_id, deadline, through=thr)
            else:
                fetched, dropped, failed, fallbacks = self._fill_with_fallback(
                    plan, namespace_id, deadline, through=thr)
            unknown = [k for j, k in enumerate(mine_keys) if j not in found]
            view = self.view_peers(sure=sure, term=term) if unknown else []
            if view:
                # no master can tell where these are, or the leader that answered has not
                # got these peers' inventories: ask them directly (view_peers)
                n_view, n_seen = self._fill_from_view(unknown, namespace_id, deadline, thr,
                                                      view)
                fetched += n_view
                num_found += n_seen
        finally:
            self.flights.release(claimed)
        if theirs:
            self.flights.wait(theirs, deadline)
        if through is not None and others:
            self._mark_found_by_others(others, namespace_id, through)
        with self._lock:
            self.num_fetched += fetched
            self.num_dropped += dropped
            self.num_failed += failed
            self.num_fallbacks += fallbacks
            self.num_hedged += hedged
            self.num_hedge_won += hedge_won
        if core.metrics is not None:
            for outcome, n in (("fetched", fetched), ("dropped", dropped), ("failed", failed),
                               ("fallback", fallbacks), ("hedged", hedged),
                               ("hedge_won", hedge_won)):
                core.metrics.count_remote_blocks(outcome, n)
        log.debug("remote_fill_done", num_missing=len(missing), num_fetched=fetched,
                  num_dropped=dropped, num_failed=failed, num_waited=len(missing) - len(mine),
                  num_fallbacks=fallbacks, num_hedged=hedged, num_hedge_won=hedge_won,
                  lookup_ms=round((t_found - t0) * 1000, 2),
                  duration_ms=round((time.monotonic() - t0) * 1000, 2))
        return FetchResult(num_found, fetched, dropped, failed, len(missing) - len(mine),
                           fallbacks, hedged, hedge_won)

    def _fill_from_view(self, keys: list[bytes], namespace_id: bytes, deadline: float,
                        through: _Through | None, peers: list[PeerRoom]) -> tuple[int, int]:
        """Ask ``peers`` (of the cached view: :meth:`view_peers`) for ``keys`` (no master
        can tell where they are; module docstring): one GET per peer, peers in parallel,
        the first peer to announce a block gets it. Returns ``(blocks committed or
        carried, blocks some peer announced)``."""
        if not peers or deadline - time.monotonic() < _MIN_RPC_S:
            return 0, 0
        claimed: dict[bytes, str] = {}
        verified: set[bytes] = set()  # arrived whole with the holder's generation
        lock = threading.Lock()

        def from_peer(peer: PeerRoom) -> int:
            core = self.core
            reserved: dict[int, Reservation] = {}
            private: dict[int, tuple[bytearray, bytes]] = {}

            def sink(i: int, size_bytes: int, meta: bytes) -> memoryview | None:
                with lock:
                    if keys[i] in claimed:
                        return None  # another peer announced it first
                    claimed[keys[i]] = peer.node_id
                if through is not None and not through.cache:
                    if not through.take(keys[i], size_bytes):
                        return None
                    buf = bytearray(size_bytes)
                    private[i] = (buf, meta)
                    return memoryview(buf)
                got = core.reserve_items([(keys[i], size_bytes, meta)], namespace_id,
                                         copy=True)[0]
                if not isinstance(got, Reservation):
                    if (isinstance(got.error, NoCapacity) and through is not None
                            and through.take(keys[i], size_bytes)):
                        buf = bytearray(size_bytes)  # carried in the reply, not cached
                        private[i] = (buf, meta)
                        return memoryview(buf)
                    return None
                reserved[i] = got
                return got.view

            try:
                items: list[GetItem | None]
                try:
                    items = list(self._transport_for(peer.data_address).get(
                        keys, namespace_id, sink, deadline=deadline))
                except _TRANSFER_ERRORS as exc:
                    self.suspects.mark(peer.node_id)
                    items = completed_items(exc, len(keys))
                    log.info("remote_view_fetch_failed", peer=peer.node_id, error=str(exc))
                except KvstoredError as exc:
                    log.info("remote_view_fetch_refused", peer=peer.node_id, error=str(exc))
                    return 0
                # verified by the holder: a whole block of a committed replica it pinned,
                # with its generation (0: an older node that does not know it: not used)
                good = [i for i, g in enumerate(items)
                        if g is not None and g.found and g.generation
                        and (i in reserved or i in private)]
                carried = 0
                if through is not None:
                    for i in good:
                        if i in private:
                            buf, meta = private.pop(i)
                            through.put(keys[i], bytes(buf), meta)
                            carried += 1
                with lock:
                    verified.update(keys[i] for i in good)
                commit = [reserved.pop(i) for i in good if i in reserved]
                flags = core.store.commit_many(commit) if commit else []
                n = sum(1 for f in flags if f)
                if n:
                    core.count_transfer("tcp", "in", n, sum(r.size_bytes for r in commit))
                return n + carried
            finally:
                core.abort_reserved(list(reserved.values()))

        total = 0
        try:
            with self.core.put_in_flight():
                futures = [self._racers.submit(from_peer, p) for p in peers]
                for fut in futures:
                    try:
                        total += fut.result(timeout=max(0.0, deadline - time.monotonic())
                                            + _MIN_RPC_S)
                    except Exception:  # noqa: BLE001 (late or broken: its blocks are misses)
                        log.info("remote_view_fetch_late")
        except KvstoredError as exc:  # draining: no new copies
            log.info("remote_fill_refused", error=str(exc))
            return 0, 0
        except RuntimeError:  # closed
            return 0, 0
        with self._lock:
            self.num_view_fetched += total
        if through is not None:  # found in the pool: the reply may ask for it again
            for k in verified:
                through.setdefault_found(k)
        log.info("remote_view_fill_done", num_keys=len(keys), num_announced=len(claimed),
                 num_fetched=total, peers=",".join(p.node_id for p in peers))
        return total, len(claimed)

    def _mark_found_by_others(self, others: Sequence[tuple[bytes, bytes]], namespace_id: bytes,
                              through: dict[bytes, tuple[bytes, bytes] | None]) -> None:
        """Mark in ``through`` (None: found in the pool, not carried) the keys another
        request's copy brought here while this read waited for it or since its check.

        Before, only the keys this read's own lookup found were marked: a block a
        concurrent reader copied here, then dropped before this read pinned it (the
        spiller takes copies first; a put's eviction), was a plain miss for it, though
        the pool held it (the TCP data-plane GET and the inline Get read a marked key once
        more, ``fill(cache=False)``; PinBlocks hands it to the inline Get)."""
        try:
            here, _ = self.core.exists([k for _, k in others], namespace_id)
        except KvstoredError:
            return
        for (_, k), p in zip(others, here, strict=True):
            if p:
                through.setdefault(k, None)

    def _holders_of(self, rep: ClusterReplica) -> list[ClusterReplica]:
        """The holders to try for one block, in order: the named replica, then its
        alternates, one per node, never this node, suspects last, at most
        ``1 + max_fallbacks``."""
        seen: set[str] = {self.node_id}
        out: list[ClusterReplica] = []
        for r in (rep, *rep.alternates):
            if r.node_id not in seen:
                seen.add(r.node_id)
                out.append(r)
        return self._suspects_last(out)[: 1 + self.max_fallbacks]

    def _suspects_last(self, holders: list[ClusterReplica]) -> list[ClusterReplica]:
        if len(holders) < 2:
            return holders
        by_id = {r.node_id: r for r in holders}
        return [by_id[n] for n in self.suspects.order(by_id)]

    def _fill_with_fallback(
        self, plan: dict[bytes, list[ClusterReplica]], namespace_id: bytes, deadline: float,
        *, through: _Through | None = None,
    ) -> tuple[int, int, int, int]:
        """Copy each block of ``plan`` (key -> holders to try, in order) from its first
        holder; a block whose transfer failed is tried on its next holder, one round per
        fallback, while the deadline allows. A block dropped by the generation check is not
        tried again (the master's view of it changed: a miss this time). Returns
        ``(fetched, dropped, failed on every holder tried, fallbacks)``."""
        pending = {k: holders for k, holders in plan.items() if holders}
        fetched = dropped = failed = fallbacks = 0
        while pending:
            by_peer: dict[Peer, list[tuple[bytes, ClusterReplica]]] = {}
            for k, holders in pending.items():
                peer = (holders[0].node_id, holders[0].epoch, holders[0].data_address)
                by_peer.setdefault(peer, []).append((k, holders[0]))
            f, d, bad = self._fill_peers(by_peer, namespace_id, deadline, through=through)
            fetched, dropped = fetched + f, dropped + d
            again = {k: self._suspects_last(pending[k][1:]) for k in bad if len(pending[k]) > 1}
            if again and deadline - time.monotonic() < _MIN_RPC_S:
                again = {}
            failed += len(bad) - len(again)
            if again:
                log.info("remote_fill_fallback", num_blocks=len(again),
                         failed_peers=sorted({pending[k][0].node_id for k in again}),
                         next_peers=sorted({h[0].node_id for h in again.values()}))
            fallbacks += len(again)
            pending = again
        return fetched, dropped, failed, fallbacks

    def _fill_racing(
        self, plan: dict[bytes, list[ClusterReplica]], namespace_id: bytes, deadline: float,
        *, as_copy: bool = True, through: _Through | None = None,
        more: Callable[[list[bytes], list[str]], dict[bytes, list[ClusterReplica]]] | None = None,
    ) -> tuple[int, int, int, int, int, int]:
        """Copy each block of ``plan`` (key -> holders to try, in order) with fallback, as
        :meth:`_fill_with_fallback`, and hedged copies.

        Source: a backup request after a delay (J. Dean, L. A. Barroso, "The Tail at
        Scale", CACM 56(2), 2013), taken per batch: a transfer whose holder announced no
        block for ``hedge_after_s`` (since the request or its last block) has its unsettled
        blocks asked of their next holder too, at most one backup per transfer. Each
        transfer receives into its own reservations; the first verified copy of a block
        commits it (:class:`_Race`), a later one is discarded. The read returns once every
        block is committed or has failed on every holder tried (or at the deadline): a
        stalled holder's transfer is left behind, receives nothing more, commits nothing,
        and ends by the deadline (it is counted for the drain while it runs). A holder
        whose backup won is suspect (:class:`Suspects`).

        ``more(keys, tried node ids)``: more holders of blocks that ran out of them (a
        COPY names one source), asked at most once per block; None = none.

        Returns:
            ``(fetched, dropped, failed on every holder tried, fallbacks, hedged blocks,
            hedged blocks the backup served)``.
        """
        race = _Race()
        states = {k: _KeyState(list(h)) for k, h in plan.items() if h}
        running: dict[Future[tuple[int, int, list[bytes]]], _Job] = {}
        backups: set[int] = set()  # job ids of hedged copies
        step = max(1, self.core.cfg.max_batch_keys)
        hedge_s = self.hedge_after_s
        dropped = failed = fallbacks = hedged = 0

        def has_next(k: bytes) -> bool:
            return states[k].next < len(states[k].holders)

        def extend(keys: list[bytes]) -> None:
            ask = [k for k in keys if not has_next(k) and not states[k].extended]
            if not ask or more is None:
                return
            tried: set[str] = {self.node_id}
            for k in ask:
                states[k].extended = True
                tried |= states[k].tried
            for k, holders in more(ask, sorted(tried)).items():
                st = states[k]
                known = {h.node_id for h in st.holders}
                st.holders += [h for h in holders if h.node_id not in known]

        def launch(keys: list[bytes], hedge_of: _Job | None = None) -> None:
            by_peer: dict[Peer, list[tuple[bytes, ClusterReplica]]] = {}
            for k in keys:
                st = states[k]
                h = st.holders[st.next]
                st.next += 1
                st.tried.add(h.node_id)
                by_peer.setdefault((h.node_id, h.epoch, h.data_address), []).append((k, h))
            for peer, items in by_peer.items():
                for i in range(0, len(items), step):  # the peer's batch limit is ours
                    # the test hooks hold here, before the transfer and its hedge clock
                    self._before_transfer(peer[0], as_copy)
                    with self._lock:
                        self._job_ids += 1
                        job = _Job(self._job_ids, peer, items[i : i + step], time.monotonic(),
                                   hedge_of)
                    try:
                        fut = self._racers.submit(self._race_job, job, namespace_id, deadline,
                                                  race, as_copy, through)
                    except RuntimeError:  # closed: nothing in flight for these
                        continue
                    running[fut] = job
                    for k, _ in job.items:
                        states[k].running.append(job)
                    if hedge_of is not None:
                        backups.add(job.job_id)

        launch(list(states))
        give_up = deadline + _MIN_RPC_S  # every transfer ends by the deadline
        while running:
            with race.lock:
                settled = set(race.won)
            if not any(st.running and k not in settled for k, st in states.items()):
                break  # what is still running is a loser (or settled) copy
            now = time.monotonic()
            if now >= give_up:
                break
            timeout = give_up - now
            if hedge_s > 0:
                due = [j.progress + hedge_s for j in running.values() if not j.hedged]
                if due:
                    timeout = max(0.0, min(timeout, min(due) - now))
            done, _ = wait(list(running), timeout=timeout, return_when=FIRST_COMPLETED)
            with race.lock:
                settled = set(race.won)
                won = dict(race.won)
            retry: list[bytes] = []
            backup_of: dict[bytes, _Job] = {}  # a failed backup's next try backs up the same
            alive = {j.job_id for f, j in running.items() if f not in done}
            for fut in done:
                job = running.pop(fut)
                try:
                    _, d, bad = fut.result()
                except Exception:  # a bug: every block of this transfer failed
                    log.exception("remote_copy_bug", peer=job.peer[0])
                    d, bad = 0, [k for k, _ in job.items]
                dropped += d
                bad_set = set(bad)
                for k, _ in job.items:
                    st = states[k]
                    st.running.remove(job)
                    # failed here and nothing else in flight for it but silent holders
                    # (hedged already): the next holder now, not at the silent one's deadline
                    if (k in bad_set and k not in settled
                            and all(j.hedged for j in st.running)):
                        retry.append(k)
                        if job.hedge_of is not None and st.running:
                            backup_of[k] = job.hedge_of
                stalled = job.hedge_of
                if (stalled is not None and stalled.job_id in alive
                        and any(won.get(k) == job.job_id for k, _ in job.items)):
                    self.suspects.mark(stalled.peer[0])  # silent past the hedge delay
            if retry:
                extend(retry)
                again = ([k for k in retry if has_next(k)]
                         if deadline - time.monotonic() >= _MIN_RPC_S else [])
                # failed for good only with nothing in flight (else counted at the end)
                failed += sum(1 for k in retry if k not in again and not states[k].running)
                if again:
                    log.info("remote_fill_fallback", num_blocks=len(again),
                             next_peers=sorted({states[k].holders[states[k].next].node_id
                                                for k in again}))
                    fallbacks += len(again)
                    launch([k for k in again if k not in backup_of])
                    for stalled in {id(j): j for j in backup_of.values()}.values():
                        launch([k for k in again if backup_of.get(k) is stalled],
                               hedge_of=stalled)
            if hedge_s <= 0:
                continue
            now = time.monotonic()
            for job in list(running.values()):
                if job.hedged or now - job.progress < hedge_s:
                    continue
                job.hedged = True  # one backup per transfer
                keys = [k for k, _ in job.items
                        if k not in settled and len(states[k].running) == 1]
                extend(keys)
                keys = [k for k in keys if has_next(k)]
                if not keys or deadline - now < _MIN_RPC_S:
                    continue
                hedged += len(keys)
                log.info("remote_fill_hedged", peer=job.peer[0], num_blocks=len(keys),
                         silent_ms=round((now - job.progress) * 1000, 2),
                         next_peers=sorted({states[k].holders[states[k].next].node_id
                                            for k in keys}))
                launch(keys, hedge_of=job)
        race.close()
        with race.lock:
            won = dict(race.won)
            fetched = race.num_committed
        hedge_won = sum(1 for j in won.values() if j in backups)
        # blocks still in flight when the read gave up (the deadline): misses
        failed += sum(1 for k, st in states.items() if st.running and k not in won)
        return fetched, dropped, failed, fallbacks, hedged, hedge_won

    def _before_transfer(self, peer: str, as_copy: bool) -> None:
        """The test hooks of one peer batch's transfer (``before_copy``, and
        ``before_repair_copy`` for a COPY command's)."""
        if self.before_copy is not None:
            self.before_copy()
        if not as_copy and self.before_repair_copy is not None:
            self.before_repair_copy(peer)

    def _race_job(
        self, job: _Job, namespace_id: bytes, deadline: float, race: _Race, as_copy: bool,
        through: _Through | None,
    ) -> tuple[int, int, list[bytes]]:
        """One transfer of :meth:`_fill_racing` (a racer thread), counted for the drain."""
        peer, epoch, address = job.peer
        try:
            with self.core.put_in_flight():
                return self._fill_from(peer, epoch, address, job.items, namespace_id, deadline,
                                       as_copy=as_copy, through=through, race=race, job=job)
        except KvstoredError as exc:  # draining: no new copies
            log.info("remote_fill_refused", error=str(exc))
            return 0, 0, []

    def _fill_peers(
        self, by_peer: dict[Peer, list[tuple[bytes, ClusterReplica]]],
        namespace_id: bytes, deadline: float, *, as_copy: bool = True,
        through: _Through | None = None,
    ) -> tuple[int, int, list[bytes]]:
        """Copy every peer's blocks, peers in parallel (one peer: in this thread); each
        peer's batches one after another (``as_copy``: as remote-fill copies, else as
        originals). Returns ``(fetched, dropped, keys whose transfer failed)``."""
        if not by_peer:
            return 0, 0, []
        step = max(1, self.core.cfg.max_batch_keys)

        def from_peer(peer: str, epoch: int, address: str,
                      items: list[tuple[bytes, ClusterReplica]]) -> tuple[int, int, list[bytes]]:
            fetched = dropped = 0
            failed: list[bytes] = []
            for i in range(0, len(items), step):  # the peer's batch limit is ours
                f, d, x = self._fill_from(peer, epoch, address, items[i : i + step],
                                          namespace_id, deadline, as_copy=as_copy,
                                          through=through)
                fetched, dropped = fetched + f, dropped + d
                failed += x
            return fetched, dropped, failed

        try:
            with self.core.put_in_flight():
                jobs = list(by_peer.items())
                if len(jobs) == 1:
                    (peer, epoch, address), items = jobs[0]
                    return from_peer(peer, epoch, address, items)
                futures = [self._copiers.submit(from_peer, p, e, a, items)
                           for (p, e, a), items in jobs]
                fetched = dropped = 0
                failed: list[bytes] = []
                for fut in futures:  # each job is bounded by the deadline itself
                    f, d, x = fut.result()
                    fetched, dropped = fetched + f, dropped + d
                    failed += x
                return fetched, dropped, failed
        except KvstoredError as exc:  # draining: no new copies
            log.info("remote_fill_refused", error=str(exc))
            return 0, 0, []

    def copy_from(
        self, items: Sequence[tuple[bytes, ClusterReplica]], namespace_id: bytes, *,
        remaining_s: float | None = None,
    ) -> FetchResult:
        """Copy named replicas into this node as *originals* (the master's COPY commands:
        repair, drain, hot blocks; kvstored/node/replicate.py).

        The same path as a read's copy (data-plane GET with ``GET_FLAG_PEER_EXPORT`` from
        the named source, each block verified against the generation the master named,
        then committed locally and reported like any put), but the blocks are not
        remote-fill copies: they are kept like a local put's (not evicted first). Blocks
        already here are not copied. Items are ``(key, source replica)``, sources in
        parallel. Best effort under the deadline (at most ``remote_fetch_timeout_s``);
        never raises for a peer's or the master's failure.

        A source that fails (refused, reset, no answer in time) or stays silent past
        ``hedge_after_s`` does not fail the command while another replica survives: the
        master is asked once for the block's other holders (a per-key lookup avoiding the
        nodes tried, :data:`LookupEachFn`) and the copy goes to the next one (a fallback),
        or is also asked of it (a hedge: the first verified copy commits, the silent
        source's is discarded). Without ``lookup_each`` only the named source is tried.

        Returns:
            Counts: ``num_found`` = items asked, fetched / dropped (the source's replica
            changed) / failed (transfer, on every holder tried), fallbacks and hedges.
        """
        deadline = self.deadline(remaining_s)
        try:
            present, _ = self.core.exists([k for k, _ in items], namespace_id)
        except KvstoredError:
            return FetchResult()
        plan: dict[bytes, list[ClusterReplica]] = {}
        for (k, rep), here in zip(items, present, strict=True):
            if not here and rep.node_id != self.node_id:
                plan.setdefault(k, [rep])

        def more(keys: list[bytes], avoid: list[str]) -> dict[bytes, list[ClusterReplica]]:
            left = deadline - time.monotonic()
            if self.lookup_each is None or left < _MIN_RPC_S:
                return {}
            ranked_last = list(dict.fromkeys([*avoid, *self.suspects.current()]))[:MAX_SUSPECTS]
            try:
                found = self.lookup_each(namespace_id, keys, "", left, ranked_last,
                                         self.max_fallbacks)
            except KvstoredError as exc:
                log.info("remote_lookup_failed", error=str(exc))
                return {}
            out: dict[bytes, list[ClusterReplica]] = {}
            for j, rep in (found or {}).items():
                holders = [h for h in self._holders_of(rep) if h.node_id not in avoid]
                if holders:
                    out[keys[j]] = holders
            return out

        fetched, dropped, failed, fallbacks, hedged, hedge_won = self._fill_racing(
            plan, namespace_id, deadline, as_copy=False, more=more)
        self._count_hedges(fallbacks, hedged, hedge_won)
        if fallbacks or hedged:
            log.info("replica_copy_other_source", num_blocks=len(plan), num_fetched=fetched,
                     num_fallbacks=fallbacks, num_hedged=hedged, num_hedge_won=hedge_won)
        return FetchResult(len(items), fetched, dropped, failed, 0, fallbacks, hedged,
                           hedge_won)

    def _count_hedges(self, fallbacks: int, hedged: int, hedge_won: int) -> None:
        """Add a COPY's fallbacks and hedges to the counters (a read counts its own)."""
        with self._lock:
            self.num_fallbacks += fallbacks
            self.num_hedged += hedged
            self.num_hedge_won += hedge_won
        if self.core.metrics is not None:
            for outcome, n in (("fallback", fallbacks), ("hedged", hedged),
                               ("hedge_won", hedge_won)):
                self.core.metrics.count_remote_blocks(outcome, n)

    def _fill_from(
        self, peer: str, epoch: int, address: str,
        items: list[tuple[bytes, ClusterReplica]], namespace_id: bytes, deadline: float,
        *, again: bool = True, as_copy: bool = True, through: _Through | None = None,
        race: _Race | None = None, job: _Job | None = None,
    ) -> tuple[int, int, list[bytes]]:
        """Copy one batch from one peer (see the module docstring). Returns ``(committed,
        dropped, keys whose transfer failed)``.

        ``race`` and ``job`` (a racing read, :meth:`_fill_racing`): a block the race settled
        already is not received (its payload is skipped) and is never committed from here;
        ``job.progress`` is stamped on every block the peer announces."""
        core = self.core
        keys = [k for k, _ in items]
        reserved: dict[int, Reservation] = {}
        private: dict[int, tuple[bytearray, bytes]] = {}  # no room here: for the reply only
        renamed: list[tuple[bytes, ClusterReplica]] = []
        t0 = time.monotonic()

        def sink(i: int, size_bytes: int, meta: bytes) -> memoryview | None:
            if job is not None:
                job.progress = time.monotonic()  # the peer answers: not stalled
            if size_bytes != items[i][1].size_bytes:
                return None  # not the replica the master named: do not copy it
            if race is not None and race.is_settled(keys[i]):
                return None  # another holder's copy won (or the read ended): discard
            if through is not None and not through.cache:  # for the reply only, never kept
                if not through.take(keys[i], size_bytes):
                    return None  # over the budget: a miss of this read
                buf = bytearray(size_bytes)
                private[i] = (buf, meta)
                return memoryview(buf)
            # copy=True: a read never costs the pool a block. Room for the copy comes only
            # from free space, other copies, or demotions the SSD takes as is; never from
            # evicting a block the pool holds nowhere else (tiers/spare.py). A master's
            # COPY (not as_copy) is held to the same rule (spare_only): making one replica
            # by dropping another block is a net loss; no room is a failed copy, which the
            # master's repair asks again later or of another target.
            got = (core.reserve_items([(keys[i], size_bytes, meta)], namespace_id,
                                      copy=True)[0] if as_copy else
                   core.reserve_items([(keys[i], size_bytes, meta)], namespace_id,
                                      spare_only=True)[0])
            if not isinstance(got, Reservation):
                if isinstance(got.error, NoCapacity):
                    if through is not None and through.take(keys[i], size_bytes):
                        buf = bytearray(size_bytes)  # streamed through the reply, not cached
                        private[i] = (buf, meta)
                        return memoryview(buf)
                    if through is not None and through.sizes is not None:
                        return None  # marked: the reader fetches it by Get (not a miss)
                    with self._lock:
                        self.num_skipped += 1
                    if core.metrics is not None:
                        core.metrics.count_remote_blocks("skipped")
                return None  # already here meanwhile, or no room: skip the payload (a miss)
            reserved[i] = got
            return got.view

        failed: list[bytes] = []
        try:
            got: list[GetItem | None]
            try:
                if race is None:  # a racing read calls them before it starts the transfer
                    self._before_transfer(peer, as_copy)
                transport = self._transport_for(address)
                got = list(transport.get(keys, namespace_id, sink, deadline=deadline))
            except _TRANSFER_ERRORS as exc:
                self._report(peer, epoch, False)
                self.suspects.mark(peer)
                # The blocks that arrived whole before the failure are kept (verified and
                # committed below); the rest, a torn one included, are aborted: a slow or
                # broken tail costs only the tail (tried on another holder if there is one).
                got = completed_items(exc, len(keys))
                failed = [keys[i] for i, g in enumerate(got) if g is None]
                log.warning("remote_fetch_failed", peer=peer, address=address,
                            num_blocks=len(keys), num_kept=len(keys) - len(failed),
                            error=str(exc))
                if len(failed) == len(keys):
                    return 0, 0, failed
            except KvstoredError as exc:  # the peer refused the request (draining...)
                log.info("remote_fetch_refused", peer=peer, num_blocks=len(keys),
                         error=str(exc))
                return 0, 0, list(keys)
            else:
                self._report(peer, epoch, True)
                self.suspects.clear(peer)
            t_copied = time.monotonic()
            # the generation the peer sent, per block that arrived whole into a reservation
            sent_gen = {i: g.generation for i, g in enumerate(got)
                        if g is not None and g.found and (i in reserved or i in private)}
            ok = list(sent_gen)
            if self.before_verify is not None:
                self.before_verify()
            # The peer sent the generation of the replica it pinned for the send (its store
            # stamps one per replica, unique per epoch, and the master indexes the replica
            # under it): equal to the named one means these are the named bytes, no call.
            good = [i for i in ok if sent_gen[i] and sent_gen[i] == items[i][1].generation]
            # Else ask the master: a peer that sent 0 does not know its generations (an
            # older node); one that sent another generation replaced the block since the
            # lookup, which is served only if the master names that very replica by now.
            ask = [i for i in ok if sent_gen[i] != items[i][1].generation or not sent_gen[i]]
            still = self.find(namespace_id, [keys[i] for i in ask], deadline=deadline,
                              local_node_id=peer, max_runs=len(ask)) if ask else {}
            t_verified = time.monotonic()
            for j, i in enumerate(ask):
                named, now, sent = items[i][1], still.get(j), sent_gen[i]
                if now is None or (now.node_id, now.epoch) != (peer, epoch):
                    continue  # dropped: the source lost it, or restarted
                if sent:
                    if now.generation == sent:
                        good.append(i)  # the master names the replica the peer sent
                elif now.generation == named.generation:
                    good.append(i)
                else:
                    renamed.append((keys[i], now))  # e.g. our pin promoted it SSD -> DRAM
            if not again:
                renamed = []  # this is the second copy: renamed again means dropped
            if through is not None:  # verified like a copy; handed to the reply, not cached
                for i in good:
                    if i in private:
                        buf, meta = private.pop(i)
                        if race is None:
                            through.put(keys[i], bytes(buf), meta)
                            continue
                        with race.lock:  # the first verified copy wins, none after the read
                            if race.is_open and keys[i] not in race.won:
                                through.put(keys[i], bytes(buf), meta)
                                race.won[keys[i]] = job.job_id if job is not None else 0
            mine = [i for i in good if i in reserved]
            if race is None:
                commit = [reserved.pop(i) for i in mine]
                flags = core.store.commit_many(commit) if commit else []
            else:
                # Only the first verified copy of a block commits, and none once the read
                # returned; a losing copy's reservation stays in ``reserved`` (aborted
                # below): it is its own slot, never the one the winner committed.
                with race.lock:
                    mine = [i for i in mine if race.is_open and keys[i] not in race.won]
                    commit = [reserved.pop(i) for i in mine]
                    flags = core.store.commit_many(commit) if commit else []
                    for i in mine:
                        race.won[keys[i]] = job.job_id if job is not None else 0
                    race.num_committed += sum(1 for f in flags if f)
            dropped = len(ok) - len(good) - len(renamed)
            if dropped:
                log.info("remote_copy_dropped", peer=peer, num_blocks=dropped,
                         reason="the source's replica changed or vanished during the copy")
            n = sum(1 for f in flags if f)
            if n:
                core.count_transfer("tcp", "in", n, sum(r.size_bytes for r in commit))
            log.debug("remote_batch_done", peer=peer, num_blocks=len(keys),
                      copy_ms=round((t_copied - t0) * 1000, 2),
                      verify_ms=round((t_verified - t_copied) * 1000, 2),
                      commit_ms=round((time.monotonic() - t_verified) * 1000, 2))
        finally:
            core.abort_reserved(list(reserved.values()))
        if renamed:
            # The source still holds these blocks under a new generation: the commonest cause
            # is this copy's own pin promoting an SSD replica into the source's DRAM (a new
            # replica for the master). Copy them once more against the new names; the same
            # check applies, so a block that keeps changing is dropped, never served.
            log.info("remote_copy_renamed", peer=peer, num_blocks=len(renamed))
            f, d, x = self._fill_from(peer, epoch, address, renamed, namespace_id, deadline,
                                      again=False, as_copy=as_copy, through=through,
                                      race=race, job=job)
            return n + f, dropped + d, failed + x
        return n, dropped, failed

    def _report(self, peer: str, epoch: int, ok: bool) -> None:
        """Queue a transfer outcome for the master: every failure, and the first success
        after a failure (a healthy peer that stays healthy costs nothing). Every outcome is
        counted in ``kvstored_peer_transfers_total``."""
        if self.core.metrics is not None:
            self.core.metrics.count_peer_transfer(peer, ok)
        key = (peer, epoch)
        with self._lock:
            if ok and key not in self._failed:
                return
            if ok:
                self._failed.discard(key)
            else:
                self._failed.add(key)
        try:
            self._reporter.submit(self._send_report, peer, epoch, ok)
        except RuntimeError:  # closed
            pass

    def _send_report(self, peer: str, epoch: int, ok: bool) -> None:
        try:
            self.report(peer, epoch, ok, self.report_timeout_s)
            log.info("peer_transfer_reported", peer=peer, epoch=epoch, ok=ok)
        except KvstoredError as exc:
            log.info("peer_transfer_report_failed", peer=peer, error=str(exc))
        except Exception:
            log.exception("peer_transfer_report_bug")

    def wait_reports(self, timeout_s: float = 10.0) -> bool:
        """Block until every report queued so far was sent (tests, shutdown)."""
        done = self._reporter.submit(lambda: None)
        try:
            done.result(timeout_s)
        except Exception:
            return False
        return True


def master_reads(core: NodeCore, master_address: str, *, node_id: str,
                 fetch_timeout_s: float, pool_size: int = 4, rpc_timeout_s: float = 2.0,
                 tls: TlsFiles | None = None, fence: TermFence | None = None,
                 transport_for: Callable[[str], Transport] | None = None,
                 suspect_holder_s: float = DEFAULT_SUSPECT_HOLDER_S,
                 hedge_after_s: float = 0.0,
                 before_copy: Callable[[], None] | None = None,
                 before_repair_copy: Callable[[str], None] | None = None,
                 peer_view: Callable[[], Sequence[PeerRoom]] | None = None) -> RemoteReads:
    """A :class:`RemoteReads` talking to the leading master at ``master_address`` (sync
    gRPC; one address, a list or ``etcd://``); ``fence``: the node's newest term (shared with
    its MasterLink), so a lookup answered by an older term is refused (StaleTerm: a miss).

    ``tls``: mutual TLS to the master and to every peer's data plane (None = plaintext).
    ``transport_for``: a peer's transport by data address (kvstored/node/rdma_peers.py
    ``PeerTransports``, which the caller closes); None = a pooled TCP client per peer.
    ``suspect_holder_s``: seconds a holder that failed a transfer stays suspect (``[cluster]
    suspect_holder_s``; kvstored/node/suspects.py). ``before_copy``: the test hook of
    :class:`RemoteReads` (the daemon passes the ``remote_fill_before_copy`` fault hook).
    ``hedge_after_s``: ``[cluster] hedge_after_ms`` in seconds (0 = no hedged copies).
    ``before_repair_copy``: the ``remote_copy_before_copy`` fault hook (COPY commands).
    ``peer_view``: the node's cached peer view, asked when no master can tell
    (:class:`RemoteReads`).

    Returns:
        The reader; ``close()`` it (closes the peer pools; the master channel is closed
        with it).
    """
    client = MasterClient(master_address, timeout_s=fetch_timeout_s, tls=tls, fence=fence)

    def lookup(namespace_id: bytes, keys: Sequence[bytes], local: str, timeout_s: float
               ) -> list[ClusterReplica]:
        got, complete, term = client.lookup_prefix_term(namespace_id, keys, local_node_id=local,
                                                        timeout_s=timeout_s)
        return Prefix(got, complete=complete, term=term)

    def lookup_each(namespace_id: bytes, keys: Sequence[bytes], local: str, timeout_s: float,
                    avoid: Sequence[str], max_alternates: int
                    ) -> dict[int, ClusterReplica] | None:
        got = client.lookup_each_term(namespace_id, keys, local_node_id=local,
                                      timeout_s=timeout_s, avoid=avoid,
                                      max_alternates=max_alternates)
        return None if got is None else Found(got[0], complete=got[1], term=got[2])

    def report(peer: str, epoch: int, ok: bool, timeout_s: float) -> None:
        client.report_transfer(peer, epoch, ok=ok, reporter_node_id=node_id,
                               timeout_s=timeout_s)

    reads = RemoteReads(core, node_id=node_id, lookup=lookup, report=report,
                        fetch_timeout_s=fetch_timeout_s, pool_size=pool_size,
                        report_timeout_s=rpc_timeout_s, lookup_each=lookup_each,
                        ssl_context=tls.client_context() if tls is not None else None,
                        transport_for=transport_for, suspects=Suspects(suspect_holder_s),
                        before_copy=before_copy, hedge_after_s=hedge_after_s,
                        before_repair_copy=before_repair_copy, peer_view=peer_view)
    close = reads.close

    def close_all() -> None:
        close()
        client.close()

    reads.close = close_all  # type: ignore[method-assign]
    return reads
