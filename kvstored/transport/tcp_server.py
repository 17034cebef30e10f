"""TCP data-plane server: :class:`DataPlaneServer`, the node's end of the protocol of
:mod:`.framing` (the client: :class:`kvstored.transport.tcp.DataPlaneClient`).

- GET: the server pins a chunk of blocks and sends each payload from the pinned arena view
  with ``sendmsg`` (item header + payload in one call, no copy); the client ``recv_into``'s
  the payload straight into the caller's buffer.
- GET with ``GET_FLAG_FILL_FROM_PEERS`` (an engine's client: ``fill_from_peers=True``):
  a cluster node first copies the blocks it lacks from its peers
  (``DataPlaneServer.fill_from_peers``, set by the daemon), then pins and sends as above.
  A node's own reads of a peer never set it, so the peer answers from its store only.
- GET with ``GET_FLAG_PEER_EXPORT`` (a node copying a peer's blocks: ``peer_export=True``):
  the server sends the blocks through ``read_for_export`` (no promotion, no recency touch,
  no get counted; an SSD-only block read from its file into a private buffer).
- PUT: the server reserves arena space for an item only once the first byte of that item's
  payload has arrived, ``recv_into``'s the payload straight into the reservation, and commits
  the batch when all of it arrived. A connection that breaks mid-stream, or a request that
  runs past its deadline, aborts every reservation of the request, so nothing torn or
  partial ever becomes visible, and a header alone holds no space.

Bounds (server), all from :class:`~kvstored.config.NodeConfig` and checked before anything is
allocated for them: items per request (``max_batch_keys``); body bytes per request and over
all connections together (``dataplane_max_header_bytes``, a shared budget a request waits
for); the sum of a PUT's payload sizes, skipped items included
(``dataplane_max_request_bytes``), so an announced 2^62-byte item is refused at once;
connections (``dataplane_max_connections``). A request that breaks a bound gets an error
response and the connection is closed, since the stream cannot be resynchronised.

Deadline (server): a request has ``dataplane_request_timeout_s`` as a whole, counted from its
first byte, plus its payload at ``dataplane_min_bytes_per_s`` (a PUT's announced sizes, a
GET's blocks as each chunk is pinned); every socket call waits only for what is left of it.
When it passes, the connection thread -- the only writer into the request's reservations and
the only reader of its pins -- has already returned from its last ``recv_into``/``sendmsg`` (``sendmsg`` copies
into the kernel), and only then aborts the reservations and releases the pins. So space is
never released while this request may still write it (the fencing rule:
docs/architecture.md#fencing-and-sessions).

TLS (``ssl_context``, with ``[tls]``): the connection's own thread runs the handshake
(``CERT_REQUIRED``, at most ``HANDSHAKE_TIMEOUT_S``) before any request byte is read, and
the peer's certificate must name a role (kvstored/security/identity.py); the accept thread
never blocks on a handshake.

Threads: one accept thread and one daemon thread per connection. ``self._lock`` guards the
connection table, the counters and the shared request-body budget (``_budget_freed`` is a
condition on it); it is never held while calling the store or doing socket I/O.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from kvstored.addresses import format_host_port, parse_host_port
from kvstored.auth import TRUSTED_LOCAL, Principal, require_role
from kvstored.errors import ErrorCode, KvstoredError, PermissionDenied, Unavailable
from kvstored.log import bind_request, new_request_id, request_lines_enabled, unbind_request
from kvstored.security.identity import principal_of_socket
from kvstored.security.tls import HANDSHAKE_TIMEOUT_S
from kvstored.tenancy import check_stored_namespace
from kvstored.transport.framing import (
    GET_FLAG_FILL_FROM_PEERS,
    GET_FLAG_GENERATION,
    GET_FLAG_PEER_EXPORT,
    GET_FLAG_PROBE,
    GET_FLAG_RANGES,
    GET_ITEM,
    GET_ITEM_GEN,
    HEADER,
    OP_GET,
    OP_PUT,
    PUT_FLAG_FACTOR_MASK,
    PUT_FLAG_FACTOR_SHIFT,
    PUT_FLAG_SPARE,
    PUT_ITEM,
    FrameLimits,
    FrameRejected,
    PeerClosed,
    ProtocolError,
    Reader,
    decode_get_body,
    decode_get_ranges_body,
    decode_header,
    decode_put_body_flags,
    encode_header,
    error_response,
    range_bytes,
    send_all,
    short_message,
    tune_socket,
)
from kvstored.types import ExportedBlock, PinnedBlock, PutOutcome, Reservation, Tier

if TYPE_CHECKING:
    from kvstored.transport.base import BlockServer

log = structlog.get_logger(__name__)

GET_CHUNK_KEYS = 64
"""Blocks a GET pins at once on the server (bounds the arena one reader holds)."""

EXPORT_CHUNK_KEYS = 8
"""Blocks a peer's export GET (``GET_FLAG_PEER_EXPORT``) reads before it sends them. An
SSD-only block is read from disk into a private buffer before its chunk goes out, so a
chunk of 64 SSD blocks would send nothing until all 64 were read: a reading peer whose
deadline passes meanwhile keeps nothing. In chunks of 8 the blocks stream out as they are
read, and a peer whose GET fails part-way keeps what arrived whole
(:func:`kvstored.transport.base.completed_items`)."""

FillFromPeers = Callable[..., object]
"""``fill(keys, namespace_id, remaining_s=seconds, through=dict, through_budget_bytes=n
[, cache=False])``: copy the blocks of ``keys`` the node lacks from its peers
(:meth:`kvstored.node.remote.RemoteReads.fill`; best effort, never raises for a peer's
failure); a block it has no room to keep without dropping one is put in
``through[key] = (value, meta)`` instead (at most ``through_budget_bytes`` in all), for
the GET to send without caching it; ``cache=False``: every block received goes to
``through``, none is kept (a block lost here after the first fill, sent from private memory)."""

THROUGH_BUDGET_BYTES = 64 << 20
"""Most bytes one engine GET receives from peers into private buffers for blocks its node
has no room to keep (streamed through, never cached): past it such a block is a miss."""


def _check_tenant(principal: Principal, stored_namespace_id: bytes, action: str) -> None:
    """Refuse a certificate of one tenant addressing another's stored id (nodes and admins
    may address every tenant; a plaintext peer is TRUSTED_LOCAL, an admin).

    Raises:
        PermissionDenied: naming both tenants (kvstored.tenancy.check_stored_namespace).
    """
    if principal.authenticated:
        check_stored_namespace(stored_namespace_id, tenant=principal.tenant,
                               may_cross=principal.has("node") or principal.has("admin"),
                               action=action)


# ---- server --------------------------------------------------------------------------------


@dataclass(slots=True)
class DataPlaneCounters:
    """What the server did since start (a snapshot from :meth:`DataPlaneServer.counters`).

    Attributes:
        requests: requests whose header arrived.
        deadline_exceeded: requests cut off by ``dataplane_request_timeout_s``.
        rejected_frames: requests refused for a bound or a malformed frame (connection closed).
        header_bytes_buffered: request-body bytes held now, over all connections.
    """

    requests: int = 0
    deadline_exceeded: int = 0
    rejected_frames: int = 0
    header_bytes_buffered: int = 0


Hook = Callable[..., None]
"""``hook(event, **fields)``: called on a connection thread at fixed points of a request, for
tests and tracing. Events: ``request_started(op, count)``, ``payload_awaited(index)`` (a PUT
waits for the first byte of item ``index``; nothing is reserved for it yet),
``item_reserved(index, size_bytes)``, ``header_budget_waited(num_bytes)`` (the request waits
for its share of the request-body budget; called with the server's lock held: do not call
back into the server), ``get_filled(num_keys)`` (a GET with GET_FLAG_FILL_FROM_PEERS asked the node's peers for
what it lacks, before pinning), ``get_before_send(start, num_items)`` (a GET chunk is pinned,
none of it sent yet), ``chunk_sent(start, num_items)`` (a GET chunk went out
while its pins were held), ``request_done(op, code)`` (everything the request held is
released; code 0 = OK)."""


class DataPlaneServer:
    """The node's TCP data-plane listener: one daemon thread per connection.

    Args:
        core: the node it serves (the :class:`~kvstored.transport.base.BlockServer` port:
            validation, draining, the blocks and the space, metrics); limits come from
            ``core.cfg`` (``max_batch_keys``, ``max_key_bytes``, ``max_block_bytes`` and
            the ``dataplane_*`` fields).
        address: ``host:port`` to listen on (port 0 = any free port).
        max_connections: connections served at once (default ``dataplane_max_connections``);
            more are refused with UNAVAILABLE.
        request_timeout_s: deadline of one request as a whole (default
            ``dataplane_request_timeout_s``).
        idle_timeout_s: an idle connection is closed after this long (default
            ``dataplane_idle_timeout_s``).
        hook: see :data:`Hook`; None = no calls.
        ssl_context: mutual TLS (a ``CERT_REQUIRED`` server context:
            :meth:`kvstored.security.tls.TlsFiles.server_context`): each connection's thread
            completes the handshake before reading a byte of a request, so a plaintext
            peer, or one whose certificate the CA did not sign (or has expired), is refused
            there; a verified peer must hold a role (node, engine or admin) in its
            certificate, else its first request is answered PERMISSION_DENIED and the
            connection closed. None = plaintext (the cluster network is trusted).
    """

    def __init__(
        self,
        core: BlockServer,
        address: str,
        *,
        max_connections: int | None = None,
        request_timeout_s: float | None = None,
        idle_timeout_s: float | None = None,
        hook: Hook | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        cfg = core.cfg
        self.core = core
        self.ssl_context = ssl_context
        self.num_handshakes_refused = 0
        """TLS handshakes that failed (plaintext peer, unknown CA, expired certificate)."""
        self._host, self._port = parse_host_port(address)
        self.max_connections = max_connections or cfg.dataplane_max_connections
        self.request_timeout_s = request_timeout_s or cfg.dataplane_request_timeout_s
        self.idle_timeout_s = idle_timeout_s or cfg.dataplane_idle_timeout_s
        self.min_bytes_per_s = cfg.dataplane_min_bytes_per_s
        self.get_chunk_keys = GET_CHUNK_KEYS
        self.export_chunk_keys = EXPORT_CHUNK_KEYS
        self.hook = hook
        self.limits: FrameLimits = core.frame_limits()
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._budget_freed = threading.Condition(self._lock)
        self._counters = DataPlaneCounters()
        self._conns: dict[socket.socket, bool] = {}  # socket -> busy
        self._threads: set[threading.Thread] = set()
        self._ids = itertools.count(1)
        self.address = ""
        self.fill_from_peers: FillFromPeers | None = None
        # ``on_replica_factor(namespace_id, keys, factor)``: a PUT carried the blocks'
        # replication factor (a peer's put replicas); the daemon remembers it for the
        # node's inventory (node/put_replicas.py ReplicationFactors.record). None = ignored.
        self.on_replica_factor: Callable[[bytes, list[bytes], int], None] | None = None
        # ``on_stored()``: a PUT stored at least one block (a peer's spill, hand-off or put
        # replica); a cluster node wakes its master link so the replica's ADDED event goes
        # out now, not a heartbeat later: the sender keeps its own copy until the master
        # names this one (node/spill.py). Called on the connection's thread. None = ignored.
        self.on_stored: Callable[[], None] | None = None
        """Set by a cluster node: GETs with GET_FLAG_FILL_FROM_PEERS copy missing blocks
        from peers first (None: the flag is accepted and does nothing)."""
        self.num_streamed_through = 0
        """Blocks an engine's GET sent from a peer without caching them here (no room to
        keep them without dropping a block: ``THROUGH_BUDGET_BYTES``)."""
        self.num_requests_lost = 0
        """Requests whose connection broke mid-request, counted once the request's
        reservations are aborted and its pins released (tests wait on it)."""

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self) -> str:
        """Bind, listen and start accepting; returns the bound ``host:port``.

        Raises:
            OSError: the address cannot be bound (in use, bad host).
        """
        infos = socket.getaddrinfo(self._host, self._port, type=socket.SOCK_STREAM)
        family, _, _, _, sockaddr = infos[0]
        lsock = socket.socket(family, socket.SOCK_STREAM)
        try:
            lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            tune_socket(lsock)  # accepted sockets inherit the buffer sizes
            lsock.bind(sockaddr)
            lsock.listen(128)
            lsock.settimeout(0.2)
        except BaseException:
            lsock.close()
            raise
        self._listener = lsock
        host, port = lsock.getsockname()[:2]
        self.address = format_host_port(host, port)
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name="kvstored-dp-accept", daemon=True
        )
        self._accept_thread.start()
        log.info("data_plane_listening", address=self.address)
        return self.address

    def num_busy(self) -> int:
        """Connections currently inside a request."""
        with self._lock:
            return sum(1 for busy in self._conns.values() if busy)

    def counters(self) -> DataPlaneCounters:
        """A snapshot of :class:`DataPlaneCounters`."""
        with self._lock:
            c = self._counters
            return DataPlaneCounters(
                c.requests, c.deadline_exceeded, c.rejected_frames, c.header_bytes_buffered
            )

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting, let requests in progress finish (up to ``grace_s``), close all."""
        self._stopping.set()
        if self._listener is not None:
            try:
                self._listener.close()
            except OSError:
                pass
        if self._accept_thread is not None:
            self._accept_thread.join(timeout=2.0)
        deadline = time.monotonic() + grace_s
        while self.num_busy() and time.monotonic() < deadline:
            time.sleep(0.01)
        with self._lock:
            conns = list(self._conns)
            threads = list(self._threads)
            self._budget_freed.notify_all()
        for sock in conns:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in threads:
            t.join(timeout=1.0)
        log.info("data_plane_stopped", address=self.address)

    # ---- connections -------------------------------------------------------------------
    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                sock, peer = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stopping.is_set():
                    return
                log.warning("data_plane_accept_failed", exc_info=True)
                time.sleep(0.05)
                continue
            with self._lock:
                full = len(self._conns) >= self.max_connections
                if not full:
                    self._conns[sock] = False
            if full:
                self._refuse(sock)
                continue
            t = threading.Thread(
                target=self._serve_connection, args=(sock, peer),
                name=f"kvstored-dp-conn-{next(self._ids)}", daemon=True,
            )
            with self._lock:
                self._threads.add(t)
            t.start()

    def _refuse(self, sock: socket.socket) -> None:
        if self.ssl_context is not None:  # no plaintext answer to a TLS client: just close
            sock.close()
            return
        self._send_error_and_close(sock, 0, Unavailable(
            f"the data plane serves at most {self.max_connections} connections "
            "(node.dataplane_max_connections); retry later"
        ))

    @staticmethod
    def _send_error_and_close(sock: socket.socket, op: int, err: KvstoredError) -> None:
        try:
            sock.settimeout(1.0)
            sock.sendall(error_response(op, err))
        except OSError:
            pass
        finally:
            sock.close()

    def _set_busy(self, sock: socket.socket, busy: bool) -> None:
        with self._lock:
            if sock in self._conns:
                self._conns[sock] = busy

    def _emit(self, event: str, **fields: Any) -> None:
        if self.hook is not None:
            self.hook(event, **fields)

    def _count(self, op: int, code: int) -> None:
        op_name = {OP_GET: "get", OP_PUT: "put"}.get(op, "unknown")
        try:
            code_name = ErrorCode(code).name
        except ValueError:
            code_name = str(code)
        self.core.count_dataplane_request(op_name, code_name)

    def _handshake(self, raw: socket.socket, peer: object
                   ) -> tuple[ssl.SSLSocket | None, Principal, KvstoredError | None]:
        """Complete the TLS handshake of a new connection (this connection's thread).

        Returns:
            ``(tls socket, principal, None)`` for a peer whose certificate names a role;
            ``(tls socket, _, PermissionDenied/Unauthenticated)`` for a verified peer
            without one (its first request is answered with it); ``(None, _, None)`` when
            the handshake failed (the connection is closed and counted).
        """
        assert self.ssl_context is not None
        raw.settimeout(HANDSHAKE_TIMEOUT_S)
        try:
            tls = self.ssl_context.wrap_socket(raw, server_side=True)  # handshakes now
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            with self._lock:
                self._conns.pop(raw, None)
                self.num_handshakes_refused += 1
            log.info("data_plane_handshake_refused", peer=str(peer),
                     reason=getattr(exc, "reason", None) or str(exc))
            raw.close()
            return None, TRUSTED_LOCAL, None
        with self._lock:  # stop() must shut down the socket that now owns the fd
            self._conns[tls] = self._conns.pop(raw, False)
        try:
            principal = principal_of_socket(tls)
            require_role(principal, "node", "engine", "admin", action="the data plane")
        except KvstoredError as exc:
            log.info("data_plane_peer_denied", peer=str(peer), error=str(exc))
            return tls, TRUSTED_LOCAL, exc
        return tls, principal, None

    def _serve_connection(self, sock: socket.socket, peer: object) -> None:
        self.core.count_dataplane_connection(1)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            principal = TRUSTED_LOCAL  # plaintext: the cluster network is trusted
            if self.ssl_context is not None:
                tls, principal, denied = self._handshake(sock, peer)
                if tls is None:
                    return
                sock = tls
                if denied is not None:
                    self._deny_first_request(sock, denied)
                    return
            reader = Reader(sock)
            while not self._stopping.is_set():
                # The idle wait is a deadline too: the socket stays in blocking mode with a
                # kernel timeout (framing.arm_kernel_timeout), no mode switch per request.
                reader.deadline = time.monotonic() + self.idle_timeout_s
                try:
                    reader.fill()  # the first byte of the next request
                except (PeerClosed, TimeoutError, OSError):
                    return  # peer went away between requests (or idle timeout / shutdown)
                reader.deadline = time.monotonic() + self.request_timeout_s
                self._set_busy(sock, True)
                try:
                    if not self._serve_request(sock, reader, peer, principal):
                        return
                finally:
                    self._set_busy(sock, False)
        except Exception:
            log.exception("data_plane_connection_failed", peer=str(peer))
        finally:
            with self._lock:
                self._conns.pop(sock, None)
                self._threads.discard(threading.current_thread())
            try:
                sock.close()
            except OSError:
                pass
            self.core.count_dataplane_connection(-1)

    def _deny_first_request(self, sock: socket.socket, err: KvstoredError) -> None:
        """Answer the first request of a denied peer with ``err`` (then the caller closes)."""
        reader = Reader(sock, deadline=time.monotonic() + HANDSHAKE_TIMEOUT_S)
        op = 0
        with contextlib.suppress(ProtocolError, PeerClosed, TimeoutError, OSError):
            op = decode_header(reader.read_exact(HEADER.size))[0]
        self._count(op, int(err.code))
        self._send_error_and_close(sock, op, err)

    def _serve_request(self, sock: socket.socket, reader: Reader, peer: object,
                       principal: Principal = TRUSTED_LOCAL) -> bool:
        """One request under ``reader.deadline`` (see :meth:`_serve_one`), its log lines
        naming it (kvstored/log.py; this thread's context)."""
        token = bind_request({"method": "dataplane", "peer": str(peer), "request_id": new_request_id()})
        try:
            return self._serve_one(sock, reader, peer, principal)
        finally:
            unbind_request(token)

    def _serve_one(self, sock: socket.socket, reader: Reader, peer: object,
                   principal: Principal) -> bool:
        """One request under ``reader.deadline``; False = close the connection.

        ``principal``: the peer's (its certificate; TRUSTED_LOCAL without TLS). A caller that
        is neither a node nor an admin may address only its own tenant's stored namespace
        ids (:func:`kvstored.tenancy.check_stored_namespace`); another's is answered
        PERMISSION_DENIED and the connection closed (a PUT's payload may follow).
        """
        op = 0
        code = int(ErrorCode.INTERNAL)
        try:
            op, flags, count, body_len = decode_header(reader.read_exact(HEADER.size))
            with self._lock:
                self._counters.requests += 1
            self.limits.check_request_header(op, count, body_len, flags)
            self._emit("request_started", op=op, count=count)
            with self._header_budget(body_len, reader.deadline):
                raw = reader.read_exact(body_len)
                if op == OP_GET:
                    ranges = None
                    if flags & GET_FLAG_RANGES:
                        ns, keys, ranges = decode_get_ranges_body(raw, count)
                    else:
                        ns, keys = decode_get_body(raw, count)
                    del raw
                    _check_tenant(principal, ns, "data-plane GET")
                    if flags & GET_FLAG_PROBE:
                        code = self._handle_probe(
                            sock, reader, keys, ns,
                            with_generation=bool(flags & GET_FLAG_GENERATION))
                        return True
                    code = self._handle_get(sock, reader, keys, ns,
                                            with_generation=bool(flags & GET_FLAG_GENERATION),
                                            fill=bool(flags & GET_FLAG_FILL_FROM_PEERS),
                                            peer_export=bool(flags & GET_FLAG_PEER_EXPORT),
                                            ranges=ranges)
                else:
                    ns, handoff_age_ms, items = decode_put_body_flags(raw, count, flags)
                    del raw
                    _check_tenant(principal, ns, "data-plane PUT")
                    sizes = [size for _, size, _ in items]
                    self.limits.check_put_sizes(sizes)
                    self._allow_payload(reader, sum(sizes))
                    code = self._handle_put(
                        sock, reader, items, ns,
                        factor=(flags & PUT_FLAG_FACTOR_MASK) >> PUT_FLAG_FACTOR_SHIFT,
                        handoff_age_s=None if handoff_age_ms is None else handoff_age_ms / 1000,
                        spare=bool(flags & PUT_FLAG_SPARE))
            return True
        except PermissionDenied as exc:
            code = int(exc.code)
            log.info("data_plane_peer_denied", peer=str(peer), error=str(exc))
            self._send_error_and_close(sock, op, exc)
            return False
        except (ProtocolError, FrameRejected) as exc:
            err = exc.error if isinstance(exc, FrameRejected) else exc
            code = int(err.code)
            with self._lock:
                self._counters.rejected_frames += 1
            log.warning("data_plane_frame_rejected", peer=str(peer), error=str(err))
            self._send_error_and_close(sock, op, err)
            return False
        except TimeoutError:
            code = int(ErrorCode.DEADLINE_EXCEEDED)
            with self._lock:
                self._counters.deadline_exceeded += 1
            log.info("data_plane_request_deadline_exceeded", peer=str(peer),
                     timeout_s=self.request_timeout_s)
            return False
        except (ConnectionError, OSError) as exc:
            code = int(ErrorCode.TRANSFER_FAILED)
            log.info("data_plane_connection_lost", peer=str(peer), error=str(exc))
            with self._lock:
                self.num_requests_lost += 1
            return False
        finally:
            self._count(op, code)
            self._emit("request_done", op=op, code=code)
            if request_lines_enabled(__name__):
                log.debug("data_plane_request_served", op=op, code=code)

    def _allow_payload(self, reader: Reader, num_bytes: int) -> None:
        """Extend the request's deadline by ``num_bytes`` at ``dataplane_min_bytes_per_s``."""
        if reader.deadline is not None and num_bytes:
            reader.deadline += num_bytes / self.min_bytes_per_s

    @contextlib.contextmanager
    def _header_budget(self, num_bytes: int, deadline: float | None) -> Iterator[None]:
        """Hold ``num_bytes`` of the shared request-body budget for the request's duration.

        Raises:
            TimeoutError: the budget did not free up before ``deadline``.
        """
        cap = self.limits.max_body_bytes
        with self._budget_freed:
            if self._counters.header_bytes_buffered + num_bytes > cap:
                self._emit("header_budget_waited", num_bytes=num_bytes)
            while self._counters.header_bytes_buffered + num_bytes > cap:
                remaining = None if deadline is None else deadline - time.monotonic()
                if (remaining is not None and remaining <= 0) or self._stopping.is_set():
                    raise TimeoutError("no request-body budget became free within the deadline")
                self._budget_freed.wait(remaining)
            self._counters.header_bytes_buffered += num_bytes
        try:
            yield
        finally:
            with self._budget_freed:
                self._counters.header_bytes_buffered -= num_bytes
                self._budget_freed.notify_all()

    # ---- GET -----------------------------------------------------------------------------
    def _handle_probe(self, sock: socket.socket, reader: Reader, keys: list[bytes], ns: bytes,
                      *, with_generation: bool) -> int:
        """A GET_FLAG_PROBE: per key, held here and in which tier (``core.exists``: never
        pins, reads, promotes or touches); item headers only, no payload."""
        core = self.core
        item, tail = (GET_ITEM_GEN, (0,)) if with_generation else (GET_ITEM, ())
        try:
            core.check_batch(len(keys))
            core.check_namespace_id(ns)
            present, tiers = core.exists(keys, ns, with_tiers=True)
        except KvstoredError as exc:
            send_all(sock, [error_response(OP_GET, exc)], reader.deadline)
            return int(exc.code)
        out: list[bytes | memoryview] = [encode_header(OP_GET, 0, len(keys), 0)]
        for p, t in zip(present, tiers, strict=True):
            out.append(item.pack(0, int(t) if p and t is not None else 0, 1 if p else 0,
                                 0, 0, 0, *tail))
        send_all(sock, out, reader.deadline)
        return 0

    def _handle_get(self, sock: socket.socket, reader: Reader, keys: list[bytes], ns: bytes,
                    *, with_generation: bool = False, fill: bool = False,
                    peer_export: bool = False,
                    ranges: list[tuple[int, int]] | None = None) -> int:
        core = self.core
        # GET_FLAG_GENERATION: each item header ends with the replica's generation
        item, tail = (GET_ITEM_GEN, (0,)) if with_generation else (GET_ITEM, ())
        try:
            core.check_batch(len(keys))
            core.check_namespace_id(ns)
        except KvstoredError as exc:
            send_all(sock, [error_response(OP_GET, exc)], reader.deadline)
            return int(exc.code)
        through: dict[bytes, tuple[bytes, bytes] | None] = {}
        before: list[bool] | None = None  # per key, here before the fill (None: no fill)
        if fill and self.fill_from_peers is not None:  # an engine's read on a cluster node
            before = self._fill(keys, ns, reader.deadline, through)
        pending: list[bytes | memoryview] = [encode_header(OP_GET, 0, len(keys), 0)]
        num_blocks = num_bytes = 0
        # GET_FLAG_PEER_EXPORT (a peer copying the blocks): read_for_export, nothing promoted,
        # touched or counted as a get; DRAM blocks pinned in place as below (node/reads.py)
        chunks: Iterator[tuple[int, list[Any]]] = (
            core.export_chunks(keys, ns, chunk_keys=self.export_chunk_keys) if peer_export
            else core.pinned_chunks(keys, ns, chunk_keys=self.get_chunk_keys)
        )
        # closing() unpins the current chunk only after send_all returned or raised: the
        # kernel then holds its own copy, so no pin is released while it is still read.
        with contextlib.closing(chunks):  # type: ignore[type-var]  # a generator has close(); typeshed's closing() wants the SupportsClose protocol
            while True:
                try:
                    start, got = next(chunks)
                except StopIteration:
                    break
                except KvstoredError as exc:
                    if pending:  # nothing sent yet: fail the whole request cleanly
                        send_all(sock, [error_response(OP_GET, exc)], reader.deadline)
                        return int(exc.code)
                    raise ConnectionAbortedError(f"GET failed mid-stream: {exc}") from exc
                if before is not None and ranges is None:
                    self._fill_lost(keys, start, got, before, ns, reader.deadline, through)
                chunk_bytes = 0
                for j, b in enumerate(got):
                    if isinstance(b, (PinnedBlock, ExportedBlock)):
                        pending.append(
                            item.pack(0, int(b.tier), 1, b.size_bytes, len(b.meta), 0,
                                      *((b.generation,) if with_generation else ())) + b.meta
                        )
                        view, n = b.view, b.size_bytes
                        if ranges is not None:  # GET_FLAG_RANGES: that part of the block only
                            offset, length = ranges[start + j]
                            n = range_bytes(b.size_bytes, offset, length)
                            view = view[offset : offset + n]
                        if n:
                            pending.append(view)
                        num_blocks += 1
                        num_bytes += n
                        chunk_bytes += n
                    elif b is None:
                        got_through = through.get(keys[start + j]) if through else None
                        if got_through is not None and ranges is None:
                            # a peer's block with no room here, received for this GET only
                            value, meta = got_through
                            pending.append(item.pack(0, int(Tier.DRAM), 1, len(value),
                                                     len(meta), 0, *tail) + meta)
                            if value:
                                pending.append(value)
                            num_blocks += 1
                            num_bytes += len(value)
                            chunk_bytes += len(value)
                            self.num_streamed_through += 1
                        else:
                            pending.append(item.pack(0, 0, 0, 0, 0, 0, *tail))
                    else:
                        msg = short_message(str(b))
                        pending.append(item.pack(int(b.code), 0, 0, 0, 0, len(msg), *tail) + msg)
                self._allow_payload(reader, chunk_bytes)
                self._emit("get_before_send", start=start, num_items=len(got))  # pins held
                send_all(sock, pending, reader.deadline)  # while the chunk's pins are held
                self._emit("chunk_sent", start=start, num_items=len(got))
                pending = []
        if pending:
            send_all(sock, pending, reader.deadline)
        core.count_transfer("tcp", "out", num_blocks, num_bytes)
        return 0

    def _fill(self, keys: list[bytes], ns: bytes, deadline: float | None,
              through: dict[bytes, tuple[bytes, bytes] | None]) -> list[bool] | None:
        """Copy the blocks of ``keys`` missing here from peers, within the request's
        deadline (what could not be copied is a miss of this GET, never an error); the
        blocks the node has no room to keep land in ``through`` (sent, never cached).

        Returns:
            Per key, whether it was here before the fill (None: no fill, or a bad key,
            which the pin's checks then name).
        """
        fill = self.fill_from_peers
        if fill is None:
            return None
        try:
            before, _ = self.core.exists(keys, ns)
        except KvstoredError:
            return None
        if all(before):
            self._emit("get_filled", num_keys=len(keys))
            return before
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            fill(keys, ns, remaining_s=remaining, through=through,
                 through_budget_bytes=THROUGH_BUDGET_BYTES)
        except (KvstoredError, RuntimeError) as exc:  # RuntimeError: the reader closed (stop)
            log.info("data_plane_fill_failed", num_keys=len(keys), error=str(exc))
        self._emit("get_filled", num_keys=len(keys))
        return before

    def _fill_lost(self, keys: list[bytes], start: int, got: list[Any], before: list[bool],
                   ns: bytes, deadline: float | None,
                   through: dict[bytes, tuple[bytes, bytes] | None]) -> None:
        """The blocks of one pinned chunk (``got``, from ``keys[start]``) that the pool
        holds but this node lost before the pin: here before the fill, or found in the pool
        by it (``through[key]`` None: e.g. its copy committed, then the spiller dropped it,
        copies first, or a put evicted it; a block here moved to a peer). Read once more
        from the peers into ``through`` only (``fill(cache=False)``: private buffers,
        verified, never cached, so nothing can drop them before the send), within the
        deadline and what is left of the budget; still missing: a miss of this GET.
        The chunk's pins stay held meanwhile (its other blocks are sent after it)."""
        lost = [keys[start + j] for j, b in enumerate(got)
                if b is None and through.get(keys[start + j]) is None
                and (before[start + j] or keys[start + j] in through)]
        fill = self.fill_from_peers
        if not lost or fill is None:
            return
        left = THROUGH_BUDGET_BYTES - sum(len(v[0]) for v in through.values() if v is not None)
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        if left <= 0 or remaining == 0.0:
            return
        try:
            fill(lost, ns, remaining_s=remaining, through=through,
                 through_budget_bytes=left, cache=False)
        except (KvstoredError, RuntimeError) as exc:
            log.info("data_plane_fill_failed", num_keys=len(lost), error=str(exc))
        log.info("data_plane_lost_refilled", num_keys=len(lost),
                 num_carried=sum(1 for k in lost if through.get(k) is not None))
        self._emit("get_filled_again", num_keys=len(lost))

    # ---- PUT -----------------------------------------------------------------------------
    def _handle_put(
        self, sock: socket.socket, reader: Reader, items: list[tuple[bytes, int, bytes]], ns: bytes,
        *, factor: int = 0, handoff_age_s: float | None = None, spare: bool = False,
    ) -> int:
        core = self.core
        try:
            core.check_batch(len(items))
            core.check_namespace_id(ns)
            guard = core.put_in_flight()
            guard.__enter__()
        except KvstoredError as exc:
            for _, size, _ in items:  # consume the payloads (bounded) so the stream stays in sync
                reader.skip(size)
            send_all(sock, [error_response(OP_PUT, exc)], reader.deadline)
            return int(exc.code)
        try:
            on_factor = self.on_replica_factor
            if factor and on_factor is not None:  # replicas of a put(replicas=N): known before
                # the commit, so the change events of the commit carry the factor already
                on_factor(ns, [k for k, _, _ in items], min(factor, 8))
            reserved: list[Reservation | PutOutcome] = []
            seen: set[bytes] = set()  # first writer wins within a batch too
            num_bytes = 0
            try:
                for i, (key, size, meta) in enumerate(items):
                    err = core.put_item_error(i, key, size, meta)
                    if err is None and size:
                        # Reserve only once this item's payload is arriving: a header alone
                        # holds no arena space and evicts nothing.
                        self._emit("payload_awaited", index=i)
                        reader.fill()
                    if handoff_age_s is not None:
                        r = core.reserve_one(i, key, size, meta, ns, seen=seen,
                                             handoff_age_s=handoff_age_s)
                    elif spare:  # a peer's spill or replica PUT: never a sole copy's room
                        r = core.reserve_one(i, key, size, meta, ns, seen=seen,
                                             spare_or_redundant=True)
                    else:
                        r = core.reserve_one(i, key, size, meta, ns, seen=seen)
                    reserved.append(r)
                    if isinstance(r, Reservation):
                        self._emit("item_reserved", index=i, size_bytes=size)
                        reader.read_into(r.view)
                        num_bytes += size
                    else:
                        reader.skip(size)
            except BaseException:
                # This thread is the only writer of these reservations and its last recv_into
                # has returned: safe to hand the space back now.
                core.abort_reserved(reserved)
                raise
            outcomes = core.commit_reserved(reserved)
        finally:
            guard.__exit__(None, None, None)
        body = bytearray()
        for o in outcomes:
            msg = short_message(str(o.error)) if o.error is not None else b""
            code = int(o.error.code) if o.error is not None else 0
            body += PUT_ITEM.pack(code, int(o.stored), len(msg))
            body += msg
        send_all(sock, [encode_header(OP_PUT, 0, len(outcomes), len(body)), bytes(body)], reader.deadline)
        num_stored = sum(1 for o in outcomes if o.stored)
        core.count_transfer("tcp", "in", num_stored, num_bytes)
        on_stored = self.on_stored
        if num_stored and on_stored is not None:
            on_stored()
        return 0
