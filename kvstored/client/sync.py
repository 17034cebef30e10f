"""The synchronous client (``kvstored.Client``): a thin driver over kvstored.client._ops."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

import grpc

from kvstored.addresses import default_address
from kvstored.client import _control, _fastput, _fastread, _hooks, _ops, _tenant
from kvstored.client._control import NO_ANSWER, ControlChannel
from kvstored.client._ops import Blocking, Call, ClientState, Op, Session
from kvstored.client._orphans import ORPHAN_ACK_TIMEOUT_S, PAST_DEADLINE_S
from kvstored.client._steps import grant_ids
from kvstored.client.types import Block, NodeInfo, PutResult
from kvstored.errors import DeadlineExceeded, KvstoredError, Unavailable
from kvstored.keys import Namespace
from kvstored.security.tls import TlsFiles, open_channel
from kvstored.types import BlockInfo, Tier
from kvstored.v1 import node_pb2 as pb

T = TypeVar("T")


def _send_orphan_acks(stub: grpc.UnaryUnaryMultiCallable, st: ClientState) -> None:
    """Send every pending orphan ack and wait for the answers (at close(): no deadline).

    A failed one stays pending (kvstored/client/_orphans.py).
    """
    for req in st.orphans.take():
        try:
            if _hooks._hook is not None:
                _hooks.fire(
                    "orphan_ack", session_id=req.session_id,
                    request_ids=list(req.orphan_request_ids),
                )
            stub(req, timeout=ORPHAN_ACK_TIMEOUT_S)
        except grpc.RpcError:  # node unreachable, stopped meanwhile
            st.orphans.put_back(req)
        except BaseException:
            st.orphans.put_back(req)
            raise


def _start_orphan_acks(stub: grpc.UnaryUnaryMultiCallable, st: ClientState) -> None:
    """Start the pending orphan acks in the background: the caller does not wait for them."""
    st.orphans.send_in_background(
        lambda req: stub.future(req, timeout=ORPHAN_ACK_TIMEOUT_S), st.background
    )


def _wait_background(st: ClientState) -> None:
    """Wait for the RPCs started in the background (each ends within its own timeout)."""
    for fut in st.background.futures():
        with contextlib.suppress(grpc.RpcError, grpc.FutureCancelledError):
            fut.exception()


def _release_in_time(
    stub: grpc.UnaryUnaryMultiCallable, request: Any, st: ClientState, remaining: float
) -> Any:
    """Send a release/abort with :data:`_ops.RELEASE_TIMEOUT_S`; wait for it only until the
    caller's deadline (plus :data:`PAST_DEADLINE_S`).

    Returns:
        The response, or None if it failed or is still on its way (it goes on in the
        background; the node frees what it names when this client's session ends anyway).
    """
    fut = stub.future(request, timeout=_ops.RELEASE_TIMEOUT_S)
    try:
        return fut.result(timeout=max(remaining, 0.0) + PAST_DEADLINE_S)
    except grpc.FutureTimeoutError:
        st.background.add(fut)
        return None
    except grpc.RpcError:
        return None


def _release_pins_stub(channel: grpc.Channel) -> grpc.UnaryUnaryMultiCallable:
    return channel.unary_unary(
        _ops.SERVICE + "ReleasePins",
        request_serializer=pb.ReleasePinsRequest.SerializeToString,
        response_deserializer=pb.ReleasePinsResponse.FromString,
    )


class _Opening:
    """An OpenSession stream whose first event (the session id) may not have arrived yet.

    Its reader thread appends what the stream yields to ``first`` (the SessionEvent, or the
    grpc.RpcError it ended with) and sets ``got`` at the first item or at the stream's end;
    ``ended`` is set when the stream is gone.
    """

    __slots__ = ("call", "first", "got", "ended")

    def __init__(self, call: Any) -> None:
        self.call = call
        self.first: list[Any] = []
        self.got = threading.Event()
        self.ended = threading.Event()

    def read(self) -> None:
        """Hold the stream (the reader thread's body)."""
        try:
            for event in self.call:
                self.first.append(event)
                self.got.set()
        except grpc.RpcError as exc:
            self.first.append(exc)
        finally:
            self.ended.set()
            self.got.set()

    def event(self) -> Any:
        """The stream's first item: a SessionEvent, a grpc.RpcError, or None (it ended
        without one); call only once ``got`` is set."""
        return self.first[0] if self.first else None


class _SyncSession:
    """The client's OpenSession stream: opened on first use, again after it ended.

    A reader thread (``kvstored-client-session``) holds the stream and notices its end. The
    node ties the client's pins and reservations to it (kvstored/node/sessions.py): when this
    process exits or :meth:`close` cancels the stream, the node releases what it held. So the
    stream is never cancelled while an operation of this client runs (:meth:`enter` /
    :meth:`leave` count them): ``close()`` waits for them, and at interpreter exit with
    operations still running on daemon threads the stream is left to the kernel, which closes
    the socket only once every thread of the process is gone.

    A stream the node has not answered by a caller's deadline is not cancelled: it goes on
    opening (:class:`_Opening`), the caller gets DeadlineExceeded, and the next call takes
    the session once the answer is in. So a slow node (a loaded machine, a tight lookup
    deadline) costs one call, not every call: a fresh open per call would race every next
    deadline again, and leave the node a session per abandoned stream.
    Shares no reference with the :class:`Client`, so it can be its ``weakref.finalize``.
    """

    def __init__(self, channel: grpc.Channel, st: ClientState) -> None:
        self._channel = channel
        self._st = st
        self._lock = threading.Lock()
        self._call: Any = None
        self._ended = threading.Event()
        self._ended.set()
        self._session_id = 0
        self._live: tuple[threading.Event, int] | None = None
        self._opening: _Opening | None = None  # a stream not answered yet (or just answered)
        self._closed = False
        self._idle = threading.Condition(self._lock)
        self._num_ops = 0
        self._opened: list[int] = []  # sessions to end with CloseSession at close()

    def enter(self) -> None:
        """An operation starts (raises Unavailable once closed)."""
        with self._lock:
            if self._closed:
                raise Unavailable("the client is closed")
            self._num_ops += 1

    def leave(self) -> None:
        """An operation ended."""
        with self._lock:
            self._num_ops -= 1
            if not self._num_ops and self._closed:  # only close() waits (after setting _closed)
                self._idle.notify_all()

    def is_live(self) -> bool:
        """Whether the session is open now (its stream has not ended) and the client is not
        closed: the liveness a one-sided answer needs (kvstored/client/_fastread.py)."""
        live = self._live
        return live is not None and not live[0].is_set() and not self._closed

    def live_id(self) -> int:
        """The open session's id now, or 0 when none is open (never waits, never opens one:
        kvstored/client/_fastput.py)."""
        live = self._live
        if live is not None and not live[0].is_set() and not self._closed:
            return live[1]
        return 0

    def session_id(self, deadline: float) -> int:
        """The open session's id (opens one if needed, or waits for the one opening).

        Raises:
            Unavailable: the client is closed, or the node refused or ended the stream (it
                is unreachable, or stopped): the next call opens a new one.
            DeadlineExceeded: the node has not answered by ``deadline``; the stream stays
                open and a later call takes its session.
        """
        live = self._live  # (ended, session id) of the open stream, one read without the lock
        if live is not None and not live[0].is_set() and not self._closed:
            return live[1]  # (as stale as an answer under the lock once it is released)
        with self._lock:
            if self._closed:
                raise Unavailable("the client is closed")
            if self._call is not None and not self._ended.is_set():
                return self._session_id
            opening = self._opening
            if opening is not None and opening.got.is_set() and not isinstance(
                    opening.event(), pb.SessionEvent):
                opening = None  # it failed before any caller waited for it: open again
            if opening is None:
                opening = self._opening = self._open_stream()
        # waited for without the lock: other callers wait on the same stream with their own
        # deadlines, and enter()/leave() are not held up by a slow node
        opening.got.wait(max(0.0, deadline - time.monotonic()))
        with self._lock:
            return self._take(opening)

    def _open_stream(self) -> _Opening:
        """Start an OpenSession stream and its reader thread (lock held)."""
        stub = self._channel.unary_stream(
            _ops.SESSION_METHOD, request_serializer=pb.OpenSessionRequest.SerializeToString,
            response_deserializer=pb.SessionEvent.FromString,
        )
        opening = _Opening(
            stub(pb.OpenSessionRequest(client_name=f"pid {os.getpid()}", pid=os.getpid()))
        )
        threading.Thread(target=opening.read, name="kvstored-client-session", daemon=True).start()
        return opening

    def _take(self, opening: _Opening) -> int:
        """(lock held) The session of ``opening`` once answered, adopted as the open one."""
        if self._closed:
            raise Unavailable("the client is closed")
        if self._opening is opening:
            if not opening.got.is_set():
                raise DeadlineExceeded(
                    "the node did not open a session within the deadline (the stream stays "
                    "open: a later call takes the session once the node answers)"
                )
            self._opening = None
            event = opening.event()
            if isinstance(event, pb.SessionEvent):
                if self._call is not None:
                    self._call.cancel()
                self._call, self._ended = opening.call, opening.ended
                self._session_id = event.session_id
                self._live = (opening.ended, event.session_id)
                self._st.session_epoch = event.epoch
                self._opened.append(event.session_id)
                return event.session_id
            opening.call.cancel()
        elif self._call is opening.call and not self._ended.is_set():
            return self._session_id  # another caller took it meanwhile
        event = opening.event()  # it failed, or ended since another caller took it
        if isinstance(event, grpc.RpcError):
            raise self._st.map_rpc_error(event)
        raise Unavailable("the node ended the session stream")

    def close(self, *, wait: bool) -> bool:
        """Refuse new operations and end the session (the node releases what it held).

        Args:
            wait: wait for running operations first; False: if any runs, leave the stream
                open (interpreter exit: the kernel ends it with the process).

        Returns:
            True if the session was ended (or none was open).
        """
        with self._lock:
            self._closed = True
            if wait:
                self._idle.wait_for(lambda: self._num_ops == 0)
            elif self._num_ops:
                return False
            call, self._call = self._call, None
            self._live = None
            opening, self._opening = self._opening, None
            if opening is not None and isinstance(opening.event(), pb.SessionEvent):
                self._opened.append(opening.event().session_id)  # answered, never taken
            opened, self._opened = self._opened, []
        control = self._st.control
        if control is not None:  # deferred pin releases, before the session ends
            control.flush(_ops.RELEASE_TIMEOUT_S)
        _wait_background(self._st)  # acks and releases still in flight (a failed ack: pending)
        if self._st.orphans:  # acks of grants whose answer never arrived, still pending
            _send_orphan_acks(_release_pins_stub(self._channel), self._st)
        close = self._channel.unary_unary(
            _ops.SERVICE + "CloseSession",
            request_serializer=pb.CloseSessionRequest.SerializeToString,
            response_deserializer=pb.CloseSessionResponse.FromString,
        )
        for session_id in opened:  # the ack: no operation of any of them runs any more
            with contextlib.suppress(grpc.RpcError):
                close(pb.CloseSessionRequest(session_id=session_id), timeout=_ops.RELEASE_TIMEOUT_S)
        if call is not None:
            call.cancel()
        if opening is not None:
            opening.call.cancel()
        return True


_ORPHAN_ACK_STEP = Call("ReleasePins", pb.ReleasePinsRequest(), pb.ReleasePinsResponse)


def _finalize(session: _SyncSession, channel: grpc.Channel, st: ClientState) -> None:
    """close() of a Client that was never closed (garbage collected, or interpreter exit)."""
    if session.close(wait=False):
        channel.close()
        st.close()


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
        replicas: replicas each put of this client wants when ``put`` names none (1..8;
            None = the node's default for the namespace, ``[cluster] namespace_replicas``
            / ``default_replicas``). Not part of the namespace: block hashes are unchanged.
        tenant: the tenant this client acts for ("" = the shared tenant), declared on every
            call; the node keeps each tenant's blocks in a key space of its own
            (docs/tenants.md). None (the default) = the tenant its TLS certificate names
            (``kvstored://tenant/T``), or "" without TLS or without one. With TLS a
            certificate's tenant is enforced by the servers whatever is declared here.
        tls: mutual TLS (:class:`kvstored.security.tls.TlsFiles`) to a ``HOST:PORT`` node and
            its data plane; None (the default) = from ``KVSTORED_TLS__CERT_FILE``,
            ``..._KEY_FILE``, ``..._CA_FILE`` when set, else plaintext; False = plaintext.
            A unix address is always plaintext (a local caller).
        reserve_ahead_bytes: shared-memory puts: most arena bytes of slots this client holds
            granted in advance, so a put costs one round trip (CommitSlots) at any size;
            counted as used room on the node and freed when the session ends. None = 64 MiB;
            the pool is also at most an eighth of the arena and the node's
            ``node.max_slot_bytes_per_session``; 0 = off (ReservePut, copy, CommitPut).

    Raises:
        InvalidArgument: malformed address, timeout, namespace, transport, replicas or tenant
            name.
        ConfigInvalid: ``tls`` not given and only some ``KVSTORED_TLS__*`` env vars set, or
            their files unreadable / not a certificate and its key.
        Unauthenticated: no ``tenant=`` and the certificate's ``kvstored://`` URIs are
            malformed.
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
        self._st.control_factory = ControlChannel  # hot calls over it when the node offers it
        self._channel = _tenant.sync_channel(
            open_channel(self._st.target, self._st.tls, options=_ops.CHANNEL_OPTIONS), self._st.tenant
        )
        self._stubs: dict[str, grpc.UnaryUnaryMultiCallable] = {}
        self._session = _SyncSession(self._channel, self._st)
        # close() at garbage collection and at interpreter exit, if the caller never did
        self._finalizer = weakref.finalize(self, _finalize, self._session, self._channel, self._st)
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

    def _execute(self, step: Call | Blocking | Session, deadline: float) -> Any:
        # Copies run on the calling thread, so no release can overtake them.
        if isinstance(step, Blocking):
            return step.fn(deadline)
        if isinstance(step, Session):
            return self._session.session_id(deadline)
        control = self._st.control
        if control is not None:
            if step.method in _control.METHODS:
                return self._execute_control(control, step, deadline)
            # a gRPC call after a get sees its release (get(K) then remove(K) removes K);
            # within the caller's time: releases it cannot send stay pending, sent later
            control.flush(max(deadline - time.monotonic(), 0.0) + PAST_DEADLINE_S)
        stub = self._stub(step)
        if _hooks._hook is not None:
            _hooks.fire("rpc", method=step.method, abort=getattr(step.request, "abort", False))
        if step.release:  # always sent; awaited until the deadline, then in the background
            return _release_in_time(stub, step.request, self._st, deadline - time.monotonic())
        if self._st.orphans:  # acks that failed before: started with this call, not awaited
            _start_orphan_acks(self._stub(_ORPHAN_ACK_STEP), self._st)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineExceeded(f"deadline passed before calling {step.method}")
        try:
            response = stub(step.request, timeout=remaining)
        except grpc.RpcError as exc:
            if step.undo is not None:  # no answer: the node may hold a grant we never saw
                self._st.orphans.add(*grant_ids(step))
                _start_orphan_acks(self._stub(_ORPHAN_ACK_STEP), self._st)
            raise self._st.map_rpc_error(exc) from None
        except BaseException:  # interrupted mid-call: acked with the next call or at close()
            if step.undo is not None:
                self._st.orphans.add(*grant_ids(step))
            raise
        self._st.connected = True
        return response

    def _execute_control(self, control: ControlChannel, step: Call, deadline: float) -> Any:
        """A hot call over the control channel; the same rules as the gRPC path above."""
        if _hooks._hook is not None:
            _hooks.fire("rpc", method=step.method, abort=getattr(step.request, "abort", False))
        if step.release:  # always sent; awaited until the deadline, then in the background
            remaining = max(deadline - time.monotonic(), 0.0) + PAST_DEADLINE_S
            try:
                return control.call(step.method, step.request, remaining)
            except NO_ANSWER:  # sent again over gRPC, in the background (it is idempotent)
                self._st.background.add(
                    self._stub(step).future(step.request, timeout=_ops.RELEASE_TIMEOUT_S)
                )
                return None
            except KvstoredError:
                return None  # the node frees it when this client's session ends
        if self._st.orphans:  # acks that failed before: started with this call, not awaited
            _start_orphan_acks(self._stub(_ORPHAN_ACK_STEP), self._st)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineExceeded(f"deadline passed before calling {step.method}")
        try:
            response = control.call(step.method, step.request, remaining, step.trailer)
        except NO_ANSWER:
            if step.undo is not None:  # no answer: the node may hold a grant we never saw
                self._st.orphans.add(*grant_ids(step))
                _start_orphan_acks(self._stub(_ORPHAN_ACK_STEP), self._st)
            raise
        except KvstoredError:
            raise  # the node answered: nothing was granted
        except BaseException:  # interrupted mid-call: acked with the next call or at close()
            if step.undo is not None:
                self._st.orphans.add(*grant_ids(step))
            raise
        self._st.connected = True
        return response

    def _drive(self, gen: Op[T], deadline: float) -> T:
        send_value: Any = None
        throw_exc: BaseException | None = None
        while True:
            done, value = _ops.drive_step(gen, send_value, throw_exc)
            if done:
                return value
            send_value, throw_exc = None, None
            try:
                send_value = self._execute(value, deadline)
            except BaseException as exc:  # thrown into the op so it can release what it holds
                throw_exc = exc

    def _run(self, make_op: Callable[[float], Op[T]], timeout_s: float | None) -> T:
        self._session.enter()
        try:
            return self._run_entered(make_op, timeout_s)
        finally:
            self._session.leave()

    def _run_entered(self, make_op: Callable[[float], Op[T]], timeout_s: float | None,
                     first: Callable[[float], T | None] | None = None) -> T:
        """Run an operation with retries; ``first``: an attempt tried before the op
        (``fn(deadline)``: its result, or None to run the op; its error is retried as the
        op's own would be)."""
        deadline = self._st.deadline(timeout_s)
        attempt = 0
        retried: KvstoredError | None = None  # the error the last retry was for
        while True:
            try:
                if first is not None:
                    got = first(deadline)
                    first = None
                    if got is not None:
                        return got
                return self._drive(make_op(deadline), deadline)
            except KvstoredError as exc:
                if isinstance(exc, Unavailable):
                    self._st.invalidate()
                delay = _ops.retry_delay(exc, attempt, deadline)
                if delay is None:
                    raise _ops.final_error(exc, retried, deadline) from None
                retried = exc
            time.sleep(delay)
            attempt += 1

    def _fast(self, fn: Callable[..., T | None], timeout_s: float | None, *args: Any) -> T | None:
        """A DRAM hit answered in one native call (kvstored/client/_fastread.py), or None:
        take the general path. Counted as an operation (close() waits for it)."""
        if timeout_s is not None:
            _ops.check_timeout_s(timeout_s)
        session = self._session
        session.enter()
        try:
            return fn(self._st, session.is_live, *args)
        finally:
            session.leave()

    # ---- API ---------------------------------------------------------------------------------
    def put(
        self,
        keys: Sequence[bytes],
        values: Sequence[Any],
        *,
        metas: Sequence[bytes] | None = None,
        timeout_s: float | None = None,
        replicas: int | None = None,
    ) -> list[PutResult]:
        """Store blocks. Idempotent: the first complete writer of a key wins.

        Args:
            keys: block hashes (bytes, ``min_key_bytes``..``max_key_bytes`` long).
            values: one C-contiguous buffer per key (bytes, bytearray, numpy array...).
            metas: optional opaque metadata per key (<= 4 KiB each).
            replicas: replicas wanted per block, 1..8, on distinct nodes (distinct zones
                where nodes declare them), the node this client talks to first; None = the
                client's ``replicas``, else the node's default for the namespace
                (``[cluster] namespace_replicas`` / ``default_replicas``, 1). With more
                than one the node writes the others to peers before put returns
                (docs/cluster.md "Replicas").

        Returns:
            One :class:`PutResult` per key: ``stored`` True (stored now), False with no error
            (already present), or ``error`` (KeyInvalid, BlockTooLarge, NoCapacity, ...) for
            that key only; ``replicas_written`` / ``short`` / ``replica_error``: how many
            replicas it has, never fewer than asked silently.

        Raises:
            InvalidArgument: mismatched lengths, or ``keys``/``values``/``metas`` is not a
            sequence (raised before any RPC; a meta that is not bytes is that item's
            ``PutResult.error``). Unavailable, DeadlineExceeded: the node could
            not be reached / did not finish in time. Draining: the node is shutting down.
        """
        def make_op(d: float) -> Op[list[PutResult]]:
            return _ops.op_put(self._st, keys, values, metas, d, replicas)

        if metas is not None or replicas is not None:
            return self._run(make_op, timeout_s)
        self._session.enter()
        try:  # a steady shm put in one call first (kvstored/client/_fastput.py), else the op
            return self._run_entered(make_op, timeout_s, self._fast_put(keys, values))
        finally:
            self._session.leave()

    def _fast_put(self, keys: Sequence[bytes], values: Sequence[Any],
                  ) -> Callable[[float], list[PutResult] | None]:
        st = self._st

        def first(deadline: float) -> list[PutResult] | None:
            return _fastput.put(st, self._session.live_id, keys, values, deadline,
                                self._start_orphan_acks)
        return first

    def _start_orphan_acks(self) -> None:
        _start_orphan_acks(self._stub(_ORPHAN_ACK_STEP), self._st)

    def get(self, keys: Sequence[bytes], *, timeout_s: float | None = None) -> list[bytes | None]:
        """Read blocks: per key its bytes, or None on a miss.

        Raises:
            KeyInvalid: a malformed key (index named). Unavailable, DeadlineExceeded.
            (A block of another namespace is a miss, never an error.)
        """
        got = self._fast(_fastread.read, timeout_s, keys, None)
        if got is not None:
            return got
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
        got = self._fast(_fastread.read_into, timeout_s, keys, buffers, return_meta)
        if got is not None:
            return got
        return self._run(
            lambda d: _ops.op_get_into(self._st, keys, buffers, return_meta, d), timeout_s
        )

    def lookup_prefix(self, keys: Sequence[bytes], *, timeout_s: float | None = None) -> int:
        """Number of leading blocks of a prefix present on the node (stops at the first miss).

        Never pins and never counts as a hit. Raises KeyInvalid, Unavailable, DeadlineExceeded.
        """
        n = self._fast(_fastread.lookup_prefix, timeout_s, keys)
        if n is not None:
            return n
        return len(self._run(lambda d: _ops.op_lookup_prefix_tiers(self._st, keys, d), timeout_s))

    def lookup_prefix_tiers(
        self, keys: Sequence[bytes], *, timeout_s: float | None = None
    ) -> list[Tier]:
        """The tier of each leading present block of a prefix (DRAM preferred)."""
        n = self._fast(_fastread.lookup_prefix, timeout_s, keys)
        if n is not None:
            return _fastread.tiers_of_lead(n)
        return self._run(lambda d: _ops.op_lookup_prefix_tiers(self._st, keys, d), timeout_s)

    def exists(self, keys: Sequence[bytes], *, timeout_s: float | None = None) -> list[bool]:
        """Per key: stored on the node (any tier)."""
        got = self._fast(_fastread.exists, timeout_s, keys)
        if got is not None:
            return got
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

    def connect(self, *, timeout_s: float | None = None) -> NodeInfo:
        """Describe the node, set up the transport and open this client's session now.

        What the first call would otherwise do inside its own deadline: a caller whose
        calls get a few milliseconds (an engine's prefix lookups) connects first, so no
        such call spends them on setup. Calling it again describes the node again and
        reopens the session only if it ended. Optional: every call connects as needed.

        Returns:
            The node description, with the transport in use.

        Raises:
            Unavailable: the node could not be reached (or the client is closed).
            DeadlineExceeded: it did not answer in time (a session still opening stays
                open: the next call takes it).
        """
        return self._run(lambda d: _ops.op_connect(self._st), timeout_s)

    def close(self) -> None:
        """End the session, close the channel, data-plane connections and the arena mapping.

        Idempotent. Waits for operations running on other threads (their copies must end
        before the node may free their space); new ones raise Unavailable. Also runs when the client is garbage
        collected and at interpreter exit
        (``weakref.finalize``); a process that dies without it still releases everything,
        because the node ends the session when the process's socket closes.
        """
        if self._closed:
            return
        self._closed = True
        self._session.close(wait=True)  # operations of other threads finish first
        self._finalizer()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        info = self._st.info
        return f"Client({self._st.address!r}, transport={info.transport if info else self._st.transport!r})"
