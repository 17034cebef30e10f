"""The asyncio client (``kvstored.AsyncClient``): the same operations as :class:`Client`.

Both clients run the generators of kvstored.client._ops; this driver awaits gRPC calls on
grpc.aio and runs blocking steps (shared-memory copies over 256 KiB, data-plane socket I/O)
in a small named thread pool (``kvstored-client-io``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import grpc

from kvstored.client import _ops
from kvstored.client._ops import Blocking, Call, ClientState, Flush, Op
from kvstored.client.types import Block, NodeInfo, PutResult
from kvstored.config import default_address
from kvstored.errors import DeadlineExceeded, KvstoredError, Unavailable
from kvstored.keys import Namespace
from kvstored.tiers.base import BlockInfo, Tier

T = TypeVar("T")

_INLINE_COPY_BYTES = 256 << 10
_IO_THREADS = 4


class AsyncClient:
    """asyncio client of one kvstored node; every method of :class:`Client` as a coroutine.

    Use from one event loop. Arguments, results and errors are those of :class:`Client`.
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
        self._channel: grpc.aio.Channel | None = None
        self._stubs: dict[str, Any] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._background: set[Any] = set()
        self._closed = False

    @property
    def address(self) -> str:
        """The node address this client talks to."""
        return self._st.address

    @property
    def namespace(self) -> Namespace | None:
        """The client's namespace (None = none)."""
        return self._st.namespace

    # ---- driver ------------------------------------------------------------------------------
    def _stub(self, call: Call) -> Any:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self._st.target, options=_ops.CHANNEL_OPTIONS)
        stub = self._stubs.get(call.method)
        if stub is None:
            stub = self._channel.unary_unary(
                _ops.SERVICE + call.method,
                request_serializer=type(call.request).SerializeToString,
                response_deserializer=call.response_cls.FromString,
            )
            self._stubs[call.method] = stub
        return stub

    async def _execute(self, step: Call | Blocking | Flush, deadline: float) -> Any:
        if isinstance(step, Flush):
            if self._background:
                await asyncio.wait(
                    list(self._background), timeout=max(0.0, deadline - time.monotonic())
                )
            return None
        if isinstance(step, Blocking):
            if step.num_bytes and step.num_bytes <= _INLINE_COPY_BYTES:
                return step.fn(deadline)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(_IO_THREADS, thread_name_prefix="kvstored-client-io")
            # not cancelled at the deadline: the step bounds itself (socket timeouts), and a
            # copy must finish before its pin is released
            return await asyncio.get_running_loop().run_in_executor(self._pool, step.fn, deadline)
        remaining = deadline - time.monotonic()
        stub = self._stub(step)
        if not step.wait:  # fire and forget, but owned: awaited in close()
            call = stub(step.request, timeout=max(remaining, 1.0))
            task = asyncio.ensure_future(call)
            self._background.add(task)
            task.add_done_callback(self._background_done)
            return None
        if remaining <= 0:
            raise DeadlineExceeded(f"deadline passed before calling {step.method}")
        try:
            response = await stub(step.request, timeout=remaining)
        except grpc.RpcError as exc:
            raise self._st.map_rpc_error(exc) from None
        self._st.connected = True
        return response

    def _background_done(self, task: Any) -> None:
        self._background.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a failed release is reclaimed by the node's lease

    async def _drive(self, gen: Op[T], deadline: float) -> T:
        send_value: Any = None
        throw_exc: BaseException | None = None
        while True:
            done, value = _ops.drive_step(gen, send_value, throw_exc)
            if done:
                return value  # type: ignore[no-any-return]
            send_value, throw_exc = None, None
            try:
                send_value = await self._execute(value, deadline)
            except BaseException as exc:  # incl. CancelledError: the op releases, then re-raises
                throw_exc = exc

    async def _run(self, make_op: Callable[[float], Op[T]], timeout_s: float | None) -> T:
        if self._closed:
            raise Unavailable("the client is closed")
        deadline = self._st.deadline(timeout_s)
        attempt = 0
        while True:
            try:
                return await self._drive(make_op(deadline), deadline)
            except KvstoredError as exc:
                if isinstance(exc, Unavailable):
                    self._st.invalidate()
                delay = _ops.retry_delay(exc, attempt, deadline)
                if delay is None:
                    raise
            await asyncio.sleep(delay)
            attempt += 1

    # ---- API (see Client for the documentation of each method) --------------------------------
    async def put(
        self,
        keys: Sequence[bytes],
        values: Sequence[Any],
        *,
        metas: Sequence[bytes] | None = None,
        timeout_s: float | None = None,
    ) -> list[PutResult]:
        """Store blocks; one :class:`PutResult` per key (see :meth:`Client.put`)."""
        return await self._run(lambda d: _ops.op_put(self._st, keys, values, metas, d), timeout_s)

    async def get(self, keys: Sequence[bytes], *, timeout_s: float | None = None) -> list[bytes | None]:
        """Read blocks: bytes or None per key (see :meth:`Client.get`)."""
        return await self._run(lambda d: _ops.op_get(self._st, keys, d), timeout_s)

    async def get_blocks(
        self, keys: Sequence[bytes], *, timeout_s: float | None = None
    ) -> list[Block | None]:
        """Read blocks with metadata and tier (see :meth:`Client.get_blocks`)."""
        return await self._run(lambda d: _ops.op_get_blocks(self._st, keys, d), timeout_s)

    async def get_into(
        self,
        keys: Sequence[bytes],
        buffers: Sequence[Any],
        *,
        return_meta: bool = False,
        timeout_s: float | None = None,
    ) -> list[Any]:
        """Read blocks into caller buffers (see :meth:`Client.get_into`)."""
        return await self._run(
            lambda d: _ops.op_get_into(self._st, keys, buffers, return_meta, d), timeout_s
        )

    async def lookup_prefix(self, keys: Sequence[bytes], *, timeout_s: float | None = None) -> int:
        """Number of leading blocks present (see :meth:`Client.lookup_prefix`)."""
        return len(await self.lookup_prefix_tiers(keys, timeout_s=timeout_s))

    async def lookup_prefix_tiers(
        self, keys: Sequence[bytes], *, timeout_s: float | None = None
    ) -> list[Tier]:
        """Tier of each leading present block (see :meth:`Client.lookup_prefix_tiers`)."""
        return await self._run(lambda d: _ops.op_lookup_prefix_tiers(self._st, keys, d), timeout_s)

    async def exists(self, keys: Sequence[bytes], *, timeout_s: float | None = None) -> list[bool]:
        """Per key: stored (see :meth:`Client.exists`)."""
        return await self._run(lambda d: _ops.op_exists(self._st, keys, False, d), timeout_s)

    async def where(
        self, keys: Sequence[bytes], *, namespace_id: bytes | None = None,
        timeout_s: float | None = None,
    ) -> list[Tier | None]:
        """Per key: tier or None (see :meth:`Client.where`)."""
        return await self._run(
            lambda d: _ops.op_exists(self._st, keys, True, d, namespace_id), timeout_s
        )

    async def remove(self, keys: Sequence[bytes], *, timeout_s: float | None = None) -> list[bool]:
        """Delete blocks (see :meth:`Client.remove`)."""
        return await self._run(lambda d: _ops.op_remove(self._st, keys, d), timeout_s)

    async def stats(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        """Node counters and tier usage (see :meth:`Client.stats`)."""
        return await self._run(lambda d: _ops.op_stats(self._st), timeout_s)

    async def list_blocks(
        self,
        namespace_id: bytes | None = None,
        limit: int = 10000,
        *,
        timeout_s: float | None = None,
    ) -> tuple[list[BlockInfo], bool]:
        """Admin listing (see :meth:`Client.list_blocks`)."""
        return await self._run(lambda d: _ops.op_list_blocks(self._st, namespace_id, limit), timeout_s)

    async def describe(self, *, timeout_s: float | None = None) -> NodeInfo:
        """Fresh node description (see :meth:`Client.describe`)."""
        return await self._run(lambda d: _ops.op_describe(self._st), timeout_s)

    async def close(self) -> None:
        """Finish background releases (<= 1 s), close the channel, pool and mapping."""
        if self._closed:
            return
        self._closed = True
        if self._background:
            with contextlib.suppress(Exception):
                await asyncio.wait(list(self._background), timeout=1.0)
        if self._channel is not None:
            await self._channel.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._st.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
