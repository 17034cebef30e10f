"""NodeService: the thin grpc.aio adapter over :class:`~kvstored.node.core.NodeCore`.

Each method decodes its request, calls the core and encodes the response. The store never
holds its lock during disk I/O (tiers/tiered.py), so the metadata calls of the hot path
(LookupPrefix, Exists, CommitPut, ReleasePins, Stats) run on the loop and never wait for a
disk. PinBlocks pins on the loop when every block is a DRAM hit or a miss; when one needs a
promotion from SSD it runs in the named, bounded store executor (``kvstored-store-*``),
where only that request waits for its read. ReservePut, and an inline Put of at most
LOOP_PUT_MAX_BYTES, run on the loop when the batch fits in free space (or there is no SSD
tier: evictions are metadata only), else in the executor (an eviction may demote: disk I/O).
Remove (file deletion) and calls that copy larger payloads (inline Put/Get, ListBlocks) run
in the executor; without an SSD tier Remove is metadata-only and runs on the loop.

Sessions (a grant needs one: enforced in kvstored/node/grants.py for every caller):
``OpenSession`` is a server stream that sends the session id once and stays open
until the client goes away. The session is closed in the core (which releases what it held;
fencing rule: kvstored/node/sessions.py) on ``CloseSession`` (the client's ack), or when the
stream ends and the client's process is gone: the request names the client's pid, the node
holds a pidfd of it, and a stream that ends while that process still lives (a stopped
process whose connection was dropped) keeps the session until the pidfd reports the exit
(``loop.add_reader``; no polling). :meth:`NodeServicer.end_sessions` ends everything at
shutdown so the server's grace period is not spent waiting for the streams.

Tenants (docs/tenants.md): every method that names a namespace scopes its id by the tenant
the request acts for (:meth:`NodeServicer._ns`; kvstored/node/tenants.py) before the core sees
it, so the store, the master's index and the peers only see stored ids and one tenant's
request never addresses another's blocks. A session is bound to its tenant at OpenSession;
ListBlocks crosses tenants only for an admin of the shared tenant; ``node.shm_tenants`` keeps
other tenants off the arena (Describe hides it, pins and reservations are refused).

Errors: a :class:`KvstoredError` becomes a gRPC status (kvstored/rpc_status.py) whose trailing
metadata carries ``kvstored-error-code``; anything else becomes INTERNAL and is logged once
with its traceback. Requests are parsed here rather than by grpc, so a garbage protobuf gets
INVALID_ARGUMENT (error code INVALID_ARGUMENT) instead of an opaque deserialization failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import itertools
import os
import select
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
import structlog
from google.protobuf.message import DecodeError, Message

from kvstored.auth import Role, require_role
from kvstored.errors import (
    BatchTooLarge,
    ErrorCode,
    InternalError,
    InvalidArgument,
    KvstoredError,
    NoCapacity,
    NotFound,
    Unavailable,
)
from kvstored.log import bind_request, new_request_id, request_lines_enabled, unbind_request
from kvstored.node.core import NodeCore
from kvstored.node.grants import require_session
from kvstored.node.limits import MAX_META_BYTES
from kvstored.node.reads import GetOutcome
from kvstored.node.tenants import (
    SessionTenants,
    check_shm_tenant,
    declared_tenant,
    effective_tenant,
    request_principal,
)
from kvstored.pb_enum import pb_enum, pb_enums
from kvstored.rpc_status import grpc_status, grpc_trailing_metadata
from kvstored.security.identity import principal_of
from kvstored.tenancy import scope_namespace, split_namespace
from kvstored.tiers.base import NEEDS_IO
from kvstored.types import PinnedBlock, PutOutcome, Reservation, Tier

if TYPE_CHECKING:
    from kvstored.node.put_replicas import PutReplicas
    from kvstored.node.rdma_node import NodeRdma
    from kvstored.node.rdma_peers import PeerTransports
    from kvstored.node.remote import RemoteReads
    from kvstored.node.slots import GrantedSlot
from kvstored.v1 import common_pb2 as cpb
from kvstored.v1 import node_pb2 as pb

log = structlog.get_logger(__name__)

SERVICE_NAME = "kvstored.v1.NodeService"
T = TypeVar("T")

_OK = cpb.ItemStatus()
LOOP_PUT_MAX_BYTES = 64 << 10
"""An inline Put carrying at most this many value bytes is stored on the event loop (the
copy takes microseconds); larger ones are copied in the store executor."""


def item_status(err: KvstoredError | None) -> cpb.ItemStatus:
    """The wire form of one item's result (default = OK)."""
    if err is None:
        return _OK
    return cpb.ItemStatus(code=pb_enum(cpb.ErrorCode, err.code), message=str(err))


def _tier(t: Tier | None) -> cpb.Tier:
    return pb_enum(cpb.Tier, t if t is not None else cpb.TIER_UNSPECIFIED)


def _column_writes(req: pb.CommitSlotsRequest) -> list[tuple[int, bytes, int, bytes]]:
    """The writes of a CommitSlots sent as packed columns, as ``(slot_id, key, size_bytes,
    meta)`` (meta empty: a batch with metas comes as ``writes``).

    Raises:
        InvalidArgument: the columns differ in length, or ``writes`` is also set.
    """
    ids, keys, sizes = req.write_slot_ids, req.write_keys, req.write_sizes
    if req.writes or not len(ids) == len(keys) == len(sizes):
        raise InvalidArgument(
            "CommitSlots write columns must be alone and of one length: got "
            f"{len(req.writes)} writes, {len(ids)} write_slot_ids, {len(keys)} write_keys and "
            f"{len(sizes)} write_sizes"
        )
    return list(zip(ids, keys, sizes, itertools.repeat(b"")))


def _add_slots(resp: pb.CommitSlotsResponse, slots: Sequence[GrantedSlot],
               columns: bool = False) -> None:
    """Slots granted, into ``resp``: packed columns (``columns``), else field by field (a
    keyword message costs ~1.5 us each)."""
    if columns:
        if slots:
            ids, offsets, sizes = zip(*slots, strict=True)
            resp.slot_ids.extend(ids)
            resp.slot_offsets.extend(offsets)
            resp.slot_sizes.extend(sizes)
        return
    add = resp.slots.add
    for g in slots:
        m = add()
        m.slot_id = g.slot_id
        m.offset = g.offset
        m.size_bytes = g.size_bytes


def _put_results(outcomes: list[PutOutcome]) -> list[pb.PutResult]:
    return [  # an unset status is OK
        pb.PutResult(stored=o.stored) if o.error is None else pb.PutResult(status=item_status(o.error))
        for o in outcomes
    ]


def _get_result(o: GetOutcome) -> pb.GetResult:
    return pb.GetResult(
        status=item_status(o.error), found=o.found, value=o.value, meta=o.meta, tier=_tier(o.tier)
    )


def _add_through(keys: list[bytes], out: list[GetOutcome],
                 through: dict[bytes, tuple[bytes, bytes] | None], budget_bytes: int
                 ) -> list[GetOutcome]:
    """Answer the misses of an inline Get that a fill received without room to keep them
    (``RemoteReads.fill(through=...)``), within the reply's budget: past it (or when the
    fill left it out for the budget: None), such an item gets BatchTooLarge, so the client
    asks for it again, as long as the reply carries a value; so does a block the fill
    found (None) that is a miss here now (its copy was evicted by the fill's next copy).
    Each such call answers at least one value; a block no node holds is a miss at once."""
    used = sum(len(o.value) for o in out if o.found)
    res = list(out)
    later: list[int] = []  # to fetch in another call (the client asks again)
    for i, (k, o) in enumerate(zip(keys, out, strict=True)):
        if k not in through or o.found or o.error is not None:
            continue  # (not in through: the master named no replica, a true miss)
        got = through[k]
        if got is None or (used and used + len(got[0]) > budget_bytes):
            later.append(i)
            continue
        used += len(got[0])
        res[i] = GetOutcome(True, value=got[0], meta=got[1], tier=Tier.DRAM)
    if used:  # (a reply with no value would make the client ask forever: misses then)
        for i in later:
            res[i] = GetOutcome(False, error=BatchTooLarge(
                f"inline response budget of {budget_bytes} bytes reached at key #{i}; fetch "
                "the remaining keys in another call or use the data plane"))
    return res


def _mark_through(blocks: Any, keys: list[bytes], got: list[Any], before: list[bool],
                  through: dict[bytes, tuple[bytes, bytes] | None], sizes: dict[bytes, int]
                  ) -> None:
    """Mark the misses of a PinBlocks answer whose block the pool holds but this node did not
    keep (``PinnedBlock.through``: the fill found a replica, or the block was here before
    the fill: ``NodeServicer._fill_from_peers``): the client reads exactly those by Get,
    which streams them through. A block whose size the fill learnt carries it
    (``size_bytes``: the client batches its Gets by the inline budget); a key that was not
    here and that the master named no replica for stays a plain miss.

    Args:
        blocks: the response's PinnedBlock messages, one per key.
        keys: the request's keys.
        got: the pin's result per key (a PinnedBlock, None = a miss, or an item error).
        before: per key, whether it was here before the fill.
        through: the fill's ``through`` (keys only; mark-only fill: no values).
        sizes: the fill's ``through_sizes`` (bytes per key).
    """
    for m, k, b, here in zip(blocks, keys, got, before, strict=True):
        if b is None and (here or k in through):
            m.through = True
            size = sizes.get(k)
            if size is not None:
                m.size_bytes = size


def _time_left(ctx: Any) -> float | None:
    """Seconds left of the caller's gRPC deadline (None = none set)."""
    try:
        return ctx.time_remaining()
    except AttributeError:
        return None


class NodeServicer:
    """The node's gRPC methods (see protos/kvstored/v1/node.proto).

    Args:
        core: request handling.
        executor: where blocking core calls run (bounded, named threads).
        version: reported by Describe.
        check_roles: judge each call by its caller's certificate (:data:`METHOD_ROLES`).
            The daemon passes False only when it has no ``[tls]``: every caller is then
            TRUSTED_LOCAL, which holds every role, so skipping the check changes nothing and
            saves reading the auth context on every call.

    Attributes:
        remote: reads across the pool (a cluster node): set by the daemon once the node
            knows its master; None = this node's blocks only.
        replicator: a put's extra replicas (Replicate; kvstored/node/put_replicas.py): set
            by the daemon of a cluster node; None = no master (every block answers 1).
        replicas_for: ``replicas_for(namespace_id)`` -> the replicas a put of that namespace
            wants when its client names none (``[cluster] default_replicas`` /
            ``namespace_replicas``; Describe answers it).
        rdma: this node's RDMA device and arena MR (ConnectRdma answers from it): set by
            the daemon when ``[rdma]`` found a device; None = TCP only.
        peer_transports: the transport choice of reads across the pool (Stats counts its
            paths): set by the daemon of a cluster node.
    """

    def __init__(self, core: NodeCore, executor: Executor, *, version: str,
                 check_roles: bool = True) -> None:
        self.core = core
        self.check_roles = check_roles
        self._executor = executor
        self._version = version
        cfg = core.cfg
        has_ssd = cfg.ssd_dir is not None and cfg.ssd_size_bytes > 0
        self._has_ssd = has_ssd
        self.remote: RemoteReads | None = None
        self.replicator: PutReplicas | None = None
        self.replicas_for: Callable[[bytes], int] = lambda namespace_id: 1
        self.rdma: NodeRdma | None = None  # this node's RDMA side (node/rdma_node.py)
        self.peer_transports: PeerTransports | None = None  # reads of peers, by path
        self.control_path = ""  # the control channel's socket (node/control.py), "" = none
        self._sessions_end: asyncio.Event | None = None  # created on the server's loop
        self._process_watches: dict[int, int] = {}  # pidfd -> session id (stream gone, pid alive)
        self.session_tenants = SessionTenants()  # session id -> its tenant (node/tenants.py)

    def end_sessions(self) -> None:
        """End every OpenSession stream and process watch (shutdown; on the server's loop)."""
        if self._sessions_end is None:
            self._sessions_end = asyncio.Event()
        self._sessions_end.set()
        for pidfd in list(self._process_watches):
            self._process_exited(pidfd)

    def num_process_watches(self) -> int:
        """Sessions whose stream ended while their process still runs."""
        return len(self._process_watches)

    def _process_exited(self, pidfd: int) -> None:
        session_id = self._process_watches.pop(pidfd)
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(pidfd)
        os.close(pidfd)
        self._close_session(session_id)

    def _close_session(self, session_id: int) -> None:
        self.core.close_session(session_id)
        self.session_tenants.forget(session_id)

    def _tenant(self, ctx: Any, session_id: int = 0) -> str:
        """The tenant the request acts for (node/tenants.py); a named session must be its.

        Raises:
            PermissionDenied: another tenant's session, or a certificate's tenant overridden
                by a caller that is no admin.
            InvalidArgument: a declared tenant that is no tenant name.
        """
        tenant = effective_tenant(request_principal(ctx), declared_tenant(ctx))
        if session_id:
            self.session_tenants.check(session_id, tenant)
        return tenant

    def _ns(self, ctx: Any, namespace_id: bytes, session_id: int = 0) -> bytes:
        """The stored namespace id the request addresses: its id scoped by its tenant."""
        return scope_namespace(self._tenant(ctx, session_id), namespace_id)

    def _stream_ended(self, session_id: int, pidfd: int | None) -> None:
        """The session's stream is gone: close it, unless its process still runs."""
        ended = self._sessions_end is not None and self._sessions_end.is_set()
        if pidfd is not None and not ended and self.core.leases.is_open(session_id):
            if not select.select([pidfd], [], [], 0)[0]:  # readable = the process exited
                self._process_watches[pidfd] = session_id
                asyncio.get_running_loop().add_reader(pidfd, self._process_exited, pidfd)
                log.info("session_stream_ended_process_alive", session_id=session_id)
                return
        if pidfd is not None:
            os.close(pidfd)
        self._close_session(session_id)

    async def _fill_from_peers(
        self, keys: list[bytes], namespace_id: bytes, ctx: Any, *,
        through: dict[bytes, tuple[bytes, bytes] | None] | None = None,
        through_sizes: dict[bytes, int] | None = None,
    ) -> list[bool] | None:
        """Cluster node: copy the blocks of ``keys`` missing here from peers (see remote.py);
        with ``through``, a block with no room here lands there instead (for the reply;
        ``through_sizes``: marked only, its size there: ``RemoteReads.fill``).

        Returns:
            Per key, whether it was here before the fill (None: no master, no keys, or a bad
            key). A block that was here and is a miss by the time the read pins it (the
            fill's copies evicted a copy an earlier call made; the spiller moved the block to
            a peer, which holds it before this node drops it) is held by the pool: the reader
            asks again (``through``) rather than missing it.
        """
        remote = self.remote
        if remote is None or not keys:
            return None
        try:
            before = self.core.store.exists(keys, namespace_id=namespace_id)
        except KvstoredError:
            return None  # bad keys: the core's validation answers them
        if all(before):
            return before
        await self._run(functools.partial(
            remote.fill, keys, namespace_id, remaining_s=_time_left(ctx), through=through,
            through_budget_bytes=self.core.cfg.max_inline_bytes if through is not None else 0,
            through_sizes=through_sizes))
        return before

    @staticmethod
    async def _inline(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return fn(*args, **kwargs)

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        ctx = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._executor, functools.partial(ctx.run, fn, *args, **kwargs)
        )

    # ---- methods ---------------------------------------------------------------------------
    async def Describe(self, req: pb.DescribeRequest, ctx: Any) -> pb.DescribeResponse:
        core, cfg = self.core, self.core.cfg
        arena_path = core.store.arena_path or ""
        if cfg.shm_tenants is not None and self._tenant(ctx) not in cfg.shm_tenants:
            arena_path = ""  # not this tenant's arena: its client uses TCP or inline gRPC
        # the identity of the file the node MAPPED, recorded at creation: a file put at the
        # path later (replaced, recreated) must not pass the client's device/inode check
        dev, ino = core.store.arena_file_id if arena_path else (0, 0)
        return pb.DescribeResponse(
            node_id=cfg.node_id, version=self._version, epoch=core.epoch,
            arena_path=arena_path, arena_size_bytes=core.store.arena_size_bytes,
            data_address=core.data_address, max_block_bytes=cfg.max_block_bytes,
            max_batch_keys=cfg.max_batch_keys, max_inline_bytes=cfg.max_inline_bytes,
            draining=core.draining, listen_addresses=core.listen_addresses,
            metrics_address=core.metrics_address, arena_dev=dev, arena_ino=ino,
            max_meta_bytes=MAX_META_BYTES, min_key_bytes=cfg.min_key_bytes,
            max_key_bytes=cfg.max_key_bytes, pin_lease_ms=int(cfg.pin_lease_s * 1000),
            control_path=self.control_path,
            # [cluster] namespace_replicas names the engine's namespace id, whatever its tenant
            default_replicas=self.replicas_for(bytes(req.namespace_id)),
            transports=["tcp", "rdma"] if self.rdma is not None else ["tcp"],
        )

    async def Replicate(self, req: pb.ReplicateRequest, ctx: Any) -> pb.ReplicateResponse:
        from kvstored.node.put_replicas import MAX_REPLICAS

        ns, keys = self._ns(ctx, req.namespace_id), [bytes(k) for k in req.keys]
        factor = req.replicas or self.replicas_for(bytes(req.namespace_id))
        if not 1 <= factor <= MAX_REPLICAS:
            raise InvalidArgument(f"Replicate: replicas must be in 1..{MAX_REPLICAS} (0 = the "
                                  f"node's default), got {req.replicas}")
        if len(keys) > self.core.cfg.max_batch_keys:
            raise InvalidArgument(f"Replicate: {len(keys)} keys; the limit is "
                                  f"{self.core.cfg.max_batch_keys} (node.max_batch_keys)")
        rep = self.replicator
        if rep is None:  # no master: only this node's replica
            held = await self._run(self.core.store.exists, keys, namespace_id=ns)
            no_master = item_status(Unavailable(
                f"node {self.core.cfg.node_id!r} has no master: a block has no other replica"))
            return pb.ReplicateResponse(results=[
                pb.ReplicateResult(status=no_master if h else item_status(NotFound(
                    f"block {k.hex()[:16]} is not on this node; put it first")),
                    num_replicas=int(h), num_wanted=factor)
                for k, h in zip(keys, held, strict=True)])
        out = await self._run(rep.replicate, ns, keys, factor, remaining_s=_time_left(ctx))
        return pb.ReplicateResponse(results=[
            pb.ReplicateResult(status=item_status(o.error), num_replicas=o.num_replicas,
                               num_wanted=o.num_wanted) for o in out])

    async def Prefetch(self, req: pb.PrefetchRequest, ctx: Any) -> pb.PrefetchResponse:
        """Copy the blocks of ``req.keys`` this node lacks from their peers (the cluster get
        path, :meth:`RemoteReads.fill`: committed here as remote-fill copies), within the
        caller's deadline; pins nothing. Idempotent. A node without a master copies nothing.

        Raises:
            InvalidArgument: more than ``max_batch_keys`` keys, or a malformed key.
        """
        ns, keys = self._ns(ctx, req.namespace_id), [bytes(k) for k in req.keys]
        if len(keys) > self.core.cfg.max_batch_keys:
            raise InvalidArgument(f"Prefetch: {len(keys)} keys; the limit is "
                                  f"{self.core.cfg.max_batch_keys} (node.max_batch_keys)")
        if not keys:
            return pb.PrefetchResponse()
        self.core.check_keys(keys)
        before, _ = await self._run(self.core.exists, keys, ns)
        num_present = sum(before)
        fetched = 0
        remote = self.remote
        if remote is not None and num_present < len(keys):
            got = await self._run(functools.partial(remote.fill, keys, ns,
                                                    remaining_s=_time_left(ctx)))
            fetched = got.num_fetched
        after, _ = await self._run(self.core.exists, keys, ns)
        return pb.PrefetchResponse(num_present=num_present, num_fetched=fetched,
                                   num_missing=len(keys) - sum(after))

    def _loop_may_evict(self) -> bool:
        """Whether an eviction may run on the loop: only on a DRAM-only node (metadata only)
        whose store never waits for the pool (no spiller's backpressure installed:
        ``TieredStore.set_pool_room``; such a wait blocks until a spill round moved blocks)."""
        return not self._has_ssd and not self.core.store.has_pool_room

    async def _maybe_io(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn`` inline when it never waits (:meth:`_loop_may_evict`), else on the executor."""
        if self._loop_may_evict():
            return fn(*args, **kwargs)
        return await self._run(fn, *args, **kwargs)

    async def Put(self, req: pb.PutRequest, ctx: Any) -> pb.PutResponse:
        items = [(it.key, it.value, it.meta) for it in req.items]
        ns = self._ns(ctx, req.namespace_id)
        out: Any = NEEDS_IO
        if sum(len(v) for _, v, _ in items) <= LOOP_PUT_MAX_BYTES:
            # small values (the control channel's one-round-trip put): copied and committed
            # on the loop unless an eviction is needed that may demote to SSD (disk I/O)
            out = self.core.put_inline(items, ns, may_block=self._loop_may_evict())
        if out is NEEDS_IO:
            out = await self._run(self.core.put_inline, items, ns)
        return pb.PutResponse(results=_put_results(out))

    async def Get(self, req: pb.GetRequest, ctx: Any) -> pb.GetResponse:
        ns = self._ns(ctx, req.namespace_id)
        keys = list(req.keys)
        # a peer's block this full node has no room to keep is streamed through the reply
        through: dict[bytes, tuple[bytes, bytes] | None] = {}
        before = await self._fill_from_peers(keys, ns, ctx, through=through)
        if before is not None:  # here before and a miss now: the client asks again
            for k, present in zip(keys, before, strict=True):
                if present:
                    through.setdefault(k, None)
        budget = self.core.cfg.max_inline_bytes
        out = await self._run(self.core.get_inline, keys, ns, budget_bytes=budget)
        if through:
            lost = [k for k, o in zip(keys, out, strict=True)
                    if k in through and through[k] is None and not o.found and o.error is None]
            if lost and not any(o.found for o in out) and not any(through.values()):
                # found in the pool, lost here before the read (the fill's copy dropped by
                # the spiller or an eviction, a block moved to a peer) and the reply carries
                # no value, so BatchTooLarge cannot ask again: read them once more into
                # private buffers (never cached: nothing can drop them again)
                assert self.remote is not None  # (through is only filled with a remote)
                await self._run(functools.partial(
                    self.remote.fill, lost, ns, remaining_s=_time_left(ctx), through=through,
                    through_budget_bytes=budget, cache=False))
            out = _add_through(keys, out, through, budget)
        return pb.GetResponse(results=[_get_result(o) for o in out])

    async def ReservePut(self, req: pb.ReservePutRequest, ctx: Any) -> pb.ReservePutResponse:
        items = [(it.key, it.size_bytes, it.meta) for it in req.items]
        kwargs = dict(lease_ms=req.lease_ms, epoch=req.epoch, session_id=req.session_id,
                      request_id=req.request_id)
        core = self.core
        tenant = self._tenant(ctx, req.session_id)
        check_shm_tenant(core.cfg.shm_tenants, tenant, action="ReservePut")
        ns = scope_namespace(tenant, req.namespace_id)
        # reserved on the loop (no SSD tier and no backpressure: evictions are metadata only;
        # else only when free space holds the batch, node/local_put.py); a batch that needs an
        # eviction, which may demote to SSD (disk I/O) or wait for the spiller, goes to the
        # store executor
        rid, got = core.reserve_put_items(
            items, ns, may_block=self._loop_may_evict(), **kwargs
        )
        if got is NEEDS_IO:
            rid, got = await self._maybe_io(
                core.reserve_put_items, items, ns, **kwargs
            )
        assert isinstance(got, list), got  # a blocking call (may_block=True) never answers NEEDS_IO
        resp = pb.ReservePutResponse(reservation_id=rid)
        add = resp.reservations.add
        for x in got:
            if isinstance(x, Reservation):
                add(offset=x.offset)  # an unset status is OK
            elif x.error is None:
                add(exists=True)
            else:
                add(status=item_status(x.error))
        return resp

    async def CommitPut(self, req: pb.CommitPutRequest, ctx: Any) -> pb.CommitPutResponse:
        out = self.core.commit_put(req.reservation_id, abort=req.abort)
        return pb.CommitPutResponse(results=_put_results(out))

    async def CommitSlots(
        self, req: pb.CommitSlotsRequest, ctx: Any,
        after: list[Callable[[], Coroutine[Any, Any, pb.CommitSlotsResponse]]] | None = None,
        into: pb.CommitSlotsResponse | None = None,
    ) -> pb.CommitSlotsResponse:
        """Reserve-ahead puts (kvstored/node/slots.py): commit, return and grant slots.

        Args:
            after: the control channel's list of work to run once this answer is sent: with
                it and ``grant_after_answer``, the refill is left out of the answer
                (``grant_follows``) and appended here as a coroutine function returning the
                response of the slots granted (:meth:`_grant_after_answer`).
            into: fill this (empty) message instead of a new one (the control channel passes
                its response's field, saving a copy); returned.
        """
        core = self.core
        tenant = self._tenant(ctx, req.session_id)
        check_shm_tenant(core.cfg.shm_tenants, tenant, action="CommitSlots")
        ns = scope_namespace(tenant, req.namespace_id)
        columns = bool(req.write_slot_ids) or bool(req.write_keys) or bool(req.write_sizes)
        writes = _column_writes(req) if columns else [
            (w.slot_id, w.key, w.size_bytes, w.meta) for w in req.writes]
        want = [(w.size_bytes, w.num_slots) for w in req.want]
        later = after is not None and req.grant_after_answer and bool(want)
        kwargs = dict(session_id=req.session_id, return_slot_ids=list(req.return_slot_ids),
                      want=() if later else want, lease_ms=req.lease_ms, epoch=req.epoch,
                      request_id=req.request_id)
        if later:
            core.slots.check_want(want)  # a bad want fails the request, before its commits
        got = core.slots.commit_slots(ns, writes, may_block=self._loop_may_evict(), **kwargs)  # type: ignore[arg-type]  # kwargs values are each the right type
        if got is NEEDS_IO:  # the refill needs an eviction: the store executor
            got = await self._run(core.slots.commit_slots, ns, writes, **kwargs)
        assert isinstance(got, tuple), got
        outcomes, slots = got
        resp = pb.CommitSlotsResponse() if into is None else into
        resp.slot_budget_bytes = core.slots.budget_bytes
        resp.accepts_columns = True
        if columns and all(o.error is None for o in outcomes):
            resp.write_stored.extend([o.stored for o in outcomes])  # one packed field
        else:
            add_result = resp.results.add
            for o in outcomes:  # field by field (keyword construction costs ~1.5 us per message)
                if o.error is None:
                    add_result().stored = o.stored  # an unset status is OK
                else:
                    add_result().status.CopyFrom(item_status(o.error))
        _add_slots(resp, slots, columns)
        if later:
            assert after is not None
            resp.grant_follows = True
            after.append(functools.partial(self._grant_after_answer, ns, want, req.session_id,
                                           req.lease_ms, req.request_id, columns))
        return resp

    async def _grant_after_answer(
        self, ns: bytes, want: list[tuple[int, int]], session_id: int, lease_ms: int,
        request_id: int, columns: bool = False,
    ) -> pb.CommitSlotsResponse:
        """The refill of a CommitSlots answered with ``grant_follows`` (on the loop when it
        comes from free room, else on the store executor); ``columns``: in the packed slot
        columns (the request came with write columns)."""
        core = self.core
        kwargs = dict(session_id=session_id, lease_ms=lease_ms, request_id=request_id)
        got = core.slots.grant(ns, want, may_block=self._loop_may_evict(), **kwargs)
        if got is NEEDS_IO:
            got = await self._run(core.slots.grant, ns, want, **kwargs)
        assert isinstance(got, list), got
        resp = pb.CommitSlotsResponse(slot_budget_bytes=core.slots.budget_bytes,
                                      accepts_columns=True)
        _add_slots(resp, got, columns)
        return resp

    async def PinBlocks(
        self, req: pb.PinBlocksRequest, ctx: Any, into: pb.PinBlocksResponse | None = None
    ) -> pb.PinBlocksResponse:
        """PinBlocks; ``into``: fill this (empty) message instead of a new one (the control
        channel passes its response's field, saving a copy)."""
        require_session("PinBlocks", req.session_id)  # before a fill from peers (core checks too)
        tenant = self._tenant(ctx, req.session_id)
        check_shm_tenant(self.core.cfg.shm_tenants, tenant, action="PinBlocks")
        ns = scope_namespace(tenant, req.namespace_id)
        keys = list(req.keys)
        # a peer's block this full node has no room to keep: marked, the client reads it by
        # Get, which streams it through (no bytes are received for it here)
        through: dict[bytes, tuple[bytes, bytes] | None] = {}
        sizes: dict[bytes, int] = {}
        before = await self._fill_from_peers(keys, ns, ctx, through=through, through_sizes=sizes)
        # DRAM hits are pinned on the loop (never waits for a disk); a request that needs a
        # promotion from SSD goes to the store executor, where only it waits for its read
        pin_id, got = self.core.pin_blocks(
            keys, ns, lease_ms=req.lease_ms, epoch=req.epoch,
            session_id=req.session_id, may_block=False, request_id=req.request_id,
        )
        first = got[0] if got else None  # NEEDS_IO is all or nothing for the store's keys
        if first is NEEDS_IO or (
            not isinstance(first, PinnedBlock) and any(b is NEEDS_IO for b in got)
        ):
            pin_id, got = await self._run(
                self.core.pin_blocks, keys, ns,
                lease_ms=req.lease_ms, epoch=req.epoch, session_id=req.session_id,
                request_id=req.request_id,
            )
        out = pb.PinBlocksResponse() if into is None else into
        out.pin_id = pin_id
        add = out.blocks.add
        missed = False
        for j, b in enumerate(got):
            # set field by field: keyword construction costs ~3 us per message (upb), this ~0.4
            m = add()
            if isinstance(b, PinnedBlock):
                m.found = True
                m.offset = b.offset
                m.size_bytes = b.size_bytes
                if b.meta:
                    m.meta = b.meta
                m.tier = pb_enum(cpb.Tier, b.tier)
            elif j == 0 and isinstance(b, NoCapacity):
                # an SSD hit the store would not promote even first (DRAM holds only blocks
                # the pool has nowhere else, or pinned ones): no slot to pin, but the inline
                # Get serves it from its file (NodeReads.pinned_chunks); later keys cut at a
                # NoCapacity are asked again by the client, first in their own chunk
                m.through = True
            elif b is not None:
                m.status.CopyFrom(item_status(b))
            else:
                missed = True
        if missed and before is not None:
            _mark_through(out.blocks, keys, got, before, through, sizes)
        return out

    async def ReleasePins(self, req: pb.ReleasePinsRequest, ctx: Any) -> pb.ReleasePinsResponse:
        num_orphans = 0
        if req.orphan_request_ids:  # the client never got these grants: free them first
            self._tenant(ctx, req.session_id)  # only the session's own tenant may
            num_orphans = await self._inline(
                self.core.release_orphans, req.session_id, list(req.orphan_request_ids)
            )
        n, expired = await self._inline(self.core.release_pins_report, list(req.pin_ids))
        return pb.ReleasePinsResponse(
            num_released=n, expired_pin_ids=expired, num_orphans_released=num_orphans
        )

    async def LookupPrefix(
        self, req: pb.LookupPrefixRequest, ctx: Any
    ) -> pb.LookupPrefixResponse:
        keys = list(req.keys)
        ns = self._ns(ctx, req.namespace_id)
        tiers = await self._inline(self.core.lookup_prefix, keys, ns)
        if self.remote is not None and len(tiers) < len(keys):  # probe: never pins or fetches
            tiers = await self._run(self.remote.extend_prefix, ns, keys, tiers,
                                    remaining_s=_time_left(ctx))
        return pb.LookupPrefixResponse(num_hit_blocks=len(tiers), tiers=pb_enums(cpb.Tier, tiers))

    async def Exists(self, req: pb.ExistsRequest, ctx: Any) -> pb.ExistsResponse:
        ns = self._ns(ctx, req.namespace_id)
        present, tiers = await self._inline(
            self.core.exists, list(req.keys), ns, with_tiers=req.with_tiers
        )
        if self.remote is not None and not all(present):  # probe: never pins or fetches
            present, tiers = await self._run(
                self.remote.exists, ns, list(req.keys), present, tiers,
                remaining_s=_time_left(ctx))
        return pb.ExistsResponse(exists=present, tiers=[_tier(t) for t in tiers])

    async def Remove(self, req: pb.RemoveRequest, ctx: Any) -> pb.RemoveResponse:
        removed = await self._maybe_io(
            self.core.remove, list(req.keys), self._ns(ctx, req.namespace_id)
        )
        return pb.RemoveResponse(removed=removed)

    async def Stats(self, req: pb.StatsRequest, ctx: Any) -> pb.StatsResponse:
        s = await self._inline(self.core.stats)
        core = self.core
        return pb.StatsResponse(
            node_id=core.cfg.node_id, epoch=core.epoch,
            tiers=[
                pb.TierStats(
                    tier=pb_enum(cpb.Tier, t.tier), capacity_bytes=t.capacity_bytes, used_bytes=t.used_bytes,
                    num_blocks=t.num_blocks, hits=t.hits, evictions=t.evictions,
                )
                for t in s.tiers
            ],
            gets=s.gets, hits=s.hits, misses=s.misses, puts=s.puts, put_failures=s.put_failures,
            checksum_failures=s.checksum_failures, pinned_blocks=s.pinned_blocks,
            uptime_s=core.uptime_s(), draining=core.draining,
            quarantined_bytes=core.quarantined_bytes(), num_sessions=core.leases.num_sessions(),
            **self._rdma_stats(),
        )

    def _rdma_stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.peer_transports is not None:
            c = self.peer_transports.counts
            out.update(remote_rdma_blocks=c.rdma_blocks, remote_tcp_blocks=c.tcp_blocks,
                       rdma_fallbacks=c.fallbacks)
        if self.rdma is not None:
            out.update(rdma_device=self.rdma.device, rdma_sessions=self.rdma.num_sessions)
        return out

    async def ConnectRdma(self, req: pb.ConnectRdmaRequest, ctx: Any) -> pb.ConnectRdmaResponse:
        rdma = self.rdma
        if rdma is None:
            raise NotFound(f"node {self.core.cfg.node_id!r} has no RDMA device ([rdma] "
                           "enabled = off, or none found); read it over TCP")
        sid, advert = await self._run(rdma.accept, bytes(req.advert), node_id=req.node_id,
                                      epoch=req.epoch)
        return pb.ConnectRdmaResponse(advert=advert, session_id=sid,
                                      arena_size_bytes=rdma.arena_size_bytes,
                                      arena_path=rdma.arena_path, epoch=self.core.epoch)

    async def DisconnectRdma(self, req: pb.DisconnectRdmaRequest, ctx: Any
                             ) -> pb.DisconnectRdmaResponse:
        if self.rdma is not None:
            await self._inline(self.rdma.disconnect, req.session_id)
        return pb.DisconnectRdmaResponse()

    async def ListBlocks(self, req: pb.ListBlocksRequest, ctx: Any) -> pb.ListBlocksResponse:
        # an admin of the shared tenant lists every tenant, under stored namespace ids
        # (kvstored.tenancy.split_namespace names the tenant); anyone else lists only its
        # own tenant's blocks, under the ids it knows them by
        principal = request_principal(ctx)
        tenant = self._tenant(ctx)
        cross = not tenant and principal.has("admin")
        ns = scope_namespace(tenant, req.namespace_id) if req.namespace_id else b""
        blocks, truncated = await self._run(self.core.list_blocks, ns, req.limit)
        out = pb.ListBlocksResponse(truncated=truncated)
        for b in blocks:
            ns_id = b.namespace_id
            if not cross:
                owner, ns_id = split_namespace(b.namespace_id)
                if owner != tenant:
                    continue
            out.blocks.add(
                key=b.key, size_bytes=b.size_bytes, namespace_id=ns_id,
                tiers=[pb_enum(cpb.Tier, t) for t in b.tiers], pinned=b.pinned,
            )
        return out


    async def OpenSession(self, req: pb.OpenSessionRequest, context: Any) -> None:
        """Send the session id, then hold the stream until the client or the node ends it."""
        try:
            if self.check_roles:
                require_role(principal_of(context), *METHOD_ROLES["OpenSession"],
                             action="NodeService.OpenSession")
        except KvstoredError as exc:
            await context.abort(grpc_status(exc), str(exc), trailing_metadata=grpc_trailing_metadata(exc))
        core = self.core
        if self._sessions_end is None:
            self._sessions_end = asyncio.Event()
        ended = self._sessions_end
        peer = context.peer()
        tenant = self._tenant(context)  # before a pidfd is opened: a refusal leaks nothing
        pidfd = _open_pidfd(req.pid)
        session_id = core.open_session(f"{peer} {req.client_name}".strip())
        self.session_tenants.bind(session_id, tenant)
        try:
            await context.write(pb.SessionEvent(session_id=session_id, epoch=core.epoch))
            await ended.wait()
        finally:  # also on cancellation: the client's stream (socket) is gone
            self._stream_ended(session_id, pidfd)

    async def CloseSession(self, req: pb.CloseSessionRequest, ctx: Any) -> pb.CloseSessionResponse:
        self._tenant(ctx, req.session_id)  # another tenant may not end (and free) this session
        for pidfd, session_id in list(self._process_watches.items()):
            if session_id == req.session_id:
                self._process_exited(pidfd)  # acked: no need to wait for the process
        await self._inline(self._close_session, req.session_id)
        return pb.CloseSessionResponse()


def _open_pidfd(pid: int) -> int | None:
    """A pidfd of the client's process, or None (pid 0, not found, or no pidfd support)."""
    if pid <= 0 or not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


ENGINE_ROLES: tuple[Role, ...] = ("engine", "node", "admin")
READ_ROLES: tuple[Role, ...] = ("engine", "node", "admin")
METHOD_ROLES: dict[str, tuple[Role, ...]] = {
    "Describe": READ_ROLES, "Stats": READ_ROLES, "ListBlocks": READ_ROLES,
    "LookupPrefix": READ_ROLES, "Exists": READ_ROLES,
    "Put": ENGINE_ROLES, "Get": ENGINE_ROLES, "ReservePut": ENGINE_ROLES,
    "CommitPut": ENGINE_ROLES, "CommitSlots": ENGINE_ROLES, "PinBlocks": ENGINE_ROLES, "ReleasePins": ENGINE_ROLES,
    "OpenSession": ENGINE_ROLES, "CloseSession": ENGINE_ROLES, "Replicate": ENGINE_ROLES,
    "Remove": ("admin",), "Prefetch": ("node", "admin"),
    # an rkey READs the whole arena, every tenant's blocks: a node's call only
    "ConnectRdma": ("node",), "DisconnectRdma": ("node",),
}
"""Who may call each NodeService method (:func:`kvstored.auth.require_role`): removing
blocks (kvstorectl evict) is an admin's; puts, gets and their sessions are an engine's (and
a node's or an admin's: a node reads and writes for its engines, an admin may check a
block); the read-only views are everyone's. The principal comes from the caller's TLS
certificate; on a unix socket, or without TLS, it is TRUSTED_LOCAL (every role)."""

_METHODS: dict[str, type[Message]] = {
    "Describe": pb.DescribeRequest,
    "Put": pb.PutRequest,
    "Get": pb.GetRequest,
    "ReservePut": pb.ReservePutRequest,
    "CommitPut": pb.CommitPutRequest,
    "CommitSlots": pb.CommitSlotsRequest,
    "PinBlocks": pb.PinBlocksRequest,
    "ReleasePins": pb.ReleasePinsRequest,
    "LookupPrefix": pb.LookupPrefixRequest,
    "Exists": pb.ExistsRequest,
    "Remove": pb.RemoveRequest,
    "Stats": pb.StatsRequest,
    "ListBlocks": pb.ListBlocksRequest,
    "CloseSession": pb.CloseSessionRequest,
    "Replicate": pb.ReplicateRequest,
    "ConnectRdma": pb.ConnectRdmaRequest,
    "DisconnectRdma": pb.DisconnectRdmaRequest,
    "Prefetch": pb.PrefetchRequest,
}


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


def _wrap(
    name: str,
    req_cls: type[Message],
    fn: Callable[[Any, Any], Awaitable[Message]],
    servicer: NodeServicer,
) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[Message]]:
    metrics = servicer.core.metrics
    roles = METHOD_ROLES[name]
    check_roles = servicer.check_roles

    async def handle(raw: bytes, context: grpc.aio.ServicerContext) -> Message:
        # every line logged while serving this call names it (kvstored/log.py)
        token = bind_request({"method": name, "peer": context.peer(), "request_id": new_request_id()})
        try:
            return await _serve(raw, context)
        finally:
            unbind_request(token)

    async def _serve(raw: bytes, context: grpc.aio.ServicerContext) -> Message:
        t0 = time.perf_counter()
        err: KvstoredError
        try:
            if check_roles:
                require_role(principal_of(context), *roles, action=f"NodeService.{name}")
            try:
                request = req_cls.FromString(raw)
            except DecodeError as exc:
                raise InvalidArgument(
                    f"cannot parse the {req_cls.__name__} of {name} ({len(raw)} bytes): "
                    f"{exc}; the request is not a valid kvstored.v1 protobuf"
                ) from None
            response = await fn(request, context)
            duration_s = time.perf_counter() - t0
            if metrics is not None:
                metrics.count_rpc(name, "OK", duration_s)
            if request_lines_enabled(__name__):
                log.debug("rpc_served", duration_ms=round(duration_s * 1000, 3))
            return response
        except KvstoredError as exc:
            err = exc
            log.debug("rpc_failed", code=exc.code.name, error=str(exc))
        except Exception:
            log.exception("rpc_failed_internally")
            err = InternalError(f"internal error in {name}; see the node's log")
        if metrics is not None:
            metrics.count_rpc(name, ErrorCode(err.code).name, time.perf_counter() - t0)
        await context.abort(grpc_status(err), str(err), trailing_metadata=grpc_trailing_metadata(err))
        raise AssertionError("unreachable: context.abort raises")  # pragma: no cover

    return handle


def _counted(
    core: NodeCore, handle: Callable[[bytes, grpc.aio.ServicerContext], Awaitable[Message]]
) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[Message]]:
    """Count the handler in ``core.rpcs_in_flight`` while it runs (the drain waits on it)."""

    async def counted(raw: bytes, context: grpc.aio.ServicerContext) -> Message:
        core.rpcs_in_flight += 1
        try:
            return await handle(raw, context)
        finally:
            core.rpcs_in_flight -= 1

    return counted


def add_node_service(server: grpc.aio.Server, servicer: NodeServicer) -> None:
    """Register the NodeService methods of ``servicer`` on ``server``."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        name: grpc.unary_unary_rpc_method_handler(
            _counted(servicer.core, _wrap(name, req_cls, getattr(servicer, name), servicer)),
            request_deserializer=None,
            response_serializer=_serialize,
        )
        for name, req_cls in _METHODS.items()
    }
    handlers["OpenSession"] = grpc.unary_stream_rpc_method_handler(
        servicer.OpenSession,
        request_deserializer=pb.OpenSessionRequest.FromString,
        response_serializer=_serialize,
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
