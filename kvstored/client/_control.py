"""The client end of the lean control channel (node end: kvstored/node/control.py).

A client of a local node (unix address) whose Describe names a ``control_path`` sends the
hot calls (PinBlocks, ReleasePins, ReservePut, CommitPut, LookupPrefix, Exists) as
``ControlRequest`` frames on a unix stream socket instead of gRPC; every other call, and
every call when the node offers no channel or it cannot be reached, stays on gRPC. Set
``KVSTORED_CONTROL_CHANNEL=0`` to keep everything on gRPC.

Piggybacked release: a shared-memory get whose copy has returned hands its pin id to
:meth:`ControlChannel.defer_release` instead of sending ReleasePins; the id travels in the
``release_pin_ids`` of this client's next request on the channel, which the node serves
before the request's op. So a get costs one round trip, and until that request arrives the
pin holds (the block cannot be evicted or removed). Deferred ids are sent at the latest:

- with the next control request (any op, on any connection of this client);
- before any gRPC call of this client (:meth:`flush`), so ``get(K)`` then ``remove(K)``
  removes K, and ``stats()`` counts no pin of a finished get;
- by the idle flusher, once no request carried them for :data:`IDLE_RELEASE_S`;
- at ``close()`` (and the session's end frees them in any case).

A refill after its answer (CommitSlots with ``grant_after_answer``, kvstored/node/slots.py):
the node answers with ``grant_follows`` and then sends one more frame on that connection, the
slots granted; the connection keeps a :data:`Trailer` for it and reads that frame with its
next request, after sending it and before that request's answer (so the wait, if any, overlaps
the node's work). A connection closed with a frame still unread calls its trailer with None:
the refill's request is then acked as an orphan.

A request that gets no answer (the connection failed) raises :class:`NoAnswer` (retriable
Unavailable); the driver then treats a granting request as orphaned, as for gRPC
(kvstored/client/_orphans.py), and the release ids it carried are kept for the next request
(a release is idempotent). Fencing is the node's (kvstored/node/sessions.py): pins and
reservations belong to the session, not to a connection.

:class:`ControlChannel` (the blocking client's) is thread-safe: one request at a time per
connection; concurrent callers use more connections. :class:`AsyncControlChannel` (the
asyncio client's) is the same on asyncio streams, used from one event loop.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog
from google.protobuf.message import DecodeError, Message

from kvstored.client import _hooks
from kvstored.errors import DeadlineExceeded, Unavailable, error_from_code
from kvstored.transport.control import FIELD_OF, LENGTH_BYTES, MAX_FRAME_BYTES, FrameTooLarge, recv_exactly
from kvstored.v1 import node_pb2 as pb

log = structlog.get_logger(__name__)

ENV_SWITCH = "KVSTORED_CONTROL_CHANNEL"
"""``0`` (or ``off``/``false``) keeps every call on gRPC."""
METHODS = frozenset(FIELD_OF)
"""NodeService methods the channel carries."""
IDLE_RELEASE_S = 0.01
"""Deferred pin releases that no request carried for this long are sent on their own."""
REPORT_IDLE_S = 1.0
"""One-sided counts that no request carried for this long are sent on their own (metrics
are scraped every few seconds: a second of delay costs nothing, a wake-up per get would)."""
FLUSHER_PARK_S = 1.0
"""The idle flusher stops polling once nothing was deferred for this long (see
:meth:`ControlChannel._flush_when_idle`)."""
CONNECT_TIMEOUT_S = 1.0


def enabled() -> bool:
    """Whether clients of this process may use the channel (``KVSTORED_CONTROL_CHANNEL``)."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "off", "false", "no")


class NoAnswer(Unavailable):
    """A control request got no answer (the connection failed or closed); retriable."""


class NoAnswerInTime(DeadlineExceeded):
    """A control request got no answer within its timeout (as a gRPC deadline would)."""


NO_ANSWER = (NoAnswer, NoAnswerInTime)
"""What a request that may have run without its answer arriving raises."""


class OneSidedCounts:
    """This client's one-sided reads and probes not yet reported to the node (thread-safe).

    One-sided reads take no round trip, so the node would never count them: the counts ride
    on this client's next control request (``ControlRequest.one_sided``), or a bare request
    of the idle flusher (:data:`REPORT_IDLE_S` after the first unreported one), or the flush
    before any gRPC call and at close; the node adds them to its hit metrics
    (kvstored/node/control.py). A request that got no answer gives its counts back, so a
    count is reported at least once and, after such a failure, at most once too many.
    """

    __slots__ = ("_lock", "_c", "since")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._c = [0, 0, 0, 0, 0, 0]  # hit blocks, hit bytes, fallbacks, misses, lookup keys, lookup hits
        self.since = 0.0
        """When the oldest unreported count was added (monotonic s; 0 = none pending)."""

    def add(self, hits: int, hit_bytes: int, fallbacks: int, misses: int) -> bool:
        """Count a one-sided read: blocks kept (and their bytes), blocks whose version check
        failed and blocks the index did not name (both then read through the node).

        Returns:
            Whether this count made some pending where none were (then the caller makes
            sure they are sent: ``note_report``; while counts stay pending, whoever made
            them pending has done so, and a read adding to them need not again).
        """
        if not (hits or fallbacks or misses):
            return False
        with self._lock:
            c = self._c
            c[0] += hits
            c[1] += hit_bytes
            c[2] += fallbacks
            c[3] += misses
            if self.since:
                return False
            self.since = time.monotonic()
            return True

    def add_lookup(self, num_keys: int, num_hits: int) -> bool:
        """Count a lookup_prefix answered (wholly or in its leading part) in the client;
        returns whether it made counts pending where none were (as :meth:`add`)."""
        if not num_keys:
            return False
        with self._lock:
            self._c[4] += num_keys
            self._c[5] += num_hits
            if self.since:
                return False
            self.since = time.monotonic()
            return True

    def pending(self) -> bool:
        """Whether some count is not reported yet."""
        return bool(self.since)

    def take_into(self, req: pb.ControlRequest) -> list[int] | None:
        """Move the pending counts into ``req.one_sided``; returns them (None: none pending)."""
        if not self.since:
            return None
        with self._lock:
            c, self._c = self._c, [0, 0, 0, 0, 0, 0]
            self.since = 0.0
        r = req.one_sided
        r.hit_blocks, r.hit_bytes, r.fallback_blocks, r.miss_blocks, r.lookup_blocks, r.lookup_hit_blocks = c
        return c

    def give_back(self, c: list[int] | None) -> None:
        """Counts a request carried but got no answer for: reported with a later one."""
        if c is None:
            return
        with self._lock:
            for i, v in enumerate(c):
                self._c[i] += v
            if not self.since:
                self.since = time.monotonic()


Trailer = Callable[[pb.ControlResponse | None], None]
"""What receives the frame that follows an answer with ``grant_follows`` (a refill granted
after its answer, kvstored/node/slots.py): the parsed frame, or None when the connection
failed or closed before it was read (its grant, if any, is then an orphan to ack)."""


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [bytes((n,)) for n in range(0x80)]
_OP_TAGS = {
    f.name: _varint((f.number << 3) | 2)  # wire type 2: a length-delimited sub-message
    for f in pb.ControlRequest.DESCRIPTOR.oneofs_by_name["op"].fields
}


def encode_request(envelope: pb.ControlRequest, field: str, op: Message) -> bytes:
    """The serialized ControlRequest of ``envelope`` with ``op`` as its ``field`` (the
    bytes ``envelope`` with ``getattr(envelope, field).CopyFrom(op)`` serializes to, without
    copying ``op``: protobuf's encoding of a message field is its tag, its length and its
    serialized bytes, and the fields of a message may come in any order)."""
    data = op.SerializeToString()
    return b"".join((envelope.SerializeToString(), _OP_TAGS[field], _varint(len(data)), data))


def _takes_trailer(resp: pb.ControlResponse) -> bool:
    return resp.WhichOneof("op") == "commit_slots" and resp.commit_slots.grant_follows


class _Connection:
    """One blocking unix stream connection; one request at a time (and the trailer frame
    of a request answered with ``grant_follows``, read with the next request)."""

    def __init__(self, path: str) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(CONNECT_TIMEOUT_S)
            sock.connect(path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self.session_id = 0  # the session the node bound this connection to (0 = none yet)
        self._timeout_s: float | None = None
        self._rest = b""  # bytes read past the last frame (the start of a trailer)
        self.trailer: Trailer | None = None
        """Where the frame the node sends next, unasked, goes (see :data:`Trailer`)."""

    def _frame(self) -> bytes:
        """The next frame's payload (what was read past it is kept for the next one)."""
        buf = self._rest
        sock = self.sock
        while len(buf) < LENGTH_BYTES:
            got = sock.recv(LENGTH_BYTES + 65536)
            if not got:
                raise ConnectionResetError("the peer closed the control connection")
            buf += got
        size = int.from_bytes(buf[:LENGTH_BYTES], "big")
        if size > MAX_FRAME_BYTES:
            raise FrameTooLarge(f"control frame of {size} bytes; the limit is {MAX_FRAME_BYTES}")
        end = LENGTH_BYTES + size
        if len(buf) < end:
            buf += recv_exactly(sock, end - len(buf))
        self._rest = buf[end:]
        return buf[LENGTH_BYTES:end]

    def request(self, data: bytes, timeout_s: float, on_trailer: Trailer | None = None,
                ) -> pb.ControlResponse:
        """Send one serialized ControlRequest and read its response (after the trailer
        pending from an earlier request, which the node sent first).

        Args:
            on_trailer: where the trailer of this request goes if it is answered with
                ``grant_follows`` (read with this connection's next request, or given
                None at close).

        Raises:
            NoAnswer: the connection failed or closed; NoAnswerInTime: it timed out
            (close the connection either way).
        """
        current = self._timeout_s
        # settimeout only when the deadline moved noticeably (at most 5% + 5 ms late)
        if current is None or current < timeout_s or current > timeout_s * 1.05 + 0.005:
            self.sock.settimeout(timeout_s)
            self._timeout_s = timeout_s
        try:
            self.sock.sendall(len(data).to_bytes(LENGTH_BYTES, "big") + data)
            pending, self.trailer = self.trailer, None
            if pending is not None:  # the frame the node sent before this answer
                try:
                    first = pb.ControlResponse.FromString(self._frame())
                except BaseException:
                    pending(None)
                    raise
                pending(first)
            resp = pb.ControlResponse.FromString(self._frame())
        except TimeoutError:
            raise NoAnswerInTime(
                f"the node did not answer within {timeout_s:.3f} s (control channel)"
            ) from None
        except (OSError, FrameTooLarge, DecodeError) as exc:
            raise NoAnswer(f"the control channel failed: {exc}") from None
        if _takes_trailer(resp):
            self.trailer = on_trailer or _drop_trailer
        return resp

    def close(self) -> None:
        pending, self.trailer = self.trailer, None
        self.sock.close()
        if pending is not None:
            pending(None)


def _drop_trailer(_resp: pb.ControlResponse | None) -> None:
    """A trailer nobody asked for (never sent to this client's requests): read, ignored."""


class ControlChannel:
    """The control channel of one client (a pool of connections to ``path``).

    Args:
        path: the node's control socket (``DescribeResponse.control_path``).

    Raises:
        OSError: the first connection cannot be made (the caller stays on gRPC).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._free: list[_Connection] = [_Connection(path)]
        self._pending: list[int] = []  # pin ids whose copies returned, not yet released
        self._deferred_at = 0.0  # when the newest pending id was deferred
        self._wake = threading.Condition(self._lock)
        self._flusher_parked = False  # the flusher waits for a first pending id (untimed)
        self._closed = False
        self._flusher: threading.Thread | None = None
        self.counts: OneSidedCounts | None = None
        """The client's one-sided counts this channel reports (set by its ClientState)."""

    # ---- requests ------------------------------------------------------------------------
    def _acquire(self, session_id: int) -> _Connection:
        with self._lock:
            if self._closed:
                raise Unavailable("the client is closed")
            while self._free:
                conn = self._free.pop()
                if not session_id or conn.session_id in (0, session_id):
                    return conn
                conn.close()  # bound to a session that ended: the node would refuse it
        try:
            return _Connection(self.path)
        except OSError as exc:
            raise NoAnswer(f"cannot connect to the control channel {self.path}: {exc}") from None

    def _take_pending(self) -> list[int]:
        with self._lock:
            ids, self._pending = self._pending, []
        return ids

    def _give_back(self, ids: list[int]) -> None:
        if ids:
            with self._lock:
                self._pending[:0] = ids
                self._wake.notify()

    def call(self, method: str, request: Message, timeout_s: float,
             on_trailer: Trailer | None = None) -> Any:
        """Run one NodeService call over the channel; carries the deferred releases.

        Args:
            method: one of :data:`METHODS`.
            request: its request message (its ``session_id`` binds the connection).
            timeout_s: how long to wait for the answer.
            on_trailer: where the frame that follows an answer with ``grant_follows`` goes
                (called later, on the thread of the connection's next request, or at close).

        Returns:
            The op's response message.

        Raises:
            KvstoredError: the node's error for the op (it answered).
            NoAnswer, NoAnswerInTime: no answer arrived (the op may or may not have run).
        """
        field = FIELD_OF[method]
        session_id = getattr(request, "session_id", 0) if method != "ReleasePins" else 0
        req = pb.ControlRequest(session_id=session_id)
        with self._lock:  # the pending ids and a free connection under one lock (hot path)
            ids, self._pending = self._pending, []
            conn = self._free.pop() if self._free and not self._closed else None
        if conn is not None and session_id and conn.session_id not in (0, session_id):
            conn.close()  # bound to a session that ended: the node would refuse it
            conn = None
        if ids:
            req.release_pin_ids.extend(ids)
            if _hooks._hook is not None:
                try:
                    _hooks.fire("control_release_sent", method=method, pin_ids=list(ids))
                except BaseException:
                    self._put_back(conn)
                    self._give_back(ids)
                    raise
        counts = self.counts
        carried = None if counts is None else counts.take_into(req)
        try:
            resp = self._roundtrip(encode_request(req, field, request), session_id, ids,
                                   timeout_s, conn, on_trailer)
        except BaseException:
            if counts is not None and carried is not None:
                counts.give_back(carried)
                # the hit path wakes the flusher only when its count made some pending
                # (OneSidedCounts.add), and these are pending again without that
                self.note_report()
            raise
        if resp.error_code:
            raise error_from_code(resp.error_code, resp.error_message)
        return getattr(resp, field)

    def _roundtrip(
        self, data: bytes, session_id: int, ids: list[int], timeout_s: float,
        conn: _Connection | None = None, on_trailer: Trailer | None = None,
    ) -> pb.ControlResponse:
        if conn is None:
            try:
                conn = self._acquire(session_id)
            except BaseException:
                self._give_back(ids)
                raise
        try:
            resp = conn.request(data, max(timeout_s, 1e-3), on_trailer)
        except BaseException:  # no answer, or interrupted mid-way: the connection is unusable
            conn.close()
            self._give_back(ids)  # idempotent: sent again with the next request
            raise
        if session_id:
            conn.session_id = session_id
        self._put_back(conn)
        return resp

    def _put_back(self, conn: _Connection | None) -> None:
        if conn is None:
            return
        with self._lock:
            if self._closed:
                conn.close()
            else:
                self._free.append(conn)

    # ---- deferred releases ---------------------------------------------------------------
    def defer_release(self, pin_id: int) -> None:
        """Release ``pin_id`` with the next request (its copy has returned)."""
        with self._lock:
            self._pending.append(pin_id)
            self._deferred_at = time.monotonic()
            if self._flusher is None and not self._closed:
                self._flusher = threading.Thread(
                    target=self._flush_when_idle, name="kvstored-client-release", daemon=True
                )
                self._flusher.start()
            if self._flusher_parked:  # else it is in a timed wait and rechecks by itself
                self._flusher_parked = False  # one wake per park, not one per get
                self._wake.notify()
        if _hooks._hook is not None:
            _hooks.fire("pin_release_deferred", pin_id=pin_id)

    def note_report(self) -> None:
        """One-sided counts are pending: make sure the idle flusher sends them within
        :data:`REPORT_IDLE_S` if no request carries them first (wakes it only when parked)."""
        with self._lock:
            if self._closed:
                return
            if self._flusher is None:
                self._flusher = threading.Thread(
                    target=self._flush_when_idle, name="kvstored-client-release", daemon=True
                )
                self._flusher.start()
            if self._flusher_parked:
                self._flusher_parked = False
                self._wake.notify()

    def num_pending(self) -> int:
        """Pin ids deferred and not yet sent."""
        with self._lock:
            return len(self._pending)

    def flush(self, timeout_s: float) -> bool:
        """Send the deferred releases and one-sided counts now (a bare request); True if no
        release is left pending."""
        ids = self._take_pending()
        req = pb.ControlRequest(release_pin_ids=ids)
        counts = self.counts
        carried = None if counts is None else counts.take_into(req)
        if not ids and carried is None:
            return True
        if ids and _hooks._hook is not None:
            _hooks.fire("control_release_sent", method="", pin_ids=list(ids))
        try:
            self._roundtrip(req.SerializeToString(), 0, ids, timeout_s)
        except (Unavailable, DeadlineExceeded):
            if counts is not None:
                counts.give_back(carried)
            return False  # kept pending: the next request, the flusher or close() sends them
        return True

    def _idle_wait_s(self) -> float | None:
        """(lock held) How long until the flusher must send (<= 0: now), or None: nothing due."""
        now = time.monotonic()
        if self._pending:
            return self._deferred_at + IDLE_RELEASE_S - now
        counts = self.counts
        if counts is not None and counts.since:
            return counts.since + REPORT_IDLE_S - now
        return None

    def _flush_when_idle(self) -> None:
        # While gets keep coming, each next request carries the last get's pin id: the
        # flusher then only polls (a timed wait of IDLE_RELEASE_S), it is not woken per get
        # (a thread wake-up per get cost ~30 us of its latency on a loaded 2-core machine).
        # It parks (an untimed wait, woken by the next defer_release) once nothing was
        # deferred for FLUSHER_PARK_S.
        # One-sided counts (note_report) are sent REPORT_IDLE_S after the oldest pending one,
        # by one timed wait: they never make the flusher poll (a wake-up takes the GIL from
        # the reading thread; polling for them raised lookup_prefix's p99 on 2 loaded cores).
        while True:
            with self._lock:
                while (wait_s := self._idle_wait_s()) is None and not self._closed:
                    if time.monotonic() - self._deferred_at < FLUSHER_PARK_S:
                        self._wake.wait(IDLE_RELEASE_S)
                        continue
                    self._flusher_parked = True
                    self._wake.wait()
                    self._flusher_parked = False
                if self._closed:
                    return
                if wait_s is not None and wait_s > 0:
                    self._wake.wait(wait_s)
                    continue
            if not self.flush(timeout_s=5.0):
                with self._lock:
                    self._wake.wait(0.1)  # the node is unreachable: try again later

    def close(self, timeout_s: float = 5.0) -> list[int]:
        """Send the deferred releases, close every connection (idempotent).

        Returns:
            Pin ids that could not be released here (the caller sends them over gRPC; the
            session's end frees them in any case).
        """
        self.flush(timeout_s)
        with self._lock:
            self._closed = True
            conns, self._free = self._free, []
            left, self._pending = self._pending, []
            self._wake.notify_all()
        for conn in conns:
            conn.close()
        return left


class _AsyncConnection:
    """One connection of an :class:`AsyncControlChannel` (asyncio streams)."""

    __slots__ = ("reader", "writer", "session_id", "trailer")

    def __init__(self, reader: Any, writer: Any) -> None:
        self.reader = reader
        self.writer = writer
        self.session_id = 0
        self.trailer: Trailer | None = None

    async def read(self) -> pb.ControlResponse:
        """The next frame, parsed.

        Raises:
            OSError, asyncio.IncompleteReadError, FrameTooLarge, DecodeError.
        """
        size = int.from_bytes(await self.reader.readexactly(LENGTH_BYTES), "big")
        if size > MAX_FRAME_BYTES:
            raise FrameTooLarge(f"control frame of {size} bytes; the limit is {MAX_FRAME_BYTES}")
        return pb.ControlResponse.FromString(await self.reader.readexactly(size))

    def close(self) -> None:
        pending, self.trailer = self.trailer, None
        self.writer.close()
        if pending is not None:
            pending(None)


class AsyncControlChannel:
    """The control channel of an :class:`~kvstored.client.aio.AsyncClient` (asyncio streams).

    The same protocol and release rules as :class:`ControlChannel`. Made in any thread (the
    first connection is a plain blocking connect, wrapped into the loop on first use); used
    from one event loop. Deferred releases not carried by a request within
    :data:`IDLE_RELEASE_S` are sent by a task of that loop.

    Raises:
        OSError: the first connection cannot be made (the caller stays on gRPC).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        first = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            first.settimeout(CONNECT_TIMEOUT_S)
            first.connect(path)
            first.setblocking(False)
        except BaseException:
            first.close()
            raise
        self._first: socket.socket | None = first
        self._free: list[_AsyncConnection] = []
        self._pending: list[int] = []
        self._flush_task: Any = None
        self._closed = False
        self.counts: OneSidedCounts | None = None
        """The client's one-sided counts this channel reports (set by its ClientState)."""

    async def _acquire(self, session_id: int) -> _AsyncConnection:
        import asyncio

        if self._closed:
            raise Unavailable("the client is closed")
        while self._free:
            conn = self._free.pop()
            if not session_id or conn.session_id in (0, session_id):
                return conn
            conn.close()
        try:
            if self._first is not None:
                sock, self._first = self._first, None
                reader, writer = await asyncio.open_unix_connection(sock=sock)
            else:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_unix_connection(self.path), CONNECT_TIMEOUT_S
                )
        except (OSError, TimeoutError) as exc:
            raise NoAnswer(f"cannot connect to the control channel {self.path}: {exc}") from None
        return _AsyncConnection(reader, writer)

    async def _roundtrip(
        self, data: bytes, session_id: int, ids: list[int], timeout_s: float,
        on_trailer: Trailer | None = None,
    ) -> pb.ControlResponse:
        import asyncio

        try:
            conn = await self._acquire(session_id)
        except BaseException:
            self._give_back(ids)
            raise
        try:
            async with asyncio.timeout(max(timeout_s, 1e-3)):
                conn.writer.write(len(data).to_bytes(LENGTH_BYTES, "big") + data)
                pending, conn.trailer = conn.trailer, None
                if pending is not None:  # the frame the node sent before this answer
                    try:
                        first = await conn.read()
                    except BaseException:
                        pending(None)
                        raise
                    pending(first)
                resp = await conn.read()
        except TimeoutError:
            conn.close()
            self._give_back(ids)
            raise NoAnswerInTime(
                f"the node did not answer within {timeout_s:.3f} s (control channel)"
            ) from None
        except (OSError, asyncio.IncompleteReadError, FrameTooLarge, DecodeError) as exc:
            conn.close()
            self._give_back(ids)
            raise NoAnswer(f"the control channel failed: {exc}") from None
        except BaseException:  # cancelled mid-way: the connection is unusable
            conn.close()
            self._give_back(ids)
            raise
        if _takes_trailer(resp):
            conn.trailer = on_trailer or _drop_trailer
        if session_id:
            conn.session_id = session_id
        if self._closed:
            conn.close()
        else:
            self._free.append(conn)
        return resp

    def _give_back(self, ids: list[int]) -> None:
        if ids:
            self._pending[:0] = ids
            self._schedule_flush()

    async def call(self, method: str, request: Message, timeout_s: float,
                   on_trailer: Trailer | None = None) -> Any:
        """As :meth:`ControlChannel.call`, awaited (``on_trailer`` is called on the loop)."""
        field = FIELD_OF[method]
        session_id = getattr(request, "session_id", 0) if method != "ReleasePins" else 0
        ids, self._pending = self._pending, []
        req = pb.ControlRequest(session_id=session_id, release_pin_ids=ids)
        if ids and _hooks._hook is not None:
            _hooks.fire("control_release_sent", method=method, pin_ids=list(ids))
        counts = self.counts
        carried = None if counts is None else counts.take_into(req)
        try:
            resp = await self._roundtrip(encode_request(req, field, request), session_id, ids,
                                         timeout_s, on_trailer)
        except BaseException:
            if counts is not None:
                counts.give_back(carried)
            raise
        if resp.error_code:
            raise error_from_code(resp.error_code, resp.error_message)
        return getattr(resp, field)

    def defer_release(self, pin_id: int) -> None:
        """Release ``pin_id`` with the next request (its copy has returned); on the loop."""
        self._pending.append(pin_id)
        self._schedule_flush()
        if _hooks._hook is not None:
            _hooks.fire("pin_release_deferred", pin_id=pin_id)

    def num_pending(self) -> int:
        """Pin ids deferred and not yet sent."""
        return len(self._pending)

    def note_report(self) -> None:
        """One-sided counts are pending: sent within :data:`REPORT_IDLE_S` (on the loop)."""
        self._schedule_flush()

    def _due(self) -> bool:
        counts = self.counts
        return bool(self._pending) or (counts is not None and counts.pending())

    def _schedule_flush(self) -> None:
        import asyncio

        if self._closed or (self._flush_task is not None and not self._flush_task.done()):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # not on the loop: the next request or close() sends them
        self._flush_task = loop.create_task(self._flush_when_idle(), name="kvstored-client-release")

    async def _flush_when_idle(self) -> None:
        import asyncio

        while self._due() and not self._closed:
            await asyncio.sleep(IDLE_RELEASE_S if self._pending else REPORT_IDLE_S)
            if self._due() and not await self.flush(5.0):
                await asyncio.sleep(0.1)  # the node is unreachable: try again later

    async def flush(self, timeout_s: float) -> bool:
        """Send the deferred releases and one-sided counts now; True if no release is left
        pending."""
        ids, self._pending = self._pending, []
        req = pb.ControlRequest(release_pin_ids=ids)
        counts = self.counts
        carried = None if counts is None else counts.take_into(req)
        if not ids and carried is None:
            return True
        if ids and _hooks._hook is not None:
            _hooks.fire("control_release_sent", method="", pin_ids=list(ids))
        try:
            await self._roundtrip(req.SerializeToString(), 0, ids, timeout_s)
        except (Unavailable, DeadlineExceeded):
            if counts is not None:
                counts.give_back(carried)
            return False
        return True

    async def aclose(self, timeout_s: float = 5.0) -> None:
        """Send the deferred releases, then close every connection (idempotent)."""
        if not self._closed:
            await self.flush(timeout_s)
        self.close()

    def close(self, timeout_s: float = 0.0) -> list[int]:
        """Close every connection without sending anything; returns the ids left pending."""
        self._closed = True
        if self._flush_task is not None:
            self._flush_task.cancel()
        for conn in self._free:
            conn.close()
        self._free = []
        if self._first is not None:
            self._first.close()
            self._first = None
        left, self._pending = self._pending, []
        return left
