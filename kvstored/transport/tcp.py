"""TCP data plane: server and client of the framed, batched protocol in :mod:`.framing`.

Used by clients that cannot map the node's shared-memory arena (another host or container),
and later for node-to-node transfers (:class:`DataPlaneClient` is a
:class:`~kvstored.transport.base.Transport`). gRPC stays the control plane; this port only
moves payloads, straight between sockets and the arena:

- GET: the server pins a chunk of blocks and sends each payload from the pinned arena view
  with ``sendmsg`` (item header + payload in one call, no copy); the client ``recv_into``'s
  the payload straight into the caller's buffer.
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
first byte; every socket call waits only for what is left of it. When it passes, the
connection thread -- the only writer into the request's reservations and the only reader of
its pins -- has already returned from its last ``recv_into``/``sendmsg`` (``sendmsg`` copies
into the kernel), and only then aborts the reservations and releases the pins. So space is
never released while this request may still write it (the fencing rule of DESIGN.md s. 6).

Client: :class:`DataPlaneClient`, a small pool of blocking sockets, every call under the
caller's deadline; it checks every size the server announces (item count, payload, meta,
message) before allocating for it.

Sockets use TCP_NODELAY and 4 MiB send/receive buffers.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from kvstored.errors import (
    DeadlineExceeded,
    ErrorCode,
    InternalError,
    KvstoredError,
    TransferFailed,
    Unavailable,
    error_from_code,
)
from kvstored.tiers.base import PinnedBlock, Reservation
from kvstored.transport.base import GetItem, PutItem, Sink
from kvstored.transport.framing import (
    GET_ITEM,
    HEADER,
    MAX_MSG_BYTES,
    OP_GET,
    OP_PUT,
    PUT_ITEM,
    Body,
    FrameLimits,
    FrameRejected,
    PeerClosed,
    ProtocolError,
    Reader,
    decode_get_body,
    decode_header,
    decode_put_body,
    encode_get_body,
    encode_header,
    encode_put_body,
    error_response,
    format_host_port,
    parse_host_port,
    send_all,
    short_message,
    tune_socket,
)

if TYPE_CHECKING:
    from kvstored.node.core import NodeCore

__all__ = [
    "DataPlaneClient", "DataPlaneCounters", "DataPlaneServer", "GetItem", "PutItem", "Sink",
    "format_host_port", "parse_host_port", "tune_socket",
]

log = structlog.get_logger(__name__)

GET_CHUNK_KEYS = 64
"""Blocks a GET pins at once on the server (bounds the arena one reader holds)."""
DEFAULT_CLIENT_MAX_BLOCK_BYTES = 64 << 20
DEFAULT_CLIENT_MAX_META_BYTES = 4096


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
``item_reserved(index, size_bytes)``, ``chunk_sent(start, num_items)`` (a GET chunk went out
while its pins were held), ``request_done(op, code)`` (everything the request held is
released; code 0 = OK)."""


class DataPlaneServer:
    """The node's TCP data-plane listener: one daemon thread per connection.

    Args:
        core: request handling (validation, draining, metrics) over the store; limits come
            from ``core.cfg`` (``max_batch_keys``, ``max_key_bytes``, ``max_block_bytes`` and
            the ``dataplane_*`` fields).
        address: ``host:port`` to listen on (port 0 = any free port).
        max_connections: connections served at once (default ``dataplane_max_connections``);
            more are refused with UNAVAILABLE.
        request_timeout_s: deadline of one request as a whole (default
            ``dataplane_request_timeout_s``).
        idle_timeout_s: an idle connection is closed after this long (default
            ``dataplane_idle_timeout_s``).
        hook: see :data:`Hook`; None = no calls.
    """

    def __init__(
        self,
        core: NodeCore,
        address: str,
        *,
        max_connections: int | None = None,
        request_timeout_s: float | None = None,
        idle_timeout_s: float | None = None,
        hook: Hook | None = None,
    ) -> None:
        from kvstored.node.core import MAX_META_BYTES, MAX_NAMESPACE_ID_BYTES

        cfg = core.cfg
        self.core = core
        self._host, self._port = parse_host_port(address)
        self.max_connections = max_connections or cfg.dataplane_max_connections
        self.request_timeout_s = request_timeout_s or cfg.dataplane_request_timeout_s
        self.idle_timeout_s = idle_timeout_s or cfg.dataplane_idle_timeout_s
        self.get_chunk_keys = GET_CHUNK_KEYS
        self.hook = hook
        self.limits = FrameLimits(
            max_items=cfg.max_batch_keys,
            max_key_bytes=cfg.max_key_bytes,
            max_meta_bytes=MAX_META_BYTES,
            max_namespace_bytes=MAX_NAMESPACE_ID_BYTES,
            max_item_bytes=cfg.max_block_bytes,
            max_request_payload_bytes=max(cfg.dataplane_max_request_bytes, cfg.max_block_bytes),
            max_body_bytes=cfg.dataplane_max_header_bytes,
        )
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
        metrics = self.core.metrics
        if metrics is not None:
            op_name = {OP_GET: "get", OP_PUT: "put"}.get(op, "unknown")
            try:
                code_name = ErrorCode(code).name
            except ValueError:
                code_name = str(code)
            metrics.dataplane_requests.labels(op=op_name, code=code_name).inc()

    def _serve_connection(self, sock: socket.socket, peer: object) -> None:
        metrics = self.core.metrics
        if metrics is not None:
            metrics.dataplane_connections.inc()
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            reader = Reader(sock)
            while not self._stopping.is_set():
                reader.deadline = None
                sock.settimeout(self.idle_timeout_s)
                try:
                    reader.fill()  # the first byte of the next request
                except (PeerClosed, TimeoutError, OSError):
                    return  # peer went away between requests (or idle timeout / shutdown)
                reader.deadline = time.monotonic() + self.request_timeout_s
                self._set_busy(sock, True)
                try:
                    if not self._serve_request(sock, reader, peer):
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
            if metrics is not None:
                metrics.dataplane_connections.dec()

    def _serve_request(self, sock: socket.socket, reader: Reader, peer: object) -> bool:
        """One request under ``reader.deadline``; False = close the connection."""
        op = 0
        code = int(ErrorCode.INTERNAL)
        try:
            op, _flags, count, body_len = decode_header(reader.read_exact(HEADER.size))
            with self._lock:
                self._counters.requests += 1
            self.limits.check_request_header(op, count, body_len)
            self._emit("request_started", op=op, count=count)
            with self._header_budget(body_len, reader.deadline):
                raw = reader.read_exact(body_len)
                if op == OP_GET:
                    ns, keys = decode_get_body(raw, count)
                    del raw
                    code = self._handle_get(sock, keys, ns, reader.deadline)
                else:
                    ns, items = decode_put_body(raw, count)
                    del raw
                    self.limits.check_put_sizes([size for _, size, _ in items])
                    code = self._handle_put(sock, reader, items, ns)
            return True
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
            return False
        finally:
            self._count(op, code)
            self._emit("request_done", op=op, code=code)

    @contextlib.contextmanager
    def _header_budget(self, num_bytes: int, deadline: float | None) -> Any:
        """Hold ``num_bytes`` of the shared request-body budget for the request's duration.

        Raises:
            TimeoutError: the budget did not free up before ``deadline``.
        """
        cap = self.limits.max_body_bytes
        with self._budget_freed:
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
    def _handle_get(
        self, sock: socket.socket, keys: list[bytes], ns: bytes, deadline: float | None
    ) -> int:
        core = self.core
        try:
            core.check_batch(len(keys))
            core.check_namespace_id(ns)
        except KvstoredError as exc:
            send_all(sock, [error_response(OP_GET, exc)], deadline)
            return int(exc.code)
        pending: list[bytes | memoryview] = [encode_header(OP_GET, 0, len(keys), 0)]
        num_blocks = num_bytes = 0
        chunks = core.pinned_chunks(keys, ns, chunk_keys=self.get_chunk_keys)
        # closing() unpins the current chunk only after send_all returned or raised: the
        # kernel then holds its own copy, so no pin is released while it is still read.
        with contextlib.closing(chunks):
            while True:
                try:
                    start, got = next(chunks)
                except StopIteration:
                    break
                except KvstoredError as exc:
                    if pending:  # nothing sent yet: fail the whole request cleanly
                        send_all(sock, [error_response(OP_GET, exc)], deadline)
                        return int(exc.code)
                    raise ConnectionAbortedError(f"GET failed mid-stream: {exc}") from exc
                for b in got:
                    if isinstance(b, PinnedBlock):
                        pending.append(
                            GET_ITEM.pack(0, int(b.tier), 1, b.size_bytes, len(b.meta), 0) + b.meta
                        )
                        pending.append(b.view)
                        num_blocks += 1
                        num_bytes += b.size_bytes
                    elif b is None:
                        pending.append(GET_ITEM.pack(0, 0, 0, 0, 0, 0))
                    else:
                        msg = short_message(str(b))
                        pending.append(GET_ITEM.pack(int(b.code), 0, 0, 0, 0, len(msg)) + msg)
                send_all(sock, pending, deadline)  # while the chunk's pins are held
                self._emit("chunk_sent", start=start, num_items=len(got))
                pending = []
        if pending:
            send_all(sock, pending, deadline)
        core.count_transfer("tcp", "out", num_blocks, num_bytes)
        return 0

    # ---- PUT -----------------------------------------------------------------------------
    def _handle_put(
        self, sock: socket.socket, reader: Reader, items: list[tuple[bytes, int, bytes]], ns: bytes
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
            reserved: list[Reservation | object] = []
            num_bytes = 0
            try:
                for i, (key, size, meta) in enumerate(items):
                    err = core.put_item_error(i, key, size, meta)
                    if err is None and size:
                        # Reserve only once this item's payload is arriving: a header alone
                        # holds no arena space and evicts nothing.
                        self._emit("payload_awaited", index=i)
                        reader.fill()
                    r = core.reserve_one(i, key, size, meta, ns)
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
            outcomes = core.commit_reserved(reserved)  # type: ignore[arg-type]
        finally:
            guard.__exit__(None, None, None)
        body = bytearray()
        for o in outcomes:
            msg = short_message(str(o.error)) if o.error is not None else b""
            code = int(o.error.code) if o.error is not None else 0
            body += PUT_ITEM.pack(code, int(o.stored), len(msg))
            body += msg
        send_all(sock, [encode_header(OP_PUT, 0, len(outcomes), len(body)), bytes(body)], reader.deadline)
        core.count_transfer("tcp", "in", sum(1 for o in outcomes if o.stored), num_bytes)
        return 0


# ---- client --------------------------------------------------------------------------------


class DataPlaneClient:
    """Client side of the data plane: a pool of blocking connections to one node.

    Thread-safe: each call takes its own connection from the pool. Implements
    :class:`~kvstored.transport.base.Transport`.

    Args:
        address: the node's data-plane ``host:port`` (from Describe).
        pool_size: idle connections kept open.
        max_block_bytes: largest payload the node may announce per item (its
            ``max_block_bytes``); a larger announcement fails the call before any allocation.
        max_meta_bytes: longest per-item metadata the node may announce.
    """

    def __init__(
        self,
        address: str,
        *,
        pool_size: int = 4,
        max_block_bytes: int = DEFAULT_CLIENT_MAX_BLOCK_BYTES,
        max_meta_bytes: int = DEFAULT_CLIENT_MAX_META_BYTES,
    ) -> None:
        self.address = address
        self._host, self._port = parse_host_port(address)
        self._pool_size = pool_size
        self.max_block_bytes = max_block_bytes
        self.max_meta_bytes = max_meta_bytes
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False

    def _connect(self, deadline: float) -> socket.socket:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineExceeded(f"deadline passed before connecting to the data plane at {self.address}")
        sock: socket.socket | None = None
        try:
            family, _, _, _, sockaddr = socket.getaddrinfo(
                self._host, self._port, type=socket.SOCK_STREAM
            )[0]
            sock = socket.socket(family, socket.SOCK_STREAM)
            tune_socket(sock)  # buffer sizes must be set before connect (window scaling)
            sock.settimeout(remaining)
            sock.connect(sockaddr)
        except TimeoutError:
            if sock is not None:
                sock.close()
            raise Unavailable(
                f"data plane at {self.address} did not accept a connection within {remaining:.3f} s"
            ) from None
        except OSError as exc:
            if sock is not None:
                sock.close()
            raise Unavailable(
                f"data plane at {self.address} is unreachable: {exc.strerror or exc}"
            ) from None
        return sock

    def _acquire(self, deadline: float) -> tuple[socket.socket, bool]:
        with self._lock:
            if self._closed:
                raise Unavailable("the data-plane client is closed")
            if self._idle:
                return self._idle.pop(), True
        return self._connect(deadline), False

    def _release(self, sock: socket.socket) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._pool_size:
                self._idle.append(sock)
                return
        sock.close()

    def _call(self, fn: Callable[[socket.socket, Reader], object], deadline: float) -> object:
        """Run one request on a pooled connection; a stale pooled connection is retried once."""
        for _attempt in range(2):
            sock, reused = self._acquire(deadline)
            reader = Reader(sock, deadline)
            try:
                result = fn(sock, reader)
            except (TimeoutError, socket.timeout):
                sock.close()
                raise DeadlineExceeded(
                    f"data plane at {self.address} did not finish the request within the deadline"
                ) from None
            except ProtocolError as exc:
                sock.close()
                raise TransferFailed(f"data plane at {self.address} sent a malformed frame: {exc}") from None
            except (ConnectionError, OSError) as exc:
                sock.close()
                if reused and reader.num_received == 0 and time.monotonic() < deadline:
                    continue  # the node closed an idle pooled connection: use a fresh one
                raise TransferFailed(f"data-plane connection to {self.address} failed: {exc}") from None
            except BaseException:
                sock.close()
                raise
            if reader.buffered:
                sock.close()  # trailing bytes: out of sync, do not reuse
            else:
                self._release(sock)
            return result
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _check_status(reader: Reader, op: int, count: int) -> int:
        """Read a response header; returns its body length (checked by the caller).

        Raises:
            The node's whole-request error; ProtocolError for a malformed or over-limit header.
        """
        rop, status, rcount, body_len = decode_header(reader.read_exact(HEADER.size))
        if status != 0:
            if body_len > MAX_MSG_BYTES:
                raise ProtocolError(
                    f"error response announces a {body_len}-byte message; at most {MAX_MSG_BYTES}"
                )
            msg = reader.read_exact(body_len).decode("utf-8", "replace") if body_len else ""
            raise error_from_code(status, msg or f"data-plane request failed with code {status}")
        if rop != op:
            raise ProtocolError(f"response op {rop} does not match request op {op}")
        if rcount != count:
            raise ProtocolError(f"response has {rcount} items for {count} requested")
        return int(body_len)

    def get(
        self, keys: Sequence[bytes], namespace_id: bytes, sink: Sink, *, deadline: float
    ) -> list[GetItem]:
        """Fetch blocks; each found payload is received straight into ``sink(...)``'s view.

        Every announced size is checked before ``sink`` is asked for memory: a payload over
        ``max_block_bytes`` or a meta over ``max_meta_bytes`` fails the call.

        Returns:
            Per key, in order: a :class:`GetItem` (``found`` False = miss; ``code`` != 0 =
            this item's error).

        Raises:
            Unavailable: cannot connect.  DeadlineExceeded: the deadline passed.
            TransferFailed: the connection broke, or the node announced more than the limits.
            A KvstoredError for a whole-request error.
        """
        request = encode_get_body(keys, namespace_id)
        request = encode_header(OP_GET, 0, len(keys), len(request)) + request

        def run(sock: socket.socket, reader: Reader) -> list[GetItem]:
            send_all(sock, [request], deadline)
            self._check_status(reader, OP_GET, len(keys))
            out = []
            for i in range(len(keys)):
                code, tier, found, size, meta_len, msg_len = GET_ITEM.unpack(
                    reader.read_exact(GET_ITEM.size)
                )
                if meta_len > self.max_meta_bytes or msg_len > MAX_MSG_BYTES:
                    raise ProtocolError(
                        f"GET item #{i} announces a {meta_len}-byte meta and a {msg_len}-byte "
                        f"message; at most {self.max_meta_bytes} and {MAX_MSG_BYTES}"
                    )
                if found and size > self.max_block_bytes:
                    raise ProtocolError(
                        f"GET item #{i} announces a {size}-byte block; the node's limit is "
                        f"{self.max_block_bytes} bytes"
                    )
                meta = reader.read_exact(meta_len) if meta_len else b""
                msg = reader.read_exact(msg_len).decode("utf-8", "replace") if msg_len else ""
                if found:
                    dst = sink(i, size, meta)
                    if dst is None:
                        reader.skip(size)
                    else:
                        if len(dst) != size:
                            raise InternalError(f"sink returned {len(dst)} bytes for a {size}-byte block")
                        reader.read_into(dst)
                out.append(GetItem(code, msg, bool(found), tier, size, meta))
            return out

        return self._call(run, deadline)  # type: ignore[return-value]

    def put(
        self,
        items: Sequence[tuple[bytes, memoryview, bytes]],
        namespace_id: bytes,
        *,
        deadline: float,
    ) -> list[PutItem]:
        """Store blocks: ``items`` are ``(key, value as a byte view, meta)``.

        Returns:
            Per item, in order: a :class:`PutItem` (``stored`` False with code 0 = already
            present).

        Raises:
            As :meth:`get`.
        """
        body = encode_put_body([(k, len(v), m) for k, v, m in items], namespace_id)
        header = encode_header(OP_PUT, 0, len(items), len(body)) + body
        max_body = len(items) * (PUT_ITEM.size + MAX_MSG_BYTES)

        def run(sock: socket.socket, reader: Reader) -> list[PutItem]:
            send_all(sock, [header, *(v for _, v, _ in items)], deadline)
            body_len = self._check_status(reader, OP_PUT, len(items))
            if body_len > max_body:
                raise ProtocolError(
                    f"PUT response announces a {body_len}-byte body for {len(items)} items; at "
                    f"most {max_body}"
                )
            resp = Body(reader.read_exact(body_len))
            out = []
            for _ in range(len(items)):
                code, stored, msg_len = PUT_ITEM.unpack(resp.take(PUT_ITEM.size))
                msg = resp.take(msg_len).decode("utf-8", "replace")
                out.append(PutItem(code, msg, bool(stored)))
            return out

        return self._call(run, deadline)  # type: ignore[return-value]

    def close(self) -> None:
        """Close every pooled connection; idempotent."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()
