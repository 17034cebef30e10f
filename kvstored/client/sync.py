"""The synchronous client (``kvstored.Client``): a thin driver over kvstored.client._ops."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc

from kvstored.client import _ops
from kvstored.client._ops import Blocking, Call, ClientState, Flush, Op
from kvstored.client.types import Block, NodeInfo, PutResult
from kvstored.config import default_address
from kvstored.errors import DeadlineExceeded, KvstoredError, Unavailable
from kvstored.keys import Namespace
from kvstored.tiers.base import BlockInfo, Tier
from kvstored.v1 import node_pb2 as pb

T = TypeVar("T")

_BACKGROUND_TIMEOUT_S = 5.0


class _Background:
    """Sends fire-and-forget calls (pin releases, put aborts) from one daemon thread.

    Releases queued together go out as one ReleasePins. A release that fails is reclaimed by
    the node's lease reaper. (grpc's ``future()`` would start a thread per call.)
    """

    def __init__(self, invoke: Callable[[Call], None]) -> None:
        self._invoke = invoke
        self._queue: queue.SimpleQueue[Call | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._cond = threading.Condition()
        self._num_submitted = 0
        self._num_done = 0

    def submit(self, call: Call) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="kvstored-client-release", daemon=True
                )
                self._thread.start()
        with self._cond:
            self._num_submitted += 1
        self._queue.put(call)

    def flush(self, deadline: float) -> None:
        """Wait until every call submitted so far was sent (or the deadline passes)."""
        with self._cond:
            target = self._num_submitted
            self._cond.wait_for(
                lambda: self._num_done >= target, timeout=max(0.0, deadline - time.monotonic())
            )

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            calls = [first]
            while True:
                try:
                    calls.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = calls[-1] is None
            pin_ids = [
                pid for c in calls if c is not None and c.method == "ReleasePins"
                for pid in c.request.pin_ids  # type: ignore[attr-defined]
            ]
            others = [c for c in calls if c is not None and c.method != "ReleasePins"]
            if pin_ids:
                others.append(Call("ReleasePins", pb.ReleasePinsRequest(pin_ids=pin_ids),
                                   pb.ReleasePinsResponse))
            for call in others:
                try:
                    self._invoke(call)
                except Exception:  # the node's lease reaper reclaims what we could not release
                    pass
            with self._cond:
                self._num_done += sum(1 for c in calls if c is not None)
                self._cond.notify_all()
            if stop:
                return

    def close(self) -> None:
        with self._lock:
            thread = self._thread
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout=_BACKGROUND_TIMEOUT_S)


class Client:
    """Blocking client of one kvstored node. Thread-safe; use one per process.

    Every call runs under a deadline (``timeout_s``, per call or the client default). Errors
    are :class:`~kvstored.errors.KvstoredError` subclasses; retriable ones (Unavailable,
    DeadlineExceeded, NoCapacity, Draining...) are retried with jittered backoff inside the
    deadline. An unreachable node raises :class:`Unavailable` within the deadline.

    Args:
        address: ``unix:PATH`` or ``HOST:PORT``; default ``$KVSTORED_ADDRESS`` or the local
            daemon's unix socket.
        timeout_s: default deadline of each call, seconds.
        namespace: scopes every operation: a block's identity is (namespace id, key), so put,
            get, exists, lookup_prefix, where and remove see only this namespace's blocks
            (None = the empty namespace id, a namespace of its own).
        transport: ``"auto"`` (shared memory over a unix socket when the arena can be mapped,
            else the TCP data plane), ``"shm"``, ``"tcp"`` or ``"grpc"`` (everything inline).

    Raises:
        InvalidArgument: malformed address, timeout, namespace or transport.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        timeout_s: float = 10.0,
        namespace: Namespace | None = None,
        transport: str = "auto",
    ) -> None:
        self._st = ClientState(
            address or default_address(), timeout_s=timeout_s, namespace=namespace,
            transport=transport,
        )
        self._channel = grpc.insecure_channel(self._st.target, options=_ops.CHANNEL_OPTIONS)
        self._stubs: dict[str, grpc.UnaryUnaryMultiCallable] = {}
        self._background = _Background(
            lambda call: self._stub(call)(call.request, timeout=_BACKGROUND_TIMEOUT_S)
        )
        self._closed = False

    # ---- driver ------------------------------------------------------------------------------
    @property
    def address(self) -> str:
        """The node address this client talks to."""
        return self._st.address

    @property
    def namespace(self) -> Namespace | None:
        """The client's namespace (None = none)."""
        return self._st.namespace

    def _stub(self, call: Call) -> grpc.UnaryUnaryMultiCallable:
        stub = self._stubs.get(call.method)
        if stub is None:
            stub = self._channel.unary_unary(
                _ops.SERVICE + call.method,
                request_serializer=type(call.request).SerializeToString,
                response_deserializer=call.response_cls.FromString,
            )
            self._stubs[call.method] = stub
        return stub

    def _execute(self, step: Call | Blocking | Flush, deadline: float) -> Any:
        if isinstance(step, Blocking):
            return step.fn(deadline)
        if isinstance(step, Flush):
            self._background.flush(deadline)
            return None
        remaining = deadline - time.monotonic()
        stub = self._stub(step)
        if not step.wait:  # fire and forget (pin release, abort): never delays the caller
            self._background.submit(step)
            return None
        if remaining <= 0:
            raise DeadlineExceeded(f"deadline passed before calling {step.method}")
        try:
            response = stub(step.request, timeout=remaining)
        except grpc.RpcError as exc:
            raise self._st.map_rpc_error(exc) from None
        self._st.connected = True
        return response

    def _drive(self, gen: Op[T], deadline: float) -> T:
        send_value: Any = None
        throw_exc: BaseException | None = None
        while True:
            done, value = _ops.drive_step(gen, send_value, throw_exc)
            if done:
                return value  # type: ignore[no-any-return]
            send_value, throw_exc = None, None
            try:
                send_value = self._execute(value, deadline)
            except BaseException as exc:  # thrown into the op so it can release what it holds
                throw_exc = exc

    def _run(self, make_op: Callable[[float], Op[T]], timeout_s: float | None) -> T:
        if self._closed:
            raise Unavailable("the client is closed")
        deadline = self._st.deadline(timeout_s)
        attempt = 0
        while True:
            try:
                return self._drive(make_op(deadline), deadline)
            except KvstoredError as exc:
                if isinstance(exc, Unavailable):
                    self._st.invalidate()
                delay = _ops.retry_delay(exc, attempt, deadline)
                if delay is None:
                    raise
            time.sleep(delay)
            attempt += 1

    # ---- API ---------------------------------------------------------------------------------
    def put(
        self,
        keys: Sequence[bytes],
        values: Sequence[Any],
        *,
        metas: Sequence[bytes] | None = None,
        timeout_s: float | None = None,
    ) -> list[PutResult]:
        """Store blocks. Idempotent: the first complete writer of a key wins.

        Args:
            keys: block hashes (bytes, ``min_key_bytes``..``max_key_bytes`` long).
            values: one C-contiguous buffer per key (bytes, bytearray, numpy array...).
            metas: optional opaque metadata per key (<= 4 KiB each).

        Returns:
            One :class:`PutResult` per key: ``stored`` True (stored now), False with no error
            (already present), or ``error`` (KeyInvalid, BlockTooLarge, NoCapacity, ...) for
            that key only.

        Raises:
            InvalidArgument: mismatched lengths, or ``keys``/``values``/``metas`` is not a
            sequence (raised before any RPC; a meta that is not bytes is that item's
            ``PutResult.error``). Unavailable, DeadlineExceeded: the node could
            not be reached / did not finish in time. Draining: the node is shutting down.
        """
        return self._run(lambda d: _ops.op_put(self._st, keys, values, metas, d), timeout_s)

    def get(self, keys: Sequence[bytes], *, timeout_s: float | None = None) -> list[bytes | None]:
        """Read blocks: per key its bytes, or None on a miss.

        Raises:
            KeyInvalid: a malformed key (index named). Unavailable, DeadlineExceeded.
            (A block of another namespace is a miss, never an error.)
        """
        return self._run(lambda d: _ops.op_get(self._st, keys, d), timeout_s)

    def get_blocks(self, keys: Sequence[bytes], *, timeout_s: float | None = None) -> list[Block | None]:
        """Read blocks with their metadata and tier (None on a miss). Raises as :meth:`get`."""
        return self._run(lambda d: _ops.op_get_blocks(self._st, keys, d), timeout_s)

    def get_into(
        self,
        keys: Sequence[bytes],
        buffers: Sequence[Any],
        *,
        return_meta: bool = False,
        timeout_s: float | None = None,
    ) -> list[Any]:
        """Read blocks straight into caller buffers (no intermediate copy).

        Args:
            keys: block hashes.
            buffers: one writable C-contiguous buffer per key (bytearray, numpy array, a
                torch tensor's ``.numpy()`` view), at least as large as its block.
            return_meta: return ``(num_bytes, meta)`` tuples instead of ``num_bytes``.

        Returns:
            Per key: bytes written (or ``(bytes, meta)``), or None on a miss (buffer untouched).

        Raises:
            InvalidArgument: a buffer is read-only, non-contiguous, or smaller than its block
            (the message names each key index and both sizes). Otherwise as :meth:`get`.
        """
        return self._run(
            lambda d: _ops.op_get_into(self._st, keys, buffers, return_meta, d), timeout_s
        )

    def lookup_prefix(self, keys: Sequence[bytes], *, timeout_s: float | None = None) -> int:
        """Number of leading blocks of a prefix present on the node (stops at the first miss).

        Never pins and never counts as a hit. Raises KeyInvalid, Unavailable, DeadlineExceeded.
        """
        return len(self.lookup_prefix_tiers(keys, timeout_s=timeout_s))

    def lookup_prefix_tiers(
        self, keys: Sequence[bytes], *, timeout_s: float | None = None
    ) -> list[Tier]:
        """The tier of each leading present block of a prefix (DRAM preferred)."""
        return self._run(lambda d: _ops.op_lookup_prefix_tiers(self._st, keys, d), timeout_s)

    def exists(self, keys: Sequence[bytes], *, timeout_s: float | None = None) -> list[bool]:
        """Per key: stored on the node (any tier)."""
        return self._run(lambda d: _ops.op_exists(self._st, keys, False, d), timeout_s)

    def where(
        self, keys: Sequence[bytes], *, namespace_id: bytes | None = None,
        timeout_s: float | None = None,
    ) -> list[Tier | None]:
        """Per key: the tier holding it (DRAM preferred), or None. Admin probe; never pins.

        Args:
            namespace_id: look in this namespace id instead of the client's (admin tools
                that know only the id, e.g. ``kvstorectl where --namespace-id``).
        """
        return self._run(
            lambda d: _ops.op_exists(self._st, keys, True, d, namespace_id), timeout_s
        )

    def remove(self, keys: Sequence[bytes], *, timeout_s: float | None = None) -> list[bool]:
        """Delete blocks; per key True if removed (False: absent, or pinned and kept)."""
        return self._run(lambda d: _ops.op_remove(self._st, keys, d), timeout_s)

    def stats(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        """The node's counters and tier usage as a JSON-ready dict (see ``stats_to_dict``)."""
        return self._run(lambda d: _ops.op_stats(self._st), timeout_s)

    def list_blocks(
        self,
        namespace_id: bytes | None = None,
        limit: int = 10000,
        *,
        timeout_s: float | None = None,
    ) -> tuple[list[BlockInfo], bool]:
        """Admin listing: ``(blocks, truncated)``; ``namespace_id`` None = all namespaces.

        Raises:
            InvalidArgument: ``namespace_id`` is not bytes/None or ``limit`` not an int >= 0
            (before any RPC).
        """
        return self._run(lambda d: _ops.op_list_blocks(self._st, namespace_id, limit), timeout_s)

    def describe(self, *, timeout_s: float | None = None) -> NodeInfo:
        """Fresh node description (addresses, limits, epoch) plus the transport in use."""
        return self._run(lambda d: _ops.op_describe(self._st), timeout_s)

    def close(self) -> None:
        """Close the channel, data-plane connections and the arena mapping; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._background.close()
        self._channel.close()
        self._st.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        info = self._st.info
        return f"Client({self._st.address!r}, transport={info.transport if info else self._st.transport!r})"
