"""The asyncio client (``kvstored.AsyncClient``): the same operations as :class:`Client`.

Both clients run the generators of kvstored.client._ops; this driver awaits gRPC calls on
grpc.aio (the hot ones on the control channel, kvstored/client/_control.py, when the node
offers it over a unix socket) and runs blocking steps (shared-memory copies over 256 KiB, data-plane socket I/O)
in a small named thread pool (``kvstored-client-io``).

Cancellation (``task.cancel()``, ``asyncio.timeout``) is safe by construction:

- a blocking step (a copy into or out of the arena) always runs to its end; the cancellation
  is delivered to the operation only after it returned, so the operation's cleanup (abort,
  release) never races its own copy;
- a ReservePut/PinBlocks in flight when the cancellation lands is awaited, and what it got is
  released at once (``Call.undo``); one that ends without an answer is acked as an orphan
  (kvstored/client/_orphans.py), so the node frees what it granted;
- releases and aborts are shielded and awaited until the call's deadline (then they go on
  in the background, and ``close()`` waits for them); orphan acks always go in the background.

A cancelled call therefore returns only after its copy finished, which takes at most the
copy's own time (the data plane's socket I/O is bounded by the call's deadline).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, TypeVar

import grpc

from kvstored.addresses import default_address
from kvstored.client import _control, _hooks, _ops, _tenant
from kvstored.client._control import NO_ANSWER, AsyncControlChannel
from kvstored.client._ops import Blocking, Call, ClientState, Op, Session
from kvstored.client._orphans import ORPHAN_ACK_TIMEOUT_S, PAST_DEADLINE_S
from kvstored.client._steps import grant_ids
from kvstored.client.types import Block, NodeInfo, PutResult
from kvstored.errors import DeadlineExceeded, KvstoredError, Unavailable
from kvstored.keys import Namespace
from kvstored.security.tls import TlsFiles, open_aio_channel
from kvstored.types import BlockInfo, Tier
from kvstored.v1 import node_pb2 as pb

T = TypeVar("T")

_ORPHAN_ACK_STEP = Call("ReleasePins", pb.ReleasePinsRequest(), pb.ReleasePinsResponse)

_INLINE_COPY_BYTES = 256 << 10
_IO_THREADS = 4


async def _wait_through_cancel(fut: asyncio.Future[Any]) -> bool:
    """Wait until ``fut`` is done even if this task is cancelled meanwhile.

    Returns:
        True if a cancellation arrived while waiting (the caller re-raises it once the
        work it must not abandon is done).
    """
    cancelled = False
    while not fut.done():
        try:
            await asyncio.wait([fut])
        except asyncio.CancelledError:
            cancelled = True
    return cancelled


def _result_or_none(fut: asyncio.Future[Any]) -> Any:
    if fut.cancelled() or fut.exception() is not None:
        return None
    return fut.result()


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
        replicas: int | None = None,
        tenant: str | None = None,
        tls: TlsFiles | Literal[False] | None = None,
        reserve_ahead_bytes: int | None = None,
    ) -> None:
        self._st = ClientState(
            address or default_address(), timeout_s=timeout_s, namespace=namespace,
            transport=transport, replicas=replicas, tenant=tenant, tls=tls,
            reserve_ahead_bytes=reserve_ahead_bytes,
        )
        self._st.control_factory = AsyncControlChannel  # hot calls over it when offered
        self._channel: grpc.aio.Channel | None = None
        self._stubs: dict[str, Any] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._session_opening: tuple[Any, asyncio.Task[None], asyncio.Future[Any]] | None = None
        """An OpenSession stream not answered yet: (call, reader task, first event)."""
        self._session_reader: asyncio.Task[None] | None = None
        self._session_call: Any = None
        self._session_id = 0
        self._opened: list[int] = []  # sessions to end with CloseSession at close()
        self._num_ops = 0
        self._idle: asyncio.Event | None = None
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
    def _get_channel(self) -> grpc.aio.Channel:
        if self._channel is None:
            self._channel = open_aio_channel(
                self._st.target, self._st.tls, options=_ops.CHANNEL_OPTIONS,
                interceptors=_tenant.aio_interceptors(self._st.tenant),
            )
        return self._channel

    def _stub(self, call: Call) -> Any:
        self._get_channel()
        assert self._channel is not None
        stub = self._stubs.get(call.method)
        if stub is None:
            stub = self._channel.unary_unary(
                _ops.SERVICE + call.method,
                request_serializer=type(call.request).SerializeToString,
                response_deserializer=call.response_cls.FromString,
            )
            self._stubs[call.method] = stub
        return stub

    async def _session(self, deadline: float) -> int:
        """The open session's id; opens the OpenSession stream on first use or after it ended.

        A stream the node has not answered by the deadline is not cancelled: it goes on
        opening, the caller gets DeadlineExceeded and a later call takes its session (as
        :class:`kvstored.client.sync._SyncSession` does). Loop-only: nothing between the
        checks and the stream's start awaits, so no lock is needed, and each caller waits
        for the answer under its own deadline only.
        """
        if self._session_reader is not None and not self._session_reader.done():
            return self._session_id
        opening = self._session_opening
        if opening is not None and opening[2].done() and (
                opening[2].cancelled() or opening[2].exception() is not None):
            opening = None  # it failed before any caller waited for it: open again
        if opening is None:
            opening = self._session_opening = self._open_session_stream()
        call, reader, first = opening
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                event = await asyncio.shield(first)
        except TimeoutError:
            raise DeadlineExceeded(
                "the node did not open a session within the deadline (the stream stays open: "
                "a later call takes the session once the node answers)"
            ) from None
        except BaseException:
            if first.done() and self._session_opening is opening:  # refused or ended
                self._session_opening = None
                call.cancel()
            raise  # (a cancelled caller leaves the stream opening for the next one)
        if self._session_opening is opening:
            self._session_opening = None
            if self._session_call is not None:
                self._session_call.cancel()
            self._session_call, self._session_reader = call, reader
            self._session_id = event.session_id
            self._st.session_epoch = event.epoch
            self._opened.append(self._session_id)
        elif self._session_call is not call or reader.done():  # taken, and ended since
            raise Unavailable("the node ended the session stream")
        return self._session_id

    def _open_session_stream(self) -> tuple[Any, asyncio.Task[None], asyncio.Future[Any]]:
        """Start an OpenSession stream: (call, its reader task, its first event)."""
        call = self._get_channel().unary_stream(
            _ops.SESSION_METHOD, request_serializer=pb.OpenSessionRequest.SerializeToString,
            response_deserializer=pb.SessionEvent.FromString,
        )(pb.OpenSessionRequest(client_name=f"pid {os.getpid()}", pid=os.getpid()))
        first: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        async def read() -> None:  # holds the stream; done = the session ended
            try:
                async for event in call:
                    if not first.done():
                        first.set_result(event)
            except grpc.RpcError as exc:
                if not first.done():
                    first.set_exception(self._st.map_rpc_error(exc))
            finally:
                if not first.done():
                    first.set_exception(Unavailable("the node ended the session at once"))

        reader = asyncio.create_task(read(), name="kvstored-client-session")
        return call, reader, first

    async def _ack_orphans(self) -> None:
        """Send every pending orphan ack and await the answers (at close(): no deadline).

        A failed one stays pending (kvstored/client/_orphans.py).
        """
        stub = self._stub(_ORPHAN_ACK_STEP)
        for req in self._st.orphans.take():
            try:
                if _hooks._hook is not None:
                    _hooks.fire(
                        "orphan_ack", session_id=req.session_id,
                        request_ids=list(req.orphan_request_ids),
                    )
                await stub(req, timeout=ORPHAN_ACK_TIMEOUT_S)
            except grpc.RpcError:  # node unreachable
                self._st.orphans.put_back(req)
            except BaseException:  # cancelled meanwhile: kept for the next call
                self._st.orphans.put_back(req)
                raise

    def _start_orphan_acks(self) -> None:
        """Start the pending orphan acks as tasks; the caller does not wait for them."""
        stub = self._stub(_ORPHAN_ACK_STEP)
        self._st.orphans.send_in_background(
            lambda req: asyncio.ensure_future(stub(req, timeout=ORPHAN_ACK_TIMEOUT_S)),
            self._st.background,
        )

    async def _release_in_time(self, send: Callable[[float], Any], remaining: float) -> Any:
        """Send a release/abort with :data:`_ops.RELEASE_TIMEOUT_S`, shielded from cancels;
        wait for it only until the caller's deadline (plus :data:`PAST_DEADLINE_S`).

        Returns:
            The response, or None if it failed or is still on its way (it goes on in the
            background; the node frees what it names when this client's session ends anyway).

        Raises:
            CancelledError: the caller was cancelled meanwhile (after the wait above).
        """
        task = asyncio.ensure_future(send(_ops.RELEASE_TIMEOUT_S))
        wait_s = max(remaining, 0.0) + PAST_DEADLINE_S
        waiter = asyncio.ensure_future(asyncio.wait([task], timeout=wait_s))
        cancelled = await _wait_through_cancel(waiter)
        if not task.done():
            self._st.background.add(task)
        if cancelled:
            raise asyncio.CancelledError
        return _result_or_none(task) if task.done() else None

    def _orphaned(self, step: Call) -> None:
        """A granting call ended without an answer: its grant (if any) is orphaned."""
        self._st.orphans.add(*grant_ids(step))

    async def _execute(self, step: Call | Blocking | Session, deadline: float) -> Any:
        if isinstance(step, Session):
            return await self._session(deadline)
        if isinstance(step, Blocking):
            if step.num_bytes and step.num_bytes <= _INLINE_COPY_BYTES:
                return step.fn(deadline)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(_IO_THREADS, thread_name_prefix="kvstored-client-io")
            # never abandoned: a cancellation waits for the copy (its space is released after)
            fut = asyncio.get_running_loop().run_in_executor(self._pool, step.fn, deadline)
            if await _wait_through_cancel(fut):
                raise asyncio.CancelledError
            return fut.result()
        control = self._st.control
        if control is not None and step.method in _control.METHODS:
            def send(timeout: float) -> Any:  # the hot calls over the control channel
                return control.call(step.method, step.request, timeout, step.trailer)
        else:
            if control is not None:  # a gRPC call after a get sees its release (in time)
                await control.flush(max(deadline - time.monotonic(), 0.0) + PAST_DEADLINE_S)
            stub = self._stub(step)

            def send(timeout: float) -> Any:
                return stub(step.request, timeout=timeout)
        if _hooks._hook is not None:
            _hooks.fire("rpc", method=step.method, abort=getattr(step.request, "abort", False))
        if step.release:  # always sent, shielded; awaited until the deadline; errors -> None
            return await self._release_in_time(send, deadline - time.monotonic())
        if self._st.orphans:  # acks that failed before: started with this call, not awaited
            self._start_orphan_acks()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineExceeded(f"deadline passed before calling {step.method}")
        if step.undo is not None:  # a cancel must not lose what the node grants
            task = asyncio.ensure_future(send(remaining))
            if await _wait_through_cancel(task):
                got = _result_or_none(task)
                undo = step.undo(got) if got is not None else None
                if undo is not None:
                    await self._execute(undo, deadline)
                elif got is None:  # no answer: ack the orphan (in the background)
                    self._orphaned(step)
                    self._start_orphan_acks()
                raise asyncio.CancelledError
            pending: Any = task
        else:
            pending = send(remaining)
        try:
            response = await pending
        except grpc.RpcError as exc:
            if step.undo is not None:  # no answer: the node may hold a grant we never saw
                self._orphaned(step)
                self._start_orphan_acks()
            raise self._st.map_rpc_error(exc) from None
        except NO_ANSWER:  # the control channel's "no answer"
            if step.undo is not None:
                self._orphaned(step)
                self._start_orphan_acks()
            raise
        self._st.connected = True
        return response

    async def _drive(self, gen: Op[T], deadline: float) -> T:
        send_value: Any = None
        throw_exc: BaseException | None = None
        while True:
            done, value = _ops.drive_step(gen, send_value, throw_exc)
            if done:
                return value
            send_value, throw_exc = None, None
            try:
                send_value = await self._execute(value, deadline)
            except BaseException as exc:  # incl. CancelledError: the op releases, then re-raises
                throw_exc = exc

    async def _run(self, make_op: Callable[[float], Op[T]], timeout_s: float | None) -> T:
        if self._closed:
            raise Unavailable("the client is closed")
        self._num_ops += 1
        try:
            return await self._run_entered(make_op, timeout_s)
        finally:
            self._num_ops -= 1
            if not self._num_ops and self._idle is not None:
                self._idle.set()

    async def _run_entered(self, make_op: Callable[[float], Op[T]], timeout_s: float | None) -> T:
        deadline = self._st.deadline(timeout_s)
        attempt = 0
        retried: KvstoredError | None = None  # the error the last retry was for
        while True:
            try:
                return await self._drive(make_op(deadline), deadline)
            except KvstoredError as exc:
                if isinstance(exc, Unavailable):
                    self._st.invalidate()
                delay = _ops.retry_delay(exc, attempt, deadline)
                if delay is None:
                    raise _ops.final_error(exc, retried, deadline) from None
                retried = exc
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
        replicas: int | None = None,
    ) -> list[PutResult]:
        """Store blocks; one :class:`PutResult` per key, ``replicas`` as
        :meth:`Client.put` (see there)."""
        return await self._run(
            lambda d: _ops.op_put(self._st, keys, values, metas, d, replicas), timeout_s)

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

    async def connect(self, *, timeout_s: float | None = None) -> NodeInfo:
        """Describe the node, set up the transport and open the session now (see
        :meth:`Client.connect`)."""
        return await self._run(lambda d: _ops.op_connect(self._st), timeout_s)

    async def close(self) -> None:
        """End the session, close the channel, pool and mapping; idempotent.

        Waits for operations of other tasks to finish first; new ones raise Unavailable.

        A process that exits without it still releases everything: the node ends the
        session when the process's socket closes.
        """
        if self._closed:
            return
        self._closed = True
        if self._num_ops:  # other tasks' copies must end before the node may free their space
            self._idle = asyncio.Event()
            await self._idle.wait()
        control = self._st.control
        if control is not None:  # deferred pin releases, before the session ends
            await control.aclose(_ops.RELEASE_TIMEOUT_S)
        background = self._st.background.futures()  # acks, late releases (a failed ack: pending)
        if background:
            await asyncio.wait(background)
        if self._st.orphans:  # acks of grants whose answer never arrived, still pending
            await self._ack_orphans()
        opening, self._session_opening = self._session_opening, None
        if opening is not None:  # a stream still opening (or answered, never taken)
            call, reader, first = opening
            if first.done() and not first.cancelled() and first.exception() is None:
                self._opened.append(first.result().session_id)
            call.cancel()
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
        for session_id in self._opened:  # the ack: no operation of any of them runs any more
            with contextlib.suppress(grpc.RpcError, asyncio.TimeoutError):
                await self._get_channel().unary_unary(
                    _ops.SERVICE + "CloseSession",
                    request_serializer=pb.CloseSessionRequest.SerializeToString,
                    response_deserializer=pb.CloseSessionResponse.FromString,
                )(pb.CloseSessionRequest(session_id=session_id), timeout=_ops.RELEASE_TIMEOUT_S)
        self._opened = []
        if self._session_call is not None:
            self._session_call.cancel()
        if self._session_reader is not None:
            self._session_reader.cancel()
            with contextlib.suppress(BaseException):
                await self._session_reader
        if self._channel is not None:
            await self._channel.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._st.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
