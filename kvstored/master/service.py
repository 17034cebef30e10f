"""MasterService: the thin grpc.aio adapter over one term's MasterState (master/state.py).

Every method decodes its request, calls the plain-Python components on the event loop (one
loop, no locks) and encodes the answer. A :class:`KvstoredError` becomes a gRPC status with
the error code in the ``kvstored-error-code`` trailing metadata; anything else becomes
INTERNAL and is logged with its traceback.

Roles (``@_rpc(roles)``, checked before the method runs; the caller's principal comes from
its TLS certificate, docs/security.md): only ``node`` registers, heartbeats, syncs and
reports; ``node`` and ``engine`` look up and put; only ``admin`` drains a node or sets a
replication factor; every role reads the admin views. Without
TLS every caller is TRUSTED_LOCAL, which holds every role.

Tenants (docs/tenants.md): every RPC that names a (stored) namespace id checks it with
:func:`check_caller_namespace` before reading or placing anything: a caller that is neither a
node nor an admin (an engine's certificate) may name only stored ids of its own tenant
(:func:`kvstored.tenancy.split_namespace`); another tenant's is ``PermissionDenied`` naming
both tenants and the caller. ``ListNodeBlocks`` over every namespace keeps only the caller's
tenant's blocks for such a caller. The caller is the one the role check judged, kept in a
context variable for the duration of the call.

Leadership (``kvstored master --etcd``, kvstored/master/election.py): the servicer asks its
:class:`LeaderGate` before every call and again before answering; while the gate says this
master does not lead, every call is answered ``NotLeader`` (code 504, gRPC UNAVAILABLE) with
the leader's address in the message and in the ``kvstored-leader`` trailing metadata (empty:
no leader known), and the newest term it knows of in ``kvstored-term``. A leadership that
ends during a call (its etcd lease lapsed, or a new term's state was swapped in) answers that
call NotLeader too, so nothing is answered under a term the master no longer holds. Every
answer carries the term of the state that computed it (``term`` in every response). Without
a gate (no etcd) the master always leads and its term is its start epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol, TypeVar

import grpc
import numpy as np
import structlog

from kvstored import native
from kvstored.addresses import parse_host_port
from kvstored.auth import TRUSTED_LOCAL, Principal, Role, require_role
from kvstored.errors import (
    InternalError,
    InvalidArgument,
    KvstoredError,
    NoCapacity,
    NotLeader,
)
from kvstored.log import bind_request, new_request_id, unbind_request
from kvstored.master import admin
from kvstored.master.commands import Command
from kvstored.master.index import BlockIndex
from kvstored.master.membership import Membership, NodeRecord
from kvstored.master.metrics import MasterMetrics
from kvstored.master.placement import Placement
from kvstored.master.state import MasterState
from kvstored.master.types import (
    MAX_REPLICAS,
    BlockColumns,
    BlockRef,
    EventColumns,
    EventKind,
    NodeAction,
    NodeSpec,
    PlacementPolicy,
    TierUsage,
)
from kvstored.pb_enum import pb_enum
from kvstored.rpc_status import grpc_status, grpc_trailing_metadata
from kvstored.security.identity import principal_of_call
from kvstored.tenancy import (
    MAX_NAMESPACE_ID_BYTES as MAX_CLIENT_NAMESPACE_BYTES,
)
from kvstored.tenancy import (
    MAX_STORED_NAMESPACE_BYTES,
    check_namespace_length,
    check_stored_namespace,
    tenant_of,
)
from kvstored.transport.master_targets import LEADER_METADATA_KEY, TERM_METADATA_KEY
from kvstored.types import Tier
from kvstored.v1 import common_pb2 as cpb
from kvstored.v1 import master_pb2 as pb
from kvstored.v1 import master_pb2_grpc as pb_grpc

log = structlog.get_logger(__name__)

MAX_LOOKUP_KEYS = 65536
MAX_KEY_BYTES = 1024
MAX_AVOID_NODES = 64
"""Most ``avoid_node_ids`` one LookupPrefix may name (a reader's suspects)."""
MAX_ALTERNATES = 3
"""Most alternates per block a LookupPrefix answers (``max_alternates`` is capped here)."""
MAX_NAMESPACE_ID_BYTES = MAX_STORED_NAMESPACE_BYTES  # the master indexes stored ids
_POLICY_FROM_PB: dict[int, PlacementPolicy] = {  # keyed by the wire number
    pb.PLACEMENT_POLICY_LOCAL_FIRST: PlacementPolicy.LOCAL_FIRST,
    pb.PLACEMENT_POLICY_MOST_FREE: PlacementPolicy.MOST_FREE,
    pb.PLACEMENT_POLICY_RANDOM: PlacementPolicy.RANDOM,
}
_ACTION_TO_PB = {NodeAction.NONE: pb.NODE_ACTION_UNSPECIFIED,
                 NodeAction.REREGISTER: pb.NODE_ACTION_REREGISTER,
                 NodeAction.RESYNC: pb.NODE_ACTION_RESYNC}
_ACTION_RANK = {NodeAction.NONE: 0, NodeAction.RESYNC: 1, NodeAction.REREGISTER: 2}
"""A heartbeat that carried events answers the stronger of the two actions (REREGISTER
implies a resync too)."""


def _policy_of(value: int) -> PlacementPolicy | None:
    """The placement policy a request names (None: unspecified, the master's default).

    Raises:
        InvalidArgument: ``value`` is no known ``PlacementPolicy``.
    """
    policy = _POLICY_FROM_PB.get(value)
    if policy is None and value != pb.PLACEMENT_POLICY_UNSPECIFIED:
        raise InvalidArgument(f"unknown placement policy {value}")
    return policy


R = TypeVar("R")
Handler = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[R]]


READ_ROLES: tuple[Role, ...] = ("node", "engine", "admin")
"""Who may read the master's admin views (ListNodes, ListReplicas, ListNodeBlocks)."""

class LeaderGate(Protocol):
    """What the servicer asks the election (:class:`~kvstored.master.election.Elector` fits)."""

    leader_address: str
    """The leader's ``HOST:PORT`` as last seen ("" = none known)."""
    leader_term: int
    """The newest term seen (this master's own or another's)."""

    def is_leading(self) -> bool:
        """Whether this master may answer as leader now."""



_CALLER: contextvars.ContextVar[Principal] = contextvars.ContextVar(
    "kvstored_master_caller", default=TRUSTED_LOCAL)
"""The principal of the MasterService call being served (set by ``@_rpc``)."""


def may_cross_tenants(principal: Principal) -> bool:
    """Whether ``principal`` may name every tenant's stored namespace ids on the master: a
    node (it reports and looks up every tenant's blocks) or an admin. TRUSTED_LOCAL (no TLS)
    holds every role, so it may."""
    return principal.has("node") or principal.has("admin")


def check_caller_namespace(namespace_ids: bytes | Iterable[bytes], *, action: str) -> None:
    """Refuse the current call if it names another tenant's stored namespace id.

    The one check every MasterService RPC that names a namespace id makes, before it reads
    the index or places anything. The caller is the principal ``@_rpc`` judged (see
    :func:`may_cross_tenants` for who may cross); outside a call it is TRUSTED_LOCAL.

    Args:
        namespace_ids: the stored namespace id(s) the request names.
        action: the RPC, for the message (``"MasterService.LookupPrefix"``).

    Raises:
        PermissionDenied: naming the caller, its tenant and the tenant addressed; not
            retriable (the same request is refused again).
    """
    principal = _CALLER.get()
    if may_cross_tenants(principal):
        return
    ids = (namespace_ids,) if isinstance(namespace_ids, bytes) else set(namespace_ids)
    for ns in ids:
        check_stored_namespace(ns, tenant=principal.tenant, may_cross=False, action=action,
                               caller=principal.name)


def _caller_node_id(request: Any) -> str:
    """The node a request speaks for (``node_id``, or ``node.node_id`` of RegisterNode), or
    "" (a request of kvstorectl or an engine); names the node on the call's log lines."""
    node_id = getattr(request, "node_id", "")
    if not node_id:
        node_id = getattr(getattr(request, "node", None), "node_id", "")
    return node_id if isinstance(node_id, str) else ""


class WireRequest:
    """A request as the gRPC server hands it to the hot handlers (Heartbeat, LookupPrefix):
    the parsed message plus the wire bytes it was parsed from, so the C readers
    (``parse_events``, ``lookup_wire``) read those bytes instead of serializing the message
    again (~25 us for a heartbeat of ~94 events, measured). Made by :func:`add_master_service`'s
    deserializers; the handlers take a plain message too (in-process callers, tests).

    Args:
        msg: the parsed request.
        data: the bytes ``msg`` was parsed from (unchanged since).
    """

    __slots__ = ("data", "events", "msg")

    def __init__(self, msg: Any, data: bytes, events: tuple[Any, ...] | None = None) -> None:
        self.msg = msg
        self.data = data
        self.events = events
        """A heartbeat's events as C read them from ``data`` (``parse_events``' answer;
        ``msg`` was then parsed from the other fields' bytes only, its ``events`` empty);
        None: ``msg`` is the whole request."""

    @property
    def node_id(self) -> str:
        """The node the request speaks for ("" for a lookup): names the caller on log lines
        (read only when a line is logged)."""
        node_id = getattr(self.msg, "node_id", "")
        return node_id if isinstance(node_id, str) else ""

    @staticmethod
    def reader(message_type: Any) -> Callable[[bytes], WireRequest]:
        """The request deserializer of one method: ``data -> WireRequest(parsed, data)``."""
        parse = message_type.FromString

        def read(data: bytes) -> WireRequest:
            return WireRequest(parse(data), data)

        return read


def read_heartbeat(data: bytes) -> WireRequest:
    """The request deserializer of Heartbeat: its events read by C from ``data``
    (``parse_events``), the message parsed from the bytes of its other fields only (protobuf
    parses no event); the whole message when the extension is not built or the events are
    not in the form C reads (protobuf's reading, then the handler's)."""
    impl = native.master_index
    got = impl.parse_events(data, *_HEARTBEAT_PARSE_ARGS) if impl is not None else None
    if got is None:
        return WireRequest(pb.HeartbeatRequest.FromString(data), data)
    return WireRequest(pb.HeartbeatRequest.FromString(got[-1]), data, got)


class WireAnswer:
    """An answer the handler built as wire bytes (a LookupPrefix answer from ``lookup_wire``'s
    columns and the cached node entries), sent as is: no parse into a message and no
    serialization of it again. ``term`` is set by ``@_rpc`` as on any response and
    appended by :func:`serialize_answer` (field 9 of MasterLookupPrefixResponse, which the
    bytes never hold).

    Args:
        wire: the answer's bytes, without its term.
        num_blocks: blocks answered (the lookup metrics count them).
    """

    __slots__ = ("num_blocks", "term", "wire")

    def __init__(self, wire: bytes, num_blocks: int) -> None:
        self.wire = wire
        self.num_blocks = num_blocks
        self.term = 0

    def message(self) -> pb.MasterLookupPrefixResponse:
        """The answer as a message (tests, in-process callers)."""
        return pb.MasterLookupPrefixResponse.FromString(serialize_answer(self))


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_LOOKUP_TERM_TAG = _varint(pb.MasterLookupPrefixResponse.TERM_FIELD_NUMBER << 3)  # a varint


_term_field: dict[int, bytes] = {}
"""The encoded term field of LookupPrefix answers, per term (a master serves few terms)."""


def serialize_answer(resp: Any) -> bytes:
    """The response serializer of LookupPrefix: a :class:`WireAnswer`'s bytes plus its term
    (omitted when 0, as protobuf omits it), else the message's own serialization."""
    if isinstance(resp, WireAnswer):
        term = resp.term
        if not term:
            return resp.wire
        field = _term_field.get(term)
        if field is None:
            if len(_term_field) > 64:
                _term_field.clear()
            field = _term_field[term] = _LOOKUP_TERM_TAG + _varint(term)
        return resp.wire + field
    return resp.SerializeToString()


class _CallFields(Mapping[str, Any]):
    """The fields every line logged while serving one call carries (kvstored/log.py
    ``bind_request``): ``method``, ``peer``, ``request_id`` and the ``node_id`` the request
    speaks for. Made on the first line logged (most calls log none, and a request id costs
    a read of the OS's random source), then kept for the call's other lines."""

    __slots__ = ("_context", "_fields", "_method", "_request")

    def __init__(self, method: str, context: Any, request: Any) -> None:
        self._method = method
        self._context = context
        self._request = request
        self._fields: dict[str, Any] | None = None

    def _made(self) -> dict[str, Any]:
        f = self._fields
        if f is None:
            try:
                peer = self._context.peer()
            except Exception:  # a call grpc already finished (a task that outlived it logs)
                peer = ""
            f = {"method": self._method, "peer": peer, "request_id": new_request_id()}
            caller = _caller_node_id(self._request)
            if caller:
                f["node_id"] = caller
            self._fields = f
        return f

    def __getitem__(self, key: str) -> Any:
        return self._made()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._made())

    def __len__(self) -> int:
        return len(self._made())


_std_log = logging.getLogger(__name__)
"""This module's stdlib logger: whether per-call debug lines are kept (``isEnabledFor`` is
cached by the logging module; ``logging.getLogger`` per call takes its lock)."""


def _rpc(*roles: Role) -> Callable[[Handler[R]], Handler[R]]:
    """Check the caller's role, then map errors of one RPC handler onto gRPC statuses (see
    the module docstring).

    The fixed work per call is kept small (a master at 10,000 nodes serves ~30,000 calls a
    second): the log fields are made only if a line is logged (:class:`_CallFields`), the
    role check is one set test, and the leadership check reads the gate directly.

    Args:
        roles: who may call it (:func:`kvstored.auth.require_role`); the caller's principal
            comes from its certificate (:func:`kvstored.security.identity.principal_of`;
            TRUSTED_LOCAL without TLS, which holds every role).
    """
    allowed = frozenset(roles)

    def decorate(fn: Handler[R]) -> Handler[R]:
        action = f"MasterService.{fn.__name__}"
        method = fn.__name__

        @functools.wraps(fn)
        async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> R:
            extra: tuple[tuple[str, str], ...] = ()
            err: KvstoredError
            # every line logged while serving this call names it (kvstored/log.py)
            token = bind_request(_CallFields(method, context, request))
            caller_token = None
            try:
                if self.check_roles:
                    principal = principal_of_call(context)
                    if allowed.isdisjoint(principal.roles):
                        require_role(principal, *roles, action=action)  # raises, naming both
                    if principal is not _CALLER.get():  # (the default: TRUSTED_LOCAL)
                        caller_token = _CALLER.set(principal)
                gate = self.gate
                if gate is not None and not gate.is_leading():
                    raise self._not_leader()
                state = self.state
                resp = await fn(self, request, context)
                if self.state is not state or (gate is not None and not gate.is_leading()):
                    raise self._not_leader()  # the leadership ended during the call
                resp.term = state.term  # type: ignore[attr-defined]  # every master response has a term
                if _std_log.isEnabledFor(logging.DEBUG):
                    log.debug("rpc_served")
                return resp
            except NotLeader as exc:
                err = exc
                extra = ((LEADER_METADATA_KEY, self.gate.leader_address if self.gate else ""),
                         (TERM_METADATA_KEY, str(self.gate.leader_term if self.gate else 0)))
            except KvstoredError as exc:
                err = exc
                log.debug("rpc_failed", code=exc.code.name, error=str(exc))
            except Exception as exc:  # a bug: log once with its traceback, answer INTERNAL
                log.exception("master_rpc_failed")
                err = InternalError(f"{type(exc).__name__}: {exc}")
            finally:
                unbind_request(token)
                if caller_token is not None:
                    _CALLER.reset(caller_token)
            context.set_trailing_metadata(grpc_trailing_metadata(err) + extra)
            await context.abort(grpc_status(err), str(err))
            raise AssertionError("unreachable")  # context.abort raises

        wrapper.roles = roles  # type: ignore[attr-defined]  # read by the role-table test
        return wrapper

    return decorate


_TIERS = {int(Tier.DRAM): Tier.DRAM, int(Tier.SSD): Tier.SSD}


def _tier(value: int, what: str) -> Tier:
    got = _TIERS.get(value)  # (a dict, not Tier(value): 4x cheaper per event, measured)
    if got is None:
        raise InvalidArgument(f"{what}: tier must be DRAM (1) or SSD (2), got {value}")
    return got


def _usage(items: Any, what: str) -> tuple[TierUsage, ...]:
    return tuple([TierUsage(_tier(t.tier, what), t.capacity_bytes, t.used_bytes, t.num_blocks,
                            t.spare_bytes)
                  for t in items])


def _block(b: pb.BlockRef, what: str) -> BlockRef:
    if not b.key or len(b.key) > MAX_KEY_BYTES:
        raise InvalidArgument(f"{what}: key must have 1..{MAX_KEY_BYTES} bytes, got {len(b.key)}")
    if b.generation >= 1 << 63:
        raise InvalidArgument(f"{what}: generation must be < 2**63, got {b.generation}")
    if b.replicas > MAX_REPLICAS:
        raise InvalidArgument(f"{what}: replicas (the block's replication factor) must be in "
                              f"0..{MAX_REPLICAS}, got {b.replicas}")
    return BlockRef(bytes(b.namespace_id), bytes(b.key), _tier(b.tier, what), b.size_bytes,
                    b.generation, b.copy, b.replicas)


def block_columns(refs: Any, what: Callable[[int], str]) -> BlockColumns:
    """The columns of some ``pb.BlockRef`` messages (one pass over them, checked as
    columns: no object per block).

    Args:
        what: names block ``i`` in an error (e.g. ``"event 7"``).

    Raises:
        InvalidArgument: naming the first bad block and what it held: a key not
            1..MAX_KEY_BYTES bytes, a generation >= 2**63, a replication factor above
            MAX_REPLICAS, a tier other than DRAM or SSD.
    """
    keys = [b.key for b in refs]
    cols = BlockColumns([b.namespace_id for b in refs], keys,
                        np.array([b.tier for b in refs], dtype=np.int64),
                        np.array([b.size_bytes for b in refs], dtype=np.int64),
                        np.array([b.generation for b in refs], dtype=np.uint64),
                        np.array([b.copy for b in refs], dtype=np.bool_),
                        np.array([b.replicas for b in refs], dtype=np.int64))
    _check_block_columns(cols, lambda: refs, what)
    return cols


def _check_block_columns(cols: BlockColumns, refs: Callable[[], Any], what: Callable[[int], str]
                         ) -> None:
    """The checks of :func:`block_columns` (``refs()``: the messages, walked to name the
    first bad one only when the columns hold one)."""
    keys = cols.keys
    if keys:
        lens = [len(k) for k in keys]
        bad = (~np.isin(cols.tiers, _TIER_VALUES)) | (cols.generations >= np.uint64(1 << 63)) \
            | (cols.replicas > MAX_REPLICAS)
        if min(lens) == 0 or max(lens) > MAX_KEY_BYTES or bad.any():
            for i, b in enumerate(refs()):  # the scalar check names the first bad block
                _block(b, what(i))


def event_columns(events: Any) -> EventColumns:
    """The columns of a ReportEvents request's events (see :func:`block_columns`).

    Raises:
        InvalidArgument: naming the first bad event (its seq) and what it held: a kind other
            than ADDED or REMOVED, or a bad block (:func:`block_columns`).
    """
    seqs = [e.seq for e in events]  # one comprehension per field: no append per event
    kinds = [e.kind for e in events]
    refs = [e.block for e in events]
    _check_kinds(seqs, kinds)
    return EventColumns(seqs, kinds, block_columns(refs, lambda i: f"event {seqs[i]}"),
                        kinds_checked=True)


def _check_kinds(seqs: list[int], kinds: list[int]) -> None:
    if not set(kinds) <= _EVENT_KINDS:
        i = next(i for i, k in enumerate(kinds) if k not in _EVENT_KINDS)
        raise InvalidArgument(f"event {seqs[i]}: kind must be ADDED or REMOVED, got {kinds[i]}")


def request_event_columns(request: pb.ReportEventsRequest | pb.HeartbeatRequest,
                          data: bytes | None = None) -> EventColumns:
    """:func:`event_columns` of a ReportEventsRequest (or of the events a HeartbeatRequest
    carries), read from its wire bytes in one C call (native/master.c ``parse_events``: ~25 us
    to serialize and parse 96 events, against ~300-700 us for reading each protobuf field from
    Python, measured) when the extension is built; the same columns, checks and errors. Falls
    back to :func:`event_columns` without the extension or for bytes that C does not read
    exactly as protobuf would.

    Args:
        data: the bytes ``request`` was parsed from (:class:`WireRequest`), read instead of
            serializing it again; None: serialize it.
    """
    impl = native.master_index
    field = _HEARTBEAT_EVENTS_FIELD if isinstance(request, pb.HeartbeatRequest) else _REPORT_EVENTS_FIELD
    if impl is not None and data is None:
        data = request.SerializeToString()
    got = impl.parse_events(data, MAX_KEY_BYTES, MAX_REPLICAS,
                            *_EVENT_KINDS_PAIR, *_TIER_PAIR, field) if impl is not None else None
    if got is None:
        return event_columns(request.events)
    return parsed_event_columns(got, lambda: request.events)


def parsed_event_columns(got: tuple[Any, ...], events: Callable[[], Any]) -> EventColumns:
    """The :class:`EventColumns` of ``parse_events``' answer ``got``, checked as
    :func:`event_columns` checks them.

    Args:
        events: the request's event messages (walked only when C found a bad value, to name
            the first bad event as the protobuf path names it).

    Raises:
        InvalidArgument: as :func:`event_columns`.
    """
    seqs, kinds, nss, keys, tiers, sizes, gens, copies, reps, clean, consecutive, distinct = got[:12]
    # (C's columns are bytearrays: the arrays are views of them, writable, no copy)
    frombuffer = np.frombuffer
    cols = BlockColumns(nss, keys, frombuffer(tiers, np.int64), frombuffer(sizes, np.int64),
                        frombuffer(gens, np.uint64), frombuffer(copies, np.bool_),
                        frombuffer(reps, np.int64))
    if not clean:  # C found a bad value: these checks name the first bad event
        _check_kinds(seqs, kinds)
        _check_block_columns(cols, lambda: [e.block for e in events()],
                             lambda i: f"event {seqs[i]}")
    return EventColumns(seqs, kinds, cols, consecutive, distinct, kinds_checked=True)


_COMPLETE_TRUE = bytes([6 << 3, 1])
"""``complete = true`` (field 6, a varint) of a MasterLookupPrefixResponse, as wire bytes."""
_EVERY_KEY_TRUE = bytes([8 << 3, 1])
"""``every_key = true`` (field 8) of a MasterLookupPrefixResponse, as wire bytes."""

_REPORT_EVENTS_FIELD = pb.ReportEventsRequest.EVENTS_FIELD_NUMBER
_HEARTBEAT_EVENTS_FIELD = pb.HeartbeatRequest.EVENTS_FIELD_NUMBER
_EVENT_KINDS = frozenset({int(EventKind.ADDED), int(EventKind.REMOVED)})
_TIER_VALUES = np.array([int(Tier.DRAM), int(Tier.SSD)], dtype=np.int64)
_EVENT_KINDS_PAIR = (int(EventKind.ADDED), int(EventKind.REMOVED))
_TIER_PAIR = (int(Tier.DRAM), int(Tier.SSD))
_HEARTBEAT_PARSE_ARGS = (MAX_KEY_BYTES, MAX_REPLICAS, *_EVENT_KINDS_PAIR, *_TIER_PAIR,
                         _HEARTBEAT_EVENTS_FIELD, True)
"""``parse_events``' arguments after the bytes for a heartbeat (its events, the rest apart)."""


MAX_ZONE_CHARS = 64


def _zone(zone: str, node_id: str) -> str:
    if len(zone) > MAX_ZONE_CHARS or not zone.isprintable() or zone != zone.strip():
        raise InvalidArgument(f"node {node_id!r}: zone must be at most {MAX_ZONE_CHARS} printable "
                              f"characters without leading or trailing spaces, got {zone!r}")
    return zone


def node_info(rec: NodeRecord) -> pb.NodeInfo:
    """The wire form of a registered node (tiers as last heartbeated)."""
    s = rec.spec
    return pb.NodeInfo(
        node_id=s.node_id, epoch=s.epoch, grpc_address=s.grpc_address,
        data_address=s.data_address, transports=list(s.transports), zone=s.zone,
        tiers=[pb.TierCapacity(tier=pb_enum(cpb.Tier, t.tier), capacity_bytes=t.capacity_bytes,
                               used_bytes=t.used_bytes, num_blocks=t.num_blocks,
                               spare_bytes=t.spare_bytes)
               for _, t in sorted(rec.tiers.items())],
    )


class MasterServicer(pb_grpc.MasterServiceServicer):
    """gRPC adapter over one master term's :class:`~kvstored.master.state.MasterState`.

    Args:
        state: the term's index, membership and placement (swap in a new term's with
            :meth:`set_state`).
        metrics: where lookups, puts and admin calls are counted (a fresh registry if None).
        check_roles: judge each call by its caller's certificate (see :attr:`check_roles`).
        gate: the election (None: this master always leads, as without ``--etcd``).
    """

    def __init__(self, state: MasterState, *, metrics: MasterMetrics | None = None,
                 check_roles: bool = True, gate: LeaderGate | None = None) -> None:
        self.state = state
        self.check_roles = check_roles
        """Judge each call by its caller's certificate (``@_rpc(roles)``); the daemon
        passes False only without ``[tls]``, where every caller is TRUSTED_LOCAL anyway."""
        self.metrics = metrics if metrics is not None else MasterMetrics()
        self.gate = gate
        self._node_wire: dict[int, bytes] = {}  # holder -> its answers' node entry
        self._node_wire_of: Membership | None = None  # whose holders, at which version
        self._node_wire_version = -1

    def _not_leader(self) -> NotLeader:
        g = self.gate
        leader = g.leader_address if g is not None else ""
        return NotLeader(
            f"this master does not lead (newest term {g.leader_term if g else 0}); "
            + (f"the leader is {leader}" if leader else "no leader is known right now"))

    def _leading_state(self) -> MasterState:
        """The state to answer from, if this master leads now.

        Raises:
            NotLeader: it does not (a follower, or a leader that lost its etcd lease).
        """
        if self.gate is not None and not self.gate.is_leading():
            raise self._not_leader()
        return self.state

    def set_state(self, state: MasterState) -> None:
        """Serve a new term's state from the next call on (the old one is dropped whole)."""
        self.state = state
        self._node_wire = {}  # holder ids are the term's own
        self._node_wire_of = None

    @property
    def membership(self) -> Membership:
        """The current term's membership."""
        return self.state.membership

    @property
    def placement(self) -> Placement:
        """The current term's placement."""
        return self.state.placement

    @property
    def index(self) -> BlockIndex:
        """The current term's block index."""
        return self.state.index

    @property
    def master_epoch(self) -> int:
        """The current term's epoch (reported to nodes and kvstorectl)."""
        return self.state.epoch

    def _lease_ms(self) -> int:
        return int(self.membership.node_lease_s * 1000)

    @_rpc("node")
    async def RegisterNode(  # noqa: N802 (gRPC method names)
        self, request: pb.RegisterNodeRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterNodeResponse:
        n = request.node
        spec = NodeSpec(n.node_id, n.epoch, n.grpc_address, n.data_address,
                        _usage(n.tiers, f"node {n.node_id!r}"), tuple(n.transports) or ("tcp",),
                        _zone(n.zone, n.node_id))
        live = self.membership.duplicate_of(spec)
        answering = live is not None and await data_port_answers(live.spec.data_address)
        out = self.membership.register(
            spec, live_epoch_answering=live.spec.epoch if live is not None and answering else 0)
        return pb.RegisterNodeResponse(node_lease_ms=self._lease_ms(),
                                       master_epoch=self.master_epoch,
                                       superseded_epoch=out.superseded_epoch,
                                       announces_departures=True,
                                       heartbeat_carries_events=True)

    @_rpc("node")
    async def UnregisterNode(  # noqa: N802
        self, request: pb.UnregisterNodeRequest, context: grpc.aio.ServicerContext
    ) -> pb.UnregisterNodeResponse:
        self.membership.unregister(request.node_id, request.epoch)
        return pb.UnregisterNodeResponse()

    @_rpc("node")
    async def Heartbeat(  # noqa: N802
        self, request: pb.HeartbeatRequest | WireRequest, context: grpc.aio.ServicerContext
    ) -> pb.HeartbeatResponse:
        data = parsed = None
        if isinstance(request, WireRequest):  # from the server: its events read from its bytes
            req: pb.HeartbeatRequest = request.msg
            data = request.data
            parsed = request.events  # read by its deserializer (read_heartbeat), or None
        else:
            req = request
        state = self.state
        node_id, epoch = req.node_id, req.epoch
        tiers = req.tiers
        usage = _usage(tiers, "heartbeat") if tiers else ()
        applied = 0
        events_action = NodeAction.NONE
        cols = None
        if parsed is not None:
            whole = data if data is not None else b""
            cols = parsed_event_columns(parsed, lambda: pb.HeartbeatRequest.FromString(whole).events)
        elif req.events:
            cols = request_event_columns(req, data)
        if cols is not None and len(cols):  # a round in one RPC: the events first, as
            events_action, applied = state.membership.report_events(  # ReportEvents applies them
                node_id, epoch, cols)
        action = state.membership.heartbeat(
            node_id, epoch, tiers=usage, load=req.load, last_seq=req.last_seq,
            coldest_age_ms=req.coldest_age_ms,
        )
        if _ACTION_RANK[events_action] > _ACTION_RANK[action]:
            action = events_action  # what either call alone would have made the node do
        queue = state.commands
        if req.acked_command_ids:
            state.repair.on_commands_acked(queue.ack(node_id, epoch, req.acked_command_ids))
        resp = pb.HeartbeatResponse(action=_ACTION_TO_PB[action],
                                    node_lease_ms=int(state.membership.node_lease_s * 1000),
                                    applied_seq=applied)
        if action is NodeAction.NONE:
            cmds = queue.take(node_id, epoch)
            if cmds:
                resp.commands.extend([command_pb(c) for c in cmds])
        return resp

    @_rpc("node")
    async def WaitCommands(  # noqa: N802
        self, request: pb.WaitCommandsRequest, context: grpc.aio.ServicerContext
    ) -> pb.WaitCommandsResponse:
        queue = self.state.commands
        if request.acked_command_ids:
            self.state.repair.on_commands_acked(
                queue.ack(request.node_id, request.epoch, request.acked_command_ids))
        cmds = await queue.wait(request.node_id, request.epoch, request.wait_ms / 1000.0)
        return pb.WaitCommandsResponse(commands=[command_pb(c) for c in cmds])

    @_rpc("node")
    async def SyncInventory(  # noqa: N802
        self, request: pb.SyncInventoryRequest, context: grpc.aio.ServicerContext
    ) -> pb.SyncInventoryResponse:
        blocks = block_columns(request.blocks, lambda i: f"inventory block {i}")
        action, num = self.membership.sync_inventory(
            request.node_id, request.epoch, sync_id=request.sync_id, blocks=blocks,
            last_chunk=request.last_chunk, seq=request.seq,
        )
        return pb.SyncInventoryResponse(action=_ACTION_TO_PB[action], num_replicas=num)

    @_rpc("node")
    async def ReportEvents(  # noqa: N802
        self, request: pb.ReportEventsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReportEventsResponse:
        action, applied = self.membership.report_events(request.node_id, request.epoch,
                                                        request_event_columns(request))
        return pb.ReportEventsResponse(action=_ACTION_TO_PB[action], applied_seq=applied)

    @_rpc("node")
    async def ReportTransfer(  # noqa: N802
        self, request: pb.ReportTransferRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReportTransferResponse:
        health = self.membership.report_transfer(request.node_id, request.epoch, ok=request.ok)
        return pb.ReportTransferResponse(health=pb_enum(pb.NodeHealth, health))

    @_rpc("node", "engine")
    async def LookupPrefix(  # noqa: N802
        self, request: pb.MasterLookupPrefixRequest | WireRequest, context: grpc.aio.ServicerContext
    ) -> pb.MasterLookupPrefixResponse | WireAnswer:
        t0 = time.perf_counter()
        if isinstance(request, WireRequest):  # from the server: answered as bytes, sent as is
            msg: pb.MasterLookupPrefixRequest = request.msg
            resp: pb.MasterLookupPrefixResponse | WireAnswer = self._lookup_prefix(
                msg, request.data, wire_answer=True)
        else:
            msg = request
            resp = self._lookup_prefix(request)
        hit = resp.num_blocks if isinstance(resp, WireAnswer) else len(resp.node_index)
        self.metrics.lookup.observe(len(msg.keys), hit, time.perf_counter() - t0)
        return resp

    def _lookup_prefix(self, request: pb.MasterLookupPrefixRequest, data: bytes | None = None,
                       *, wire_answer: bool = False) -> Any:
        """The answer of one LookupPrefix: from the request's bytes to the response's in one
        C call (:meth:`BlockIndex.lookup_wire`) when the extension is built and every key
        has 16 bytes, else :meth:`_lookup_prefix_columns`; the same answer either way.

        Args:
            data: the bytes ``request`` was parsed from (None: serialize it).
            wire_answer: answer a :class:`WireAnswer` when the C path answered (the server's
                path: the bytes go out as they are), else always a message.
        """
        namespace_id = request.namespace_id
        if len(namespace_id) > MAX_CLIENT_NAMESPACE_BYTES:  # (shorter ones always pass)
            check_namespace_length(namespace_id)
        if _CALLER.get() is not TRUSTED_LOCAL:  # (TRUSTED_LOCAL may name every tenant's)
            check_caller_namespace(namespace_id, action="MasterService.LookupPrefix")
        num_keys = len(request.keys)
        if num_keys > MAX_LOOKUP_KEYS:
            raise InvalidArgument(f"{num_keys} keys in one lookup; the limit is {MAX_LOOKUP_KEYS}")
        avoid_ids = request.avoid_node_ids
        if len(avoid_ids) > MAX_AVOID_NODES:
            raise InvalidArgument(f"{len(avoid_ids)} avoid_node_ids in one lookup; "
                                  f"the limit is {MAX_AVOID_NODES}")
        m = self.membership
        local, avoid, complete = m.lookup_view(request.local_node_id, avoid_ids)
        alternates = min(request.max_alternates, MAX_ALTERNATES)
        every_key = request.every_key
        got = self.index.lookup_wire(namespace_id, request.SerializeToString() if data is None else data,
                                     local_holder=local.holder if local else -1,
                                     avoid_holders=avoid, max_alternates=alternates,
                                     every_key=every_key)
        if got is None:
            return self._lookup_prefix_columns(request, local, avoid, alternates)
        parts = self._node_entries(m, got.holders)
        parts.append(got.wire)
        if complete:
            parts.append(_COMPLETE_TRUE)
        if every_key:
            parts.append(_EVERY_KEY_TRUE)
        wire = b"".join(parts)
        if local is not None and got.num_blocks and self.state.repair.settings.hot_reads_per_window:
            self._note_remote_reads(request, local, np.frombuffer(got.best_holders, np.int64),
                                    np.frombuffer(got.positions, np.int64))
        if wire_answer:
            return WireAnswer(wire, got.num_blocks)
        return pb.MasterLookupPrefixResponse.FromString(wire)

    def _node_entries(self, m: Membership, holders: list[int]) -> list[bytes]:
        """The wire bytes of the ``nodes`` entries of a LookupPrefix answer naming
        ``holders`` (field 1: a ReplicaNode each), from a cache kept while the membership's
        :attr:`~Membership.holders_version` stays the same (no holder's node changed), so a
        lookup reads a dict per holder instead of its node's record and spec.

        Raises:
            InternalError: a holder has no node (cannot happen: readable holders have one).
        """
        cache = self._node_wire
        if self._node_wire_of is not m or self._node_wire_version != m.holders_version:
            cache.clear()  # a node registered, synced or left: built again as asked
            self._node_wire_of = m
            self._node_wire_version = m.holders_version
        try:
            return [cache[h] for h in holders]
        except KeyError:
            return [self._node_entry(m, h) for h in holders]

    def _node_entry(self, m: Membership, holder: int) -> bytes:
        """The wire bytes of one ``nodes`` entry (see :meth:`_node_entries`), cached.

        Raises:
            InternalError: the holder has no node (cannot happen: readable holders have one).
        """
        got = self._node_wire.get(holder)
        if got is not None:
            return got
        rec = m.record_of_holder(holder)
        if rec is None:  # cannot happen: readable holders have records
            raise InternalError(f"holder {holder} is readable but has no node")
        spec = rec.spec
        entry = pb.MasterLookupPrefixResponse(nodes=[pb.ReplicaNode(
            node_id=spec.node_id, epoch=spec.epoch, data_address=spec.data_address)]).SerializeToString()
        self._node_wire[holder] = entry
        return entry

    def _note_remote_reads(self, request: pb.MasterLookupPrefixRequest, local: NodeRecord,
                           best_holders: np.ndarray, positions: np.ndarray) -> None:
        """Count the answered blocks the asker will copy in (best replica not its own) for
        hot-block replication (kvstored/master/repair.py ``note_lookup``)."""
        remote = np.flatnonzero(best_holders != local.holder)
        if not len(remote):
            return
        m = self.membership
        names: dict[int, str] = {}
        for h in set(best_holders[remote].tolist()):
            rec = m.record_of_holder(h)
            names[h] = rec.spec.node_id if rec is not None else ""
        keys = request.keys
        self.state.repair.note_lookup(
            local.spec.node_id, bytes(request.namespace_id),
            [(keys[p], names[h]) for p, h in zip(positions[remote].tolist(),
                                                 best_holders[remote].tolist(), strict=True)])

    def _lookup_prefix_columns(self, request: pb.MasterLookupPrefixRequest,
                               local: NodeRecord | None, avoid: list[int],
                               alternates: int) -> pb.MasterLookupPrefixResponse:
        """:meth:`_lookup_prefix` through :meth:`BlockIndex.lookup_prefix` / ``lookup_each``
        and the response's fields set from the hit's columns (the fallback: keys of other
        lengths, or no extension).

        Raises:
            InvalidArgument: a key not of 1..MAX_KEY_BYTES bytes (naming it).
        """
        keys = list(request.keys)
        lens = list(map(len, keys))
        if lens and (min(lens) == 0 or max(lens) > MAX_KEY_BYTES):
            i = next(i for i, n in enumerate(lens) if not 0 < n <= MAX_KEY_BYTES)
            raise InvalidArgument(f"key {i} must have 1..{MAX_KEY_BYTES} bytes, got {lens[i]}")
        m = self.membership
        holder = local.holder if local else -1
        resp = pb.MasterLookupPrefixResponse(complete=m.is_complete(), every_key=request.every_key)
        if request.every_key:
            positions, hit = self.index.lookup_each(
                bytes(request.namespace_id), keys, local_holder=holder,
                avoid_holders=avoid, max_alternates=alternates)
            resp.key_index.extend(positions.tolist())
        else:
            hit = self.index.lookup_prefix(bytes(request.namespace_id), keys,
                                           local_holder=holder, avoid_holders=avoid,
                                           max_alternates=alternates)
            positions = np.arange(len(hit), dtype=np.int64)
        if not len(hit):
            return resp
        alt = hit.alternates
        every = hit.holders if alt is None else np.concatenate([hit.holders, alt.holders])
        holders, inverse = np.unique(every, return_inverse=True)
        node_index = inverse[:len(hit)]
        for h in holders.tolist():
            rec = m.record_of_holder(h)
            if rec is None:  # cannot happen: readable holders have records
                raise InternalError(f"holder {h} is readable but has no node")
            resp.nodes.add(node_id=rec.spec.node_id, epoch=rec.spec.epoch,
                           data_address=rec.spec.data_address)
        resp.node_index.extend(node_index.tolist())
        resp.tier.extend(hit.tiers.tolist())
        resp.size_bytes.extend(hit.sizes.tolist())
        resp.generation.extend(hit.generations.tolist())
        if alt is not None:
            resp.num_alternates.extend(alt.counts.tolist())
            resp.alternate_node_index.extend(inverse[len(hit):].tolist())
            resp.alternate_tier.extend(alt.tiers.tolist())
            resp.alternate_size_bytes.extend(alt.sizes.tolist())
            resp.alternate_generation.extend(alt.generations.tolist())
        if local is not None and self.state.repair.settings.hot_reads_per_window:
            self._note_remote_reads(request, local, hit.holders, positions)
        return resp

    @_rpc("node", "engine")
    async def PutStart(  # noqa: N802
        self, request: pb.PutStartRequest, context: grpc.aio.ServicerContext
    ) -> pb.PutStartResponse:
        policy = _policy_of(request.policy)
        check_caller_namespace(request.namespace_id, action="MasterService.PutStart")
        try:
            out = self.placement.start_put(
                bytes(request.namespace_id), bytes(request.key), request.size_bytes,
                writer_node_id=request.writer_node_id, num_replicas=request.num_replicas or 1,
                policy=policy, exclude_writer=request.exclude_writer,
                max_used_fraction=request.max_used_fraction, headroom_bytes=request.headroom_bytes,
                holder_reports=request.holder_reports, replicas=request.replicas,
            )
        except KvstoredError as exc:
            self.metrics.put_starts.labels(result=exc.code.name).inc()
            raise
        self.metrics.put_starts.labels(result="exists" if out.exists else "placed").inc()
        return pb.PutStartResponse(
            exists=out.exists, generation=out.generation,
            replicas=[pb.ReplicaRef(node_id=r.node_id, epoch=r.epoch, tier=pb_enum(cpb.Tier, r.tier),
                                    size_bytes=request.size_bytes, generation=out.generation,
                                    data_address=r.data_address) for r in out.replicas],
        )

    @_rpc("node", "engine")
    async def PutEnd(  # noqa: N802
        self, request: pb.PutEndRequest, context: grpc.aio.ServicerContext
    ) -> pb.PutEndResponse:
        outcome = "commit" if request.commit else "abort"
        check_caller_namespace(request.namespace_id, action="MasterService.PutEnd")
        try:
            n = self.placement.end_put(bytes(request.namespace_id), bytes(request.key),
                                       request.generation, commit=request.commit)
        except KvstoredError as exc:
            self.metrics.put_ends.labels(outcome=outcome, result=exc.code.name).inc()
            raise
        self.metrics.put_ends.labels(outcome=outcome, result="ok").inc()
        return pb.PutEndResponse(num_replicas=n)

    @_rpc("node", "engine")
    async def PutStartBatch(  # noqa: N802
        self, request: pb.PutStartBatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.PutStartBatchResponse:
        policy = _policy_of(request.policy)
        items = [(bytes(i.namespace_id), bytes(i.key), i.size_bytes) for i in request.items]
        check_caller_namespace([ns for ns, _, _ in items], action="MasterService.PutStartBatch")
        check_caller_namespace([e.namespace_id for e in request.ends],
                               action="MasterService.PutStartBatch")
        resp = pb.PutStartBatchResponse()
        if request.ends:  # the carried ends first: their space is released before placing
            self._end_batch(request.ends, resp.end_results)
        factors = [i.replicas for i in request.items]
        outs = self.placement.start_put_batch(
            items, factors=factors if any(factors) else None, top_up=request.top_up,
            writer_node_id=request.writer_node_id, num_replicas=request.num_replicas or 1,
            policy=policy, exclude_writer=request.exclude_writer,
            max_used_fraction=request.max_used_fraction, headroom_bytes=request.headroom_bytes,
            holder_reports=request.holder_reports,
        )
        for (_, _, size), out in zip(items, outs, strict=True):
            if isinstance(out, KvstoredError):
                self.metrics.put_starts.labels(result=out.code.name).inc()
                resp.results.add(
                    outcome=(pb.PUT_START_OUTCOME_NO_CAPACITY if isinstance(out, NoCapacity)
                             else pb.PUT_START_OUTCOME_ERROR),
                    error_code=int(out.code), message=str(out))
                continue
            if not out.exists and not out.replicas:  # a top-up with no room anywhere
                self.metrics.put_starts.labels(result=NoCapacity.code.name).inc()
                resp.results.add(
                    outcome=pb.PUT_START_OUTCOME_NO_CAPACITY, error_code=int(NoCapacity.code),
                    num_held=out.num_held,
                    message=f"the block has {out.num_held} replicas; no other registered, "
                            f"healthy node has room for {size} more bytes")
                continue
            self.metrics.put_starts.labels(result="exists" if out.exists else "placed").inc()
            resp.results.add(
                outcome=pb.PUT_START_OUTCOME_EXISTS if out.exists else pb.PUT_START_OUTCOME_PLACED,
                generation=out.generation, num_held=out.num_held,
                replicas=[pb.ReplicaRef(node_id=r.node_id, epoch=r.epoch, tier=pb_enum(cpb.Tier, r.tier),
                                        size_bytes=size, generation=out.generation,
                                        data_address=r.data_address) for r in out.replicas])
        return resp

    @_rpc("node", "engine")
    async def PutEndBatch(  # noqa: N802
        self, request: pb.PutEndBatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.PutEndBatchResponse:
        resp = pb.PutEndBatchResponse()
        check_caller_namespace([i.namespace_id for i in request.items],
                               action="MasterService.PutEndBatch")
        self._end_batch(request.items, resp.results)
        return resp

    def _end_batch(self, requests: Any, results: Any) -> None:
        """``end_put_batch`` of PutEndRequests, one PutEndResult appended per request."""
        items = [(bytes(i.namespace_id), bytes(i.key), i.generation, i.commit) for i in requests]
        outs = self.placement.end_put_batch(items)
        for (_, _, _, commit), n in zip(items, outs, strict=True):
            outcome = "commit" if commit else "abort"
            if isinstance(n, KvstoredError):
                self.metrics.put_ends.labels(outcome=outcome, result=n.code.name).inc()
                results.add(error_code=int(n.code), message=str(n))
            else:
                self.metrics.put_ends.labels(outcome=outcome, result="ok").inc()
                results.add(num_replicas=n)

    @_rpc(*READ_ROLES)
    async def ListNodes(  # noqa: N802
        self, request: pb.ListNodesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListNodesResponse:
        self.metrics.admin_requests.labels(method="ListNodes").inc()
        m = self.membership
        now = m.clock()
        nodes = [
            pb.NodeStatus(node=node_info(r), health=pb_enum(pb.NodeHealth, r.health), load=r.load,
                          num_replicas=self.index.num_holder_replicas(r.holder),
                          lease_left_s=m.lease_left_s(r), last_seq=r.applied_seq,
                          probation=r.probation and not r.healthy, draining=r.draining,
                          coldest_age_s=r.coldest_age_now_s(now))
            for r in m.nodes()
        ]
        departed = [
            pb.DepartedNode(
                node=pb.NodeInfo(node_id=node_id, epoch=d.spec.epoch,  # type: ignore[attr-defined]  # DepartedNode.spec is typed object; it holds a NodeSpec
                                 grpc_address=d.spec.grpc_address,  # type: ignore[attr-defined]  # as above
                                 data_address=d.spec.data_address,  # type: ignore[attr-defined]  # as above
                                 transports=list(d.spec.transports)),  # type: ignore[attr-defined]  # as above
                reason=d.reason, departed_s_ago=max(0.0, now - d.departed_s),
                num_replicas=d.num_replicas)
            for node_id, d in m.departed.recent(now)
        ]
        return pb.ListNodesResponse(nodes=nodes, master_epoch=self.master_epoch,
                                    num_replicas=self.index.num_replicas, departed=departed)

    @_rpc(*READ_ROLES)
    async def ListReplicas(  # noqa: N802
        self, request: pb.ListReplicasRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListReplicasResponse:
        self.metrics.admin_requests.labels(method="ListReplicas").inc()
        _check_keys(request.namespace_id, request.keys)
        check_caller_namespace(request.namespace_id, action="MasterService.ListReplicas")
        found = admin.list_replicas(self.membership, bytes(request.namespace_id),
                                    [bytes(k) for k in request.keys])
        resp = pb.ListReplicasResponse(complete=self.membership.is_complete())
        factors = self.index.replication_factors(bytes(request.namespace_id),
                                                 [bytes(k) for k in request.keys])
        for key, views, factor in zip(request.keys, found, factors.tolist(), strict=True):
            resp.blocks.add(key=key, replication_factor=factor, replicas=[
                pb.ReplicaDetail(node_id=v.node_id, epoch=v.epoch, tier=pb_enum(cpb.Tier, v.tier),
                                 size_bytes=v.size_bytes, generation=v.generation,
                                 state=pb_enum(pb.ReplicaState, v.state), readable=v.readable,
                                 grpc_address=v.grpc_address, data_address=v.data_address,
                                 copy=v.copy)
                for v in views])
        return resp

    @_rpc(*READ_ROLES)
    async def ListNodeBlocks(  # noqa: N802
        self, request: pb.ListNodeBlocksRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListNodeBlocksResponse:
        self.metrics.admin_requests.labels(method="ListNodeBlocks").inc()
        check_namespace_length(request.namespace_id)
        if not request.any_namespace:
            check_caller_namespace(request.namespace_id, action="MasterService.ListNodeBlocks")
        entries, token, epoch, num = admin.list_node_blocks(
            self.membership, request.node_id,
            namespace_id=None if request.any_namespace else bytes(request.namespace_id),
            limit=request.limit, page_token=bytes(request.page_token),
        )
        caller = _CALLER.get()
        if request.any_namespace and not may_cross_tenants(caller):
            # every namespace, of the caller's tenant only (a page may then hold fewer than
            # ``limit`` blocks; its next_page_token still continues the walk)
            entries = [e for e in entries if tenant_of(e.namespace_id) == caller.tenant]
        return pb.ListNodeBlocksResponse(
            blocks=[pb.NodeBlockEntry(namespace_id=e.namespace_id, key=e.key, tier=pb_enum(cpb.Tier, e.tier),
                                      size_bytes=e.size_bytes, generation=e.generation,
                                      state=pb_enum(pb.ReplicaState, e.state), copy=e.copy) for e in entries],
            next_page_token=token, epoch=epoch, num_replicas=num,
        )


    @_rpc("admin")
    async def DrainNode(  # noqa: N802
        self, request: pb.DrainNodeRequest, context: grpc.aio.ServicerContext
    ) -> pb.DrainNodeResponse:
        self.metrics.admin_requests.labels(method="DrainNode").inc()
        if not request.node_id:
            raise InvalidArgument("DrainNode needs a node_id, got an empty one")
        p = self.state.repair.drain(request.node_id)
        return pb.DrainNodeResponse(draining=True, num_blocks=p.num_blocks,
                                    num_blocks_to_move=p.num_blocks_to_move,
                                    num_copies_issued=p.num_copies_issued,
                                    leave_sent=p.leave_sent)

    @_rpc("admin")
    async def SetReplication(  # noqa: N802
        self, request: pb.SetReplicationRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetReplicationResponse:
        self.metrics.admin_requests.labels(method="SetReplication").inc()
        _check_keys(request.namespace_id, request.keys)
        check_caller_namespace(request.namespace_id, action="MasterService.SetReplication")
        n = self.state.repair.set_factor(bytes(request.namespace_id),
                                         [bytes(k) for k in request.keys], request.replicas)
        self.state.repair.tick()  # queue the copies now, not on the next maintenance tick
        return pb.SetReplicationResponse(num_keys=n)


def command_pb(c: Command) -> pb.NodeCommand:
    """The wire form of one queued command (:mod:`kvstored.master.commands`)."""
    out = pb.NodeCommand(command_id=c.command_id, kind=pb_enum(pb.NodeCommandKind, c.kind), target_epoch=c.epoch,
                         term=c.term, namespace_id=c.namespace_id, key=c.key)
    if c.source is not None:
        out.source_node_id = c.source.node_id
        out.source_epoch = c.source.epoch
        out.source_data_address = c.source.data_address
        out.size_bytes = c.source.size_bytes
        out.generation = c.source.generation
    return out


DUPLICATE_PROBE_TIMEOUT_S = 1.0


async def data_port_answers(address: str, timeout_s: float = DUPLICATE_PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connect to a node's data address (``host:port``) is accepted.

    Tells a second daemon that took a live node's id from a restart of that node (whose
    old process is gone): a refused connect (nothing listens) is False; an accepted one
    is True, and so is no answer within ``timeout_s`` (a stopped or partitioned process
    may still be alive: refusing the newcomer is the safe side, it loses nothing stored).
    """
    try:
        host, port = parse_host_port(address)  # InvalidArgument is a ValueError
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except TimeoutError:
        return True
    except (OSError, ValueError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


def _check_keys(namespace_id: bytes, keys: Any) -> None:
    """Limits shared by the lookups (namespace id, key count, key sizes).

    Raises:
        InvalidArgument: naming the limit and what was received.
    """
    check_namespace_length(namespace_id)
    if len(keys) > MAX_LOOKUP_KEYS:
        raise InvalidArgument(f"{len(keys)} keys in one lookup; the limit is {MAX_LOOKUP_KEYS}")
    for i, k in enumerate(keys):
        if not k or len(k) > MAX_KEY_BYTES:
            raise InvalidArgument(f"key {i} must have 1..{MAX_KEY_BYTES} bytes, got {len(k)}")


class _Handlers:
    """Takes the method handlers the generated ``add_MasterServiceServicer_to_server``
    registers (a stand-in for the server)."""

    def __init__(self) -> None:
        self.handlers: dict[str, Any] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.handlers = dict(handlers)


def master_method_handlers(servicer: MasterServicer) -> dict[str, Any]:
    """The MasterService's gRPC method handlers: the generated ones, except the hot two,
    whose requests reach the handler with their wire bytes (:class:`WireRequest`: C reads
    the bytes, nothing is serialized again) and LookupPrefix's answer goes out as the bytes
    the handler built (:class:`WireAnswer`, :func:`serialize_answer`)."""
    got = _Handlers()
    pb_grpc.add_MasterServiceServicer_to_server(servicer, got)
    h = got.handlers
    h["Heartbeat"] = grpc.unary_unary_rpc_method_handler(
        servicer.Heartbeat, request_deserializer=read_heartbeat,
        response_serializer=pb.HeartbeatResponse.SerializeToString)
    h["LookupPrefix"] = grpc.unary_unary_rpc_method_handler(
        servicer.LookupPrefix, request_deserializer=WireRequest.reader(pb.MasterLookupPrefixRequest),
        response_serializer=serialize_answer)
    return h


def add_master_service(server: grpc.aio.Server, servicer: MasterServicer) -> None:
    """Register the MasterService on a grpc.aio server (:func:`master_method_handlers`)."""
    handlers = master_method_handlers(servicer)
    name = "kvstored.v1.MasterService"
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    server.add_registered_method_handlers(name, handlers)
