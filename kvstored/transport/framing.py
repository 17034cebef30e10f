"""Frame codec of the TCP data plane: headers, bodies, limits and deadline-bounded socket I/O.

No policy and no store in here: :mod:`kvstored.transport.tcp_server` (server) and
:mod:`kvstored.transport.tcp` (client) build on it, and so will node-to-node transfers.
Every size a peer announces is checked against :class:`FrameLimits` *before* anything is
allocated for it.

Framing (all integers little-endian)::

    Request  = ReqHeader(16) + body(body_len) [+ payloads, PUT only]
      ReqHeader  = magic "KVDP" | version u8 (=1) | op u8 (1=GET, 2=PUT) | flags u16
                   PUT flags: bits 8..11 = the blocks' replication factor (1..8;
                     PUT_FLAG_FACTOR_SHIFT): a replica a node writes for a put(replicas=N)
                     (node/put_replicas.py), so the receiving node's inventory carries the
                     factor too; 0 = none; any other bit is refused (a node older than the
                     field refuses it: the writer sends without it from then on)
                   PUT_FLAG_HANDOFF (1) = a pool-LRU hand-off (node/spill.py): the body
                     carries the blocks' age; the receiver takes them only by evicting an
                     original of its own that is older (else NO_CAPACITY per item); a node
                     older than the flag refuses it (the sender evicts its own block)
                   PUT_FLAG_SPARE (2) = a spill PUT or a put(replicas=N) replica PUT
                     (node/spill.py, node/put_replicas.py): the receiver takes each item
                     only into room that drops no sole copy there (free space, its copies,
                     DRAM blocks also on its SSD, redundant replicas), else NO_CAPACITY per
                     item (the sender asks another peer, or reports fewer replicas); refused
                     together with PUT_FLAG_HANDOFF; a node older than the flag refuses it
                     (the sender sends without it from then on: that node reserves as for
                     any put, as before the flag)
                   GET flags (any other bit is refused):
                     GET_FLAG_GENERATION (1) = item headers carry the generation;
                     GET_FLAG_FILL_FROM_PEERS (2) = a cluster node first copies the blocks
                       it lacks from its peers (an engine's client sets it; a node reading
                       a peer never does, so reads between nodes never chain or loop)
                     GET_FLAG_PEER_EXPORT (4) = a node copying the blocks into its own
                       store (node/remote.py): the source sends them without promoting an
                       SSD-only block into its DRAM, touching recency or counting a get
                       (TieredStore.read_for_export); refused when combined with flag 2
                     GET_FLAG_RANGES (8) = each key is followed by offset u64 | length u64:
                       the item's payload is bytes [offset, offset + length) of the block,
                       clipped to its size (range_bytes); the item header still carries the
                       whole block's size (a client reads one large block over several
                       streams, one range each)
                   | count u32 | body_len u32
      GET body   = ns_len u16 | ns | count x (key_len u16 | key [| offset u64 | length u64])
      PUT body   = ns_len u16 | ns [| handoff_age_ms u64, with PUT_FLAG_HANDOFF]
                   | count x (key_len u16 | key | size u64 | meta_len u32 | meta)
                 handoff_age_ms: ms since the blocks' (coldest original's) last use on the
                   sender
      PUT payloads: the count values back to back; item i is exactly size_i bytes (items the
                   server rejects are still sent and skipped, so the stream stays in sync)

    Response = RespHeader(16) + ...
      RespHeader = magic "KVDP" | version u8 | op u8 | status u16 (ErrorCode; 0 = OK)
                   | count u32 | body_len u32
      status != 0: body = UTF-8 message (<= MAX_MSG_BYTES); nothing follows
      GET, OK:   body_len = 0; then count items, in request order:
                   ItemHeader(18) = code u16 | tier u8 | found u8 | size u64 | meta_len u32
                                    | msg_len u16 [| generation u64, with GET_FLAG_GENERATION]
                   | meta | msg | size payload bytes (only when found; with
                   GET_FLAG_RANGES, range_bytes(size, offset, length) of them)
                 generation: the generation of the replica that was pinned and sent, as
                   the node reported it to the master (0 = unknown, always 0 on a miss;
                   < 2**63)
      PUT, OK:   body = count x (code u16 | stored u8 | msg_len u16 | msg)

Deadlines: a :class:`Reader` and :func:`send_all` take an absolute ``time.monotonic()``
deadline for the *whole* exchange; each ``recv``/``sendmsg`` waits at most for what is left
of it, so a peer trickling one byte at a time cannot stretch a request past its deadline.
Under a deadline the socket is in blocking mode with the kernel's own timeout
(``SO_RCVTIMEO``/``SO_SNDTIMEO``) set to what is left before each call, so a payload is one
``recv_into(..., MSG_WAITALL)`` and a GET chunk one ``sendmsg``, instead of a ``poll`` plus a
``recv`` per 64 KiB segment (3x fewer syscalls and no Python step per segment). A
call the kernel timeout cuts short returns what it moved (or EAGAIN: TimeoutError), and the
next call finds the deadline passed. (A signal that interrupts a call before it moved a byte
restarts it with the timeout set before it: the one case where a call may wait a little past
the deadline.)

Over TLS (an ``ssl.SSLSocket``: the data plane with ``[tls]``) there is no ``sendmsg`` and no
``MSG_WAITALL``: ``send_all`` sends buffer by buffer and a ``Reader`` loops on plain
``recv_into``; the deadline is the socket's own timeout, re-armed before each call, since
OpenSSL retries a blocking read that a kernel timeout cut short (it would never end).
"""

from __future__ import annotations

import collections
import itertools
import socket
import ssl
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass

from kvstored.errors import BatchTooLarge, BlockTooLarge, InvalidArgument, KvstoredError

MAGIC = b"KVDP"
VERSION = 1
OP_GET = 1
OP_PUT = 2
HEADER = struct.Struct("<4sBBHII")  # magic, version, op, flags|status, count, body_len
GET_ITEM = struct.Struct("<HBBQIH")  # code, tier, found, size, meta_len, msg_len
GET_ITEM_GEN = struct.Struct("<HBBQIHQ")  # ... msg_len, generation (GET_FLAG_GENERATION)
GET_FLAG_GENERATION = 1
"""Request flag of a GET: every item header carries the replica's generation."""
GET_FLAG_FILL_FROM_PEERS = 2
"""Request flag of a GET: a cluster node copies the blocks it lacks from its peers first
(engines' clients only; a node's reads of its peers never set it: no fetch loops)."""
GET_FLAG_PEER_EXPORT = 4
"""Request flag of a GET: a peer node reads the blocks to copy them (node/remote.py sets
it). The source serves them through ``read_for_export``: a DRAM block pinned in place for
the send, an SSD-only block read from its file (checksum-verified) into a private buffer,
nothing promoted, touched or counted as a get (the reader keeps its own copy). Refused
together with GET_FLAG_FILL_FROM_PEERS (a node's read of a peer asks nobody else)."""
GET_FLAG_RANGES = 8
"""Request flag of a GET: every key carries a byte range (offset u64, length u64) and the
item's payload is that range of the block (:func:`range_bytes` bytes); the item header keeps
the block's whole size. A node older than the flag refuses it (the client then reads whole
blocks)."""
GET_FLAG_PROBE = 16
"""Request flag of a GET: a presence probe. Each item header says whether the node holds
the key and in which tier (``found``, ``tier``; size 0, no meta, generation 0) and no
payload follows; nothing is pinned, read, promoted, touched or counted as a get (a node's
Exists / LookupPrefix asking the peers of its cached view during a failover,
kvstored/node/remote.py). Refused with GET_FLAG_FILL_FROM_PEERS or GET_FLAG_RANGES; a node
older than the flag refuses it (the prober then counts that peer as not answering)."""
PUT_FLAG_FACTOR_SHIFT = 8
PUT_FLAG_FACTOR_MASK = 0x0F << PUT_FLAG_FACTOR_SHIFT
"""PUT flag bits of the blocks' replication factor (``flags >> PUT_FLAG_FACTOR_SHIFT``)."""
PUT_FLAG_HANDOFF = 1
"""PUT flag: a pool-LRU hand-off; the body carries ``handoff_age_ms`` after the namespace."""
PUT_FLAG_SPARE = 2
"""PUT flag: a spill or replica PUT; the receiver reserves only room that drops no sole
copy (``TieredStore.reserve(spare_or_redundant=True)``), else answers the item NO_CAPACITY.
Never with PUT_FLAG_HANDOFF (a hand-off has its own rule)."""
PUT_FLAGS = PUT_FLAG_FACTOR_MASK | PUT_FLAG_HANDOFF | PUT_FLAG_SPARE
"""Every flag a PUT may carry."""
U64 = struct.Struct("<Q")
GET_FLAGS = (GET_FLAG_GENERATION | GET_FLAG_FILL_FROM_PEERS | GET_FLAG_PEER_EXPORT
             | GET_FLAG_RANGES | GET_FLAG_PROBE)
"""Every flag a GET may carry."""
RANGE = struct.Struct("<QQ")  # offset, length (GET_FLAG_RANGES)
RANGE_TO_END = (1 << 64) - 1
"""A range length meaning "to the end of the block"."""


def range_bytes(size_bytes: int, offset: int, length: int) -> int:
    """Payload bytes of the range ``[offset, offset + length)`` of a ``size_bytes`` block."""
    return max(0, min(length, size_bytes - offset))
MAX_GENERATION = (1 << 63) - 1
"""Largest generation a GET item may carry (the master's generations are in (0, 2**63))."""
PUT_ITEM = struct.Struct("<HBH")  # code, stored, msg_len
PUT_REQ_ITEM = struct.Struct("<QI")  # size, meta_len
U16 = struct.Struct("<H")
SOCKET_BUFFER_BYTES = 4 << 20
READ_BUFFER_BYTES = 64 << 10
IOV_MAX = 512
MAX_MSG_BYTES = 1000
"""Longest error message either side sends (longer ones are cut)."""


class PeerClosed(ConnectionError):
    """The peer closed the connection."""


class ProtocolError(InvalidArgument):
    """A malformed frame; the connection cannot be resynchronised."""


class FrameRejected(Exception):
    """A well-formed request the receiver will not consume (over a limit).

    The stream cannot be kept in sync without reading what the frame announced, so the
    receiver answers ``error`` and closes the connection.
    """

    def __init__(self, error: KvstoredError) -> None:
        super().__init__(str(error))
        self.error = error


def tune_socket(sock: socket.socket) -> None:
    """TCP_NODELAY, big buffers and keepalive on a data-plane socket."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER_BYTES)
        except OSError:  # capped by net.core.[rw]mem_max; the kernel default still works
            pass


_TIMEVAL = struct.Struct("@ll")  # struct timeval {time_t tv_sec; suseconds_t tv_usec} (LP64 Linux)


def arm_kernel_timeout(sock: socket.socket, option: int, deadline: float) -> None:
    """Put ``sock`` in blocking mode and let the kernel end the next call at ``deadline``.

    Args:
        sock: a connected socket.
        option: ``socket.SO_RCVTIMEO`` (next recv) or ``socket.SO_SNDTIMEO`` (next send).
        deadline: absolute ``time.monotonic()`` seconds.

    Raises:
        TimeoutError: the deadline has passed already.
    """
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("deadline exceeded")
    if isinstance(sock, ssl.SSLSocket):
        # TLS: a kernel timeout would make OpenSSL retry its read forever (a blocking
        # socket's WANT_READ is retried); the socket's own timeout raises TimeoutError.
        sock.settimeout(remaining)
        return
    if sock.gettimeout() is not None:
        sock.settimeout(None)  # blocking: MSG_WAITALL and one whole sendmsg work only so
    sec = int(remaining)
    usec = max(1 if sec == 0 else 0, int((remaining - sec) * 1e6))  # 0 s 0 us = no timeout
    sock.setsockopt(socket.SOL_SOCKET, option, _TIMEVAL.pack(sec, usec))


# ---- limits -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FrameLimits:
    """The most a peer may announce in one frame; checked before anything is allocated.

    Attributes:
        max_items: most items (keys) in one request or response.
        max_key_bytes: longest key.
        max_meta_bytes: longest per-item metadata.
        max_namespace_bytes: longest namespace id.
        max_item_bytes: largest payload of one item (``node.max_block_bytes``).
        max_request_payload_bytes: largest sum of a PUT's announced payloads, skipped items
            included.
        max_body_bytes: largest request body (keys and metas) one request may announce.
    """

    max_items: int
    max_key_bytes: int
    max_meta_bytes: int
    max_namespace_bytes: int
    max_item_bytes: int
    max_request_payload_bytes: int
    max_body_bytes: int

    def max_body_for(self, op: int, count: int, flags: int = 0) -> int:
        """The largest body a well-formed request of ``op`` with ``count`` items can have."""
        per_item = 2 + self.max_key_bytes
        fixed = 2 + self.max_namespace_bytes
        if op == OP_PUT:
            per_item += PUT_REQ_ITEM.size + self.max_meta_bytes
            if flags & PUT_FLAG_HANDOFF:
                fixed += U64.size
        elif flags & GET_FLAG_RANGES:
            per_item += RANGE.size
        return min(self.max_body_bytes, fixed + count * per_item)

    def check_request_header(self, op: int, count: int, body_len: int, flags: int = 0) -> None:
        """Check a request header's op, flags and announced sizes.

        Raises:
            ProtocolError: unknown op, a flag this side does not know, GET flags 2 and
                4 together, or PUT_FLAG_HANDOFF with PUT_FLAG_SPARE.
            FrameRejected: too many items or too long a body (holding BatchTooLarge or
                InvalidArgument naming the limit and the setting that raises it).
        """
        if op not in (OP_GET, OP_PUT):
            raise ProtocolError(f"unknown data-plane op {op}; expected 1 (GET) or 2 (PUT)")
        known = GET_FLAGS if op == OP_GET else PUT_FLAGS
        if flags & ~known:
            raise ProtocolError(
                f"data-plane request flags {flags:#x} are not supported for op {op} "
                f"(known: {known:#x})"
            )
        both = GET_FLAG_FILL_FROM_PEERS | GET_FLAG_PEER_EXPORT
        if op == OP_GET and flags & both == both:
            raise ProtocolError(
                f"data-plane GET flags {flags:#x} set both GET_FLAG_FILL_FROM_PEERS (2) and "
                "GET_FLAG_PEER_EXPORT (4): a peer's export read never fills from other peers"
            )
        spare_with = PUT_FLAG_HANDOFF | PUT_FLAG_SPARE
        if op == OP_PUT and flags & spare_with == spare_with:
            raise ProtocolError(
                f"data-plane PUT flags {flags:#x} set both PUT_FLAG_HANDOFF (1) and "
                "PUT_FLAG_SPARE (2): a hand-off has its own room rule"
            )
        probe_with = GET_FLAG_FILL_FROM_PEERS | GET_FLAG_RANGES
        if op == OP_GET and flags & GET_FLAG_PROBE and flags & probe_with:
            raise ProtocolError(
                f"data-plane GET flags {flags:#x} set GET_FLAG_PROBE (16) with "
                "GET_FLAG_FILL_FROM_PEERS (2) or GET_FLAG_RANGES (8): a probe sends no bytes "
                "and asks nobody else"
            )
        if count > self.max_items:
            raise FrameRejected(BatchTooLarge(
                f"data-plane request announces {count} items; at most {self.max_items} per "
                "request (node.max_batch_keys); split the batch"
            ))
        limit = self.max_body_for(op, count, flags)
        if body_len > limit:
            raise FrameRejected(InvalidArgument(
                f"data-plane request announces a {body_len}-byte body for {count} items; at most "
                f"{limit} bytes (keys <= {self.max_key_bytes} bytes, metas <= "
                f"{self.max_meta_bytes} bytes, node.dataplane_max_header_bytes="
                f"{self.max_body_bytes})"
            ))

    def check_put_sizes(self, sizes: Sequence[int]) -> None:
        """Check a PUT's announced payload sizes as a whole (per-item limits are per-item errors).

        Raises:
            FrameRejected: the sum is over ``max_request_payload_bytes`` (holding BlockTooLarge),
                so a request announcing an absurd size is refused at once, not read or skipped.
        """
        total = sum(sizes)
        if total > self.max_request_payload_bytes:
            raise FrameRejected(BlockTooLarge(
                f"data-plane PUT announces {total} payload bytes in {len(sizes)} items; at most "
                f"{self.max_request_payload_bytes} bytes per request "
                "(node.dataplane_max_request_bytes) and "
                f"{self.max_item_bytes} per block (node.max_block_bytes)"
            ))


# ---- socket I/O -------------------------------------------------------------------------------


class Reader:
    """Buffered reads of small headers; payloads go straight into the caller's memory.

    Args:
        sock: a connected socket.
        deadline: absolute ``time.monotonic()`` by which every read must be done (None = the
            socket's own timeout per call). May be changed between requests.
    """

    def __init__(self, sock: socket.socket, deadline: float | None = None) -> None:
        self.sock = sock
        self.deadline = deadline
        self._tls = isinstance(sock, ssl.SSLSocket)
        self._buf = bytearray(READ_BUFFER_BYTES)
        self._mv = memoryview(self._buf)
        self._start = 0
        self._end = 0
        self.num_received = 0

    @property
    def buffered(self) -> int:
        """Bytes received and not consumed yet."""
        return self._end - self._start

    def _recv_into(self, view: memoryview, waitall: bool = False) -> int:
        """One ``recv_into``; ``waitall``: fill all of ``view`` in that one call (MSG_WAITALL)
        unless the deadline or a signal cuts it short (only under a deadline)."""
        deadline = self.deadline
        if deadline is None:
            n = self.sock.recv_into(view)  # the socket's own timeout (an idle wait)
        else:
            arm_kernel_timeout(self.sock, socket.SO_RCVTIMEO, deadline)
            try:
                if self._tls:  # SSLSocket takes no flags; read_into loops until full
                    n = self.sock.recv_into(view)
                else:
                    n = self.sock.recv_into(view, 0, socket.MSG_WAITALL if waitall else 0)
            except BlockingIOError:  # EAGAIN: SO_RCVTIMEO ran out before a byte arrived
                raise TimeoutError("deadline exceeded") from None
        if n == 0:
            raise PeerClosed("the peer closed the connection")
        self.num_received += n
        return n

    def fill(self) -> None:
        """Wait until at least one unconsumed byte is buffered.

        Raises:
            PeerClosed, TimeoutError, OSError: as the socket.
        """
        if self._end > self._start:
            return
        self._start = self._end = 0
        self._end = self._recv_into(self._mv)

    def read_exact(self, n: int) -> bytes:
        """Exactly ``n`` bytes as a bytes object (headers, bodies; ``n`` checked by the caller)."""
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
            pos += self._recv_into(dst[pos:], waitall=True)

    def skip(self, n: int) -> None:
        """Consume and discard ``n`` bytes."""
        take = min(self._end - self._start, n)
        self._start += take
        n -= take
        if n:
            self._start = self._end = 0  # the buffer is empty now
        while n > 0:
            n -= self._recv_into(self._mv[: min(n, len(self._buf))], waitall=True)


def send_all(sock: socket.socket, bufs: Sequence[bytes | memoryview], deadline: float | None) -> None:
    """``sendmsg`` every buffer completely (gather I/O, no copies), within ``deadline``.

    When this returns, the kernel holds its own copy of every byte: the buffers may be
    released or reused at once.

    Raises:
        TimeoutError: the deadline passed.  OSError: the connection broke.
    """
    views = collections.deque(memoryview(b).cast("B") for b in bufs if len(b))
    if isinstance(sock, ssl.SSLSocket):  # no sendmsg over TLS: one send per buffer part
        for view in views:
            while len(view):
                if deadline is not None:
                    arm_kernel_timeout(sock, socket.SO_SNDTIMEO, deadline)
                view = view[sock.send(view):]  # the bytes are encrypted into OpenSSL's buffer
        return
    while views:
        batch = list(itertools.islice(views, IOV_MAX))
        if deadline is None:
            sent = sock.sendmsg(batch)  # the socket's own timeout
        else:
            arm_kernel_timeout(sock, socket.SO_SNDTIMEO, deadline)
            try:
                sent = sock.sendmsg(batch)  # blocking: returns once all of it is queued
            except BlockingIOError:  # EAGAIN: SO_SNDTIMEO ran out before a byte was queued
                raise TimeoutError("deadline exceeded") from None
        while sent:
            head = views[0]
            if sent >= len(head):
                sent -= len(head)
                views.popleft()
            else:
                views[0] = head[sent:]
                sent = 0


# ---- headers and bodies -----------------------------------------------------------------------


def encode_header(op: int, status: int, count: int, body_len: int) -> bytes:
    """A 16-byte request/response header."""
    return HEADER.pack(MAGIC, VERSION, op, status, count, body_len)


def decode_header(raw: bytes) -> tuple[int, int, int, int]:
    """``(op, flags or status, count, body_len)`` of a 16-byte header.

    Raises:
        ProtocolError: bad magic or version.
    """
    magic, version, op, flags_or_status, count, body_len = HEADER.unpack(raw)
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic {magic!r}; expected {MAGIC!r} (not a kvstored data-plane peer)")
    if version != VERSION:
        raise ProtocolError(f"data-plane protocol version {version} is not supported (this side speaks {VERSION})")
    return op, flags_or_status, count, body_len


def short_message(msg: str) -> bytes:
    """``msg`` as UTF-8, cut to :data:`MAX_MSG_BYTES`."""
    return msg.encode("utf-8", "replace")[:MAX_MSG_BYTES]


def error_response(op: int, err: KvstoredError) -> bytes:
    """A whole-request error response carrying ``err``'s code and message."""
    msg = short_message(str(err))
    return encode_header(op, int(err.code), 0, len(msg)) + msg


class Body:
    """Cursor over a request/response body."""

    __slots__ = ("raw", "pos")

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.pos = 0

    def take(self, n: int) -> bytes:
        """The next ``n`` bytes.

        Raises:
            ProtocolError: fewer than ``n`` bytes are left.
        """
        end = self.pos + n
        if end > len(self.raw):
            raise ProtocolError(
                f"frame body truncated: wanted {n} bytes at offset {self.pos}, body is {len(self.raw)} bytes")
        out = self.raw[self.pos : end]
        self.pos = end
        return out

    def u16(self) -> int:
        """The next little-endian u16."""
        return int(U16.unpack(self.take(2))[0])


def encode_get_body(
    keys: Sequence[bytes], namespace_id: bytes,
    ranges: Sequence[tuple[int, int]] | None = None,
) -> bytes:
    """A GET request body; ``ranges``: one ``(offset, length)`` per key (GET_FLAG_RANGES)."""
    parts = [U16.pack(len(namespace_id)), namespace_id]
    for i, k in enumerate(keys):
        parts.append(U16.pack(len(k)))
        parts.append(k)
        if ranges is not None:
            parts.append(RANGE.pack(*ranges[i]))
    return b"".join(parts)


def decode_get_body(raw: bytes, count: int) -> tuple[bytes, list[bytes]]:
    """``(namespace id, keys)`` of a GET body.

    Raises:
        ProtocolError: truncated body.
    """
    body = Body(raw)
    ns = body.take(body.u16())
    return ns, [body.take(body.u16()) for _ in range(count)]


def decode_get_ranges_body(raw: bytes, count: int) -> tuple[bytes, list[bytes], list[tuple[int, int]]]:
    """``(namespace id, keys, ranges)`` of a GET body with GET_FLAG_RANGES.

    Raises:
        ProtocolError: truncated body.
    """
    body = Body(raw)
    ns = body.take(body.u16())
    keys, ranges = [], []
    for _ in range(count):
        keys.append(body.take(body.u16()))
        offset, length = RANGE.unpack(body.take(RANGE.size))
        ranges.append((int(offset), int(length)))
    return ns, keys, ranges


def encode_put_body(items: Sequence[tuple[bytes, int, bytes]], namespace_id: bytes,
                    handoff_age_ms: int | None = None) -> bytes:
    """A PUT request body for ``(key, size_bytes, meta)`` items; ``handoff_age_ms`` (a
    hand-off, sent with PUT_FLAG_HANDOFF; 0..2**64-1): the blocks' age on the sender."""
    parts = [U16.pack(len(namespace_id)), namespace_id]
    if handoff_age_ms is not None:
        parts.append(U64.pack(handoff_age_ms))
    for key, size, meta in items:
        parts.append(U16.pack(len(key)))
        parts.append(key)
        parts.append(PUT_REQ_ITEM.pack(size, len(meta)))
        parts.append(meta)
    return b"".join(parts)


def decode_put_body(raw: bytes, count: int) -> tuple[bytes, list[tuple[bytes, int, bytes]]]:
    """``(namespace id, [(key, size_bytes, meta)])`` of a PUT body.

    Raises:
        ProtocolError: truncated body.
    """
    ns, _, items = decode_put_body_flags(raw, count, 0)
    return ns, items


def decode_put_body_flags(raw: bytes, count: int, flags: int
                          ) -> tuple[bytes, int | None, list[tuple[bytes, int, bytes]]]:
    """``(namespace id, handoff_age_ms or None, [(key, size_bytes, meta)])`` of a PUT body
    sent with ``flags`` (the age is there only with PUT_FLAG_HANDOFF).

    Raises:
        ProtocolError: truncated body.
    """
    body = Body(raw)
    ns = body.take(body.u16())
    age = int(U64.unpack(body.take(U64.size))[0]) if flags & PUT_FLAG_HANDOFF else None
    items = []
    for _ in range(count):
        key = body.take(body.u16())
        size, meta_len = PUT_REQ_ITEM.unpack(body.take(PUT_REQ_ITEM.size))
        items.append((key, int(size), body.take(meta_len)))
    return ns, age, items
