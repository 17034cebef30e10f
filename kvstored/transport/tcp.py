"""TCP data plane: a framed, batched binary protocol for bulk block bytes.

Used by clients that cannot map the node's shared-memory arena (another host or container),
and later for node-to-node transfers. gRPC stays the control plane; this port only moves
payloads, straight between sockets and the arena:

- GET: the server pins a chunk of blocks and sends each payload from the pinned arena view
  with ``sendmsg`` (item header + payload in one call, no copy); the client ``recv_into``'s
  the payload straight into the caller's buffer.
- PUT: the server reserves arena space for every item, ``recv_into``'s each payload straight
  into its reservation, then commits the batch. A connection that breaks mid-stream aborts
  every reservation of the request, so nothing torn or partial ever becomes visible.

Framing (all integers little-endian)::

    Request  = ReqHeader(16) + body(body_len) [+ payloads, PUT only]
      ReqHeader  = magic "KVDP" | version u8 (=1) | op u8 (1=GET, 2=PUT) | flags u16 (=0)
                   | count u32 | body_len u32
      GET body   = ns_len u16 | ns | count x (key_len u16 | key)
      PUT body   = ns_len u16 | ns | count x (key_len u16 | key | size u64 | meta_len u32 | meta)
      PUT payloads: the count values back to back; item i is exactly size_i bytes (items the
                   server rejects are still sent and skipped, so the stream stays in sync)

    Response = RespHeader(16) + ...
      RespHeader = magic "KVDP" | version u8 | op u8 | status u16 (ErrorCode; 0 = OK)
                   | count u32 | body_len u32
      status != 0: body = UTF-8 message; nothing follows (the whole request failed; for a
                   PUT the server has consumed the payloads first)
      GET, OK:   body_len = 0; then count items, in request order:
                   ItemHeader(18) = code u16 | tier u8 | found u8 | size u64 | meta_len u32
                                    | msg_len u16
                   | meta | msg | size payload bytes (only when found)
      PUT, OK:   body = count x (code u16 | stored u8 | msg_len u16 | msg)

A malformed frame (bad magic, version or op, oversized body) gets an error response and the
connection is closed, since the stream cannot be resynchronised.

Server: one daemon thread per connection (bounded; the excess get an UNAVAILABLE response
and are closed), calling the thread-safe store through :class:`~kvstored.node.core.NodeCore`.
Client: :class:`DataPlaneClient`, a small pool of blocking sockets, every call under a
deadline (``socket.timeout`` -> :class:`DeadlineExceeded`).

Sockets use TCP_NODELAY and 4 MiB send/receive buffers.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from kvstored.errors import (
    DeadlineExceeded,
    ErrorCode,
    InternalError,
    InvalidArgument,
    KvstoredError,
    TransferFailed,
    Unavailable,
    error_from_code,
)
from kvstored.tiers.base import PinnedBlock, Reservation

if TYPE_CHECKING:
    from kvstored.node.core import NodeCore

log = structlog.get_logger(__name__)

MAGIC = b"KVDP"
VERSION = 1
OP_GET = 1
OP_PUT = 2
_HEADER = struct.Struct("<4sBBHII")  # magic, version, op, flags|status, count, body_len
_GET_ITEM = struct.Struct("<HBBQIH")  # code, tier, found, size, meta_len, msg_len
_PUT_ITEM = struct.Struct("<HBH")  # code, stored, msg_len
_U16 = struct.Struct("<H")
_PUT_REQ_ITEM = struct.Struct("<QI")  # size, meta_len
SOCKET_BUFFER_BYTES = 4 << 20
_READ_BUFFER_BYTES = 64 << 10
_IOV_MAX = 512
_GET_CHUNK_KEYS = 64
_MAX_MSG = 1000


class _Eof(ConnectionError):
    """The peer closed the connection."""


def parse_host_port(address: str) -> tuple[str, int]:
    """Split ``"host:port"`` / ``"[v6]:port"``.

    Raises:
        InvalidArgument: malformed address.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise InvalidArgument(f"expected HOST:PORT for a TCP address, got {address!r}")
    return host.strip("[]"), int(port)


def format_host_port(host: str, port: int) -> str:
    """``host:port``, bracketing IPv6 hosts."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def tune_socket(sock: socket.socket) -> None:
    """TCP_NODELAY, big buffers and keepalive on a data-plane socket."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER_BYTES)
        except OSError:  # capped by net.core.[rw]mem_max; the kernel default still works
            pass


def _set_timeout(sock: socket.socket, deadline: float | None) -> None:
    if deadline is None:
        return
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("deadline exceeded")
    sock.settimeout(remaining)


class _Reader:
    """Buffered reads of small headers; payloads go straight into the caller's memory."""

    def __init__(self, sock: socket.socket, deadline: float | None = None) -> None:
        self.sock = sock
        self.deadline = deadline
        self._buf = bytearray(_READ_BUFFER_BYTES)
        self._mv = memoryview(self._buf)
        self._start = 0
        self._end = 0
        self.num_received = 0

    @property
    def buffered(self) -> int:
        return self._end - self._start

    def _recv_into(self, view: memoryview) -> int:
        _set_timeout(self.sock, self.deadline)
        n = self.sock.recv_into(view)
        if n == 0:
            raise _Eof("the peer closed the connection")
        self.num_received += n
        return n

    def read_exact(self, n: int) -> bytes:
        """Exactly ``n`` bytes as a bytes object (headers, bodies)."""
        avail = self._end - self._start
        if avail >= n:
            out = bytes(self._mv[self._start : self._start + n])
            self._start += n
            return out
        if n > len(self._buf):
            big = bytearray(n)
            self.read_into(memoryview(big))
            return bytes(big)
        if self._start:
            self._buf[:avail] = self._mv[self._start : self._end]
            self._start, self._end = 0, avail
        while self._end < n:
            self._end += self._recv_into(self._mv[self._end :])
        out = bytes(self._mv[:n])
        self._start = n
        return out

    def read_into(self, dst: memoryview) -> None:
        """Fill ``dst`` exactly: buffered bytes first, then ``recv_into`` straight into it."""
        n = len(dst)
        pos = min(self._end - self._start, n)
        if pos:
            dst[:pos] = self._mv[self._start : self._start + pos]
            self._start += pos
        while pos < n:
            pos += self._recv_into(dst[pos:])

    def skip(self, n: int) -> None:
        """Consume and discard ``n`` bytes."""
        take = min(self._end - self._start, n)
        self._start += take
        n -= take
        if n:
            self._start = self._end = 0  # the buffer is empty now
        while n > 0:
            n -= self._recv_into(self._mv[: min(n, len(self._buf))])


def _send_all(sock: socket.socket, bufs: Sequence[bytes | memoryview], deadline: float | None) -> None:
    """``sendmsg`` every buffer completely (gather I/O, no copies)."""
    views = collections.deque(memoryview(b).cast("B") for b in bufs if len(b))
    while views:
        _set_timeout(sock, deadline)
        batch = list(itertools.islice(views, _IOV_MAX))
        sent = sock.sendmsg(batch)
        while sent:
            head = views[0]
            if sent >= len(head):
                sent -= len(head)
                views.popleft()
            else:
                views[0] = head[sent:]
                sent = 0


def _encode_header(op: int, status: int, count: int, body_len: int) -> bytes:
    return _HEADER.pack(MAGIC, VERSION, op, status, count, body_len)


def _decode_header(raw: bytes) -> tuple[int, int, int, int]:
    magic, version, op, flags_or_status, count, body_len = _HEADER.unpack(raw)
    if magic != MAGIC:
        raise _ProtocolError(f"bad frame magic {magic!r}; expected {MAGIC!r} (not a kvstored data-plane peer)")
    if version != VERSION:
        raise _ProtocolError(f"data-plane protocol version {version} is not supported (this side speaks {VERSION})")
    return op, flags_or_status, count, body_len


class _ProtocolError(InvalidArgument):
    """A malformed frame; the connection cannot be resynchronised."""


def _short(msg: str) -> bytes:
    return msg.encode("utf-8", "replace")[:_MAX_MSG]


def _error_response(op: int, err: KvstoredError) -> bytes:
    msg = _short(str(err))
    return _encode_header(op, int(err.code), 0, len(msg)) + msg


class _Body:
    """Cursor over a request/response body."""

    __slots__ = ("raw", "pos")

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.pos = 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.raw):
            raise _ProtocolError(f"frame body truncated: wanted {n} bytes at offset {self.pos}, body is {len(self.raw)} bytes")
        out = self.raw[self.pos : end]
        self.pos = end
        return out

    def u16(self) -> int:
        return _U16.unpack(self.take(2))[0]


# ---- server --------------------------------------------------------------------------------


class DataPlaneServer:
    """The node's TCP data-plane listener: one daemon thread per connection.

    Args:
        core: request handling (validation, draining, metrics) over the store.
        address: ``host:port`` to listen on (port 0 = any free port).
        max_connections: connections served at once; more are refused with UNAVAILABLE.
        io_timeout_s: longest wait for a peer inside one request (a stalled writer's
            reservations are aborted after it).
        idle_timeout_s: an idle connection is closed after this long.
    """

    def __init__(
        self,
        core: NodeCore,
        address: str,
        *,
        max_connections: int = 1024,
        io_timeout_s: float | None = None,
        idle_timeout_s: float = 60.0,
    ) -> None:
        self.core = core
        self._host, self._port = parse_host_port(address)
        self.max_connections = max_connections
        self.io_timeout_s = io_timeout_s if io_timeout_s is not None else core.cfg.pin_lease_s
        self.idle_timeout_s = idle_timeout_s
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._conns: dict[socket.socket, bool] = {}  # socket -> busy
        self._threads: set[threading.Thread] = set()
        self._ids = itertools.count(1)
        self.address = ""
        self.num_requests_lost = 0
        """Requests whose connection broke mid-request, counted once the request's
        reservations are aborted and its pins released (tests wait on it)."""

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
        try:
            sock.settimeout(1.0)
            sock.sendall(_error_response(0, Unavailable(
                f"the data plane serves at most {self.max_connections} connections; retry later"
            )))
        except OSError:
            pass
        finally:
            sock.close()

    def _set_busy(self, sock: socket.socket, busy: bool) -> None:
        with self._lock:
            if sock in self._conns:
                self._conns[sock] = busy

    def _serve_connection(self, sock: socket.socket, peer: object) -> None:
        metrics = self.core.metrics
        if metrics is not None:
            metrics.dataplane_connections.inc()
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            reader = _Reader(sock)
            while not self._stopping.is_set():
                sock.settimeout(self.idle_timeout_s)
                try:
                    raw = reader.read_exact(_HEADER.size)
                except (_Eof, TimeoutError, OSError):
                    return  # peer went away between requests (or idle timeout / shutdown)
                self._set_busy(sock, True)
                sock.settimeout(self.io_timeout_s)
                try:
                    self._handle(sock, reader, raw)
                except _ProtocolError as exc:
                    log.warning("data_plane_bad_frame", peer=str(peer), error=str(exc))
                    try:
                        sock.sendall(_error_response(0, exc))
                    except OSError:
                        pass
                    return
                except (ConnectionError, TimeoutError, OSError) as exc:
                    log.info("data_plane_connection_lost", peer=str(peer), error=str(exc))
                    with self._lock:
                        self.num_requests_lost += 1
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

    def _handle(self, sock: socket.socket, reader: _Reader, raw_header: bytes) -> None:
        op, _flags, count, body_len = _decode_header(raw_header)
        if op not in (OP_GET, OP_PUT):
            raise _ProtocolError(f"unknown data-plane op {op}; expected 1 (GET) or 2 (PUT)")
        cfg = self.core.cfg
        max_body = 66 + count * (2 + cfg.max_key_bytes + 12 + 4096)
        if count > cfg.max_batch_keys * 4 or body_len > max_body:
            raise _ProtocolError(
                f"frame announces {count} items in a {body_len}-byte body; at most "
                f"{cfg.max_batch_keys} keys per request (node.max_batch_keys)"
            )
        body = _Body(reader.read_exact(body_len))
        ns = body.take(body.u16())
        metrics = self.core.metrics
        op_name = "get" if op == OP_GET else "put"
        if op == OP_GET:
            keys = [body.take(body.u16()) for _ in range(count)]
            code = self._handle_get(sock, keys, ns)
        else:
            items = []
            for _ in range(count):
                key = body.take(body.u16())
                size, meta_len = _PUT_REQ_ITEM.unpack(body.take(_PUT_REQ_ITEM.size))
                items.append((key, size, body.take(meta_len)))
            code = self._handle_put(sock, reader, items, ns)
        if metrics is not None:
            metrics.dataplane_requests.labels(op=op_name, code=ErrorCode(code).name).inc()

    def _handle_get(self, sock: socket.socket, keys: list[bytes], ns: bytes) -> int:
        core = self.core
        try:
            core.check_batch(len(keys))
            core.check_namespace_id(ns)
        except KvstoredError as exc:
            sock.sendall(_error_response(OP_GET, exc))
            return int(exc.code)
        pending: list[bytes | memoryview] = [_encode_header(OP_GET, 0, len(keys), 0)]
        num_blocks = num_bytes = 0
        chunks = core.pinned_chunks(keys, ns, chunk_keys=_GET_CHUNK_KEYS)
        with contextlib.closing(chunks):
            while True:
                try:
                    _start, got = next(chunks)
                except StopIteration:
                    break
                except KvstoredError as exc:
                    if pending:  # nothing sent yet: fail the whole request cleanly
                        sock.sendall(_error_response(OP_GET, exc))
                        return int(exc.code)
                    raise ConnectionAbortedError(f"GET failed mid-stream: {exc}") from exc
                for b in got:
                    if isinstance(b, PinnedBlock):
                        pending.append(
                            _GET_ITEM.pack(0, int(b.tier), 1, b.size_bytes, len(b.meta), 0) + b.meta
                        )
                        pending.append(b.view)
                        num_blocks += 1
                        num_bytes += b.size_bytes
                    elif b is None:
                        pending.append(_GET_ITEM.pack(0, 0, 0, 0, 0, 0))
                    else:
                        msg = _short(str(b))
                        pending.append(_GET_ITEM.pack(int(b.code), 0, 0, 0, 0, len(msg)) + msg)
                _send_all(sock, pending, None)  # while the chunk's pins are held
                pending = []
        if pending:
            _send_all(sock, pending, None)
        core.count_transfer("tcp", "out", num_blocks, num_bytes)
        return 0

    def _handle_put(
        self, sock: socket.socket, reader: _Reader, items: list[tuple[bytes, int, bytes]], ns: bytes
    ) -> int:
        core = self.core
        try:
            core.check_batch(len(items))
            core.check_namespace_id(ns)
            guard = core.put_in_flight()
            guard.__enter__()
        except KvstoredError as exc:
            for _, size, _ in items:  # consume the payloads so the stream stays in sync
                reader.skip(size)
            sock.sendall(_error_response(OP_PUT, exc))
            return int(exc.code)
        try:
            reserved = core.reserve_items(items, ns)
            try:
                num_bytes = 0
                for (_, size, _), r in zip(items, reserved, strict=True):
                    if isinstance(r, Reservation):
                        reader.read_into(r.view)
                        num_bytes += size
                    else:
                        reader.skip(size)
            except BaseException:
                core.abort_reserved(reserved)  # disconnect mid-stream: nothing becomes visible
                raise
            outcomes = core.commit_reserved(reserved)
        finally:
            guard.__exit__(None, None, None)
        body = bytearray()
        for o in outcomes:
            msg = _short(str(o.error)) if o.error is not None else b""
            code = int(o.error.code) if o.error is not None else 0
            body += _PUT_ITEM.pack(code, int(o.stored), len(msg))
            body += msg
        sock.sendall(_encode_header(OP_PUT, 0, len(outcomes), len(body)) + bytes(body))
        core.count_transfer("tcp", "in", sum(1 for o in outcomes if o.stored), num_bytes)
        return 0

    def num_busy(self) -> int:
        """Connections currently inside a request."""
        with self._lock:
            return sum(1 for busy in self._conns.values() if busy)

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
        for sock in conns:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in threads:
            t.join(timeout=1.0)
        log.info("data_plane_stopped", address=self.address)


# ---- client --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GetItem:
    """One item of a data-plane GET response (payload already delivered to the sink)."""

    code: int
    message: str
    found: bool
    tier: int
    size_bytes: int
    meta: bytes


@dataclass(frozen=True, slots=True)
class PutItem:
    """One item of a data-plane PUT response."""

    code: int
    message: str
    stored: bool


Sink = Callable[[int, int, bytes], memoryview | None]
"""``sink(index, size_bytes, meta)`` -> where to receive a found block's payload: a writable
byte view of exactly ``size_bytes``, or None to discard it."""


class DataPlaneClient:
    """Client side of the data plane: a pool of blocking connections to one node.

    Thread-safe: each call takes its own connection from the pool.

    Args:
        address: the node's data-plane ``host:port`` (from Describe).
        pool_size: idle connections kept open.
    """

    def __init__(self, address: str, *, pool_size: int = 4) -> None:
        self.address = address
        self._host, self._port = parse_host_port(address)
        self._pool_size = pool_size
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

    def _call(self, fn: Callable[[socket.socket, _Reader], object], deadline: float) -> object:
        """Run one request on a pooled connection; a stale pooled connection is retried once."""
        for _attempt in range(2):
            sock, reused = self._acquire(deadline)
            reader = _Reader(sock, deadline)
            try:
                result = fn(sock, reader)
            except (TimeoutError, socket.timeout):
                sock.close()
                raise DeadlineExceeded(
                    f"data plane at {self.address} did not finish the request within the deadline"
                ) from None
            except _ProtocolError as exc:
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
    def _check_status(reader: _Reader, op: int) -> tuple[int, int]:
        rop, status, count, body_len = _decode_header(reader.read_exact(_HEADER.size))
        if status != 0:
            msg = reader.read_exact(body_len).decode("utf-8", "replace") if body_len else ""
            raise error_from_code(status, msg or f"data-plane request failed with code {status}")
        if rop != op:
            raise _ProtocolError(f"response op {rop} does not match request op {op}")
        return count, body_len

    def get(
        self, keys: Sequence[bytes], namespace_id: bytes, sink: Sink, *, deadline: float
    ) -> list[GetItem]:
        """Fetch blocks; each found payload is received straight into ``sink(...)``'s view.

        Returns:
            Per key, in order: a :class:`GetItem` (``found`` False = miss; ``code`` != 0 =
            this item's error).

        Raises:
            Unavailable: cannot connect.  DeadlineExceeded: the deadline passed.
            TransferFailed: the connection broke.  A KvstoredError for a whole-request error.
        """
        parts = [_U16.pack(len(namespace_id)), namespace_id]
        for k in keys:
            parts.append(_U16.pack(len(k)))
            parts.append(k)
        body = b"".join(parts)
        request = _encode_header(OP_GET, 0, len(keys), len(body)) + body

        def run(sock: socket.socket, reader: _Reader) -> list[GetItem]:
            _send_all(sock, [request], deadline)
            count, _ = self._check_status(reader, OP_GET)
            if count != len(keys):
                raise _ProtocolError(f"GET response has {count} items for {len(keys)} keys")
            out = []
            for i in range(count):
                code, tier, found, size, meta_len, msg_len = _GET_ITEM.unpack(
                    reader.read_exact(_GET_ITEM.size)
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
        parts = [_U16.pack(len(namespace_id)), namespace_id]
        for key, value, meta in items:
            parts.append(_U16.pack(len(key)))
            parts.append(key)
            parts.append(_PUT_REQ_ITEM.pack(len(value), len(meta)))
            parts.append(meta)
        body = b"".join(parts)
        header = _encode_header(OP_PUT, 0, len(items), len(body)) + body

        def run(sock: socket.socket, reader: _Reader) -> list[PutItem]:
            _send_all(sock, [header, *(v for _, v, _ in items)], deadline)
            count, body_len = self._check_status(reader, OP_PUT)
            if count != len(items):
                raise _ProtocolError(f"PUT response has {count} items for {len(items)} sent")
            resp = _Body(reader.read_exact(body_len))
            out = []
            for _ in range(count):
                code, stored, msg_len = _PUT_ITEM.unpack(resp.take(_PUT_ITEM.size))
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
