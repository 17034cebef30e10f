"""MasterLink: a node's membership in the cluster (register, inventory, events, heartbeats).

One owned task talks to the master, one call at a time, in rounds::

    round:  [REREGISTER pending] RegisterNode(node, epoch, addresses, tiers, transports)
            [RESYNC pending]     SyncInventory(whole inventory, chunked; seq = last event seq)
            ReportEvents(diff of the inventory since the last round: seq last+1, last+2, ...)
            Heartbeat(usage, load, last_seq,          -> action: NONE | REREGISTER | RESYNC,
                      [events],
                      acked_command_ids)                 commands: the master's command
                                                         queue (copy, promote, drop, leave:
                                                         kvstored/node/replicate.py), acked
                                                         on the next Heartbeat once applied

    A master whose RegisterNodeResponse says ``heartbeat_carries_events`` takes the round's
    events in the Heartbeat (one RPC per round: it applies them as ReportEvents would, then
    the heartbeat, and answers their applied_seq); ReportEvents is then sent only for a
    backlog of more than one batch (8192 events), before the Heartbeat carries the rest. An
    older master (the field unset) gets ReportEvents, then Heartbeat, as before.

    beside the rounds (a second task, once a replicator is set): WaitCommands(acks) held
    open by the master until a command is queued for this node (a long poll: commands start
    without waiting for a heartbeat); a round also starts early when the replicator applied
    commands (:meth:`MasterLink.wake`: their replicas' ADDED events go out at once). A
    master without WaitCommands (UNIMPLEMENTED) leaves the heartbeat to carry them.

Events come from the store's change feed (kvstored/tiers/feed.py: every replica the DRAM or
SSD map gains or loses, in order), so a round costs O(changes), not O(blocks); the whole
store is listed only at (re)registration, when the master asks for a resync, or when the
feed overflowed (it then says so: a resync, never a silent loss). A store without a feed
(test doubles) is diffed between two listings instead. Either way every change the store
made between two rounds is reported, in order, with sequence numbers that have no gaps
within one epoch. Events not acknowledged (the call
failed) are resent with the same seqs; the master ignores duplicates. Any answer the master
gives that says it lost track (REREGISTER: it restarted or the lease lapsed; RESYNC: a gap)
makes the next round start over from registration or inventory, so the master's index
converges to the node's truth within one heartbeat interval of the master coming back.

Every BlockRef carries the replica's generation (the store stamps one per replica it adds,
unique per epoch: kvstored/tiers/feed.py); the master indexes the replica under it, so the
data plane's per-block generation verifies a peer's copy without a master call. It also
carries ``copy``: the DRAM replica is a remote-fill copy of a peer's block (the store evicts
it first, tiers/spare.py), so the master never counts it as the block's original (placement's
``exists`` for spill, lookups ranking); a local put of the same key re-reports the replica
ADDED with ``copy=False`` (the feed records it, kvstored/tiers/feed.py).

**Several masters** (``cluster.master_address`` = ``HOST:PORT,HOST:PORT`` or
``etcd://HOST:PORT/PFX``, kvstored/transport/master_targets.py): a round answered NotLeader
moves the link to the leader the answer names (else the next address, or the leader etcd
names), one that finds its master Unavailable or past the deadline moves to the next; the new leader answers
REREGISTER (it knows no node) and the node registers and resyncs its whole inventory there.
**Term fencing**: every answer's term goes through the node's :class:`TermFence` (shared
with its spiller and remote reads); an answer from a term older than the newest seen is
refused (StaleTerm): the round fails and nothing in it is acted on (no action, no
promotion), and the link moves on.

The master being unreachable never affects serving: failures are logged
(rate-limited) and retried next round. One answer is final: the daemon's first registration
refused as a duplicate (AlreadyExists: another live daemon holds the node id); the daemon
waits for that first answer at start (:meth:`MasterLink.wait_first_registration`) and
exits with a configuration error.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Protocol

import grpc
import structlog

from kvstored.config import ClusterConfig
from kvstored.errors import (
    AlreadyExists,
    DeadlineExceeded,
    KvstoredError,
    NotLeader,
    StaleTerm,
    Unavailable,
)
from kvstored.node.put_replicas import ReplicationFactors
from kvstored.node.replicate import Replicator
from kvstored.pb_enum import pb_enum
from kvstored.rpc_status import error_from_rpc, no_answer_error
from kvstored.security.tls import TlsFiles, open_aio_channel
from kvstored.tiers.feed import Change
from kvstored.transport.master_targets import (
    RECONNECT_BACKOFF_OPTIONS,
    TermFence,
    leader_hint,
    parse_master_targets,
    read_leader,
)
from kvstored.types import BlockInfo, StoreStats, Tier
from kvstored.v1 import common_pb2 as cpb
from kvstored.v1 import master_pb2 as pb
from kvstored.v1 import master_pb2_grpc as pb_grpc

log = structlog.get_logger(__name__)

_LIST_ALL = 1 << 40
_MAX_EVENTS_PER_CALL = 8192
COMMAND_POLL_WAIT_S = 2.0
_POLL_IDLE_S = 0.05  # how often the poll looks again while the link is not registered
"""How long the master holds one WaitCommands call of this node (``wait_ms``) at most."""

ReplicaKey = tuple[bytes, bytes, int]  # (namespace_id, key, tier)
Replica = tuple[int, int, bool]  # (size_bytes, generation, copy)


class InventorySource(Protocol):
    """What the link reads from the node's store (a :class:`TieredStore` fits)."""

    def list_blocks(self, *, namespace_id: bytes = b"", limit: int = 10000) -> tuple[list[BlockInfo], bool]:
        """Up to ``limit`` blocks (of ``namespace_id``; b"" = every namespace), as
        ``(blocks, truncated)``; ``truncated`` is True when more matched. Never pins or touches
        recency."""

    def stats(self) -> StoreStats:
        """The store's counters and per-tier usage now; never waits on disk I/O."""


class _FeedSource(Protocol):
    """What the link drains when the store has a change feed (``TieredStore.change_feed``)."""

    def reset(self) -> None:
        """Drop queued changes and clear the resync flag; called just before a full listing."""

    def drain(self, max_events: int | None = None) -> tuple[list[Change], bool]:
        """Take up to ``max_events`` queued changes (None: all), oldest first, as ``(changes,
        resync_needed)``; when ``resync_needed`` the changes are empty and the caller must
        :meth:`reset` and send a full inventory."""


def snapshot_inventory(store: InventorySource) -> dict[ReplicaKey, Replica]:
    """Every replica of the store: ``{(namespace_id, key, tier): (size_bytes, generation,
    copy)}`` (no pins; generation 0 when the store does not know it; ``copy`` only on the
    DRAM replica of a remote-fill copy)."""
    blocks, _ = store.list_blocks(limit=_LIST_ALL)
    out: dict[ReplicaKey, Replica] = {}
    for b in blocks:
        gens = b.generations or (0,) * len(b.tiers)
        for t, g in zip(b.tiers, gens, strict=True):
            out[(b.namespace_id, b.key, int(t))] = (b.size_bytes, g,
                                                    b.copy and int(t) == 1)  # 1 = DRAM
    return out


def _ref(rk: ReplicaKey, rep: Replica) -> pb.BlockRef:
    return pb.BlockRef(namespace_id=rk[0], key=rk[1], tier=pb_enum(cpb.Tier, rk[2]), size_bytes=rep[0],
                       generation=rep[1], copy=rep[2])


class MasterLink:
    """Keeps one node registered with the master (async ``start``/``stop``; loop only).

    Args:
        cfg: the link's settings (master address, heartbeat interval, timeouts).
        node_id: this node's name.
        epoch: this daemon start's epoch.
        grpc_address: ``host:port`` peers and kvstorectl reach the node's gRPC API on.
        data_address: ``host:port`` of the node's data plane.
        store: the node's block store (listing and usage).
        load: in-flight requests right now (pins + reservations + puts).
        executor: where store listings run (never the loop).
        zone: this node's failure domain (``[node] zone``; "" = none), sent when it registers.
        factors: the replication factors of blocks held here (put(replicas=N); every
            BlockRef carries its block's, 0 when unknown); None = none known.
        tls: mutual TLS to the master (kvstored/security/tls.py); None = plaintext.
        fence: the node's newest master term (shared with its spiller and remote reads; a
            private one if None).
        transports: the data-plane transports the node registers (``("tcp", "rdma")``
            with an RDMA device: kvstored/node/rdma_node.py).

    Raises:
        InvalidArgument: ``cfg.master_address`` is malformed.
    """

    def __init__(
        self,
        cfg: ClusterConfig,
        *,
        node_id: str,
        epoch: int,
        grpc_address: str,
        data_address: str,
        store: InventorySource,
        load: Callable[[], float],
        executor: Executor | None = None,
        zone: str = "",
        factors: ReplicationFactors | None = None,
        tls: TlsFiles | None = None,
        fence: TermFence | None = None,
        transports: Sequence[str] = ("tcp",),
    ) -> None:
        self.cfg = cfg
        self.transports = list(transports)  # advertised when registering (NodeInfo.transports)
        self.tls = tls
        self.targets = parse_master_targets(cfg.master_address, "cluster.master_address")
        self.address = self.targets.first()  # the master talked to now ("": ask etcd)
        self.fence = fence if fence is not None else TermFence()
        self._hint = ""  # the leader a NotLeader answer named
        self.node_id = node_id
        self.epoch = epoch
        self.grpc_address = grpc_address
        self.data_address = data_address
        self.store = store
        self.load = load
        self.executor = executor
        self.zone = zone
        self.factors = factors
        self.registered = False
        self.synced = False
        self.seq = 0
        self.master_epoch = 0
        self.lease_s = 0.0
        self.num_rounds = 0
        self.num_listings = 0  # full inventories taken (registration, resync, overflow)
        self.num_copies_kept = 0  # copies the master asked to keep as originals
        self.feed: _FeedSource | None = getattr(store, "change_feed", None)
        self._known: dict[ReplicaKey, Replica] = {}
        self._unacked: list[pb.BlockEvent] = []
        self._sync_ids = itertools.count(1)
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.MasterServiceStub | None = None
        self._task: asyncio.Task[None] | None = None
        self._last_error = ""
        self.departures_announced = False
        """The master queues PEER_LEFT on every departure (RegisterNodeResponse)."""
        self.heartbeat_carries_events = False
        """The master applies events a Heartbeat carries (RegisterNodeResponse): a round is
        then one RPC (its ReportEvents folded into the Heartbeat); False (an older master,
        or not registered yet): ReportEvents, then Heartbeat."""
        self.num_report_events_calls = 0  # ReportEvents RPCs sent (tests)
        self._marks_trusted = False  # what the store was last told (set_marks_trusted)
        self._marks_term = 0  # the master term the marks were made under
        self.num_registrations = 0
        self.refused: AlreadyExists | None = None  # the first registration, as a duplicate
        self._first_answer = asyncio.Event()
        # applies the master's commands (kvstored/node/replicate.py); set by the daemon
        self.replicator: Replicator | None = None
        self.left = False  # drained: unregistered on the master's LEAVE, no more rounds
        self._leaving = False
        self._wake = asyncio.Event()  # start the next round now (commands were applied)
        self._poll_task: asyncio.Task[None] | None = None
        self.poll_wait_s = COMMAND_POLL_WAIT_S
        self.num_polls = 0  # WaitCommands answers taken (tests, metrics)
        # test hook (kvstored/node/fault_hooks.py ``master_link_before_reregister``): run on
        # a worker thread before every registration but the first; None in production
        self.before_reregister: Callable[[], None] | None = None

    def wake(self) -> None:
        """Run the next round now instead of after the interval (loop only)."""
        self._wake.set()

    def request_leave(self) -> None:
        """Unregister after the current round and stop heartbeating (the master's LEAVE
        command once a drain re-homed this node's blocks). Loop only."""
        self._leaving = True

    # ---- lifecycle -------------------------------------------------------------------
    async def _ensure_stub(self) -> pb_grpc.MasterServiceStub:
        if self._stub is None:
            if not self.address:  # etcd only: the leader's record names it
                leader, _ = await read_leader(self.targets, timeout_s=self.cfg.rpc_timeout_s)
                if not leader:
                    raise NotLeader("no master leads right now (etcd "
                                    f"{','.join(self.targets.etcd_endpoints)})")
                self.address = leader
            self._channel = open_aio_channel(  # one function per side: kvstored/security/tls.py
                self.address, self.tls,
                options=[("grpc.max_send_message_length", 64 << 20), *RECONNECT_BACKOFF_OPTIONS])
            self._stub = pb_grpc.MasterServiceStub(self._channel)
        return self._stub

    async def _move(self, err: KvstoredError) -> None:
        """After a failed round: go to the leader NotLeader named, else the next master."""
        hint, self._hint = self._hint, ""
        if not (isinstance(err, (NotLeader, StaleTerm))
                or type(err) in (Unavailable, DeadlineExceeded)):
            return
        if len(self.targets.addresses) <= 1 and not self.targets.uses_etcd:
            return  # one master: stay (as before)
        if hint and hint != self.address:
            new = hint
        elif self.targets.uses_etcd:
            new = ""
        else:
            addrs = self.targets.addresses
            i = addrs.index(self.address) if self.address in addrs else -1
            new = addrs[(i + 1) % len(addrs)]
        if self._channel is not None:
            await self._channel.close()
        self._channel = None
        self._stub = None
        if new != self.address:
            log.info("master_link_moving", old=self.address, new=new or "(etcd)",
                     reason=type(err).__name__)
        self.address = new

    def _check_term(self, resp: object, what: str) -> None:
        """Refuse an answer from an older term (StaleTerm); record a newer one."""
        self.fence.observe(int(getattr(resp, "term", 0)), f"{what} from master {self.address}")

    async def start(self) -> None:
        """Start the link's task (returns at once; the master may still be unreachable)."""
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="kvstored-master-link")
        if self._poll_task is None:
            self._poll_task = asyncio.create_task(self._poll_loop(),
                                                  name="kvstored-command-poll")

    async def stop(self, *, unregister: bool = True) -> None:
        """Stop the task; tell the master this node leaves (best effort, short deadline)."""
        if self._poll_task is not None:
            self._poll_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poll_task
            self._poll_task = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if unregister and self.registered and self._stub is not None:
            try:
                await self._stub.UnregisterNode(
                    pb.UnregisterNodeRequest(node_id=self.node_id, epoch=self.epoch),
                    timeout=min(1.0, self.cfg.rpc_timeout_s),
                )
                log.info("master_unregistered", node_id=self.node_id, epoch=self.epoch)
            except grpc.RpcError as exc:
                log.warning("master_unregister_failed", error=str(error_from_rpc(exc)))
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
            self._stub = None

    async def wait_first_registration(self, timeout_s: float) -> None:
        """Wait at most ``timeout_s`` for the master's answer to the first registration
        (an unreachable master is no error: the link keeps retrying).

        Raises:
            AlreadyExists: the master refused it: another live daemon holds the node id.
        """
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._first_answer.wait(), timeout_s)
        if self.refused is not None:
            raise self.refused

    def interval_s(self) -> float:
        """Seconds between rounds: the configured interval, at most a third of the lease."""
        if self.lease_s > 0:
            return min(self.cfg.heartbeat_interval_s, self.lease_s / 3)
        return self.cfg.heartbeat_interval_s

    async def _leave(self) -> None:
        stub = await self._ensure_stub()
        await stub.UnregisterNode(
            pb.UnregisterNodeRequest(node_id=self.node_id, epoch=self.epoch),
            timeout=self.cfg.rpc_timeout_s)
        self.registered = False
        self.left = True
        log.info("master_left_drained", node_id=self.node_id, epoch=self.epoch)

    async def _loop(self) -> None:
        while True:
            try:
                if self._leaving:
                    await self._leave()
                    return
                await self.run_once()
                self._trust_marks(True)
                if self._last_error:
                    log.info("master_link_recovered", master=self.address)
                    self._last_error = ""
            except (KvstoredError, grpc.RpcError) as exc:
                if isinstance(exc, grpc.RpcError):
                    self._hint = self._hint or leader_hint(exc)
                # a master that never answered (SIGSTOPped, cut off) is Unavailable, named
                err = ((no_answer_error(exc, f"master at {self.address}", "this node's round",
                                        self.cfg.rpc_timeout_s) or error_from_rpc(exc))
                       if isinstance(exc, grpc.RpcError) else exc)
                self._trust_marks(False)  # departures may go unheard now: no mark counts
                await self._move(err)
                # rate-limit: log each distinct failure once (a duplicate's message names
                # the lease left, which changes every round)
                what = "AlreadyExists" if isinstance(err, AlreadyExists) else str(err)
                if what != self._last_error:
                    log.warning("master_link_failed", master=self.address or self.cfg.master_address,
                                error=str(err))
                    self._last_error = what
            except Exception:
                log.exception("master_link_bug")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval_s())
            self._wake.clear()

    def _trust_marks(self, ok: bool) -> None:
        """Tell the store whether its redundant-replica marks count (tiers/redundant.py):
        only while this link hears the master's departure notices (registered, synced, a
        replicator to take PEER_LEFT, a master that sends them). Untrusted clears them, so
        a mark never outlives a gap in which a keeper's departure could be missed."""
        fn = getattr(self.store, "set_marks_trusted", None)
        if fn is None:
            return
        want = bool(ok and self.registered and self.synced and self.departures_announced
                    and self.replicator is not None and not self.left)
        term = int(getattr(self.fence, "term", 0))
        if term != self._marks_term:  # another leader: it may not have heard every departure
            self._marks_term = term
            fn(False)
            self._marks_trusted = False
        if want != self._marks_trusted:
            fn(want)
            self._marks_trusted = want

    async def _poll_loop(self) -> None:
        """WaitCommands while registered (see the module docstring); the rounds' task owns
        registration and moving between masters, this one only follows it."""
        while True:
            rep = self.replicator
            if rep is None or not self.registered or self.left or self._leaving:
                # not a heartbeat interval: the first registration is usually a moment away
                await asyncio.sleep(min(self.interval_s(), _POLL_IDLE_S))
                continue
            acks = rep.take_acks()
            try:
                stub = await self._ensure_stub()
                resp = await stub.WaitCommands(
                    pb.WaitCommandsRequest(node_id=self.node_id, epoch=self.epoch,
                                           acked_command_ids=acks,
                                           wait_ms=int(self.poll_wait_s * 1000)),
                    timeout=self.poll_wait_s + self.cfg.rpc_timeout_s)
                self._check_term(resp, "WaitCommands")
            except (KvstoredError, grpc.RpcError) as exc:
                rep.restore_acks(acks)
                if (isinstance(exc, grpc.RpcError)
                        and exc.code() is grpc.StatusCode.UNIMPLEMENTED):
                    log.info("master_without_command_poll", master=self.address)
                    return  # an older master: the heartbeat answers carry the commands
                await asyncio.sleep(self.interval_s())  # the rounds' task reports failures
                continue
            except BaseException:
                rep.restore_acks(acks)
                raise
            self.num_polls += 1
            rep.observe_term(int(resp.term))
            if resp.commands:
                rep.submit(resp.commands)

    # ---- one round -------------------------------------------------------------------
    def _list_inventory(self) -> dict[ReplicaKey, Replica]:
        self.num_listings += 1
        if self.feed is not None:
            self.feed.reset()  # changes from here on are drained; earlier ones are listed
        return snapshot_inventory(self.store)

    async def _snapshot(self) -> dict[ReplicaKey, Replica]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, self._list_inventory)

    async def run_once(self) -> None:
        """One round: register / resync if needed, report events, heartbeat.

        Raises:
            grpc.RpcError: the master could not be reached (state kept for the next round).
        """
        self.num_rounds += 1
        if not self.registered:
            try:
                await self._register()
            finally:
                self._first_answer.set()
        if not self.synced:
            await self._sync()
        await self._report_events()
        await self._heartbeat()

    def _handle(self, action: int) -> None:
        if action == pb.NODE_ACTION_REREGISTER:
            log.info("master_asks_reregister", node_id=self.node_id, epoch=self.epoch)
            self.registered = False
            self.synced = False
        elif action == pb.NODE_ACTION_RESYNC:
            log.info("master_asks_resync", node_id=self.node_id, seq=self.seq)
            self.synced = False

    def _coldest_age_ms(self) -> int:
        """Ms since the last use of the store's coldest original block (pool LRU; 0 = none,
        or a store that does not tell: ``TieredStore.coldest_original_age_s``)."""
        age = getattr(self.store, "coldest_original_age_s", None)
        if age is None:
            return 0
        s = float(age())
        return int(s * 1000) if math.isfinite(s) and s > 0 else 0

    def _tiers(self) -> list[pb.TierCapacity]:
        """The store's tiers as heartbeated; the DRAM tier's ``spare_bytes`` (copies and
        blocks also on SSD: room, not use, for the master's placement) when the store tells
        (``TieredStore.spare_bytes``)."""
        st = self.store.stats()
        spare_of = getattr(self.store, "spare_bytes", None)
        spare = int(spare_of()) if spare_of is not None else 0
        return [pb.TierCapacity(tier=pb_enum(cpb.Tier, t.tier), capacity_bytes=t.capacity_bytes,
                                used_bytes=t.used_bytes, num_blocks=t.num_blocks,
                                spare_bytes=min(spare, t.used_bytes) if t.tier is Tier.DRAM else 0)
                for t in st.tiers]

    async def _register(self) -> None:
        if self.before_reregister is not None and self.num_registrations:
            await asyncio.get_running_loop().run_in_executor(None, self.before_reregister)
        stub = await self._ensure_stub()
        info = pb.NodeInfo(node_id=self.node_id, epoch=self.epoch,
                           grpc_address=self.grpc_address, data_address=self.data_address,
                           tiers=self._tiers(), transports=self.transports, zone=self.zone)
        try:
            resp = await stub.RegisterNode(pb.RegisterNodeRequest(node=info),
                                           timeout=self.cfg.rpc_timeout_s)
        except grpc.RpcError as exc:
            err = error_from_rpc(exc)
            if isinstance(err, AlreadyExists) and self.num_registrations == 0:
                self.refused = err
            self._hint = leader_hint(exc)
            raise err from None
        self._check_term(resp, "RegisterNode")
        # a (re)registration may follow a gap in which departures went unheard (this node's
        # lease lapsed, a new master): every mark goes; new puts mark again
        self._trust_marks(False)
        self.departures_announced = bool(getattr(resp, "announces_departures", False))
        self.heartbeat_carries_events = bool(getattr(resp, "heartbeat_carries_events", False))
        self.num_registrations += 1
        self.registered = True
        self.synced = False
        self.lease_s = resp.node_lease_ms / 1000.0
        self.master_epoch = resp.master_epoch
        log.info("master_registered", node_id=self.node_id, epoch=self.epoch,
                 master_epoch=resp.master_epoch, term=resp.term, master=self.address,
                 node_lease_s=self.lease_s)

    async def _sync(self) -> None:
        stub = await self._ensure_stub()
        snap = await self._snapshot()
        self._known = snap if self.feed is None else {}
        self._unacked = []  # the snapshot includes every change so far
        sync_id = next(self._sync_ids)
        items = list(snap.items())
        step = self.cfg.inventory_chunk_blocks
        chunks = [items[i : i + step] for i in range(0, len(items), step)] or [[]]
        resp = None
        for i, chunk in enumerate(chunks):
            last = i == len(chunks) - 1
            resp = await stub.SyncInventory(
                pb.SyncInventoryRequest(node_id=self.node_id, epoch=self.epoch, sync_id=sync_id,
                                        blocks=[self._ref(rk, rep) for rk, rep in chunk],
                                        last_chunk=last, seq=self.seq if last else 0),
                timeout=self.cfg.rpc_timeout_s,
            )
            self._check_term(resp, "SyncInventory")
            if resp.action != pb.NODE_ACTION_UNSPECIFIED:
                self._handle(resp.action)
                return
        self.synced = True
        log.info("master_inventory_synced", node_id=self.node_id, num_replicas=len(items),
                 seq=self.seq)

    def _diff(self, snap: dict[ReplicaKey, Replica]) -> None:
        """Turn the changes since the last snapshot into numbered events."""
        known = self._known
        for rk in [rk for rk in known if rk not in snap or snap[rk][:2] != known[rk][:2]]:
            self.seq += 1
            self._unacked.append(pb.BlockEvent(seq=self.seq, kind=pb.BLOCK_EVENT_KIND_REMOVED,
                                               block=self._ref(rk, known[rk])))
        for rk, rep in snap.items():  # a changed copy mark alone: ADDED again (re-report)
            if known.get(rk) != rep:
                self.seq += 1
                self._unacked.append(pb.BlockEvent(seq=self.seq, kind=pb.BLOCK_EVENT_KIND_ADDED,
                                                   block=self._ref(rk, rep)))
        self._known = snap

    def _drain_feed(self) -> bool:
        """Number the feed's changes as events; False when it overflowed (resync owed)."""
        assert self.feed is not None
        changes, resync = self.feed.drain()
        if resync:
            return False
        factors = self.factors
        gone: list[tuple[bytes, bytes]] = []
        for c in changes:
            self.seq += 1
            kind = pb.BLOCK_EVENT_KIND_ADDED if c.added else pb.BLOCK_EVENT_KIND_REMOVED
            factor = factors.get(c.namespace_id, c.key) if factors is not None else 0
            if factor and not c.added:
                gone.append((c.namespace_id, c.key))
            self._unacked.append(pb.BlockEvent(
                seq=self.seq, kind=kind,
                block=pb.BlockRef(namespace_id=c.namespace_id, key=c.key, tier=pb_enum(cpb.Tier, c.tier),
                                  size_bytes=c.size_bytes, generation=c.generation,
                                  copy=c.copy, replicas=factor)))
        if gone and factors is not None:
            self._forget_absent(factors, gone)
        return True

    def _forget_absent(self, factors: ReplicationFactors, blocks: list[tuple[bytes, bytes]]) -> None:
        """Forget the factors of removed blocks no tier holds any more (executor thread)."""
        exists = getattr(self.store, "exists", None)
        if exists is None:
            return
        by_ns: dict[bytes, list[bytes]] = {}
        for ns, k in blocks:
            by_ns.setdefault(ns, []).append(k)
        for ns, keys in by_ns.items():
            held = exists(keys, namespace_id=ns)
            factors.forget([(ns, k) for k, h in zip(keys, held, strict=True) if not h])

    def _ref(self, rk: ReplicaKey, rep: Replica) -> pb.BlockRef:
        ref = _ref(rk, rep)
        if self.factors is not None:
            ref.replicas = self.factors.get(rk[0], rk[1])
        return ref

    async def _report_events(self) -> None:
        if not (self.registered and self.synced):
            return
        if self.feed is None:
            self._diff(await self._snapshot())
        elif not await asyncio.get_running_loop().run_in_executor(self.executor, self._drain_feed):
            log.info("store_feed_overflowed", node_id=self.node_id, seq=self.seq)
            self.synced = False
            await self._sync()  # a full inventory replaces the lost events
            if not self.synced:
                return
        stub = await self._ensure_stub()
        # a master that takes events in the heartbeat gets the last batch there (one RPC per
        # round); only a backlog of more than one batch goes as ReportEvents first
        keep = _MAX_EVENTS_PER_CALL if self.heartbeat_carries_events else 0
        while len(self._unacked) > keep:
            batch = self._unacked[:_MAX_EVENTS_PER_CALL]
            self.num_report_events_calls += 1
            resp = await stub.ReportEvents(
                pb.ReportEventsRequest(node_id=self.node_id, epoch=self.epoch, events=batch),
                timeout=self.cfg.rpc_timeout_s,
            )
            self._check_term(resp, "ReportEvents")
            if resp.action != pb.NODE_ACTION_UNSPECIFIED:
                self._handle(resp.action)
                return
            self._unacked = [e for e in self._unacked if e.seq > resp.applied_seq]

    async def _heartbeat(self) -> None:
        if not self.registered:
            return
        load = float(self.load())
        stub = await self._ensure_stub()
        rep = self.replicator
        acks = rep.take_acks() if rep is not None else []
        # the round's events (what _report_events left: at most one batch), when the master
        # applies them here; last_seq is the seq of the last of them
        events = self._unacked if (self.heartbeat_carries_events and self.synced) else []
        try:
            resp = await stub.Heartbeat(
                pb.HeartbeatRequest(node_id=self.node_id, epoch=self.epoch, tiers=self._tiers(),
                                    load=load if math.isfinite(load) else 0.0, last_seq=self.seq,
                                    acked_command_ids=acks,
                                    coldest_age_ms=self._coldest_age_ms(), events=events),
                timeout=self.cfg.rpc_timeout_s,
            )
        except BaseException:
            if rep is not None:
                rep.restore_acks(acks)
            raise
        try:  # an answer of an older term: nothing in it is acted on, the acks go again
            self._check_term(resp, "Heartbeat")
        except StaleTerm:
            if rep is not None:
                rep.restore_acks(acks)
            raise
        if rep is not None:
            # fencing by term: once answers carry the leader's term (master HA), commands of
            # an older term are refused by the replicator (absent field: 0, no fencing)
            rep.observe_term(int(getattr(resp, "term", 0) or 0))
            if resp.commands:
                rep.submit(resp.commands)
        if events and resp.action == pb.NODE_ACTION_UNSPECIFIED:  # as ReportEvents' answer
            self._unacked = [e for e in self._unacked if e.seq > resp.applied_seq]
        if resp.node_lease_ms:
            self.lease_s = resp.node_lease_ms / 1000.0
        self._handle(resp.action)
        keep = getattr(self.store, "keep_copies", None)
        if resp.promote_copies and keep is not None:  # the pool's last replicas: keep them
            blocks = [(bytes(b.namespace_id), bytes(b.key)) for b in resp.promote_copies]
            n = await asyncio.get_running_loop().run_in_executor(self.executor, keep, blocks)
            self.num_copies_kept += n
            log.info("master_promoted_copies", node_id=self.node_id, num_asked=len(blocks),
                     num_kept=n)
