"""The I/O-free core shared by :class:`Client` and :class:`AsyncClient`.

Every client operation is a generator ("sans-I/O"): it yields steps and receives their
results, and the sync and async clients only differ in how they execute a step::

    Call(method, request)   a unary NodeService RPC  -> the response message (or an exception
                            thrown into the generator). ``undo``: what to send if the caller
                            is cancelled while the RPC is in flight (the driver waits for the
                            response, sends undo(response), then raises the cancellation);
                            ``release=True``: a release/abort, always sent and awaited (at least
                            RELEASE_TIMEOUT_S), shielded from cancellation, errors -> None
    Blocking(fn)            blocking work: shared-memory copies, data-plane socket I/O
                            -> ``fn(deadline)``'s result (async: run in a named thread pool;
                            a cancellation waits for it to finish before it is delivered)
    Session()               this client's session id (opened with the OpenSession stream on
                            first use, again after it ended)

So request building, response decoding, validation, chunking, pin release and transport
choice exist once. Retries wrap a whole operation (every operation is idempotent: puts are
first-writer-wins) and only happen for retriable errors, with jittered exponential backoff,
inside the caller's deadline.

Shared-memory path (same host, arena file mappable and the very file the node uses)::

    put: ReservePut -> copy values into the mapped arena -> CommitPut (abort on any failure)
    get: PinBlocks  -> copy out of the mapped arena      -> ReleasePins (always, also on error)

Safety of the shared-memory path (fencing, see kvstored/node/sessions.py):

- Every ReservePut/PinBlocks carries this client's session id and the epoch the arena was
  mapped under (a restarted node refuses a stale mapping: retriable Unavailable, remap).
- A release or abort is only sent after the copy that touches the space has returned: the
  copy runs to its end before the op's cleanup runs, also when the caller is cancelled.
- A reservation or pin that a cancelled caller's in-flight RPC obtained is released as soon
  as that RPC answers (``Call.undo``). One whose answer never arrives (deadline, dropped
  connection, stopped process) is released by the client's orphan ack naming the request's
  ``request_id`` (kvstored/client/_orphans.py), sent at once and, if that fails, before the
  next RPC and at close().
- The node decides whether a lease held: CommitPut after the copy is refused (LeaseExpired)
  if the reservation lapsed, and ReleasePins reports lapsed pins, whose copies are reported
  as LeaseExpired. Lapsed space is quarantined by the node, never reused while this client's
  session lives, so even a late copy never touches another block's bytes.
- Releases are awaited before the operation returns, so the next operation of this client
  sees them (``get(K)`` then ``remove(K)`` removes K).
"""

from __future__ import annotations

import mmap
import os
import random
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import grpc
import numpy as np
import structlog
from google.protobuf.message import Message

from kvstored.client import _hooks
from kvstored.client._orphans import OrphanAcks, next_request_id
from kvstored.errors import (
    BlockTooLarge,
    DeadlineExceeded,
    ErrorCode,
    InternalError,
    InvalidArgument,
    KeyInvalid,
    KvstoredError,
    LeaseExpired,
    NotFound,
    Unavailable,
    error_from_code,
    error_from_rpc,
)
from kvstored.keys import Namespace, format_hash
from kvstored.native import copy_many
from kvstored.tiers.base import BlockInfo, Tier
from kvstored.transport.tcp import DataPlaneClient, format_host_port, parse_host_port
from kvstored.v1 import common_pb2 as cpb
from kvstored.v1 import node_pb2 as pb

from kvstored.client.types import Block, NodeInfo, PutResult

T = TypeVar("T")

log = structlog.get_logger(__name__)

SERVICE = "/kvstored.v1.NodeService/"
TRANSPORTS = ("auto", "shm", "tcp", "grpc")
PIN_CHUNK_KEYS = 1024
"""Most keys pinned by one PinBlocks (bounds the arena a reader holds at once)."""
MAX_CHUNK_BYTES = 256 << 20
"""Most payload bytes reserved by one ReservePut / data-plane PUT."""
INLINE_PUT_MAX_BYTES = 64 << 10
"""In tcp mode, batches up to this many bytes go inline over gRPC (no data-plane connection)."""
INITIAL_BACKOFF_S = 0.02
MAX_BACKOFF_S = 0.5
MAX_LEASE_S = 600.0
RELEASE_TIMEOUT_S = 5.0
"""Least time a release/abort RPC is given, even past the caller's deadline."""
PREFAULT_MAX_BYTES = 8 << 30
"""Arenas up to this size are prefaulted when mapped (MAP_POPULATE: no page faults in the
first copies); larger ones fault in lazily so that mapping stays fast."""

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_retries", 0),
]


@dataclass(frozen=True, slots=True)
class Call:
    """A unary NodeService RPC step (see the module docstring for ``undo`` and ``release``)."""

    method: str
    request: Message
    response_cls: type[Message]
    undo: Callable[[Any], Call | None] | None = None
    release: bool = False


@dataclass(frozen=True, slots=True)
class Blocking:
    """A blocking step: ``fn(deadline)``; ``num_bytes`` hints how much it copies."""

    fn: Callable[[float], Any]
    num_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Session:
    """This client's open session id (the driver opens the OpenSession stream if needed)."""


Op = Generator[Call | Blocking | Session, Any, T]

SESSION_METHOD = SERVICE + "OpenSession"


def abort_call(reservation_id: int) -> Call:
    """The CommitPut(abort) that releases a reservation (always sent, see ``release``)."""
    return Call(
        "CommitPut", pb.CommitPutRequest(reservation_id=reservation_id, abort=True),
        pb.CommitPutResponse, release=True,
    )


def release_call(pin_id: int) -> Call:
    """The ReleasePins that releases a pin (always sent, see ``release``)."""
    return Call("ReleasePins", pb.ReleasePinsRequest(pin_ids=[pin_id]), pb.ReleasePinsResponse,
                release=True)


def _undo_reserve(resp: pb.ReservePutResponse) -> Call | None:
    return abort_call(resp.reservation_id) if resp.reservation_id else None


def _undo_pin(resp: pb.PinBlocksResponse) -> Call | None:
    return release_call(resp.pin_id) if resp.pin_id else None


# ---- addresses, buffers, keys ----------------------------------------------------------------


def parse_address(address: str) -> tuple[str, bool]:
    """A node address -> ``(grpc target, is_unix)``.

    Accepts ``unix:PATH``, ``unix://ABS_PATH`` and ``HOST:PORT``.

    Raises:
        InvalidArgument: anything else.
    """
    if not isinstance(address, str) or not address:
        raise InvalidArgument(f"address must be 'unix:PATH' or 'HOST:PORT'; got {address!r}")
    if address.startswith("unix:"):
        path = address[len("unix:") :]
        if path.startswith("//"):
            path = path[2:]
        if not path:
            raise InvalidArgument(f"address {address!r} has an empty socket path")
        return f"unix:{os.path.abspath(path)}", True
    parse_host_port(address)
    return address, False


def as_byte_view(obj: object, what: str, index: int) -> memoryview:
    """A C-contiguous buffer as a flat byte memoryview (no copy).

    Raises:
        InvalidArgument: not a buffer, or not C-contiguous.
    """
    try:
        mv = memoryview(obj)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidArgument(
            f"{what} #{index} is a {type(obj).__name__}; pass bytes or another buffer "
            "(bytearray, memoryview, numpy array)"
        ) from None
    if not mv.c_contiguous:
        raise InvalidArgument(f"{what} #{index} is not C-contiguous; pass a contiguous buffer")
    if mv.format == "B" and mv.ndim == 1:
        return mv
    try:
        return mv.cast("B")
    except TypeError:
        return memoryview(np.frombuffer(mv, dtype=np.uint8))


def as_writable_array(obj: object, index: int) -> np.ndarray:
    """A writable C-contiguous buffer as a flat uint8 numpy array (no copy).

    Raises:
        InvalidArgument: not a buffer, read-only, or not contiguous.
    """
    try:
        mv = memoryview(obj)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidArgument(
            f"buffer #{index} is a {type(obj).__name__}; pass a writable buffer (bytearray, "
            "numpy array, a torch tensor's .numpy() view)"
        ) from None
    if mv.readonly:
        raise InvalidArgument(f"buffer #{index} is read-only; pass a writable buffer")
    if not mv.c_contiguous:
        raise InvalidArgument(f"buffer #{index} is not C-contiguous; pass a contiguous buffer")
    return np.frombuffer(mv, dtype=np.uint8)


def _received(obj: object) -> str:
    """How an unexpected argument is shown in an error: its type and a short repr."""
    text = repr(obj)
    return f"{type(obj).__name__} {text[:40] + '...' if len(text) > 40 else text}"


def require_sequence(obj: object, what: str, expected: str) -> None:
    """Check that a batch argument is a sized, indexable sequence (not str/bytes, not None).

    Raises:
        InvalidArgument: naming the argument, what was expected and what was received.
    """
    if (
        obj is None
        or isinstance(obj, (str, bytes, bytearray, memoryview))
        or not hasattr(obj, "__len__")
        or not hasattr(obj, "__getitem__")
    ):
        hint = ""
        if isinstance(obj, (bytes, bytearray, str)) and what == "keys":
            hint = "; wrap a single key in a list"
        raise InvalidArgument(f"{what} must be {expected}; got {_received(obj)}{hint}")


def _meta_bytes(meta: object, index: int) -> bytes:
    if meta is None:
        return b""
    if isinstance(meta, (bytes, bytearray, memoryview)):
        return bytes(meta)
    raise InvalidArgument(
        f"meta #{index} must be bytes (or None); got {_received(meta)}; encode text first, "
        "e.g. meta.encode()"
    )


def _key_bytes(key: object, index: int) -> bytes:
    if isinstance(key, bytes):
        return key
    if isinstance(key, (bytearray, memoryview)):
        return bytes(key)
    raise KeyInvalid(
        f"key #{index} is a {type(key).__name__}; keys are bytes (block hashes, e.g. from "
        "kvstored.block_hashes)"
    )


def _key_error(key: bytes, index: int, info: NodeInfo) -> KeyInvalid | None:
    lo, hi = info.min_key_bytes, info.max_key_bytes
    if not key:
        return KeyInvalid(f"key #{index} is empty; keys are block hashes of {lo}..{hi} bytes")
    if not lo <= len(key) <= hi:
        return KeyInvalid(
            f"key #{index} is {len(key)} bytes; the node accepts keys of {lo}..{hi} bytes"
        )
    return None


def check_keys(keys: Sequence[object], info: NodeInfo) -> list[bytes]:
    """Validate a key list for calls without per-item status.

    Raises:
        KeyInvalid: naming the first bad key's index.
        InvalidArgument: ``keys`` is a bytes object (a single key) instead of a sequence.
    """
    if isinstance(keys, (bytes, bytearray, str)):
        raise InvalidArgument("keys must be a sequence of keys; wrap a single key in a list")
    require_sequence(keys, "keys", "a sequence (list) of block keys (bytes)")
    lens = set(map(len, keys)) if set(map(type, keys)) <= {bytes} else None
    if lens is not None and (not lens or (min(lens) >= max(info.min_key_bytes, 1) and max(lens) <= info.max_key_bytes)):
        return list(keys)  # fast path: every key is valid bytes (C-level checks)
    out = []
    for i, k in enumerate(keys):
        kb = _key_bytes(k, i)
        err = _key_error(kb, i, info)
        if err is not None:
            raise err
        out.append(kb)
    return out


def status_error(status: cpb.ItemStatus) -> KvstoredError | None:
    """An item's wire status as an exception (None = OK)."""
    if status.code == 0:
        return None
    return error_from_code(status.code, status.message)


_TIER_OF: tuple[Tier | None, ...] = (None, Tier.DRAM, Tier.SSD)


def _tier(value: int) -> Tier | None:
    return _TIER_OF[value] if 0 <= value < len(_TIER_OF) else None


def _chunks(n: int, size: int) -> Iterator[tuple[int, int]]:
    for start in range(0, n, size):
        yield start, min(n, start + size)


def _tail_first(chunks: Iterable[T]) -> list[T]:
    """A request's chunks, last first: chain-aware recency across chunks.

    The node touches (pins) or commits each chunk's blocks last-key-first, so within one
    chunk the head ends up most recent. Sending the chunks themselves tail-first extends
    that to the whole request: its first key is the most recent and eviction takes the
    request's tail before its head (also when the request is larger than DRAM).
    """
    return list(chunks)[::-1]


# ---- shared-memory arena ------------------------------------------------------------------------


class ArenaMap:
    """The node's arena file mapped into this process (read-write; prefaulted up to
    ``PREFAULT_MAX_BYTES``).

    The mapping is read-write because puts write into reserved ranges; a local client can
    therefore write anywhere in the arena: the shared-memory path trusts the processes that
    may open the file (the node's user; with ``node.arena_mode = 0o660`` also its group).

    Raises:
        OSError: the file cannot be opened or mapped.
        InvalidArgument: the file is not the node's arena (other device/inode) or too small.
    """

    def __init__(self, path: str, size_bytes: int, dev: int, ino: int) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if (dev or ino) and (st.st_dev, st.st_ino) != (dev, ino):
                raise InvalidArgument(
                    f"{path} is not the node's arena (different device/inode): the client runs "
                    "in another filesystem namespace"
                )
            if st.st_size < size_bytes:
                raise InvalidArgument(
                    f"{path} is {st.st_size} bytes, smaller than the arena ({size_bytes} bytes)"
                )
            flags = mmap.MAP_SHARED
            if size_bytes <= PREFAULT_MAX_BYTES:
                flags |= getattr(mmap, "MAP_POPULATE", 0)
            self._mmap = mmap.mmap(fd, size_bytes, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.path = path
        self.size_bytes = size_bytes
        self.array: np.ndarray = np.frombuffer(self._mmap, dtype=np.uint8)

    def region(self, offset: int, size_bytes: int) -> np.ndarray:
        """``size_bytes`` of the arena at ``offset`` (a view).

        Raises:
            InternalError: the range is outside the arena (a bug or a corrupt response).
            Unavailable: the mapping was closed meanwhile (the node restarted).
        """
        if self.array.size != self.size_bytes:
            raise Unavailable(f"the arena mapping of {self.path} was closed (the node restarted)")
        if offset < 0 or offset + size_bytes > self.size_bytes:
            raise InternalError(
                f"node sent arena range [{offset}, {offset + size_bytes}) outside its "
                f"{self.size_bytes}-byte arena"
            )
        return self.array[offset : offset + size_bytes]

    def close(self) -> None:
        """Unmap (deferred to the garbage collector while copies still hold views)."""
        self.array = np.empty(0, dtype=np.uint8)
        try:
            self._mmap.close()
        except BufferError:
            pass


# ---- client state -------------------------------------------------------------------------------

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
        self.transport = transport
        self.info: NodeInfo | None = None
        self.transport_info: NodeInfo | None = None  # the node the transport was set up for
        self.arena: ArenaMap | None = None
        self.dataplane: DataPlaneClient | None = None
        self.connected = False
        self.orphans = OrphanAcks()  # grants whose answer never arrived, until acked
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
                max_meta_bytes=info.max_meta_bytes,
            )
        if pref == "tcp":
            raise InvalidArgument(
                "transport='tcp' is not possible: the node has no data plane (node.data_address)"
            )
        return "grpc", None, None

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
        self, info: NodeInfo, arena: ArenaMap | None, dataplane: DataPlaneClient | None
    ) -> NodeInfo:
        """Adopt a described node and its new transport; returns the info now in use."""
        old_arena = old_dp = None
        with self._lock:
            done = self.transport_info
            if done is not None and done.epoch == info.epoch:
                # another thread set up this very node meanwhile: keep its transport
                self.info = replace(info, transport=done.transport)
                current = self.info
                old_arena, old_dp = arena, dataplane
            else:
                old_arena, old_dp = self.arena, self.dataplane
                self.info = self.transport_info = info
                self.arena, self.dataplane = arena, dataplane
                current = info
        if old_arena is not None:
            old_arena.close()
        if old_dp is not None:
            old_dp.close()
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
                f"running there?): {err}"
            )
        if isinstance(err, Unavailable) and not self.connected:
            return Unavailable(f"node at {self.address} is unreachable: {err}")
        return err


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


def lease_for(info: NodeInfo, deadline: float) -> float:
    """The lease to ask for: the node default, or longer when the caller's deadline is.

    The lease is a deadline for this client, not a safety margin: one that lapses mid-copy
    only quarantines the space on the node and the commit/read reports LeaseExpired.
    """
    return min(MAX_LEASE_S, max(info.pin_lease_s, deadline - time.monotonic()))


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
    )


def ensure_ready(st: ClientState) -> Op[NodeInfo]:
    """Describe the node and set up the transport, once (again after an invalidate)."""
    info = st.info
    if info is not None:
        return info
    resp = yield Call("Describe", pb.DescribeRequest(), pb.DescribeResponse)
    info = node_info_from_proto(resp)
    reused = st.reuse(info)
    if reused is not None:
        return reused
    transport, arena, dp = yield Blocking(lambda _deadline: st.choose_transport(info))
    return st.install(replace(info, transport=transport), arena, dp)


def op_describe(st: ClientState) -> Op[NodeInfo]:
    """A fresh Describe (transport re-chosen only if the node restarted)."""
    resp = yield Call("Describe", pb.DescribeRequest(), pb.DescribeResponse)
    fresh = node_info_from_proto(resp)
    current = st.info
    if current is not None and current.epoch == fresh.epoch:
        return replace(fresh, transport=current.transport)
    st.invalidate()
    info = yield from ensure_ready(st)
    return info


# ---- reads --------------------------------------------------------------------------------------


class _ReadSink:
    """Where a read's blocks go: caller buffers (get_into), bytes (get) or Blocks."""

    def __init__(self, keys: list[bytes], buffers: Sequence[object] | None) -> None:
        n = len(keys)
        self.keys = keys
        self.arrays: list[np.ndarray] | None = None
        if buffers is not None:
            if len(buffers) != n:
                raise InvalidArgument(f"got {n} keys but {len(buffers)} buffers; pass one buffer per key")
            self.arrays = [as_writable_array(b, i) for i, b in enumerate(buffers)]
        self.values: list[bytes | bytearray | None] = [None] * n
        self.sizes: list[int | None] = [None] * n
        self.metas: list[bytes] = [b""] * n
        self.tiers: list[Tier | None] = [None] * n
        self.too_small: list[str] = []

    def check_status(self, i: int, status: cpb.ItemStatus) -> None:
        """Raise argument errors (namespace mismatch, bad key); other item errors are misses."""
        err = status_error(status)
        if err is None:
            return
        if isinstance(err, InvalidArgument):
            raise type(err)(f"key #{i} ({format_hash(self.keys[i])}): {err}")

    def _fits(self, i: int, size: int) -> np.ndarray | None:
        assert self.arrays is not None
        arr = self.arrays[i]
        if size > arr.size:
            self.too_small.append(f"key #{i} is {size} bytes but buffer #{i} holds {arr.size}")
            return None
        return arr[:size]

    def from_array(self, i: int, src: np.ndarray, meta: bytes, tier: Tier | None) -> None:
        size = src.size
        if self.arrays is not None:
            dst = self._fits(i, size)
            if dst is None:
                return
            np.copyto(dst, src)
        else:
            self.values[i] = src.tobytes()
        self._done(i, size, meta, tier)

    def from_bytes(self, i: int, value: bytes, meta: bytes, tier: Tier | None) -> None:
        if self.arrays is not None:
            dst = self._fits(i, len(value))
            if dst is None:
                return
            dst[:] = np.frombuffer(value, dtype=np.uint8)
        else:
            self.values[i] = value
        self._done(i, len(value), meta, tier)

    def tcp_target(self, base: int) -> Callable[[int, int, bytes], memoryview | None]:
        def target(j: int, size: int, meta: bytes) -> memoryview | None:
            i = base + j
            if self.arrays is not None:
                dst = self._fits(i, size)
                return None if dst is None else memoryview(dst)
            buf = bytearray(size)
            self.values[i] = buf
            return memoryview(buf)

        return target

    def _done(self, i: int, size: int, meta: bytes, tier: Tier | None) -> None:
        self.sizes[i] = size
        self.metas[i] = meta
        self.tiers[i] = tier

    def finish(self) -> None:
        if self.too_small:
            shown = "; ".join(self.too_small[:8])
            more = f" (and {len(self.too_small) - 8} more)" if len(self.too_small) > 8 else ""
            raise InvalidArgument(f"get_into: buffer too small for {len(self.too_small)} block(s): {shown}{more}")

    def value(self, i: int) -> bytes | None:
        v = self.values[i]
        if v is None or self.sizes[i] is None:
            return None
        return v if isinstance(v, bytes) else bytes(v)


def _copy_pinned(
    arena: ArenaMap, blocks: Sequence[pb.PinnedBlock], base: int, sink: _ReadSink, _deadline: float
) -> None:
    first = True
    for j, b in enumerate(blocks):
        if not b.found:
            continue
        src = arena.region(b.offset, b.size_bytes)
        if first and _hooks._hook is not None and sink.arrays is not None and src.size > 1:
            first = False  # test seam: copy half, report, then the rest
            dst = sink._fits(base + j, src.size)
            if dst is not None:
                half = src.size // 2
                np.copyto(dst[:half], src[:half])
                _hooks.fire("shm_copy_out_mid", offset=b.offset, size_bytes=b.size_bytes)
                np.copyto(dst[half:], src[half:])
                sink._done(base + j, src.size, b.meta, _tier(b.tier))
            continue
        sink.from_array(base + j, src, b.meta, _tier(b.tier))
    _hooks.fire("shm_copy_out_done")


def _read_shm(st: ClientState, info: NodeInfo, sink: _ReadSink, deadline: float) -> Op[None]:
    keys = sink.keys
    arena = st.arena
    if arena is None:
        raise Unavailable("the arena mapping was dropped; describe the node again")
    chunk_keys = min(PIN_CHUNK_KEYS, info.max_batch_keys)
    windows = list(_chunks(len(keys), chunk_keys))
    start, end = windows.pop() if windows else (0, 0)  # tail chunk first: see _tail_first
    while start < end or windows:
        if start >= end:
            start, end = windows.pop()
        lease_s = lease_for(info, deadline)
        session_id = yield Session()
        resp = yield Call(
            "PinBlocks",
            pb.PinBlocksRequest(
                keys=keys[start:end], namespace_id=st.namespace_id,
                lease_ms=int(lease_s * 1000), epoch=info.epoch, session_id=session_id,
                request_id=next_request_id(),
            ),
            pb.PinBlocksResponse, undo=_undo_pin,
        )
        copied = False
        try:
            if len(resp.blocks) != end - start:
                raise InternalError(f"PinBlocks answered {len(resp.blocks)} items for {end - start} keys")
            # An SSD hit that could not be promoted because this chunk's own pins fill DRAM
            # (NoCapacity after the first key) is retried in the next chunk, after release.
            cut = next(
                (j for j in range(1, len(resp.blocks))
                 if resp.blocks[j].status.code == ErrorCode.NO_CAPACITY),
                len(resp.blocks),
            )
            blocks = resp.blocks[:cut]
            for j, b in enumerate(blocks):
                sink.check_status(start + j, b.status)
            num_bytes = sum(b.size_bytes for b in blocks if b.found)
            if any(b.found for b in blocks):  # empty blocks too: they are hits of 0 bytes
                yield Blocking(
                    lambda d, blocks=blocks, base=start: _copy_pinned(arena, blocks, base, sink, d),
                    num_bytes,
                )
            copied = True
            start += cut
        finally:
            if resp.pin_id:  # after the copy returned; awaited, so the next op sees it
                rel = yield release_call(resp.pin_id)
                if copied and rel is None:
                    raise Unavailable(
                        "the node did not confirm the pin release; the read is discarded"
                    )
                if copied and resp.pin_id in rel.expired_pin_ids:
                    raise LeaseExpired(
                        f"the pins of keys #{start - cut}..#{start - 1} outlived their "
                        f"{lease_s:.1f} s lease before the copy was done; the read is discarded"
                    )


def _read_tcp(st: ClientState, info: NodeInfo, sink: _ReadSink, deadline: float) -> Op[None]:
    dp = st.dataplane
    if dp is None:
        raise Unavailable("the data-plane client was dropped; describe the node again")
    keys = sink.keys
    for start, end in _tail_first(_chunks(len(keys), info.max_batch_keys)):
        chunk = keys[start:end]
        items = yield Blocking(
            lambda d, chunk=chunk, start=start: dp.get(chunk, st.namespace_id, sink.tcp_target(start), deadline=d)
        )
        for j, it in enumerate(items):
            i = start + j
            if it.code:
                sink.check_status(i, cpb.ItemStatus(code=it.code, message=it.message))
                sink.values[i] = None
            elif it.found:
                sink._done(i, it.size_bytes, it.meta, _tier(it.tier))


def _read_grpc(st: ClientState, info: NodeInfo, sink: _ReadSink, deadline: float) -> Op[None]:
    pending = [  # batches tail-first (see _tail_first); a budget-split batch refetches first
        i for lo, hi in _tail_first(_chunks(len(sink.keys), info.max_batch_keys)) for i in range(lo, hi)
    ]
    while pending:
        batch = pending[: info.max_batch_keys]
        resp = yield Call(
            "Get",
            pb.GetRequest(keys=[sink.keys[i] for i in batch], namespace_id=st.namespace_id),
            pb.GetResponse,
        )
        if len(resp.results) != len(batch):
            raise InternalError(f"Get answered {len(resp.results)} items for {len(batch)} keys")
        again = []
        for i, r in zip(batch, resp.results, strict=True):
            if r.status.code == ErrorCode.BATCH_TOO_LARGE:
                again.append(i)  # over the node's inline budget: fetch in the next call
                continue
            sink.check_status(i, r.status)
            if r.found:
                sink.from_bytes(i, r.value, r.meta, _tier(r.tier))
        if len(again) == len(batch):
            raise InternalError("the node returned no value within its inline budget")
        pending = again + pending[len(batch) :]


def op_read(
    st: ClientState, keys: Sequence[object], buffers: Sequence[object] | None, deadline: float
) -> Op[_ReadSink]:
    """Read blocks into a sink over the chosen transport (get, get_into, get_blocks)."""
    require_sequence(keys, "keys", "a sequence (list) of block keys (bytes)")
    if buffers is not None:
        require_sequence(buffers, "buffers", "a sequence (list) with one writable buffer per key")
    info = yield from ensure_ready(st)
    sink = _ReadSink(check_keys(keys, info), buffers)
    if not sink.keys:
        return sink
    if info.transport == "shm":
        yield from _read_shm(st, info, sink, deadline)
    elif info.transport == "tcp":
        yield from _read_tcp(st, info, sink, deadline)
    else:
        yield from _read_grpc(st, info, sink, deadline)
    sink.finish()
    return sink


def op_get(st: ClientState, keys: Sequence[object], deadline: float) -> Op[list[bytes | None]]:
    sink = yield from op_read(st, keys, None, deadline)
    return [sink.value(i) for i in range(len(sink.keys))]


def op_get_blocks(st: ClientState, keys: Sequence[object], deadline: float) -> Op[list[Block | None]]:
    sink = yield from op_read(st, keys, None, deadline)
    out: list[Block | None] = []
    for i in range(len(sink.keys)):
        v = sink.value(i)
        out.append(None if v is None else Block(v, sink.metas[i], sink.tiers[i]))
    return out


def op_get_into(
    st: ClientState,
    keys: Sequence[object],
    buffers: Sequence[object],
    return_meta: bool,
    deadline: float,
) -> Op[list[Any]]:
    sink = yield from op_read(st, keys, buffers, deadline)
    if return_meta:
        return [None if s is None else (s, sink.metas[i]) for i, s in enumerate(sink.sizes)]
    return list(sink.sizes)


# ---- writes -------------------------------------------------------------------------------------

_Item = tuple[int, bytes, memoryview, bytes]  # index, key, value, meta


def _chunks_by_bytes(items: list[_Item], max_bytes: int, max_keys: int) -> Iterator[list[_Item]]:
    chunk: list[_Item] = []
    size = 0
    for it in items:
        n = len(it[2])
        if chunk and (size + n > max_bytes or len(chunk) >= max_keys):
            yield chunk
            chunk, size = [], 0
        chunk.append(it)
        size += n
    if chunk:
        yield chunk


def _result(status: cpb.ItemStatus, stored: bool) -> PutResult:
    err = status_error(status)
    return PutResult(False, err) if err is not None else PutResult(stored)


def _copy_into_arena(arena: ArenaMap, writes: list[tuple[int, memoryview]], _deadline: float) -> None:
    # No lease check here: the node decides at CommitPut whether the lease held.
    if _hooks._hook is None:  # the whole batch in one call (kvstored.native: C if built)
        copy_many([(arena.region(offset, len(value)), value) for offset, value in writes])
        _hooks.fire("shm_copy_in_done")
        return
    for k, (offset, value) in enumerate(writes):
        dst, src = arena.region(offset, len(value)), np.frombuffer(value, dtype=np.uint8)
        if k == 0 and _hooks._hook is not None and src.size > 1:  # test seam: half, report, rest
            half = src.size // 2
            np.copyto(dst[:half], src[:half])
            _hooks.fire("shm_copy_in_mid", offset=offset, size_bytes=src.size)
            np.copyto(dst[half:], src[half:])
            continue
        np.copyto(dst, src)
    _hooks.fire("shm_copy_in_done")


def _put_shm(
    st: ClientState, info: NodeInfo, items: list[_Item], results: list[PutResult | None],
    deadline: float,
) -> Op[None]:
    arena = st.arena
    if arena is None:
        raise Unavailable("the arena mapping was dropped; describe the node again")
    max_bytes = max(1, min(MAX_CHUNK_BYTES, info.arena_size_bytes // 4))
    for chunk in _tail_first(_chunks_by_bytes(items, max_bytes, info.max_batch_keys)):
        lease_s = lease_for(info, deadline)
        session_id = yield Session()
        resp = yield Call(
            "ReservePut",
            pb.ReservePutRequest(
                items=[pb.ReserveItem(key=k, size_bytes=len(v), meta=m) for _, k, v, m in chunk],
                namespace_id=st.namespace_id, lease_ms=int(lease_s * 1000), epoch=info.epoch,
                session_id=session_id, request_id=next_request_id(),
            ),
            pb.ReservePutResponse, undo=_undo_reserve,
        )
        if len(resp.reservations) != len(chunk):
            if resp.reservation_id:
                yield abort_call(resp.reservation_id)
            raise InternalError(f"ReservePut answered {len(resp.reservations)} items for {len(chunk)}")
        writes = []
        for (i, _, value, _), r in zip(chunk, resp.reservations, strict=True):
            err = status_error(r.status)
            if err is not None:
                results[i] = PutResult(False, err)
            elif r.exists:
                results[i] = PutResult(False)
            else:
                writes.append((r.offset, value))
        if not resp.reservation_id:
            continue
        try:
            yield Blocking(
                lambda d, w=writes: _copy_into_arena(arena, w, d), sum(len(v) for _, v in writes)
            )
            # the node refuses the commit (LeaseExpired, space freed) if the lease lapsed
            commit = yield Call(
                "CommitPut", pb.CommitPutRequest(reservation_id=resp.reservation_id),
                pb.CommitPutResponse,
            )
        except (LeaseExpired, NotFound):
            raise  # the node already released the reservation
        except BaseException:
            yield abort_call(resp.reservation_id)  # after the copy returned
            raise
        if len(commit.results) != len(chunk):
            raise InternalError(f"CommitPut answered {len(commit.results)} items for {len(chunk)}")
        for (i, *_), r in zip(chunk, commit.results, strict=True):
            results[i] = _result(r.status, r.stored)


def _put_tcp(
    st: ClientState, info: NodeInfo, items: list[_Item], results: list[PutResult | None],
    deadline: float,
) -> Op[None]:
    dp = st.dataplane
    if dp is None:
        raise Unavailable("the data-plane client was dropped; describe the node again")
    max_bytes = max(1, min(MAX_CHUNK_BYTES, info.arena_size_bytes // 4))
    for chunk in _tail_first(_chunks_by_bytes(items, max_bytes, info.max_batch_keys)):
        wire = [(k, v, m) for _, k, v, m in chunk]
        got = yield Blocking(
            lambda d, wire=wire: dp.put(wire, st.namespace_id, deadline=d),
            sum(len(v) for _, _, v, _ in chunk),
        )
        for (i, *_), r in zip(chunk, got, strict=True):
            results[i] = _result(cpb.ItemStatus(code=r.code, message=r.message), r.stored)


def _put_grpc(
    st: ClientState, info: NodeInfo, items: list[_Item], results: list[PutResult | None],
    deadline: float,
) -> Op[None]:
    for chunk in _tail_first(_chunks_by_bytes(items, max(1, info.max_inline_bytes), info.max_batch_keys)):
        resp = yield Call(
            "Put",
            pb.PutRequest(
                items=[pb.PutItem(key=k, value=bytes(v), meta=m) for _, k, v, m in chunk],
                namespace_id=st.namespace_id,
            ),
            pb.PutResponse,
        )
        if len(resp.results) != len(chunk):
            raise InternalError(f"Put answered {len(resp.results)} items for {len(chunk)}")
        for (i, *_), r in zip(chunk, resp.results, strict=True):
            results[i] = _result(r.status, r.stored)


def op_put(
    st: ClientState,
    keys: Sequence[object],
    values: Sequence[object],
    metas: Sequence[bytes] | None,
    deadline: float,
) -> Op[list[PutResult]]:
    """Put a batch; bad items get their own error, good ones go over the chosen transport."""
    if isinstance(keys, (bytes, bytearray, str)):
        raise InvalidArgument("keys must be a sequence of keys; wrap a single key in a list")
    require_sequence(keys, "keys", "a sequence (list) of block keys (bytes)")
    require_sequence(values, "values", "a sequence (list) with one buffer (bytes, numpy array...) per key")
    if metas is not None:
        require_sequence(metas, "metas", "None or a sequence (list) with one bytes (or None) per key")
    if len(values) != len(keys):
        raise InvalidArgument(f"got {len(keys)} keys but {len(values)} values; pass one value per key")
    if metas is not None and len(metas) != len(keys):
        raise InvalidArgument(f"got {len(keys)} keys but {len(metas)} metas; pass one meta per key")
    info = yield from ensure_ready(st)
    results: list[PutResult | None] = [None] * len(keys)
    items: list[_Item] = []
    for i, key in enumerate(keys):
        try:
            kb = _key_bytes(key, i)
            err: KvstoredError | None = _key_error(kb, i, info)
            value = as_byte_view(values[i], "value", i)
            meta = _meta_bytes(metas[i], i) if metas is not None else b""
        except InvalidArgument as exc:
            results[i] = PutResult(False, exc)
            continue
        if err is None and len(value) > info.max_block_bytes:
            err = BlockTooLarge(
                f"value #{i} ({format_hash(kb)}) is {len(value)} bytes; the node's limit is "
                f"{info.max_block_bytes} bytes (node.max_block_bytes)"
            )
        if err is None and len(meta) > info.max_meta_bytes:
            err = InvalidArgument(
                f"meta #{i} is {len(meta)} bytes; at most {info.max_meta_bytes} bytes are stored "
                "with a block"
            )
        if err is not None:
            results[i] = PutResult(False, err)
        else:
            items.append((i, kb, value, meta))
    if items:
        total = sum(len(v) for _, _, v, _ in items)
        if info.transport == "shm":
            yield from _put_shm(st, info, items, results, deadline)
        elif info.transport == "tcp" and total > min(INLINE_PUT_MAX_BYTES, info.max_inline_bytes):
            yield from _put_tcp(st, info, items, results, deadline)
        else:
            yield from _put_grpc(st, info, items, results, deadline)
    missing = [i for i, r in enumerate(results) if r is None]
    if missing:
        raise InternalError(f"no result for put items {missing[:8]}")
    return results  # type: ignore[return-value]


# ---- probes and admin ---------------------------------------------------------------------------


def op_lookup_prefix_tiers(st: ClientState, keys: Sequence[object], deadline: float) -> Op[list[Tier]]:
    require_sequence(keys, "keys", "a sequence (list) of block keys (bytes)")
    info = yield from ensure_ready(st)
    checked = check_keys(keys, info)
    tiers: list[Tier] = []
    for start, end in _chunks(len(checked), info.max_batch_keys):
        resp = yield Call(
            "LookupPrefix",
            pb.LookupPrefixRequest(keys=checked[start:end], namespace_id=st.namespace_id),
            pb.LookupPrefixResponse,
        )
        tiers.extend(map(_TIER_OF.__getitem__, resp.tiers[: resp.num_hit_blocks]))
        if resp.num_hit_blocks < end - start:
            break
    return tiers


def op_exists(
    st: ClientState, keys: Sequence[object], with_tiers: bool, deadline: float,
    namespace_id: bytes | None = None,
) -> Op[list[Any]]:
    """Exists (or where, ``with_tiers``) in the client's namespace, or in ``namespace_id``."""
    require_sequence(keys, "keys", "a sequence (list) of block keys (bytes)")
    ns_id = st.namespace_id if namespace_id is None else namespace_id
    if not isinstance(ns_id, bytes):
        raise InvalidArgument(f"namespace_id must be bytes; got {type(ns_id).__name__}")
    info = yield from ensure_ready(st)
    checked = check_keys(keys, info)
    out: list[Any] = []
    for start, end in _chunks(len(checked), info.max_batch_keys):
        resp = yield Call(
            "Exists",
            pb.ExistsRequest(keys=checked[start:end], namespace_id=ns_id, with_tiers=with_tiers),
            pb.ExistsResponse,
        )
        if with_tiers:
            out.extend(_tier(t) if e else None for e, t in zip(resp.exists, resp.tiers, strict=True))
        else:
            out.extend(resp.exists)
    return out


def op_remove(st: ClientState, keys: Sequence[object], deadline: float) -> Op[list[bool]]:
    require_sequence(keys, "keys", "a sequence (list) of block keys (bytes)")
    info = yield from ensure_ready(st)
    checked = check_keys(keys, info)
    out: list[bool] = []
    for start, end in _chunks(len(checked), info.max_batch_keys):
        resp = yield Call(
            "Remove", pb.RemoveRequest(keys=checked[start:end], namespace_id=st.namespace_id),
            pb.RemoveResponse,
        )
        out.extend(bool(r) for r in resp.removed)
    return out


def stats_to_dict(resp: pb.StatsResponse) -> dict[str, Any]:
    """Stats as a plain, JSON-ready dict (stable keys for scripts)."""
    return {
        "node_id": resp.node_id,
        "epoch": resp.epoch,
        "uptime_s": resp.uptime_s,
        "draining": resp.draining,
        "gets": resp.gets,
        "hits": resp.hits,
        "misses": resp.misses,
        "puts": resp.puts,
        "put_failures": resp.put_failures,
        "checksum_failures": resp.checksum_failures,
        "pinned_blocks": resp.pinned_blocks,
        "quarantined_bytes": resp.quarantined_bytes,
        "num_sessions": resp.num_sessions,
        "tiers": [
            {
                "tier": Tier(t.tier).name if t.tier in (1, 2) else "UNSPECIFIED",
                "capacity_bytes": t.capacity_bytes,
                "used_bytes": t.used_bytes,
                "num_blocks": t.num_blocks,
                "hits": t.hits,
                "evictions": t.evictions,
            }
            for t in resp.tiers
        ],
    }


def op_stats(st: ClientState) -> Op[dict[str, Any]]:
    resp = yield Call("Stats", pb.StatsRequest(), pb.StatsResponse)
    return stats_to_dict(resp)


def op_list_blocks(
    st: ClientState, namespace_id: bytes | None, limit: int
) -> Op[tuple[list[BlockInfo], bool]]:
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise InvalidArgument(f"limit must be an int >= 0; got {limit!r}")
    if namespace_id is not None and not isinstance(namespace_id, (bytes, bytearray, memoryview)):
        raise InvalidArgument(
            "namespace_id must be bytes (a Namespace's .id; bytes.fromhex() for a hex id) or "
            f"None for every namespace; got {_received(namespace_id)}"
        )
    resp = yield Call(
        "ListBlocks",
        pb.ListBlocksRequest(namespace_id=bytes(namespace_id or b""), limit=limit),
        pb.ListBlocksResponse,
    )
    blocks = [
        BlockInfo(
            key=b.key, size_bytes=b.size_bytes, namespace_id=b.namespace_id,
            tiers=tuple(Tier(t) for t in b.tiers if t in (1, 2)), pinned=b.pinned,
        )
        for b in resp.blocks
    ]
    return blocks, resp.truncated


# ---- driving ------------------------------------------------------------------------------------


def drive_step(gen: Op[T], send_value: Any, throw_exc: BaseException | None) -> tuple[bool, Any]:
    """Advance an operation: ``(True, result)`` when it finished, else ``(False, next step)``."""
    try:
        if throw_exc is not None:
            step = gen.throw(throw_exc)
        else:
            step = gen.send(send_value)
    except StopIteration as stop:
        return True, stop.value
    return False, step
