"""TCP data-plane client: :class:`DataPlaneClient`, for the framed, batched protocol of
:mod:`.framing` served by :class:`~kvstored.transport.tcp_server.DataPlaneServer`.

Used by clients that cannot map the node's shared-memory arena (another host or container),
and for node-to-node transfers (:class:`DataPlaneClient` is a
:class:`~kvstored.transport.base.Transport`). gRPC stays the control plane; this port only
moves payloads, straight between sockets and the arena. What the server does with each
request (GET, its flags, PUT), its bounds, its deadline and the fencing rule:
:mod:`kvstored.transport.tcp_server`.

The client is a small pool of blocking sockets, every call under the
caller's deadline; it checks every size the server announces (item count, payload, meta,
message) before allocating for it. A GET expected to move at least
``2 * stream_min_bytes`` is split into contiguous runs of keys sent as separate requests on
up to ``max_streams`` pooled connections at once, each received by its own thread straight
into the caller's memory; a GET of one block that large is split into byte ranges of it
(GET_FLAG_RANGES) the same way. One failed stream fails the whole GET, a block whose ranges
came from two replicas is a miss, and ``get`` returns only after every stream stopped
writing (:mod:`kvstored.transport.tcp_streams`). A failed GET raises with the items that
arrived whole attached (``completed``, :func:`~kvstored.transport.base.completed_items`):
the caller keeps those, never an item whose payload arrived in part.

Sockets use TCP_NODELAY and 4 MiB send/receive buffers. With an ``ssl_context`` (``[tls]``),
every connection is mutual TLS: the handshake runs under the call's deadline (at most
``HANDSHAKE_TIMEOUT_S``) and checks the node's certificate and host name.
"""

from __future__ import annotations

import math
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures

import structlog

from kvstored.addresses import parse_host_port
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
from kvstored.security.tls import HANDSHAKE_TIMEOUT_S
from kvstored.transport.base import GetItem, PutItem, Sink, attach_completed
from kvstored.transport.framing import (
    GET_FLAG_FILL_FROM_PEERS,
    GET_FLAG_GENERATION,
    GET_FLAG_PEER_EXPORT,
    GET_FLAG_PROBE,
    GET_FLAG_RANGES,
    GET_ITEM_GEN,
    HEADER,
    MAX_GENERATION,
    MAX_MSG_BYTES,
    OP_GET,
    OP_PUT,
    PUT_FLAG_FACTOR_SHIFT,
    PUT_FLAG_HANDOFF,
    PUT_FLAG_SPARE,
    PUT_ITEM,
    RANGE_TO_END,
    Body,
    ProtocolError,
    Reader,
    decode_header,
    encode_get_body,
    encode_header,
    encode_put_body,
    range_bytes,
    send_all,
    tune_socket,
)
from kvstored.transport.tcp_streams import (
    DEFAULT_MAX_STREAMS,
    DEFAULT_STREAM_MIN_BYTES,
    SharedBlock,
    StreamSet,
    plan_ranges,
    plan_streams,
)
from kvstored.types import Tier

__all__ = [
    "DataPlaneClient", "GetItem", "PutItem", "Sink",
    "tune_socket",
]

_TIERS = frozenset(int(t) for t in (Tier.DRAM, Tier.SSD))
RUNS_PER_STREAM = 2
"""Runs a split GET is cut into per stream: each stream takes the next run when it is done
with one, so a stream held up (a busy core) delays one run, not a fixed share; more runs
add a request's round trip each."""
DEFAULT_CLIENT_MAX_BLOCK_BYTES = 64 << 20
DEFAULT_CLIENT_MAX_META_BYTES = 4096

log = structlog.get_logger(__name__)


class _SiblingFailed(TransferFailed):
    """This stream of a split GET stopped because another stream of it failed."""


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
        fill_from_peers: GETs ask a cluster node to copy the blocks it lacks from its peers
            first (GET_FLAG_FILL_FROM_PEERS): an engine's client sets it; a node reading a
            peer must not (reads between nodes never go further, so they cannot loop).
        peer_export: GETs read the blocks for a copy (GET_FLAG_PEER_EXPORT): the node
            sends them without promoting, touching recency or counting a get. Set by a
            node reading a peer (node/remote.py); an engine's client must not. A node older
            than the flag refuses it: the client then drops the flag for this node (one
            extra round trip, logged) and reads without it (that node pins, and may
            promote, what it sends).
        max_streams: most connections one GET uses at once (1 = never split); default one
            per core, at most 4.
        stream_min_bytes: expected payload per stream below which a GET is not split
            further (default 8 MiB).
        ssl_context: mutual TLS (:meth:`kvstored.security.tls.TlsFiles.client_context`):
            every connection completes a handshake that checks the node's certificate
            against the CA and the host of ``address``; a failed handshake is
            ``Unavailable``. None = plaintext.

    Raises:
        InvalidArgument: both ``fill_from_peers`` and ``peer_export``, or ``max_streams`` /
            ``stream_min_bytes`` < 1.
    """

    def __init__(
        self,
        address: str,
        *,
        pool_size: int = 4,
        max_block_bytes: int = DEFAULT_CLIENT_MAX_BLOCK_BYTES,
        max_meta_bytes: int = DEFAULT_CLIENT_MAX_META_BYTES,
        fill_from_peers: bool = False,
        peer_export: bool = False,
        max_streams: int = DEFAULT_MAX_STREAMS,
        stream_min_bytes: int = DEFAULT_STREAM_MIN_BYTES,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        if max_streams < 1 or stream_min_bytes < 1:
            raise InvalidArgument(
                f"DataPlaneClient: max_streams={max_streams} and stream_min_bytes="
                f"{stream_min_bytes}; both must be >= 1"
            )
        if fill_from_peers and peer_export:
            raise InvalidArgument(
                "DataPlaneClient: fill_from_peers=True and peer_export=True; a peer's export "
                "read never fills from other peers (pick one)"
            )
        self.address = address
        self.ssl_context = ssl_context
        self.get_flags = (GET_FLAG_GENERATION | (GET_FLAG_FILL_FROM_PEERS if fill_from_peers else 0)
                          | (GET_FLAG_PEER_EXPORT if peer_export else 0))
        self._host, self._port = parse_host_port(address)
        self._pool_size = pool_size
        self.max_block_bytes = max_block_bytes
        self.max_meta_bytes = max_meta_bytes
        self.max_streams = max_streams
        self.stream_min_bytes = stream_min_bytes
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        self._streams: ThreadPoolExecutor | None = None  # max_streams - 1 workers, made on first use
        self._avg_block_bytes = 0
        """Running average of the blocks this client received (the split hint of a GET
        whose caller gave no sizes)."""
        self.num_split_gets = 0
        """GETs sent as more than one stream (tests and benches read it)."""
        self.ranges_ok = True
        """False once the node refused GET_FLAG_RANGES (an older node): whole blocks only."""
        self.put_factor_ok = True
        """False once the node refused the PUT factor flag (an older node): sent without it."""
        self.put_spare_ok = True
        """False once the node refused PUT_FLAG_SPARE (an older node): sent without it."""

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
            if self.ssl_context is not None:
                sock.settimeout(max(0.001, min(deadline - time.monotonic(), HANDSHAKE_TIMEOUT_S)))
                plain, sock = sock, None
                sock = self.ssl_context.wrap_socket(plain, server_hostname=self._host)  # handshakes
        except ssl.SSLError as exc:
            if sock is not None:
                sock.close()
            raise Unavailable(
                f"TLS handshake with the data plane at {self.address} failed: {exc.reason or exc} "
                "(is it the node's data address, and do both ends use certificates of one CA?)"
            ) from None
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

    def _acquire(self, deadline: float, *, fresh: bool = False) -> tuple[socket.socket, bool]:
        """A pooled idle connection (``reused`` True) or a new one; ``fresh``: always new."""
        with self._lock:
            if self._closed:
                raise Unavailable("the data-plane client is closed")
            if self._idle and not fresh:
                return self._idle.pop(), True
        return self._connect(deadline), False

    def _release(self, sock: socket.socket) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._pool_size:
                self._idle.append(sock)
                return
        sock.close()

    def _call(
        self, fn: Callable[[socket.socket, Reader], object], deadline: float,
        streams: StreamSet | None = None,
    ) -> object:
        """Run one request on a pooled connection; a stale pooled connection is retried once,
        on a new connection.

        ``streams``: the request is one stream of a split GET: its socket is registered there
        while in use (so a failing sibling can shut it down), a failure aborts the siblings,
        and a stream whose siblings failed neither starts nor retries.
        """
        for attempt in range(2):
            # the retry after a dead pooled connection uses a new one: the other idle ones
            # may be just as dead (the node restarted on the same address)
            sock, reused = self._acquire(deadline, fresh=attempt > 0)
            if streams is not None and not streams.enter(sock):
                self._release(sock)  # untouched: still in sync
                raise _SiblingFailed(f"a sibling stream of this GET to {self.address} failed")
            reader = Reader(sock, deadline)
            try:
                try:
                    result = fn(sock, reader)
                finally:
                    if streams is not None:
                        streams.leave(sock)
            except BaseException as exc:
                sock.close()
                aborted = streams is not None and streams.failed  # a sibling shut this down
                if (not aborted and isinstance(exc, (ConnectionError, OSError))
                        and not isinstance(exc, TimeoutError)
                        and reused and reader.num_received == 0 and time.monotonic() < deadline):
                    continue  # the node closed an idle pooled connection: use a fresh one
                if streams is not None:
                    streams.abort(sock)  # stop the siblings before anything is reported
                if aborted:
                    raise _SiblingFailed(f"a sibling stream of this GET to {self.address} failed") from None
                if isinstance(exc, TimeoutError):  # socket.timeout is TimeoutError
                    raise DeadlineExceeded(
                        f"data plane at {self.address} did not finish the request within the deadline"
                    ) from None
                if isinstance(exc, ProtocolError):
                    raise TransferFailed(
                        f"data plane at {self.address} sent a malformed frame: {exc}"
                    ) from None
                if isinstance(exc, (ConnectionError, OSError)):
                    raise TransferFailed(
                        f"data-plane connection to {self.address} failed: {exc}"
                    ) from None
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
        self, keys: Sequence[bytes], namespace_id: bytes, sink: Sink, *, deadline: float,
        size_hints: Sequence[int] | None = None,
    ) -> list[GetItem]:
        """Fetch blocks; each found payload is received straight into ``sink(...)``'s view.

        Every announced size is checked before ``sink`` is asked for memory: a payload over
        ``max_block_bytes``, a meta over ``max_meta_bytes`` or a generation out of range
        (>= 2**63, or on a miss) fails the call.

        A batch expected to move at least ``2 * stream_min_bytes`` goes out as up to
        ``max_streams`` requests at once, one per contiguous run of keys (for a single key:
        one per byte range of the block), each on its own connection and thread. ``sink``
        is then called from those threads, one at a time (once per block).
        Either way the call returns or raises only once nothing writes into a view ``sink``
        handed out any more, and a failure of any request fails the whole call. The error
        it raises carries, as ``completed`` (read it with
        :func:`~kvstored.transport.base.completed_items`), per key the :class:`GetItem`
        whose payload had arrived whole before the failure, or None: a caller may keep
        those; an item whose payload arrived only in part is None (its view holds torn
        bytes). A block read as byte ranges is kept only when every range arrived, so it
        is None after any failure.

        Args:
            keys: the block keys, in order.
            namespace_id: their namespace.
            sink: where each found payload goes (see :data:`~kvstored.transport.base.Sink`).
            deadline: absolute ``time.monotonic()`` seconds for the whole call.
            size_hints: the expected bytes of each key (e.g. the caller's buffer sizes) to
                plan the split; None = this client's running average block size.

        Returns:
            Per key, in order: a :class:`GetItem` (``found`` False = miss; ``code`` != 0 =
            this item's error).

        Raises:
            Unavailable: cannot connect.  DeadlineExceeded: the deadline passed.
            TransferFailed: the connection broke, or the node announced more than the limits.
            InvalidArgument: ``size_hints`` is not one per key.
            A KvstoredError for a whole-request error.
            Each with ``completed`` attached (above).
        """
        if size_hints is None:
            size_hints = [self._avg_block_bytes] * len(keys)
        elif len(size_hints) != len(keys):
            raise InvalidArgument(f"size_hints has {len(size_hints)} items for {len(keys)} keys")
        # Up to RUNS_PER_STREAM runs of >= stream_min_bytes per stream; max_streams in flight.
        runs = (plan_streams(size_hints, RUNS_PER_STREAM * self.max_streams, self.stream_min_bytes)
                if self.max_streams > 1 else [(0, len(keys))])
        # done[i]: item i once its header and whole payload arrived (kept on a failure)
        done: list[GetItem | None] = [None] * len(keys)
        while True:
            done[:] = [None] * len(keys)  # a refused request (retried below) received nothing
            ranges = [(0, RANGE_TO_END)]
            if len(keys) == 1 and self.ranges_ok and self.max_streams > 1:
                ranges = plan_ranges(size_hints[0], self.max_streams, self.stream_min_bytes,
                                     RANGE_TO_END)
            flags = self.get_flags
            try:
                if len(ranges) > 1:
                    out = self._get_ranges(keys[0], namespace_id, sink, deadline, ranges)
                else:
                    out = self._get_runs(keys, namespace_id, sink, deadline, runs,
                                         done.__setitem__)
                break
            except KvstoredError as exc:
                attach_completed(exc, done)
                if not isinstance(exc, InvalidArgument):
                    raise
                if "request flags" not in str(exc):
                    raise
                if len(ranges) > 1:
                    # A node older than GET_FLAG_RANGES refuses it (and closed the
                    # connection): read whole blocks from it from now on.
                    self.ranges_ok = False
                    log.info("data_plane_ranges_refused", address=self.address, error=str(exc))
                    continue
                if not flags & GET_FLAG_PEER_EXPORT:
                    raise
                # A node older than GET_FLAG_PEER_EXPORT refuses it (and closed the
                # connection): read without the flag from now on (that node pins, and may
                # promote, what it sends).
                self.get_flags = flags & ~GET_FLAG_PEER_EXPORT
                log.info("data_plane_peer_export_refused", address=self.address, error=str(exc))
        sizes = [it.size_bytes for it in out if it.found]
        if sizes:
            avg = sum(sizes) // len(sizes)
            self._avg_block_bytes = avg if not self._avg_block_bytes else (self._avg_block_bytes + avg) // 2
        return out

    def probe(self, keys: Sequence[bytes], namespace_id: bytes, *, deadline: float
              ) -> list[Tier | None]:
        """Which of ``keys`` the node holds, and in which tier (GET_FLAG_PROBE: item headers
        only; the node pins, reads, promotes and touches nothing).

        Returns:
            Per key, in order: its tier on the node, or None (absent, or an item error).

        Raises:
            Unavailable: cannot connect.  DeadlineExceeded: the deadline passed.
            TransferFailed: the connection broke, or the node sent a malformed answer.
            InvalidArgument: the node refused the flag (a node older than it) or the request.
            A KvstoredError for a whole-request error.
        """
        body = encode_get_body(keys, namespace_id, None)
        request = encode_header(OP_GET, GET_FLAG_GENERATION | GET_FLAG_PROBE, len(keys),
                                len(body)) + body
        count = len(keys)

        def run(sock: socket.socket, reader: Reader) -> list[Tier | None]:
            send_all(sock, [request], deadline)
            self._check_status(reader, OP_GET, count)
            out: list[Tier | None] = []
            for i in range(count):
                code, tier, found, size, meta_len, msg_len, _ = GET_ITEM_GEN.unpack(
                    reader.read_exact(GET_ITEM_GEN.size))
                if size or meta_len or msg_len > MAX_MSG_BYTES:
                    raise ProtocolError(f"probe item #{i} announces {size} payload bytes and a "
                                        f"{meta_len}-byte meta; a probe answer carries neither")
                if msg_len:
                    reader.read_exact(msg_len)
                out.append(Tier(tier) if found and not code and tier in _TIERS else None)
            return out

        return self._call(run, deadline)  # type: ignore[return-value]

    def _get_runs(
        self, keys: Sequence[bytes], namespace_id: bytes, sink: Sink, deadline: float,
        runs: list[tuple[int, int]], on_item: Callable[[int, GetItem], None],
    ) -> list[GetItem]:
        """One request per run of keys, on up to ``max_streams`` streams that each take the
        next run not yet sent (so a stream whose thread is held up, on a busy machine, delays
        only the run it holds, not a fixed half of the batch). ``on_item(index, item)``:
        called for each item once it arrived whole, from the stream's thread."""
        if len(runs) == 1:
            return self._get_run(keys, namespace_id, sink, deadline, 0, None, on_item=on_item)
        lock = threading.Lock()
        results: list[list[GetItem] | None] = [None] * len(runs)
        taken = [0]

        def locked_sink(i: int, size: int, meta: bytes) -> memoryview | None:
            with lock:
                return sink(i, size, meta)

        def stream(streams: StreamSet) -> list[GetItem]:
            while True:
                with lock:
                    j = taken[0]
                    if j >= len(runs) or streams.failed:
                        return []
                    taken[0] = j + 1
                lo, hi = runs[j]
                results[j] = self._get_run(keys[lo:hi], namespace_id, locked_sink, deadline,
                                           lo, streams, on_item=on_item)

        self._run_streams([stream] * min(self.max_streams, len(runs)))
        out = [it for part in results for it in (part or ())]
        return self._read_again_no_capacity(keys, namespace_id, sink, deadline, out, on_item)

    def _read_again_no_capacity(
        self, keys: Sequence[bytes], namespace_id: bytes, sink: Sink, deadline: float,
        out: list[GetItem], on_item: Callable[[int, GetItem], None],
    ) -> list[GetItem]:
        """Read the items a split GET got NoCapacity for again, in one request.

        The streams of one GET pin their chunks at once on the node: one stream's pins can
        fill DRAM while another asks for SSD blocks to be promoted, which the node answers
        NoCapacity (it cuts a chunk only at its own pins). Once every stream is done, one
        request for those keys alone is streamed by the node chunk by chunk, as any read
        larger than DRAM is; what is NoCapacity then (others' pins) stays a miss.

        Returns:
            ``out`` with those items replaced by the second read's.
        """
        again = [i for i, it in enumerate(out) if it.code == ErrorCode.NO_CAPACITY]
        if not again or time.monotonic() >= deadline:
            return out
        retried = self._get_run(
            [keys[i] for i in again], namespace_id,
            lambda j, size, meta: sink(again[j], size, meta), deadline, 0, None,
            on_item=lambda j, it: on_item(again[j], it),
        )
        for i, it in zip(again, retried, strict=True):
            out[i] = it
        return out

    def _get_ranges(
        self, key: bytes, namespace_id: bytes, sink: Sink, deadline: float,
        ranges: list[tuple[int, int]],
    ) -> list[GetItem]:
        """One block as byte ranges, one request (stream) each (GET_FLAG_RANGES)."""
        shared = SharedBlock(sink)
        def run_range(rng: tuple[int, int]) -> Callable[[StreamSet], list[GetItem]]:
            return lambda streams: self._get_run(
                [key], namespace_id, sink, deadline, 0, streams, rng=rng, shared=shared)

        parts = self._run_streams([run_range(rng) for rng in ranges])
        items = [p[0] for p in parts]
        failed = next((it for it in items if it.code), None)
        if failed is not None:
            return [failed]
        if all(it.found for it in items) and not shared.mismatch:
            return [items[0]]
        return [GetItem(0, "", False, 0, 0, b"", 0)]  # evicted or replaced between the pins

    def _run_streams(self, calls: list[Callable[[StreamSet], list[GetItem]]]) -> list[list[GetItem]]:
        """Run ``calls`` at once (the first on this thread); all of them have returned when
        this does. The first failure (not a sibling's "stopped") is raised."""
        streams = StreamSet()
        pool = self._stream_pool()
        futures: list[Future[list[GetItem]]] = [pool.submit(c, streams) for c in calls[1:]]
        errors: list[BaseException] = []
        results: list[list[GetItem]] = []
        try:
            results.append(calls[0](streams))
        except BaseException as exc:  # noqa: BLE001  (re-raised below, after the siblings stopped)
            errors.append(exc)
        wait_futures(futures)  # every stream has left its last recv_into
        for f in futures:
            failure = f.exception()
            if failure is not None:
                errors.append(failure)
            else:
                results.append(f.result())
        if errors:
            first = [e for e in errors if not isinstance(e, _SiblingFailed)] or errors
            raise first[0]
        self.num_split_gets += 1
        return results

    def _stream_pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._closed:
                raise Unavailable("the data-plane client is closed")
            if self._streams is None:
                self._streams = ThreadPoolExecutor(
                    self.max_streams - 1, thread_name_prefix="kvstored-dp-stream"
                )
            return self._streams

    def _get_run(
        self, keys: Sequence[bytes], namespace_id: bytes, sink: Sink, deadline: float,
        base: int, streams: StreamSet | None, *,
        rng: tuple[int, int] | None = None, shared: SharedBlock | None = None,
        on_item: Callable[[int, GetItem], None] | None = None,
    ) -> list[GetItem]:
        """One GET request for ``keys`` (``sink`` indices offset by ``base``); ``rng``: only
        that byte range of each block (GET_FLAG_RANGES), into ``shared``'s view.
        ``on_item(base + i, item)``: called once item ``i``'s header and whole payload
        arrived (so a failure later in the request keeps it)."""
        flags = self.get_flags | (GET_FLAG_RANGES if rng is not None else 0)
        body = encode_get_body(keys, namespace_id, None if rng is None else [rng] * len(keys))
        request = encode_header(OP_GET, flags, len(keys), len(body)) + body
        count = len(keys)

        def run(sock: socket.socket, reader: Reader) -> list[GetItem]:
            send_all(sock, [request], deadline)
            self._check_status(reader, OP_GET, count)
            out = []
            for i in range(count):
                code, tier, found, size, meta_len, msg_len, generation = GET_ITEM_GEN.unpack(
                    reader.read_exact(GET_ITEM_GEN.size)
                )
                if meta_len > self.max_meta_bytes or msg_len > MAX_MSG_BYTES:
                    raise ProtocolError(
                        f"GET item #{base + i} announces a {meta_len}-byte meta and a {msg_len}-byte "
                        f"message; at most {self.max_meta_bytes} and {MAX_MSG_BYTES}"
                    )
                if generation > MAX_GENERATION or (generation and not found):
                    raise ProtocolError(
                        f"GET item #{base + i} announces generation {generation} "
                        f"(found={bool(found)}); a generation is < 2**63 and only on a hit"
                    )
                if found and size > self.max_block_bytes:
                    raise ProtocolError(
                        f"GET item #{base + i} announces a {size}-byte block; the node's limit is "
                        f"{self.max_block_bytes} bytes"
                    )
                meta = reader.read_exact(meta_len) if meta_len else b""
                msg = reader.read_exact(msg_len).decode("utf-8", "replace") if msg_len else ""
                if found:
                    n = size if rng is None else range_bytes(size, *rng)
                    dst = (sink(base + i, size, meta) if shared is None
                           else shared.view_for(size, meta, generation))
                    if dst is None:
                        reader.skip(n)
                    else:
                        if len(dst) != size:
                            raise InternalError(f"sink returned {len(dst)} bytes for a {size}-byte block")
                        reader.read_into(dst if rng is None else dst[rng[0] : rng[0] + n])
                got = GetItem(code, msg, bool(found), tier, size, meta, generation)
                out.append(got)
                if on_item is not None:
                    on_item(base + i, got)
            return out

        return self._call(run, deadline, streams)  # type: ignore[return-value]

    def put(
        self,
        items: Sequence[tuple[bytes, memoryview, bytes]],
        namespace_id: bytes,
        *,
        deadline: float,
        replicas: int = 0,
        handoff_age_s: float | None = None,
        spare_only: bool = False,
    ) -> list[PutItem]:
        """Store blocks: ``items`` are ``(key, value as a byte view, meta)``.

        Args:
            replicas: the blocks' replication factor (0..8; a node writing the replicas of
                a put(replicas=N)): the receiving node remembers it for its inventory. A
                node older than the field refuses it; it is then left out, for this node
                from then on.
            handoff_age_s: a pool-LRU hand-off (node/spill.py; PUT_FLAG_HANDOFF): the
                blocks' age here, seconds. The node takes an item only by evicting an
                original of its own that is older, else answers it NO_CAPACITY. A node
                older than the flag refuses the request (InvalidArgument, raised).
            spare_only: a spill or replica PUT (PUT_FLAG_SPARE): the node takes an item
                only into room that drops no sole copy there, else answers it NO_CAPACITY.
                A node older than the flag refuses it; it is then left out, for this node
                from then on (that node reserves as for any put).

        Returns:
            Per item, in order: a :class:`PutItem` (``stored`` False with code 0 = already
            present).

        Raises:
            As :meth:`get`; InvalidArgument for ``replicas`` outside 0..8, or for
            ``handoff_age_s`` together with ``spare_only``.
        """
        if not 0 <= replicas <= 8:
            raise InvalidArgument(f"replicas must be in 0..8, got {replicas}")
        flags = replicas << PUT_FLAG_FACTOR_SHIFT if self.put_factor_ok else 0
        if handoff_age_s is not None and spare_only:
            raise InvalidArgument("a hand-off (handoff_age_s) has its own room rule; "
                                  "spare_only must be False with it")
        if handoff_age_s is not None:
            if not (math.isfinite(handoff_age_s) and handoff_age_s >= 0):
                raise InvalidArgument(f"handoff_age_s must be a finite age >= 0 seconds, got "
                                      f"{handoff_age_s}")
            age_ms = min(int(handoff_age_s * 1000), (1 << 64) - 1)
            return self._put(items, namespace_id, deadline, flags | PUT_FLAG_HANDOFF, age_ms)
        if spare_only and self.put_spare_ok:
            flags |= PUT_FLAG_SPARE
        while True:
            try:
                return self._put(items, namespace_id, deadline, flags)
            except InvalidArgument as exc:
                if not flags or "request flags" not in str(exc):
                    raise
                # A node older than a flag refuses the header (and closed the connection;
                # nothing was stored): send without that flag from now on. Newest first:
                # PUT_FLAG_SPARE (that node reserves as for any put, as before the flag),
                # then the factor (that node does not learn it).
                if flags & PUT_FLAG_SPARE:
                    self.put_spare_ok = False
                    flags &= ~PUT_FLAG_SPARE
                    log.info("data_plane_put_spare_refused", address=self.address,
                             error=str(exc))
                else:
                    self.put_factor_ok = False
                    flags = 0
                    log.info("data_plane_put_factor_refused", address=self.address,
                             error=str(exc))

    def _put(self, items: Sequence[tuple[bytes, memoryview, bytes]], namespace_id: bytes,
             deadline: float, flags: int, handoff_age_ms: int | None = None) -> list[PutItem]:
        body = encode_put_body([(k, len(v), m) for k, v, m in items], namespace_id,
                               handoff_age_ms)
        header = encode_header(OP_PUT, flags, len(items), len(body)) + body
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
        """Close every pooled connection and the stream threads; idempotent."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            pool, self._streams = self._streams, None
        for sock in idle:
            sock.close()
        if pool is not None:
            pool.shutdown(wait=False)
