"""PutReplicas: the extra replicas of a ``put(keys, values, replicas=N)``, written by the node.

The engine's put lands on its own node as always (the first replica: shared memory, the
TCP data plane or gRPC). With N > 1 the client then asks that node to ``Replicate`` the
keys; the node writes the other N - 1 replicas itself, two-phase through the master, the
way spill moves blocks (kvstored/node/spill.py), except that nothing leaves this node::

    store.read_for_export(keys)      DRAM blocks pinned in place, SSD-only ones read from
                                     their files (checksum-verified, never promoted)
    factors.record(keys, N)          this node's inventory and events carry the factor
                                     from now on (BlockRef.replicas): a new master learns it
    one call: PutStartBatch(items (ns, key, size, replicas=N), writer=me, top_up,
                            exclude_writer, holder_reports, max_used_fraction=spill high)
              per block -> EXISTS (it has N holders: num_held) | PLACED on the peers it
                           lacks, new zones first (num_held before) | NO_CAPACITY | error
    hook("started")
    per peer:  DataPlaneClient(peer).put(its blocks, PUT_FLAG_SPARE) under the deadline
               (the peer reserves as bytes arrive, only room that drops no sole copy of
               its own, else NO_CAPACITY for the item; a torn transfer aborts its
               reservations)
    hook("sent")
    one call:  PutEndBatch(per write: commit if every peer of it stored it, else abort)
    release the exports; answer per block: replicas = num_held + peers that stored it
                                           (0 of them when the end was refused)

Why this is safe: a replica is indexed from its holder's own change event
(``holder_reports``), so the master never names a replica a peer does not report; the
master places only on nodes that hold no original of the block, never on this node; a
peer's write is visible there only once every byte arrived. A failure anywhere leaves the
block on this node (it never leaves it: this is a copy, not a move) and is reported as
fewer replicas, never silently. A redundant replica never costs a peer an original: the
PUTs carry PUT_FLAG_SPARE, so a peer whose room vanished since its last heartbeat takes a
replica only into free space, its copies, DRAM blocks also on its SSD or a redundant
replica of its own, and otherwise refuses it (NoCapacity in the outcome: fewer replicas);
a peer older than the flag stores it as any put. A put answers after every write ended (as Mooncake's put
waits for all replicas; docs/cluster.md "Replicas" says why).

Master unavailable (a failover: the leader SIGKILLed, a follower answering NotLeader, a new
leader still rebuilding its node table, an answer from an older term): the blocks go
straight to peers of the node's cached peer view (the spiller's last ListNodes,
:class:`~kvstored.node.spill.PeerRoom`), as spill does with the master down: per block the
``factor - 1`` peers with the most room (new zones first), one data-plane PUT per peer with
the factor, no master call. A peer holds an ordinary replica and reports it with its factor
(its event, or its inventory when a new leader asks), so the new leader indexes it; the
master's index never names a replica a peer does not report. For ``MASTER_RETRY_S`` after
the master failed, puts skip it (a blackholed master would cost each put ``rpc_timeout_s``).
A block short of its factor this way reports Unavailable naming the master's state and
what the cached view had (never NoCapacity: no one asked the pool).

Thread-safe: every call runs on the caller's thread (the node's gRPC executor); the peer
clients are pooled and shared. ``hook(event, **fields)`` is the test seam at the two
points above (``KVSTORED_TEST_REPLICATE_HOOK=module:function`` installs one in a daemon).
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from kvstored.errors import (
    DeadlineExceeded,
    ErrorCode,
    InvalidArgument,
    KvstoredError,
    NoCapacity,
    NotFound,
    StaleTerm,
    TransferFailed,
    Unavailable,
)
from kvstored.node.spill import MASTER_RETRY_S, PeerRoom
from kvstored.transport.base import Transport
from kvstored.transport.master_targets import TermFence
from kvstored.types import ExportedBlock

log = structlog.get_logger(__name__)

Hook = Callable[..., None]
HOOK_ENV = "KVSTORED_TEST_REPLICATE_HOOK"
MAX_REPLICAS = 8
"""Most replicas of one block (the master's limit, kvstored/master/types.py)."""
MAX_MASTER_ITEMS = 4096
"""Items of one PutStartBatch / PutEndBatch (the master's limit, master/placement.py)."""
MASTER_DOWN_ERRORS = (Unavailable, DeadlineExceeded, StaleTerm)
"""A master call's errors that mean "no master can place now" (unreachable, a follower's
NotLeader, a new leader rebuilding its node table, an older term's answer): the cached view
places instead."""
PeerViewFn = Callable[[], Sequence[PeerRoom]]
"""The node's cached peer view (healthy peers, room below the high watermark, zone)."""
MAX_FACTORS = 1 << 22
"""Most blocks whose factor a node remembers (oldest forgotten first past it)."""


class ReplicationFactors:
    """The wanted replication factor of blocks this node holds, when above 1 (sparse).

    Set by a put's Replicate (and :meth:`record`); read by the node's MasterLink for every
    BlockRef it sends (inventory and events), so a master that lost its index (a restart,
    a failover) learns each factor again from the nodes. Forgotten when the block leaves
    the node (:meth:`forget`). Bounded: past :data:`MAX_FACTORS` the oldest entry goes.
    Thread-safe.
    """

    def __init__(self, max_entries: int = MAX_FACTORS) -> None:
        self._lock = threading.Lock()
        self._factors: dict[tuple[bytes, bytes], int] = {}
        self._max = max_entries

    def __len__(self) -> int:
        return len(self._factors)

    def record(self, namespace_id: bytes, keys: Sequence[bytes], factor: int) -> None:
        """Remember ``factor`` for ``keys`` (raise-only: a lower one keeps the higher).

        Raises:
            InvalidArgument: ``factor`` outside 1..8.
        """
        if not 1 <= factor <= MAX_REPLICAS:
            raise InvalidArgument(f"replicas must be in 1..{MAX_REPLICAS}, got {factor}")
        if factor == 1:
            return
        with self._lock:
            for k in keys:
                if self._factors.get((namespace_id, k), 0) < factor:
                    self._factors[(namespace_id, k)] = factor
            while len(self._factors) > self._max:
                del self._factors[next(iter(self._factors))]

    def get(self, namespace_id: bytes, key: bytes) -> int:
        """The block's factor as recorded here (0 = none recorded: the master keeps its own)."""
        return self._factors.get((namespace_id, key), 0)

    def forget(self, blocks: Sequence[tuple[bytes, bytes]]) -> None:
        """Drop the entries of blocks that left this node."""
        with self._lock:
            for b in blocks:
                self._factors.pop(b, None)


class ReplicaStore(Protocol):
    """What the replicator needs of the node's store (TieredStore implements it)."""

    def read_for_export(self, keys: Sequence[bytes], *, namespace_id: bytes = b""
                        ) -> list[ExportedBlock | None]:
        """Per key the block to send (pinned or read privately), or None when absent."""

    def release_export(self, blocks: Sequence[ExportedBlock | None]) -> None:
        """Release what :meth:`read_for_export` returned."""


class ReplicaMaster(Protocol):
    """The master's top-up and end calls (:class:`~kvstored.transport.master_rpc.MasterClient`)."""

    def top_up_batch(self, items: Sequence[tuple[bytes, bytes, int, int]], *,
                     writer_node_id: str, max_used_fraction: float = 0.0,
                     timeout_s: float | None = None
                     ) -> list[tuple[bool, int, list[Any], int] | KvstoredError]:
        """Per ``(namespace_id, key, size_bytes, factor)``: ``(exists, generation,
        replicas, num_held)`` or the item's error."""

    def put_end_batch(self, items: Sequence[tuple[bytes, bytes, int, bool]], *,
                      timeout_s: float | None = None) -> list[int | KvstoredError]:
        """Per ``(namespace_id, key, generation, commit)``: replicas, or the item's error."""


@dataclass(frozen=True, slots=True)
class ReplicaOutcome:
    """What one block's Replicate achieved.

    Attributes:
        num_replicas: replicas the block has now as far as this call knows (this node's
            included; at least 1 when the block is here, 0 when it is not).
        num_wanted: its replication factor.
        error: why it has fewer than wanted (NoCapacity, Unavailable, TransferFailed...),
            or why nothing was done (NotFound: not on this node); None when it has them all.
    """

    num_replicas: int
    num_wanted: int
    error: KvstoredError | None = None


@dataclass(slots=True)
class _Write:
    index: int
    block: ExportedBlock
    generation: int
    num_held: int
    peers: list[tuple[str, str]]  # (node id, data address)
    stored: set[str] = field(default_factory=set)  # node ids that stored it
    no_room: set[str] = field(default_factory=set)  # node ids that answered NO_CAPACITY


def hook_from_env() -> Hook | None:
    """The hook named by ``KVSTORED_TEST_REPLICATE_HOOK=module:function`` (None when unset)."""
    spec = os.environ.get(HOOK_ENV, "")
    if not spec:
        return None
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


class PutReplicas:
    """Writes the replicas a put's blocks lack (see the module docstring).

    Args:
        store: the node's block store (the blocks are read from it, never removed).
        master: the master's top-up and end calls; None = a node without a master
            (every block answers 1 replica, Unavailable).
        transport: ``transport(data_address)`` -> a pooled data-plane client of a peer
            (kept for the replicator's lifetime, closed by :meth:`close`).
        node_id: this node's id (the writer: the first replica, never a target).
        factors: where the factors of blocks held here are remembered.
        max_used_fraction: a peer's last tier must stay at or below this fraction after
            a replica (the spill high watermark: replicas never push a peer into spilling).
        timeout_s: most seconds one Replicate takes (master calls and transfers).
        rpc_timeout_s: deadline of each master call (within ``timeout_s``).
        hook: ``hook(event, **fields)`` at ``started`` (writes) and ``sent`` (writes),
            and ``direct`` (``blocks``: [(key, [peer node ids])]) before the transfers of
            a placement through the cached view.
        peer_view: the node's cached peer view (:data:`PeerViewFn`); None = none: with
            the master unavailable a block keeps its one replica (Unavailable).
        zone: this node's failure domain ("" = none): direct placements prefer others.
    """

    def __init__(
        self,
        store: ReplicaStore,
        master: ReplicaMaster | None,
        transport: Callable[[str], Transport],
        *,
        node_id: str,
        factors: ReplicationFactors,
        max_used_fraction: float = 0.9,
        timeout_s: float = 10.0,
        rpc_timeout_s: float = 5.0,
        hook: Hook | None = None,
        peer_view: PeerViewFn | None = None,
        zone: str = "",
    ) -> None:
        self.store = store
        self.peer_view = peer_view
        self.zone = zone
        self._master_down_until = 0.0
        self.num_replicas_direct = 0  # replicas placed through the cached view
        self.num_refused_no_room = 0  # replica PUT items a peer answered NO_CAPACITY (PUT_FLAG_SPARE)
        self.master = master
        self._transport_factory = transport
        self.node_id = node_id
        self.factors = factors
        self.max_used_fraction = float(max_used_fraction)
        self.timeout_s = float(timeout_s)
        self.rpc_timeout_s = float(rpc_timeout_s)
        self.hook = hook
        self._lock = threading.Lock()
        self._peers: dict[str, Transport] = {}
        self.num_replicas_written = 0
        self.num_short = 0

    def close(self) -> None:
        """Close the peer connections (idempotent)."""
        with self._lock:
            peers, self._peers = self._peers, {}
        for t in peers.values():
            t.close()

    def _peer(self, address: str) -> Transport:
        with self._lock:
            t = self._peers.get(address)
            if t is None:
                t = self._peers[address] = self._transport_factory(address)
            return t

    def _fire(self, event: str, **fields: Any) -> None:
        if self.hook is not None:
            self.hook(event, **fields)

    def replicate(self, namespace_id: bytes, keys: Sequence[bytes], factor: int, *,
                  remaining_s: float | None = None) -> list[ReplicaOutcome]:
        """Give each block held here ``factor`` replicas on distinct nodes (this one first).

        Idempotent: a block that has them writes nothing. Blocks absent here answer
        NotFound (0 replicas); the others at least 1 (this node's), more for each peer
        that stored one and whose write the master ended.

        Args:
            namespace_id: the blocks' namespace.
            keys: block hashes held on this node.
            factor: replicas wanted per block, 1..8.
            remaining_s: the caller's time left (capped at ``timeout_s``).

        Returns:
            One :class:`ReplicaOutcome` per key, in order.

        Raises:
            InvalidArgument: ``factor`` outside 1..8.
        """
        if not 1 <= factor <= MAX_REPLICAS:
            raise InvalidArgument(f"replicas must be in 1..{MAX_REPLICAS}, got {factor}")
        budget = self.timeout_s if remaining_s is None else max(0.0, min(remaining_s,
                                                                         self.timeout_s))
        deadline = time.monotonic() + budget
        exported = self.store.read_for_export(list(keys), namespace_id=namespace_id)
        try:
            return self._replicate(namespace_id, keys, factor, exported, deadline)
        finally:
            self.store.release_export(exported)

    def _replicate(self, ns: bytes, keys: Sequence[bytes], factor: int,
                   exported: list[ExportedBlock | None], deadline: float
                   ) -> list[ReplicaOutcome]:
        out: list[ReplicaOutcome | None] = [None] * len(keys)
        present: list[tuple[int, ExportedBlock]] = []
        for i, (k, e) in enumerate(zip(keys, exported, strict=True)):
            if e is None:
                out[i] = ReplicaOutcome(0, factor, NotFound(
                    f"block {k.hex()[:16]} is not on node {self.node_id!r}; put it first"))
            else:
                present.append((i, e))
        self.factors.record(ns, [e.key for _, e in present], factor)
        if factor == 1 or not present:
            for i, _ in present:
                out[i] = ReplicaOutcome(1, factor)
            return self._done(out)
        if self.master is None:
            for i, _ in present:
                out[i] = ReplicaOutcome(1, factor, Unavailable(
                    f"node {self.node_id!r} has no master: a block has no other replica"))
            return self._done(out)
        for start in range(0, len(present), MAX_MASTER_ITEMS):  # the master's batch limit
            chunk = present[start : start + MAX_MASTER_ITEMS]
            if time.monotonic() < self._master_down_until and self.peer_view is not None:
                self._direct(ns, factor, [(i, e, "it failed within the last second")
                                          for i, e in chunk], out, deadline)
                continue
            writes, direct = self._start(ns, factor, chunk, out, deadline)
            if direct:
                self._direct(ns, factor, direct, out, deadline)
            if writes:
                self._fire("started", writes=writes)
                self._send(ns, factor, writes, deadline)
                self._fire("sent", writes=writes)
                self._end(ns, factor, writes, out)
        return self._done(out)

    def _done(self, out: list[ReplicaOutcome | None]) -> list[ReplicaOutcome]:
        done = [o for o in out if o is not None]
        assert len(done) == len(out), "every key has an outcome"
        self.num_short += sum(1 for o in done if o.num_replicas < o.num_wanted)
        return done

    def _start(self, ns: bytes, factor: int, present: list[tuple[int, ExportedBlock]],
               out: list[ReplicaOutcome | None], deadline: float
               ) -> tuple[list[_Write], list[tuple[int, ExportedBlock, str]]]:
        """One PutStartBatch(top_up) for the present blocks; fills ``out`` for every block
        that needs no write or got none. Returns the writes and, with a cached peer view,
        the blocks no master could place (:data:`MASTER_DOWN_ERRORS`), each with the cause,
        for :meth:`_direct`."""
        assert self.master is not None
        left = deadline - time.monotonic()
        if left <= 0:
            exc = Unavailable("no time left for the master's placement of the replicas")
            for i, _ in present:
                out[i] = ReplicaOutcome(1, factor, exc)
            return [], []
        direct: list[tuple[int, ExportedBlock, str]] = []
        try:
            got = self.master.top_up_batch(
                [(ns, e.key, e.size_bytes, factor) for _, e in present],
                writer_node_id=self.node_id, max_used_fraction=self.max_used_fraction,
                timeout_s=min(self.rpc_timeout_s, left))
        except KvstoredError as exc:
            log.warning("replicate_start_failed", num_blocks=len(present), error=str(exc))
            if isinstance(exc, MASTER_DOWN_ERRORS) and self.peer_view is not None:
                self._master_down_until = time.monotonic() + MASTER_RETRY_S
                return [], [(i, e, f"{type(exc).__name__}: {exc}") for i, e in present]
            if isinstance(exc, MASTER_DOWN_ERRORS):  # the cause in words, the type kept
                exc = type(exc)(f"the master could not place the replicas and node "
                                f"{self.node_id!r} has no cached peer view: {exc}")
            for i, _ in present:
                out[i] = ReplicaOutcome(1, factor, exc)
            return [], []
        writes: list[_Write] = []
        for (i, e), r in zip(present, got, strict=True):
            if isinstance(r, MASTER_DOWN_ERRORS) and self.peer_view is not None:
                direct.append((i, e, f"{type(r).__name__}: {r}"))  # e.g. a new leader rebuilding
                continue
            if isinstance(r, KvstoredError):
                out[i] = ReplicaOutcome(1, factor, r)
                continue
            exists, gen, replicas, num_held = r
            if exists:
                out[i] = ReplicaOutcome(num_held, factor)
                continue
            if not replicas:  # no other node has room: nothing was opened
                out[i] = ReplicaOutcome(num_held, factor, NoCapacity(
                    f"block {e.key.hex()[:16]} has {num_held} of {factor} replicas: no other "
                    f"node has room (or none is left that holds no replica)"))
                continue
            writes.append(_Write(i, e, gen, num_held,
                                 [(x.node_id, x.data_address) for x in replicas]))
        return writes, direct

    def _direct(self, ns: bytes, factor: int, blocks: list[tuple[int, ExportedBlock, str]],
                out: list[ReplicaOutcome | None], deadline: float) -> None:
        """Place ``factor - 1`` replicas of each block on peers of the cached view, no master
        call (no master could place them: ``cause``); fills ``out`` for each block."""
        assert self.peer_view is not None
        peers = [p for p in self.peer_view() if p.node_id != self.node_id]
        plan: dict[int, list[PeerRoom]] = {}
        by_peer: dict[str, tuple[PeerRoom, list[tuple[int, ExportedBlock]]]] = {}
        for i, e, _ in blocks:
            cands = sorted((p for p in peers if p.room_bytes >= e.size_bytes),
                           key=lambda p: (-p.room_bytes, p.node_id))
            zones = {self.zone} if self.zone else set()
            chosen: list[PeerRoom] = []
            for p in cands:  # new zones first, then the most room
                if p.zone and p.zone not in zones:
                    chosen.append(p)
                    zones.add(p.zone)
            chosen = (chosen + [p for p in cands if p not in chosen])[: factor - 1]
            plan[i] = chosen
            for p in chosen:
                p.room_bytes -= e.size_bytes  # (restored below if the peer did not store it)
                by_peer.setdefault(p.node_id, (p, []))[1].append((i, e))
        self._fire("direct", blocks=[(e.key, [p.node_id for p in plan[i]]) for i, e, _ in blocks])
        stored: dict[int, int] = {}
        refused: dict[int, int] = {}
        no_room: dict[int, int] = {}  # of refused: the peer had no room that drops nothing
        for peer, group in by_peer.values():
            ok: list[bool] = [False] * len(group)
            if time.monotonic() < deadline:
                try:
                    got = self._peer(peer.data_address).put(
                        [(e.key, e.view, e.meta) for _, e in group], ns, deadline=deadline,
                        replicas=factor, spare_only=True)
                    ok = [item.code == 0 for item in got]
                    for (i, _), item in zip(group, got, strict=True):
                        if item.code == ErrorCode.NO_CAPACITY:
                            no_room[i] = no_room.get(i, 0) + 1
                except KvstoredError as exc:
                    log.warning("replicate_direct_transfer_failed", peer=peer.node_id,
                                num_blocks=len(group), error=str(exc))
            for (i, e), good in zip(group, ok, strict=True):
                if good:
                    stored[i] = stored.get(i, 0) + 1
                else:
                    refused[i] = refused.get(i, 0) + 1
                    peer.room_bytes += e.size_bytes
        num = sum(stored.values())
        self.num_replicas_direct += num
        self.num_replicas_written += num
        for i, e, cause in blocks:
            have = 1 + stored.get(i, 0)
            err: KvstoredError | None = None
            if have < factor:
                if refused.get(i) and no_room.get(i) == refused[i]:
                    err = NoCapacity(
                        f"block {e.key.hex()[:16]} has {have} of {factor} replicas: the master "
                        f"could not place them ({cause}), and {refused[i]} of "
                        f"{len(plan[i])} peers of the cached view had no room that drops no "
                        "sole copy of theirs")
                elif refused.get(i):
                    err = TransferFailed(
                        f"block {e.key.hex()[:16]} has {have} of {factor} replicas: the master "
                        f"could not place them ({cause}), and {refused[i]} of "
                        f"{len(plan[i])} peers of the cached view did not store it")
                else:
                    err = Unavailable(
                        f"block {e.key.hex()[:16]} has {have} of {factor} replicas: the master "
                        f"could not place them ({cause}), and the cached peer view "
                        f"({len(peers)} peers) had {len(plan[i])} with room for it")
            out[i] = ReplicaOutcome(have, factor, err)
        log.info("replicate_direct_done", num_blocks=len(blocks), num_replicas=num,
                 peers=",".join(sorted(by_peer)))

    def _send(self, ns: bytes, factor: int, writes: list[_Write], deadline: float) -> None:
        """One data-plane PUT per peer of the blocks placed there, carrying the factor (the
        peer remembers it for its own inventory: ``DataPlaneServer.on_replica_factor``)."""
        by_peer: dict[tuple[str, str], list[_Write]] = {}
        for w in writes:
            for peer in w.peers:
                by_peer.setdefault(peer, []).append(w)
        for (node_id, address), group in by_peer.items():
            if time.monotonic() >= deadline:
                log.warning("replicate_out_of_time", peer=address, num_blocks=len(group))
                continue
            items = [(w.block.key, w.block.view, w.block.meta) for w in group]
            try:
                got = self._peer(address).put(items, ns, deadline=deadline, replicas=factor,
                                              spare_only=True)
            except KvstoredError as exc:
                log.warning("replicate_transfer_failed", peer=address, num_blocks=len(group),
                            error=str(exc))
                continue
            num_no_room = 0
            for w, item in zip(group, got, strict=True):
                if item.code == 0:
                    w.stored.add(node_id)
                elif item.code == ErrorCode.NO_CAPACITY:  # its room vanished: quiet
                    w.no_room.add(node_id)
                    num_no_room += 1
                else:
                    log.warning("replicate_item_refused", peer=address,
                                key=w.block.key.hex()[:16], code=item.code, error=item.message)
            if num_no_room:
                self.num_refused_no_room += num_no_room
                log.info("replicate_peer_no_room", peer=address, num_blocks=num_no_room,
                         num_sent=len(group))

    def _end(self, ns: bytes, factor: int, writes: list[_Write],
             out: list[ReplicaOutcome | None]) -> None:
        """One PutEndBatch: commit a write that some peer stored, abort the others."""
        assert self.master is not None
        try:
            ended: list[int | KvstoredError] = self.master.put_end_batch(
                [(ns, w.block.key, w.generation, bool(w.stored)) for w in writes],
                timeout_s=self.rpc_timeout_s)
        except KvstoredError as exc:
            log.warning("replicate_end_failed", num_blocks=len(writes), error=str(exc))
            ended = [exc] * len(writes)
        marks: list[tuple[bytes, str, int]] = []
        for w, n in zip(writes, ended, strict=True):
            if isinstance(n, MASTER_DOWN_ERRORS):
                # the master went away between the start and the end: a peer that stored
                # the block holds an ordinary replica and reports it itself (holder_reports)
                # to whoever leads next, exactly as one placed through the cached view
                have = w.num_held + len(w.stored)
                self.num_replicas_written += len(w.stored)
                out[w.index] = ReplicaOutcome(have, factor, None if have >= factor else Unavailable(
                    f"block {w.block.key.hex()[:16]} has {have} of {factor} replicas: the "
                    f"master became unavailable during the write ({type(n).__name__}: {n})"))
                continue
            if isinstance(n, KvstoredError):  # refused (the write lease lapsed) or failed
                out[w.index] = ReplicaOutcome(w.num_held, factor, n)
                continue
            if w.stored:  # a peer holds these bytes as an original now: ours is redundant
                marks.append((w.block.key, min(w.stored), w.block.generation))
            have = w.num_held + len(w.stored)
            self.num_replicas_written += len(w.stored)
            err = None
            missing = len(w.peers) - len(w.stored)
            if have < factor:
                err = (NoCapacity(f"block {w.block.key.hex()[:16]} has {have} of {factor} "
                                  f"replicas: {missing} of {len(w.peers)} peers had no room "
                                  "that drops no sole copy of theirs")
                       if missing and len(w.no_room) == missing else
                       TransferFailed(f"{missing} of {len(w.peers)} peers "
                                      f"did not store block {w.block.key.hex()[:16]}")
                       if missing else
                       NoCapacity(f"block {w.block.key.hex()[:16]} has {have} of {factor} "
                                  f"replicas: no other node has room (or distinct zones)"))
            out[w.index] = ReplicaOutcome(have, factor, err)
        mark = getattr(self.store, "mark_redundant", None)
        if marks and mark is not None:
            # The writer marks its own replica, never a peer's: of a block's replicas at
            # most the writer's is marked by this put, so two holders never each count on
            # the other (tiers/redundant.py). An eviction for good here then drops it
            # before a sole copy; the peer keeps the block.
            mark(marks, namespace_id=ns)


def master_replicas(store: ReplicaStore, cfg: Any, *, node_id: str, max_block_bytes: int,
                    factors: ReplicationFactors, tls: Any = None,
                    fence: TermFence | None = None, peer_view: PeerViewFn | None = None,
                    zone: str = "") -> PutReplicas:
    """A replicator over a real master (``cfg``: the node's ClusterConfig) and TCP peers;
    ``tls`` (a :class:`kvstored.security.tls.TlsFiles`, or None = plaintext): mutual TLS to
    the master and to the peers' data planes; ``fence``: the node's newest term (shared with its
    MasterLink): a placement answered by an older term is refused (StaleTerm); ``peer_view``
    and ``zone``: see :class:`PutReplicas` (placement with the master unavailable)."""
    from kvstored.transport.master_rpc import MasterClient
    from kvstored.transport.tcp import DataPlaneClient

    master = MasterClient(cfg.master_address, timeout_s=cfg.rpc_timeout_s, tls=tls, fence=fence)
    ssl_context = tls.client_context() if tls is not None else None

    def transport(address: str) -> Transport:
        return DataPlaneClient(address, pool_size=cfg.peer_pool_size,
                               max_block_bytes=max_block_bytes, ssl_context=ssl_context)

    rep = PutReplicas(store, master, transport, node_id=node_id, factors=factors,
                      max_used_fraction=cfg.spill_high_watermark,
                      timeout_s=cfg.replicate_timeout_s, rpc_timeout_s=cfg.rpc_timeout_s,
                      hook=hook_from_env(), peer_view=peer_view, zone=zone)
    close = rep.close

    def close_all() -> None:
        close()
        master.close()

    rep.close = close_all  # type: ignore[method-assign]  # also closes the master stub
    return rep
