"""The lean control channel: the hot operations of a local client on a unix socket beside gRPC.

A gRPC unary call costs a few hundred microseconds of framework work on each side; a
shared-memory get (pin, copy, release) or put (reserve, copy, commit) of small blocks spends
most of its time there. This channel carries the same requests on a plain unix stream socket
(``<first unix listen path>.ctl``, advertised as ``DescribeResponse.control_path``):

    frame    = 4-byte big-endian length, then that many bytes of one protobuf message
    request  = ControlRequest  (node.proto): session_id, release_pin_ids, one_sided, one op
    response = ControlResponse: error_code/error_message, released, the op's response

One response per request, in order, per connection, except that a CommitSlots asking for
its refill after its answer (``grant_after_answer``) is answered by two frames: the writes'
answer (``grant_follows``), then, once the refill is granted, a ControlResponse with only
its slots (or its error); nothing else of that connection is served in between. The ops (PinBlocks, ReleasePins,
ReservePut, CommitPut, LookupPrefix, Exists) are served by the very :class:`NodeServicer`
methods the gRPC handlers call (remote fill of a cluster read included), on the daemon's
event loop, counted in ``core.rpcs_in_flight`` so the drain waits for them.

Piggybacked release: ``release_pin_ids`` are pins of the client's earlier gets whose copies
have returned (the client sends an id only after its copy ended). They are released before
the op runs, so a get costs one round trip; until that request arrives the pin holds, and
its block cannot be evicted or removed.

Piggybacked counts: ``one_sided`` (a ``OneSidedReport``) is what the client read or probed
through the shared slots since its last report, with no round trip; counted before the op
(``NodeCore.count_one_sided``: store and DRAM hits, ``kvstored_one_sided_blocks_total``,
lookups), on any request, a bare one included. Its PinBlocks counter is untouched.

Fencing (kvstored/node/sessions.py) is unchanged: pins and reservations belong to the
client's session (its OpenSession stream / pid), not to a connection. A connection that
drops releases nothing; its leases lapse into quarantine or are freed when the session
ends, exactly as for gRPC calls. A connection belongs to the first session id it names;
a request naming another session is refused (InvalidArgument). A request whose connection
drops mid-way still runs to its end (never cancelled half-way); a grant it made whose answer
never arrived is freed by the client's orphan ack.

Serving without a hop: each connection is an :class:`asyncio.Protocol`; a complete frame is
handled inside ``data_received`` (the loop's read callback), and the op's coroutine is run
eagerly there: a request that never suspends (a DRAM pin, a lookup, a commit) is answered in
that same callback, with no task and no extra turn of the loop. One that suspends (a read
promoted from SSD on the store executor, a remote fill) continues on a task; reading from
that connection pauses until it answered, so answers stay in request order.

Thread-safety: everything runs on the event loop that called :meth:`ControlServer.start`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import time
from collections.abc import Callable, Coroutine, Generator
from typing import TYPE_CHECKING, Any

import structlog
from google.protobuf.message import DecodeError

from kvstored.errors import ErrorCode, InternalError, InvalidArgument, KvstoredError
from kvstored.log import bind_request, new_request_id, request_lines_enabled, unbind_request
from kvstored.transport.control import LENGTH_BYTES, MAX_FRAME_BYTES, OPS, SOCKET_SUFFIX, frame
from kvstored.v1 import node_pb2 as pb

if TYPE_CHECKING:
    from kvstored.node.service import NodeServicer

log = structlog.get_logger(__name__)

__all__ = ["MAX_BUFFERED_BYTES", "SOCKET_SUFFIX", "ControlServer"]

MAX_BUFFERED_BYTES = 256 << 20
"""Default bound of the bytes of partial frames the channel holds over all its connections."""


class _Context:
    """The part of a grpc.aio ServicerContext the hot handlers use (no deadline: None)."""

    def __init__(self, peer: str) -> None:
        self._peer = peer
        self.tenant: str | None = None  # the connection's session's tenant (node/tenants.py)

    def time_remaining(self) -> None:
        return None

    def peer(self) -> str:
        return self._peer


class _Connection:
    def __init__(self, peer: str) -> None:
        self.session_id = 0
        self.ctx = _Context(peer)
        self.after: list[Callable[[], Coroutine[Any, Any, pb.CommitSlotsResponse]]] = []
        """Work of the request just served to run once its answer is written (a refill
        granted after its answer): each answers one more frame, in order."""


class _Resume:
    """Awaitable that continues a coroutine already started by hand (``coro.send(None)``
    returned ``first``, the future it waits on): a Task awaiting this drives the rest."""

    __slots__ = ("_coro", "_first")

    def __init__(self, coro: Coroutine[Any, Any, Any], first: Any) -> None:
        self._coro, self._first = coro, first

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, value = self._coro, self._first
        while True:
            try:
                sent = yield value
            except BaseException as exc:  # thrown in by the task (only at shutdown)
                try:
                    value = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    value = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


async def _resume(coro: Coroutine[Any, Any, Any], first: Any) -> Any:
    return await _Resume(coro, first)


class _Protocol(asyncio.Protocol):
    """One control connection: frames in, one answer per frame, in order."""

    def __init__(self, server: ControlServer) -> None:
        self._server = server
        self._conn = _Connection(f"unix:{server.path} (control)")
        self._buf = bytearray()
        self._frames: list[bytes] = []  # complete frames not yet handled (in order)
        self._busy = False  # a request suspended and runs on a task
        self._write_paused = False
        self._read_paused = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream server's transport is always an asyncio.Transport
        self._server._transports.add(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        # a request still running finishes (never cancelled half-way); its answer is dropped
        self._drop_buffer()
        self._server._transports.discard(self.transport)

    def pause_writing(self) -> None:
        self._write_paused = True
        self._flow()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._flow()

    def _flow(self) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        want = self._busy or self._write_paused
        if want != self._read_paused:
            self._read_paused = want
            if want:
                t.pause_reading()
            else:
                t.resume_reading()

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        server = self._server
        if server.buffered_bytes + len(data) > server.max_buffered_bytes:
            # frames arriving slower than they are sent, on many connections at once: drop
            # this one rather than let partial frames take the node's memory (unbounded,
            # 8 connections of 63 MiB half-frames would hold 500 MiB)
            log.warning("control_buffer_budget_exceeded", buffered_bytes=server.buffered_bytes,
                        incoming_bytes=len(data), limit=server.max_buffered_bytes)
            self._drop_buffer()
            self._frames.clear()
            assert self.transport is not None
            self.transport.close()
            return
        buf += data
        server.buffered_bytes += len(data)
        before = len(buf)
        try:
            self._split(buf)
        finally:
            server.buffered_bytes -= before - len(buf)
        self._run()

    def _drop_buffer(self) -> None:
        self._server.buffered_bytes -= len(self._buf)
        self._buf.clear()

    def _split(self, buf: bytearray) -> None:
        while len(buf) >= LENGTH_BYTES:
            size = int.from_bytes(buf[:LENGTH_BYTES], "big")
            if size > MAX_FRAME_BYTES:
                log.warning("control_frame_too_large", size_bytes=size, limit=MAX_FRAME_BYTES)
                self._frames.clear()
                assert self.transport is not None
                self.transport.close()
                return
            end = LENGTH_BYTES + size
            if len(buf) < end:
                break
            self._frames.append(bytes(buf[LENGTH_BYTES:end]))
            del buf[:end]

    def _run(self) -> None:
        frames = self._frames
        t = self.transport
        if t is None or t.is_closing():  # the client is gone: run nothing more it sent
            frames.clear()
            self._conn.after.clear()  # its refills are not granted (nothing to free)
            return
        after = self._conn.after
        while (frames or after) and not self._busy:
            # a refill granted after its answer (written just before) comes first: its frame
            # is the next on this connection
            coro = (self._server._handle_after(after.pop(0), self._conn) if after
                    else self._server._handle(frames.pop(0), self._conn))
            # one Context for the whole request, eager step and task alike: what it binds
            # (its log fields, kvstored/log.py) is set and reset in the same Context
            ctx = contextvars.copy_context()
            try:
                first = ctx.run(coro.send, None)  # eagerly: most ops answer without suspending
            except StopIteration as stop:
                self._answer(stop.value)
                continue
            self._busy = True  # it waits (executor, remote fill): finish it on a task
            task = asyncio.get_running_loop().create_task(_resume(coro, first), context=ctx)
            self._server._tasks.add(task)
            task.add_done_callback(self._resumed)
        self._flow()

    def _resumed(self, task: asyncio.Task[Any]) -> None:
        self._server._tasks.discard(task)
        self._busy = False
        if not task.cancelled() and task.exception() is None:
            self._answer(task.result())
        self._run()

    def _answer(self, response: pb.ControlResponse) -> None:
        t = self.transport
        if t is not None and not t.is_closing():
            t.write(frame(response))


class ControlServer:
    """Serves the control channel on one unix socket (see the module docstring).

    Args:
        servicer: the gRPC servicer whose methods serve the ops.
        path: the socket path (created; the caller removes a stale one first).
        max_buffered_bytes: bytes of frames still arriving, over all connections, the
            channel holds at most; a connection whose data would pass it is closed
            (``control_buffer_budget_exceeded``). One frame is at most
            ``MAX_FRAME_BYTES`` (64 MiB).
    """

    def __init__(self, servicer: NodeServicer, path: str, *,
                 max_buffered_bytes: int = MAX_BUFFERED_BYTES) -> None:
        self._servicer = servicer
        self.path = path
        self.max_buffered_bytes = int(max_buffered_bytes)
        self.buffered_bytes = 0  # partial frames held by every connection together
        self._server: asyncio.AbstractServer | None = None
        self._transports: set[Any] = set()
        self._tasks: set[asyncio.Task[Any]] = set()  # requests that suspended, until answered
        self._metric_children: dict[tuple[str, str], tuple[Any, Any]] = {}  # (method, code)

    async def start(self) -> None:
        """Listen (on the running loop).

        Raises:
            OSError: the socket cannot be created.
        """
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: _Protocol(self), path=self.path)

    def stop_listening(self) -> None:
        """Refuse new connections (open ones are still served)."""
        if self._server is not None:
            self._server.close()

    async def close(self) -> None:
        """Stop listening, close every connection, remove the socket (idempotent).

        Requests still running finish first (their handlers are awaited, never cancelled
        half-way); their answers are dropped.
        """
        self.stop_listening()
        for t in list(self._transports):
            t.close()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5.0)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        with contextlib.suppress(OSError):
            os.unlink(self.path)

    async def _handle(self, raw: bytes, conn: _Connection) -> pb.ControlResponse:
        # every line logged while serving this request names it (kvstored/log.py)
        fields = {"method": "Control", "peer": conn.ctx.peer(), "request_id": new_request_id()}
        token = bind_request(fields)
        try:
            return await self._handle_request(raw, conn, fields)
        finally:
            unbind_request(token)

    async def _handle_after(
        self, fn: Callable[[], Coroutine[Any, Any, pb.CommitSlotsResponse]], conn: _Connection,
    ) -> pb.ControlResponse:
        """The frame that follows an answer with ``grant_follows``: the refill's slots, or
        its error (nothing granted)."""
        fields = {"method": "CommitSlotsGrant", "peer": conn.ctx.peer(), "request_id": new_request_id()}
        token = bind_request(fields)
        out = pb.ControlResponse()
        self._servicer.core.rpcs_in_flight += 1
        try:
            out.commit_slots.CopyFrom(await fn())
        except KvstoredError as exc:
            out.ClearField("op")
            out.error_code, out.error_message = int(exc.code), str(exc)
            log.debug("control_op_failed", method="CommitSlotsGrant", code=exc.code.name, error=str(exc))
        except Exception:
            log.exception("control_op_failed_internally", method="CommitSlotsGrant")
            err = InternalError("internal error in CommitSlots' refill (control channel); see the node's log")
            out.ClearField("op")
            out.error_code, out.error_message = int(err.code), str(err)
        finally:
            self._servicer.core.rpcs_in_flight -= 1
            unbind_request(token)
        return out

    async def _handle_request(self, raw: bytes, conn: _Connection, fields: dict[str, Any]) -> pb.ControlResponse:
        servicer = self._servicer
        core = servicer.core
        metrics = core.metrics
        t0 = time.perf_counter()
        out = pb.ControlResponse()
        method = "Control"
        core.rpcs_in_flight += 1
        try:
            try:
                req = pb.ControlRequest.FromString(raw)
            except DecodeError as exc:
                raise InvalidArgument(
                    f"cannot parse the ControlRequest ({len(raw)} bytes): {exc}; the frame is "
                    "not a valid kvstored.v1 protobuf"
                ) from None
            if req.release_pin_ids:  # the client's earlier copies have returned (always run)
                n, expired = core.release_pins_report(req.release_pin_ids)
                released = out.released
                released.SetInParent()
                released.num_released = n
                if expired:
                    released.expired_pin_ids.extend(expired)
            if req.HasField("one_sided"):  # the client's one-sided reads since its last report
                r = req.one_sided
                core.count_one_sided(
                    hit_blocks=r.hit_blocks, hit_bytes=r.hit_bytes, fallback_blocks=r.fallback_blocks,
                    miss_blocks=r.miss_blocks, lookup_blocks=r.lookup_blocks,
                    lookup_hit_blocks=r.lookup_hit_blocks,
                )
            if req.session_id:
                if not conn.session_id:
                    conn.session_id = req.session_id
                    # the connection acts for its session's tenant (fixed at OpenSession)
                    conn.ctx.tenant = servicer.session_tenants.tenant(req.session_id)
                elif req.session_id != conn.session_id:
                    raise InvalidArgument(
                        f"this control connection belongs to session {conn.session_id}; got a "
                        f"request of session {req.session_id} (open one connection per session)"
                    )
            field = req.WhichOneof("op")
            if field is None:
                return out  # a bare release (or report)
            method = OPS[field]
            fields["method"] = method  # the log lines of this request from here on
            if field == "pin_blocks":  # the hot get: answered straight into ``out``, no copy
                await servicer.PinBlocks(req.pin_blocks, conn.ctx, into=out.pin_blocks)
            elif field == "commit_slots":  # its refill may follow the answer (conn.after)
                await servicer.CommitSlots(req.commit_slots, conn.ctx, after=conn.after,
                                           into=out.commit_slots)
                out.commit_slots.SetInParent()  # (set even when every field is its default)
            else:
                response = await getattr(servicer, method)(getattr(req, field), conn.ctx)
                getattr(out, field).CopyFrom(response)
        except KvstoredError as exc:
            out.ClearField("op")
            out.error_code, out.error_message = int(exc.code), str(exc)
            log.debug("control_op_failed", method=method, code=exc.code.name, error=str(exc))
        except Exception:
            log.exception("control_op_failed_internally", method=method)
            err = InternalError(f"internal error in {method} (control channel); see the node's log")
            out.ClearField("op")
            out.error_code, out.error_message = int(err.code), str(err)
        finally:
            core.rpcs_in_flight -= 1
        if metrics is not None:
            code = ErrorCode(out.error_code).name if out.error_code else "OK"
            children = self._metric_children.get((method, code))
            if children is None:
                children = self._metric_children[(method, code)] = (
                    metrics.rpc_requests.labels(method=method, code=code),
                    metrics.rpc_duration.labels(method=method),
                )
            children[0].inc()
            children[1].observe(time.perf_counter() - t0)
        if request_lines_enabled(__name__):
            log.debug("rpc_served", duration_ms=round((time.perf_counter() - t0) * 1000, 3),
                      code=ErrorCode(out.error_code).name if out.error_code else "OK")
        return out
