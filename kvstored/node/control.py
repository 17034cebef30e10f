"""The lean control channel: the hot operations of a local client on a unix socket beside gRPC.

A gRPC unary call costs a few hundred microseconds of framework work on each side; a
shared-memory get (pin, copy, release) or put (reserve, copy, commit) of small blocks spends
most of its time there. This channel carries the same requests on a plain unix stream socket
(``<first unix listen path>.ctl``, advertised as ``DescribeResponse.control_path``):

    frame    = 4-byte big-endian length, then that many bytes of one protobuf message
    request  = ControlRequest  (node.proto): session_id, release_pin_ids, one op
    response = ControlResponse: error_code/error_message, released, the op's response

One response per request, in order, per connection. The ops (PinBlocks, ReleasePins,
ReservePut, CommitPut, LookupPrefix, Exists) are served by the very :class:`NodeServicer`
methods the gRPC handlers call (remote fill of a cluster read included), on the daemon's
event loop, counted in ``core.rpcs_in_flight`` so the drain waits for them.

Piggybacked release: ``release_pin_ids`` are pins of the client's earlier gets whose copies
have returned (the client sends an id only after its copy ended). They are released before
the op runs, so a get costs one round trip; until that request arrives the pin holds, and
its block cannot be evicted or removed.

Fencing (kvstored/node/sessions.py) is unchanged: pins and reservations belong to the
client's session (its OpenSession stream / pid), not to a connection. A connection that
drops releases nothing; its leases lapse into quarantine or are freed when the session
ends, exactly as for gRPC calls. A connection belongs to the first session id it names;
a request naming another session is refused (InvalidArgument). A request whose connection
drops mid-way still runs to its end (never cancelled half-way); a grant it made whose answer
never arrived is freed by the client's orphan ack.

Thread-safety: everything runs on the event loop that called :meth:`ControlServer.start`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import TYPE_CHECKING, Any

import structlog
from google.protobuf.message import DecodeError

from kvstored.errors import ErrorCode, InternalError, InvalidArgument, KvstoredError
from kvstored.transport.control import LENGTH_BYTES, MAX_FRAME_BYTES, OPS, SOCKET_SUFFIX, frame
from kvstored.v1 import node_pb2 as pb

if TYPE_CHECKING:
    from kvstored.node.service import NodeServicer

log = structlog.get_logger(__name__)

__all__ = ["SOCKET_SUFFIX", "ControlServer"]


class _Context:
    """The part of a grpc.aio ServicerContext the hot handlers use (no deadline: None)."""

    def __init__(self, peer: str) -> None:
        self._peer = peer

    def time_remaining(self) -> None:
        return None

    def peer(self) -> str:
        return self._peer


class _Connection:
    def __init__(self, peer: str) -> None:
        self.session_id = 0
        self.ctx = _Context(peer)


class ControlServer:
    """Serves the control channel on one unix socket (see the module docstring).

    Args:
        servicer: the gRPC servicer whose methods serve the ops.
        path: the socket path (created; the caller removes a stale one first).
    """

    def __init__(self, servicer: NodeServicer, path: str) -> None:
        self._servicer = servicer
        self.path = path
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._metric_children: dict[tuple[str, str], tuple[Any, Any]] = {}  # (method, code)

    async def start(self) -> None:
        """Listen (on the running loop).

        Raises:
            OSError: the socket cannot be created.
        """
        self._server = await asyncio.start_unix_server(self._serve, path=self.path)

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
        for w in list(self._writers):
            w.close()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5.0)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        with contextlib.suppress(OSError):
            os.unlink(self.path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self._writers.add(writer)
        conn = _Connection(f"unix:{self.path} (control)")
        try:
            while True:
                try:
                    header = await reader.readexactly(LENGTH_BYTES)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return  # the client closed the connection
                size = int.from_bytes(header, "big")
                if size > MAX_FRAME_BYTES:
                    log.warning("control_frame_too_large", size_bytes=size, limit=MAX_FRAME_BYTES)
                    return
                try:
                    raw = await reader.readexactly(size)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                # a dropped connection does not interrupt this (the reader just sees EOF
                # afterwards); only close() at shutdown waits for it, never cancels it
                response = await self._handle(raw, conn)
                writer.write(frame(response))
                if writer.transport.get_write_buffer_size() > 1 << 20:
                    await writer.drain()
        except ConnectionError:
            return
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _handle(self, raw: bytes, conn: _Connection) -> pb.ControlResponse:
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
                n, expired = core.release_pins_report(list(req.release_pin_ids))
                out.released.CopyFrom(pb.ReleasePinsResponse(num_released=n, expired_pin_ids=expired))
            if req.session_id:
                if not conn.session_id:
                    conn.session_id = req.session_id
                elif req.session_id != conn.session_id:
                    raise InvalidArgument(
                        f"this control connection belongs to session {conn.session_id}; got a "
                        f"request of session {req.session_id} (open one connection per session)"
                    )
            field = req.WhichOneof("op")
            if field is None:
                return out  # a bare release
            method = OPS[field]
            response = await getattr(servicer, method)(getattr(req, field), conn.ctx)
            getattr(out, field).CopyFrom(response)
        except KvstoredError as exc:
            out.error_code, out.error_message = int(exc.code), str(exc)
            log.debug("control_op_failed", method=method, code=exc.code.name, error=str(exc))
        except Exception:
            log.exception("control_op_failed_internally", method=method)
            err = InternalError(f"internal error in {method} (control channel); see the node's log")
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
        return out
