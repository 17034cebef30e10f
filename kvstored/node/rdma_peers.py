"""Which transport a node's read of a peer uses (issue 18 section 2; docs/rdma.md): RDMA when
both ends advertise a device, TCP otherwise and on any RDMA error, within the same deadline.

The one place the transport choice lives; :class:`~kvstored.node.remote.RemoteReads` only
calls ``transport_for(peer data address)`` (its fallback across replicas is its own)::

    transport_for(address)
      this node has no NodeRdma ([rdma] off, no device)  -> TCP
      peer unknown to the cached ListNodes view, or its transports lack "rdma" -> TCP
      a connected QP to the peer's epoch                  -> PeerReads(TCP, RDMA)
      none: ConnectRdma on the peer's gRPC address (role node): our RC QP's advert for
        its QP and arena MR; a failure keeps the peer on TCP for [rdma] reconnect_s
    PeerReads.get(keys)
      lookup_slots: READs of the peer's index buckets and slot headers (no peer CPU)
      read_header_checked: READ headers, READ blocks, READ headers again; a block is kept
        only with the same even version both times, its ident, size, generation and an
        inline meta (kvstored/node/rdma_slots.py, kvstored/tiers/slots.py)
      the keys not delivered (not in DRAM, changed, meta not inline) -> TCP, same call
      any RDMA error (verbs, failed WR, deadline) -> the whole get over TCP, the QP is
        destroyed (nothing lands later), the peer stays on TCP for reconnect_s

Each block RDMA delivered carries the generation of its slot header, so RemoteReads verifies
the copy against the master's name exactly as one sent over TCP. Counted by path
(:class:`PathCounts`: ``kvstored_remote_reads_total{path}``, ``kvstorectl stats``).

Thread-safe: RemoteReads copies from several peers at once; reads of one peer over RDMA go
one at a time (the peer's bounce buffer is shared), over TCP as the pool allows.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from kvstored.errors import KvstoredError, TransferFailed
from kvstored.node.rdma_slots import lookup_slots, slot_check, slot_header_region
from kvstored.tiers.slots import META_INLINE_BYTES, Layout
from kvstored.transport.base import GetItem, PutItem, Sink, Transport, attach_completed
from kvstored.transport.rdma import (
    HeaderCheck,
    RdmaAdvert,
    RdmaEndpoint,
    RdmaTransport,
    connect,
    read_header_checked,
)

if TYPE_CHECKING:
    from kvstored.config import RdmaConfig
    from kvstored.node.rdma_node import NodeRdma

log = structlog.get_logger(__name__)

_LENS = struct.Struct("<II")  # slot header offset 48: key_len, meta_len
_META_OFF = 64
_VIEW_TIMEOUT_S = 0.5  # one ListNodes for the peer view: never much of a read's deadline
_CONNECT_TIMEOUT_S = 1.0


@dataclass(frozen=True, slots=True)
class PeerInfo:
    """A peer as the master's ListNodes names it: ids, addresses, and the transports it
    advertised when it registered (``("tcp", "rdma")`` with a device)."""

    node_id: str
    epoch: int
    grpc_address: str
    data_address: str
    transports: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ConnectAnswer:
    """A peer's ConnectRdma answer: its advert (JSON), our session on it, its arena's block
    bytes (the slot layout follows them), its arena file, and its epoch."""

    advert: bytes
    session_id: int
    arena_size_bytes: int
    arena_path: str
    epoch: int


ListPeers = Callable[[float], list[PeerInfo]]
"""``list_peers(timeout_s)``: the master's ListNodes. Raises KvstoredError."""
ConnectPeer = Callable[[PeerInfo, bytes, float], ConnectAnswer]
"""``connect_peer(peer, our advert JSON, timeout_s)``: the peer's ConnectRdma."""
DisconnectPeer = Callable[[PeerInfo, int, float], None]
"""``disconnect_peer(peer, session id, timeout_s)``: the peer's DisconnectRdma."""
CheckFactory = Callable[[bytes, Sequence[bytes], Sequence[Any]], HeaderCheck]
"""``factory(namespace_id, keys, regions)`` -> the header check (tests: a mutation)."""


class PathCounts:
    """Blocks peers delivered to this node's reads, by path, and RDMA reads that fell back
    to TCP. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rdma_blocks = 0
        self.tcp_blocks = 0
        self.fallbacks = 0

    def add(self, *, rdma: int = 0, tcp: int = 0, fallbacks: int = 0) -> None:
        """Count blocks delivered over RDMA / TCP and RDMA reads that fell back."""
        with self._lock:
            self.rdma_blocks += rdma
            self.tcp_blocks += tcp
            self.fallbacks += fallbacks


def slot_meta(header: bytes) -> bytes | None:
    """The inline meta of a slot header (kvstored/tiers/slots.py), None when it is not
    inline (longer than 64 bytes: that block goes over TCP)."""
    _key_len, meta_len = _LENS.unpack_from(header, 48)
    if meta_len > META_INLINE_BYTES:
        return None
    return bytes(header[_META_OFF:_META_OFF + meta_len])


def read_peer_dram(
    transport: Any, lay: Layout, keys: Sequence[bytes], namespace_id: bytes, sink: Sink, *,
    deadline: float, check: CheckFactory | None = None,
    after_copy: Callable[[], None] | None = None,
) -> list[tuple[int, bytes] | None]:
    """A peer's DRAM blocks by one-sided READs only (no call to its CPU), with their meta.

    ``namespace_id`` is the stored (tenant-scoped) id. Per key ``(generation, meta)`` of a
    block whose bytes reached ``sink(i, size, meta)``, or None (a miss in the peer's DRAM
    index, a block that changed while it was read, or a meta that is not inline: ask the
    node). ``check``: replaces :func:`~kvstored.node.rdma_slots.slot_check` (tests).
    ``after_copy``: test hook after the payload READs. Raises what the transport raises
    (TransferFailed, DeadlineExceeded), having delivered nothing.
    """
    located = lookup_slots(transport, lay, keys, namespace_id, deadline=deadline)
    idx = [i for i, r in enumerate(located) if r is not None]
    regions = [r for r in located if r is not None]
    out: list[tuple[int, bytes] | None] = [None] * len(keys)
    if not regions:
        return out
    base = (check or slot_check)(namespace_id, [keys[i] for i in idx], regions)
    metas: dict[int, bytes] = {}

    def checked(j: int, before: bytes, after: bytes) -> bool:
        meta = slot_meta(before)
        if meta is None or not base(j, before, after):
            return False
        metas[j] = meta
        return True

    def to_sink(j: int, size: int, _meta: bytes) -> memoryview | None:
        return sink(idx[j], size, metas[j])

    hits = read_header_checked(transport, regions, [slot_header_region(lay, r) for r in regions],
                               checked, to_sink, deadline=deadline, after_copy=after_copy)
    for j, ok in enumerate(hits):
        if ok:
            out[idx[j]] = (regions[j].generation, metas[j])
    return out


class PeerReads:
    """The :class:`~kvstored.transport.base.Transport` a node reads one peer through.

    Args:
        tcp: the peer's data plane (a DataPlaneClient with ``peer_export``).
        rdma: a connected transport to the peer's arena MR, or None (TCP only).
        layout: the peer arena's slot layout (with ``rdma``).
        counts: where delivered blocks are counted by path.
        check: the header check factory (tests: a mutation); None = the real one.
        on_broken: called once when the RDMA path fails (the owner schedules a reconnect).

    A get delivers the peer's DRAM hits over RDMA and the rest over TCP in the same call;
    any RDMA error sends the whole get over TCP (nothing was delivered by RDMA then) and
    every later get straight to TCP. Puts always go over TCP. Thread-safe.
    """

    def __init__(self, tcp: Transport, rdma: RdmaTransport | None, layout: Layout | None,
                 counts: PathCounts, *, check: CheckFactory | None = None,
                 on_broken: Callable[[], None] | None = None,
                 after_copy: Callable[[], None] | None = None) -> None:
        self.tcp = tcp
        self.rdma = rdma if layout is not None else None
        self.layout = layout
        self.counts = counts
        self.check = check
        self.on_broken = on_broken
        self.after_copy = after_copy

    @property
    def path(self) -> str:
        """``"rdma"`` while the RDMA path is usable, else ``"tcp"``."""
        return "rdma" if self.rdma is not None and not self.rdma.broken else "tcp"

    def _tcp_get(self, keys: Sequence[bytes], namespace_id: bytes, sink: Sink,
                 deadline: float) -> list[GetItem]:
        got = self.tcp.get(keys, namespace_id, sink, deadline=deadline)
        self.counts.add(tcp=sum(1 for g in got if g.found))
        return got

    def get(self, keys: Sequence[bytes], namespace_id: bytes, sink: Sink, *,
            deadline: float) -> list[GetItem]:
        """As :meth:`~kvstored.transport.base.Transport.get`; RDMA-delivered items carry
        tier DRAM, the slot's meta and generation."""
        rdma, lay = self.rdma, self.layout
        if rdma is None or lay is None or rdma.broken:
            return self._tcp_get(keys, namespace_id, sink, deadline)
        sizes: dict[int, int] = {}
        delivering = False

        def sized(i: int, size: int, meta: bytes) -> memoryview | None:
            nonlocal delivering
            delivering = True  # from here on a failure is the sink's, not RDMA's
            sizes[i] = size
            return sink(i, size, meta)

        try:
            hits = read_peer_dram(rdma, lay, keys, namespace_id, sized, deadline=deadline,
                                  check=self.check, after_copy=self.after_copy)
        except (KvstoredError, OSError) as exc:
            if delivering:
                raise
            self.counts.add(fallbacks=1)
            log.warning("rdma_read_fell_back", num_blocks=len(keys), error=str(exc))
            if self.on_broken is not None:
                self.on_broken()
            return self._tcp_get(keys, namespace_id, sink, deadline)
        items: list[GetItem | None] = [None] * len(keys)
        for i, h in enumerate(hits):
            if h is not None:
                items[i] = GetItem(0, "", True, 1, sizes.get(i, 0), h[1], h[0])
        self.counts.add(rdma=sum(1 for h in hits if h is not None))
        rest = [i for i, h in enumerate(hits) if h is None]
        if rest:
            def rest_sink(j: int, size: int, meta: bytes) -> memoryview | None:
                return sink(rest[j], size, meta)
            try:
                got = self._tcp_get([keys[i] for i in rest], namespace_id, rest_sink, deadline)
            except KvstoredError as exc:
                attach_completed(exc, items)  # the RDMA-delivered blocks are whole: keep them
                raise
            for j, item in enumerate(got):
                items[rest[j]] = item
        return [it if it is not None else GetItem(0, "", False, 0, 0, b"") for it in items]

    def put(self, items: Sequence[tuple[bytes, memoryview, bytes]], namespace_id: bytes, *,
            deadline: float, replicas: int = 0,
            handoff_age_s: float | None = None, spare_only: bool = False) -> list[PutItem]:
        """Over TCP (:meth:`~kvstored.transport.base.Transport.put`)."""
        return self.tcp.put(items, namespace_id, deadline=deadline, replicas=replicas,
                            handoff_age_s=handoff_age_s, spare_only=spare_only)

    def close(self) -> None:
        """Close the RDMA path only (the TCP client belongs to :class:`PeerTransports`)."""
        if self.rdma is not None:
            self.rdma.close()


@dataclass(slots=True)
class _Conn:
    peer: PeerInfo
    epoch: int
    reads: PeerReads
    endpoint: RdmaEndpoint | None = None
    session_id: int = 0
    retry_at: float = 0.0  # while reads has no RDMA: when to try again


class PeerTransports:
    """``transport_for(peer data address)`` for :class:`~kvstored.node.remote.RemoteReads`.

    Args:
        rdma: this node's RDMA side (None: every peer over TCP, counted).
        cfg: ``[rdma]`` (bounce buffer, reconnect_s, peer_view_s).
        node_id, epoch: this node (ConnectRdma names them: a restart ends our old QPs there).
        tcp_for: a peer's TCP data plane by address (built once per address here).
        list_peers, connect_peer, disconnect_peer: the master's ListNodes and a peer's
            ConnectRdma / DisconnectRdma (see :func:`grpc_peer_calls`).
        max_block_bytes: the bounce buffer holds at least one block.
        clock: monotonic seconds (tests: a fake).
        check: the header check factory (tests: a mutation).
    """

    def __init__(self, rdma: NodeRdma | None, cfg: RdmaConfig, *, node_id: str, epoch: int,
                 tcp_for: Callable[[str], Transport], list_peers: ListPeers,
                 connect_peer: ConnectPeer, disconnect_peer: DisconnectPeer,
                 max_block_bytes: int, clock: Callable[[], float] = time.monotonic,
                 check: CheckFactory | None = None) -> None:
        self.rdma = rdma
        self.cfg = cfg
        self.node_id = node_id
        self.epoch = epoch
        self.tcp_for = tcp_for
        self.list_peers = list_peers
        self.connect_peer = connect_peer
        self.disconnect_peer = disconnect_peer
        self.bounce_bytes = max(cfg.bounce_buffer_bytes, max_block_bytes)
        self.clock = clock
        self.check = check
        self.counts = PathCounts()
        self._lock = threading.Lock()
        self._tcp: dict[str, Transport] = {}
        self._plain: dict[str, PeerReads] = {}
        self._conns: dict[str, _Conn] = {}
        self._connecting: set[str] = set()
        self._view: dict[str, PeerInfo] = {}
        self._view_at = float("-inf")
        self._closed = False

    def _plain_for(self, address: str) -> PeerReads:
        with self._lock:
            t = self._plain.get(address)
            if t is None:
                tcp = self._tcp.get(address)
                if tcp is None:
                    tcp = self._tcp[address] = self.tcp_for(address)
                t = self._plain[address] = PeerReads(tcp, None, None, self.counts)
            return t

    def _peer(self, address: str) -> PeerInfo | None:
        now = self.clock()
        with self._lock:
            fresh = now - self._view_at < self.cfg.peer_view_s
            known = self._view.get(address)
            if fresh:
                return known
            self._view_at = now  # at most one refresh per peer_view_s, even a failed one
        try:
            peers = self.list_peers(_VIEW_TIMEOUT_S)
        except KvstoredError as exc:
            log.info("rdma_peer_view_failed", error=str(exc))
            return known
        with self._lock:
            self._view = {p.data_address: p for p in peers}
            return self._view.get(address)

    def path_of(self, address: str) -> str:
        """The path the next read of the peer at ``address`` takes (``rdma`` or ``tcp``)."""
        with self._lock:
            c = self._conns.get(address)
        return c.reads.path if c is not None else "tcp"

    def transport_for(self, address: str) -> Transport:
        """The transport a read of the peer at ``address`` uses now (never raises for an
        RDMA failure: that peer is read over TCP)."""
        plain = self._plain_for(address)
        if self.rdma is None:
            return plain
        peer = self._peer(address)
        if peer is None or "rdma" not in peer.transports:
            return plain
        now = self.clock()
        with self._lock:
            if self._closed:
                return plain
            c = self._conns.get(address)
            # c.epoch is the one the peer answered: a view that names an older one lags (the
            # peer restarted since it was read); only a newer one means our QP is gone
            current = c is not None and c.epoch >= peer.epoch
            if c is not None and current and c.reads.path == "rdma":
                return c.reads
            if c is not None and current and now < c.retry_at:
                return plain
            if address in self._connecting:
                return plain
            self._connecting.add(address)
            old = self._conns.pop(address, None)
        try:
            if old is not None:  # a restarted peer has no session of ours to end
                self._teardown(old, same_epoch=old.epoch >= peer.epoch)
            c = self._connect(peer, plain.tcp)
            with self._lock:
                if self._closed:
                    self._teardown(c, same_epoch=True)
                    return plain
                self._conns[address] = c
            return c.reads if c.reads.path == "rdma" else plain
        finally:
            with self._lock:
                self._connecting.discard(address)

    def _connect(self, peer: PeerInfo, tcp: Transport) -> _Conn:
        assert self.rdma is not None
        verbs = self.rdma.verbs
        answer: list[ConnectAnswer] = []
        endpoint: RdmaEndpoint | None = None
        retry_at = self.clock() + self.cfg.reconnect_s

        def exchange(local: bytes) -> bytes:
            got = self.connect_peer(peer, local, _CONNECT_TIMEOUT_S)
            answer.append(got)
            if verbs.attach_peer is not None:  # a fake verbs layer reaching the peer's file
                verbs.attach_peer(RdmaAdvert.from_json(got.advert), got.arena_path)
            return got.advert

        try:
            endpoint = self.rdma.reader_endpoint(self.bounce_bytes)
            rdma = connect(endpoint, exchange)
            lay = Layout(answer[0].arena_size_bytes)
            if lay.total_bytes != rdma.peer.length_bytes:
                rdma.close()
                raise TransferFailed(
                    f"peer {peer.node_id} registered {rdma.peer.length_bytes} bytes, its "
                    f"{answer[0].arena_size_bytes}-byte arena's file is {lay.total_bytes}")
        except (KvstoredError, ValueError, OSError, verbs.error) as exc:
            log.warning("rdma_connect_failed", peer=peer.node_id, error=str(exc),
                        retry_in_s=self.cfg.reconnect_s)
            if answer:
                self._disconnect(peer, answer[0].session_id)
            if endpoint is not None:
                endpoint.close()
            plain = PeerReads(tcp, None, None, self.counts)
            return _Conn(peer, peer.epoch, plain, retry_at=retry_at)
        a = answer[0]
        conn = _Conn(peer, a.epoch, PeerReads(tcp, rdma, lay, self.counts, check=self.check),
                     endpoint=endpoint, session_id=a.session_id)

        def broken() -> None:  # the next transport_for after reconnect_s tries a new QP
            conn.retry_at = self.clock() + self.cfg.reconnect_s
        conn.reads.on_broken = broken
        log.info("rdma_peer_reads", peer=peer.node_id, session_id=a.session_id,
                 region_bytes=rdma.peer.length_bytes)
        return conn

    def _disconnect(self, peer: PeerInfo, session_id: int) -> None:
        try:
            self.disconnect_peer(peer, session_id, _CONNECT_TIMEOUT_S)
        except KvstoredError as exc:
            log.info("rdma_disconnect_failed", peer=peer.node_id, error=str(exc))

    def _teardown(self, c: _Conn, *, same_epoch: bool) -> None:
        c.reads.close()
        if c.session_id and same_epoch:
            self._disconnect(c.peer, c.session_id)
        if c.endpoint is not None:
            c.endpoint.close()

    def close(self) -> None:
        """Tear down every QP (DisconnectRdma to each peer, best effort) and close every
        TCP client (idempotent)."""
        with self._lock:
            self._closed = True
            conns, self._conns = list(self._conns.values()), {}
            tcps, self._tcp = list(self._tcp.values()), {}
            self._plain = {}
        for c in conns:
            self._teardown(c, same_epoch=True)
        for t in tcps:
            t.close()


def grpc_peer_calls(master_list_nodes: Callable[[float], dict[str, object]], *,
                    node_id: str, epoch: int, tls: Any = None
                    ) -> tuple[ListPeers, ConnectPeer, DisconnectPeer]:
    """The three calls :class:`PeerTransports` makes, over gRPC: ``master_list_nodes
    (timeout_s)`` (the master's ListNodes as :meth:`MasterClient.list_nodes` returns it),
    and each peer's ConnectRdma / DisconnectRdma on its gRPC address (mutual TLS with
    ``tls``: the call is a node's, role ``node``). Errors come back as KvstoredError."""
    import grpc

    from kvstored.rpc_status import error_from_rpc
    from kvstored.security.tls import open_channel
    from kvstored.v1 import node_pb2 as pb
    from kvstored.v1 import node_pb2_grpc as node_grpc

    def list_peers(timeout_s: float) -> list[PeerInfo]:
        got = master_list_nodes(timeout_s)
        out = []
        for n in got.get("nodes", []):  # type: ignore[attr-defined]  # a list of dicts
            out.append(PeerInfo(str(n["node_id"]), int(n["epoch"]), str(n["grpc_address"]),
                                str(n["data_address"]), tuple(n.get("transports", ("tcp",)))))
        return out

    def call(peer: PeerInfo, method: str, req: Any, timeout_s: float) -> Any:
        channel = open_channel(peer.grpc_address, tls)
        try:
            return getattr(node_grpc.NodeServiceStub(channel), method)(req, timeout=timeout_s)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        finally:
            channel.close()

    def connect_peer(peer: PeerInfo, advert: bytes, timeout_s: float) -> ConnectAnswer:
        r = call(peer, "ConnectRdma", pb.ConnectRdmaRequest(advert=advert, node_id=node_id,
                                                            epoch=epoch), timeout_s)
        return ConnectAnswer(bytes(r.advert), r.session_id, r.arena_size_bytes, r.arena_path,
                             r.epoch)

    def disconnect_peer(peer: PeerInfo, session_id: int, timeout_s: float) -> None:
        call(peer, "DisconnectRdma", pb.DisconnectRdmaRequest(session_id=session_id), timeout_s)

    return list_peers, connect_peer, disconnect_peer
