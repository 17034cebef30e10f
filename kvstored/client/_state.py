"""What a client knows about its node (:class:`ClientState`), retries, and Describe."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Literal

import grpc
import structlog

from kvstored.addresses import format_host_port, parse_address, parse_host_port
from kvstored.client import _control
from kvstored.client._orphans import Background, OrphanAcks
from kvstored.client._rdma import RdmaReads, open_rdma_reads
from kvstored.client._shm import ArenaMap
from kvstored.client._slots import DEFAULT_RESERVE_AHEAD_BYTES, SlotPool
from kvstored.client._steps import (
    INITIAL_BACKOFF_S,
    MAX_BACKOFF_S,
    TRANSPORTS,
    Blocking,
    Call,
    Op,
    Session,
)
from kvstored.client.types import NodeInfo
from kvstored.errors import DeadlineExceeded, InvalidArgument, KvstoredError, Unavailable
from kvstored.keys import Namespace
from kvstored.rpc_status import error_from_rpc
from kvstored.security.identity import principal_from_pem
from kvstored.security.tls import TlsFiles, tls_from_env
from kvstored.tenancy import check_tenant, scope_namespace
from kvstored.transport.tcp import DataPlaneClient
from kvstored.v1 import node_pb2 as pb

log = structlog.get_logger(__name__)


_shm_fallbacks_logged: set[tuple[str, str]] = set()
_shm_fallbacks_lock = threading.Lock()


def _log_shm_fallback_once(address: str, arena_path: str, reason: str, transport: str) -> None:
    """Warn once per process and (address, arena) that the arena could not be mapped."""
    with _shm_fallbacks_lock:
        if (address, arena_path) in _shm_fallbacks_logged:
            return
        _shm_fallbacks_logged.add((address, arena_path))
    log.warning(
        "shm_transport_fell_back", address=address, arena_path=arena_path, transport=transport,
        reason=reason,
        hint="run the client as the daemon's user or in its group (node.arena_mode = 0o660, "
        "node.socket_mode = 0o660; see systemd/kvstored-node.service)",
    )



MAX_TIMEOUT_S = 86400.0
"""Longest deadline a call may have, seconds (one day). Longer ones overflow gRPC's deadline
(a call with ``inf`` failed at once with DEADLINE_EXCEEDED and was retried for ever)."""


def check_timeout_s(timeout_s: object) -> None:
    """Raise InvalidArgument unless ``timeout_s`` is a finite number in (0, MAX_TIMEOUT_S]."""
    if (
        isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
        or not 0 < timeout_s <= MAX_TIMEOUT_S  # also False for nan and inf
    ):
        raise InvalidArgument(
            f"timeout_s must be a number of seconds in (0, {MAX_TIMEOUT_S:.0f}]; got {timeout_s!r}"
        )


MAX_REPLICAS = 8
"""Most replicas of one block (the master's limit)."""


def check_replicas(replicas: int | None, what: str) -> int | None:
    """``replicas`` when it is None or an int in 1..:data:`MAX_REPLICAS`.

    Raises:
        InvalidArgument: naming ``what`` and the value received.
    """
    if replicas is None:
        return None
    if not isinstance(replicas, int) or isinstance(replicas, bool) or not (
            1 <= replicas <= MAX_REPLICAS):
        raise InvalidArgument(f"{what} must be None (the default) or an int in "
                              f"1..{MAX_REPLICAS}; got {replicas!r}")
    return replicas


def default_tenant(tenant: str | None, tls: TlsFiles | None) -> str:
    """The tenant a client acts for: ``tenant`` when given (even ""), else the
    ``kvstored://tenant/T`` SAN URI of its own TLS certificate, else the shared tenant "".

    So an engine whose certificate names its tenant needs no ``tenant=``: its declared
    tenant, and the stored ids it sends on the TCP data plane, are its certificate's.

    Raises:
        Unauthenticated: the certificate's ``kvstored://`` URIs are malformed (as the
            servers would refuse it: :func:`kvstored.security.identity.principal_from_pem`).
    """
    if tenant is not None:
        return tenant
    if tls is None:
        return ""
    return principal_from_pem(tls.cert_pem).tenant


class ClientState:
    """What a client knows about its node; shared by the sync and async clients.

    Thread-safe: ``install``/``invalidate``/``close`` take a lock; readers take a snapshot.
    """

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float,
        namespace: Namespace | None,
        transport: str,
        replicas: int | None = None,
        tenant: str | None = None,
        tls: TlsFiles | Literal[False] | None = None,
        reserve_ahead_bytes: int | None = None,
    ) -> None:
        if transport not in TRANSPORTS:
            raise InvalidArgument(f"transport must be one of {TRANSPORTS}; got {transport!r}")
        check_timeout_s(timeout_s)
        if namespace is not None and not isinstance(namespace, Namespace):
            raise InvalidArgument(f"namespace must be a kvstored.Namespace; got {type(namespace).__name__}")
        self.address = address
        self.target, self.is_unix = parse_address(address)
        self.timeout_s = float(timeout_s)
        self.namespace = namespace
        self.namespace_id = namespace.id if namespace is not None else b""
        self.tls: TlsFiles | None = (None if tls is False else tls if tls is not None
                                     else tls_from_env())
        """Mutual TLS to a TCP address and to the node's data plane (None = plaintext;
        a unix address never uses it)."""
        self.tenant = check_tenant(default_tenant(tenant, self.tls), what="Client(tenant=...)")
        """The tenant the client acts for: ``tenant=``, else its certificate's, else ""."""
        self.stored_namespace_id = scope_namespace(self.tenant, self.namespace_id)
        """The id the TCP data plane carries (tenant-scoped, docs/tenants.md)."""
        self.transport = transport
        self.replicas = check_replicas(replicas, "Client(replicas=...)")
        self.info: NodeInfo | None = None
        self.transport_info: NodeInfo | None = None  # the node the transport was set up for
        self.arena: ArenaMap | None = None
        self.session_epoch = 0
        """The node epoch the open OpenSession stream was answered with (0: none yet); the
        driver sets it. One-sided reads run only inside a live session of the epoch whose
        arena is mapped (kvstored/client/_shm.py ``one_sided_live``)."""
        self.dataplane: DataPlaneClient | None = None
        self.rdma: RdmaReads | None = None
        """The RDMA path to a remote node (kvstored/client/_rdma.py), over ``dataplane``;
        None = TCP only."""
        self.connected = False
        self.control: Any = None  # the lean control channel (_control.py), None = gRPC only
        # set by a driver that can run calls over the channel: ControlChannel (sync) or
        # AsyncControlChannel (asyncio); None = gRPC only
        self.control_factory: Callable[[str], Any] | None = None
        if reserve_ahead_bytes is None:
            reserve_ahead_bytes = DEFAULT_RESERVE_AHEAD_BYTES
        if type(reserve_ahead_bytes) is not int or reserve_ahead_bytes < 0:
            raise InvalidArgument(
                "reserve_ahead_bytes must be an int >= 0 (bytes of arena slots held ahead for "
                f"the next puts; 0 = off); got {reserve_ahead_bytes!r}"
            )
        self.slots = SlotPool(reserve_ahead_bytes)
        """Reserve-ahead slots for shared-memory puts (kvstored/client/_slots.py)."""
        self.one_sided_counts = _control.OneSidedCounts()
        """One-sided reads and probes not reported to the node yet (the control channel
        carries them: kvstored/client/_control.py)."""
        self.orphans = OrphanAcks()  # grants whose answer never arrived, until acked
        self.background = Background()  # acks and late releases still in flight
        self._lock = threading.Lock()

    def deadline(self, timeout_s: float | None) -> float:
        t = self.timeout_s if timeout_s is None else timeout_s
        check_timeout_s(t)
        return time.monotonic() + t

    def data_address(self, info: NodeInfo) -> str:
        host, port = parse_host_port(info.data_address)
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1" if self.is_unix else parse_host_port(self.target)[0]
        return format_host_port(host, port)

    def choose_transport(
        self, info: NodeInfo
    ) -> tuple[str, ArenaMap | None, DataPlaneClient | None]:
        """Pick shm / tcp / grpc for this node (blocking: may map the arena).

        Raises:
            InvalidArgument: an explicitly requested transport is not possible.
        """
        pref = self.transport
        if pref in ("auto", "shm"):
            reason = ""
            if pref == "auto" and not self.is_unix:
                reason = "the address is TCP (shared memory is only tried over a unix socket)"
            elif not info.arena_path:
                reason = "the node has no arena file"
            else:
                try:
                    return "shm", ArenaMap(
                        info.arena_path, info.arena_size_bytes, info.arena_dev, info.arena_ino
                    ), None
                except (OSError, InvalidArgument, ValueError) as exc:
                    reason = f"cannot map {info.arena_path}: {exc}"
                    if pref == "auto":
                        _log_shm_fallback_once(
                            self.address, info.arena_path, reason,
                            "tcp" if info.data_address else "grpc",
                        )
            if pref == "shm":
                raise InvalidArgument(f"transport='shm' is not possible: {reason}")
        if pref in ("auto", "tcp") and info.data_address:
            return "tcp", None, DataPlaneClient(
                self.data_address(info), max_block_bytes=info.max_block_bytes,
                max_meta_bytes=info.max_meta_bytes, fill_from_peers=True,  # an engine's reads
                ssl_context=self.tls.client_context() if self.tls is not None else None,
            )
        if pref == "tcp":
            raise InvalidArgument(
                "transport='tcp' is not possible: the node has no data plane (node.data_address)"
            )
        return "grpc", None, None

    def open_control(self, info: NodeInfo) -> Any:
        """The node's control channel, if this client may use it (blocking: connects).

        Only over a unix address, when the driver supports it and the node advertises one,
        and for the shared tenant only; a channel that cannot be reached leaves every call on
        gRPC (logged once).
        """
        factory = self.control_factory
        if not (factory is not None and self.is_unix and info.control_path and _control.enabled()):
            return None
        if self.tenant:
            # a ControlRequest has no tenant, and its session-less ops (Exists, LookupPrefix,
            # Put) would act for the shared tenant: a tenanted client stays on gRPC, whose
            # metadata declares its tenant on every call (docs/tenants.md)
            return None
        try:
            channel = factory(info.control_path)
        except OSError as exc:
            log.info("control_channel_unreachable", address=self.address,
                     control_path=info.control_path, reason=str(exc))
            return None
        channel.counts = self.one_sided_counts  # reported on its requests (_control.py)
        return channel

    def reuse(self, info: NodeInfo) -> NodeInfo | None:
        """Adopt ``info`` with the current transport if that was set up for the same epoch
        (a transient failure, not a restart); None if the transport must be set up again."""
        with self._lock:
            done = self.transport_info
            if done is None or done.epoch != info.epoch:
                return None
            self.info = replace(info, transport=done.transport)
            return self.info

    def install(
        self, info: NodeInfo, arena: ArenaMap | None, dataplane: DataPlaneClient | None,
        control: Any = None,
    ) -> NodeInfo:
        """Adopt a described node and its new transport; returns the info now in use."""
        old_arena = old_dp = old_control = None
        old_rdma = None
        with self._lock:
            done = self.transport_info
            if done is not None and done.epoch == info.epoch:
                # another thread set up this very node meanwhile: keep its transport
                self.info = replace(info, transport=done.transport)
                current = self.info
                old_arena, old_dp, old_control = arena, dataplane, control
            else:
                old_arena, old_dp, old_control = self.arena, self.dataplane, self.control
                old_rdma, self.rdma = self.rdma, None  # over the old data plane: set up again
                self.info = self.transport_info = info
                self.arena, self.dataplane, self.control = arena, dataplane, control
                current = info
        if old_rdma is not None:
            old_rdma.close()
        if old_arena is not None:
            old_arena.close()
        if old_dp is not None:
            old_dp.close()
        if old_control is not None:
            old_control.close(timeout_s=1.0)
        return current

    def invalidate(self) -> None:
        """Forget the node (after Unavailable): the next call describes it again."""
        with self._lock:
            self.info = None

    def close(self) -> None:
        with self._lock:
            self.info = self.transport_info = None
            arena, self.arena = self.arena, None
            dp, self.dataplane = self.dataplane, None
            rdma, self.rdma = self.rdma, None
            control, self.control = self.control, None
        if rdma is not None:  # its QP before the data plane it falls back to
            rdma.close()
        if control is not None:  # its deferred releases first
            control.close()
        if arena is not None:
            arena.close()
        if dp is not None:
            dp.close()

    def map_rpc_error(self, exc: grpc.RpcError) -> KvstoredError:
        """A failed RPC as a KvstoredError; never-connected timeouts become Unavailable."""
        err = error_from_rpc(exc)
        if isinstance(err, DeadlineExceeded) and not self.connected:
            return Unavailable(
                f"node at {self.address} did not answer within the deadline (is kvstored "
                f"running there?{self._tls_hint()}): {err}"
            )
        if isinstance(err, Unavailable) and not self.connected:
            return Unavailable(f"node at {self.address} is unreachable{self._tls_hint()}: {err}")
        return err

    def _tls_hint(self) -> str:
        """What to check about TLS when a TCP node never answered (a TLS server closes a
        plaintext or badly certified connection without saying why)."""
        if self.is_unix:
            return ""
        if self.tls is None:
            return "; if it uses TLS, pass tls= or set KVSTORED_TLS__CERT_FILE/KEY_FILE/CA_FILE"
        return ("; with TLS: the node's certificate must name this host and chain to "
                f"{self.tls.ca_file}, and {self.tls.cert_file} must be valid and signed by its CA")


def retry_delay(exc: KvstoredError, attempt: int, deadline: float) -> float | None:
    """Seconds to wait before retrying after ``exc``, or None to give up (not retriable, or
    the deadline would pass)."""
    if not exc.retriable:
        return None
    base = min(MAX_BACKOFF_S, INITIAL_BACKOFF_S * (2**attempt))
    delay = base / 2 + random.uniform(0, base / 2)
    if time.monotonic() + delay >= deadline:
        return None
    return delay


def final_error(exc: KvstoredError, retried: KvstoredError | None, deadline: float) -> KvstoredError:
    """The error a call that gives up raises: ``exc``, unless the deadline ran out while
    retrying an earlier error (then that one, e.g. Draining or Unavailable, which says why,
    instead of a bare DeadlineExceeded that depends on how long the last backoff slept)."""
    if retried is not None and isinstance(exc, DeadlineExceeded) and time.monotonic() >= deadline:
        return retried
    return exc



# ---- describe -----------------------------------------------------------------------------------


def node_info_from_proto(resp: pb.DescribeResponse) -> NodeInfo:
    """Decode Describe."""
    return NodeInfo(
        node_id=resp.node_id, version=resp.version, epoch=resp.epoch, arena_path=resp.arena_path,
        arena_size_bytes=resp.arena_size_bytes, data_address=resp.data_address,
        max_block_bytes=resp.max_block_bytes, max_batch_keys=resp.max_batch_keys or 8192,
        max_inline_bytes=resp.max_inline_bytes, draining=resp.draining,
        listen_addresses=tuple(resp.listen_addresses), metrics_address=resp.metrics_address,
        arena_dev=resp.arena_dev, arena_ino=resp.arena_ino,
        max_meta_bytes=resp.max_meta_bytes or 4096, min_key_bytes=resp.min_key_bytes or 1,
        max_key_bytes=resp.max_key_bytes or 64, pin_lease_s=(resp.pin_lease_ms or 30000) / 1000,
        control_path=resp.control_path, default_replicas=resp.default_replicas or 1,
        transports=tuple(resp.transports) or ("tcp",),
    )


def ensure_ready(st: ClientState) -> Op[NodeInfo]:
    """Describe the node and set up the transport, once (again after an invalidate)."""
    info = st.info
    if info is not None:
        return info
    resp = yield Call("Describe", pb.DescribeRequest(namespace_id=st.namespace_id),
                      pb.DescribeResponse)
    info = node_info_from_proto(resp)
    reused = st.reuse(info)
    if reused is not None:
        return reused
    transport, arena, dp, control = yield Blocking(
        lambda _deadline: (*st.choose_transport(info), st.open_control(info))
    )
    current = st.install(replace(info, transport=transport), arena, dp, control)
    if current.transport == "tcp" and "rdma" in current.transports and st.dataplane is not None:
        dataplane = st.dataplane  # a remote node with RDMA: its DRAM hits by one-sided READs
        rdma = yield Blocking(lambda _deadline: open_rdma_reads(st, current, dataplane))
        st.rdma = rdma
    return current


def op_describe(st: ClientState) -> Op[NodeInfo]:
    """A fresh Describe (transport re-chosen only if the node restarted)."""
    resp = yield Call("Describe", pb.DescribeRequest(namespace_id=st.namespace_id),
                      pb.DescribeResponse)
    fresh = node_info_from_proto(resp)
    current = st.info
    if current is not None and current.epoch == fresh.epoch:
        return replace(fresh, transport=current.transport)
    st.invalidate()
    info = yield from ensure_ready(st)
    return info


def op_connect(st: ClientState) -> Op[NodeInfo]:
    """A fresh Describe (as :func:`op_describe`), then this client's session opened if its
    transport uses one (shared memory: pins, reservations and one-sided reads belong to it)."""
    info = yield from op_describe(st)
    if info.transport == "shm":
        yield Session()
    return info
