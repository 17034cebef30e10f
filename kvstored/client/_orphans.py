"""Acks for orphaned grants: ReservePut/PinBlocks calls whose answer never arrived.

A granting call (``Call.undo`` set) that fails without a response (deadline, dropped
connection, the client was stopped while it was in flight) may still have been granted on
the node: space this client never learnt the offsets of, so it can neither copy into it nor
release it by id. Each granting request carries a ``request_id`` (:func:`next_request_id`,
unique in this process, hence per session); after such a failure the driver records it here
and sends the acknowledgement "I never received request R" as
``ReleasePins(session_id, orphan_request_ids)``. The node frees whatever R granted, active or
quarantined, or remembers R so that a request still in transit is refused when it arrives
(kvstored/node/sessions.py, "Orphaned grants"). The ack is idempotent; one that fails stays
pending here and is sent again with this client's next RPC and at ``close()``.

Acks go in the background (:meth:`OrphanAcks.send_in_background`): the driver starts the
ack RPC and does not wait for its answer, so no call of this client returns later than its
deadline because of an ack (a stopped node would otherwise hold every call for the ack's own
timeout). :class:`Background` holds the RPCs so started until they end; ``close()`` waits for
them (each bounded by its own timeout) before it ends the session.

Thread-safe.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any, Protocol

import grpc

from kvstored.client import _hooks
from kvstored.v1 import node_pb2 as pb

ORPHAN_ACK_TIMEOUT_S = 2.0
"""Time given to one orphan ack RPC (a failed one stays pending for the next call)."""
PAST_DEADLINE_S = 0.05
"""Most time a call waits past its deadline for its own release or abort; a release still
unanswered then goes on in the background (:class:`Background`)."""

_request_ids = itertools.count(1)
_request_ids_lock = threading.Lock()


def next_request_id() -> int:
    """A new ``request_id`` for a ReservePut/PinBlocks request (unique in this process)."""
    with _request_ids_lock:
        return next(_request_ids)


class RpcFuture(Protocol):
    """What :class:`Background` needs of an RPC in flight: a ``grpc.Future`` or an
    ``asyncio.Future`` (a callback when it ends, and how it ended)."""

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        """Call ``fn(future)`` once the RPC ended (at once if it already has)."""

    def cancelled(self) -> bool:
        """True if the RPC was cancelled before it got an answer."""


def failed(fut: Any) -> bool:
    """True if the ended RPC ``fut`` (grpc or asyncio future) got no answer."""
    return bool(fut.cancelled() or fut.exception() is not None)


class Background:
    """RPCs this client started and does not wait for: orphan acks, late releases.

    ``close()`` of the client waits for them (:meth:`futures`) before it ends the session.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._futures: set[Any] = set()

    def add(self, fut: RpcFuture, on_done: Callable[[Any], object] | None = None) -> None:
        """Hold ``fut`` until it ends; then call ``on_done(fut)`` (on whatever thread ends it)."""
        with self._lock:
            self._futures.add(fut)

        def done(f: Any) -> None:
            with self._lock:
                self._futures.discard(f)
            if on_done is not None:
                on_done(f)

        fut.add_done_callback(done)

    def futures(self) -> list[Any]:
        """The RPCs still in flight."""
        with self._lock:
            return list(self._futures)


class OrphanAcks:
    """Request ids whose grant this client never received, by session, until acked."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, list[int]] = {}

    def add(self, session_id: int, request_id: int) -> None:
        """Record that request ``request_id`` of ``session_id`` got no answer (0 = no id)."""
        if not request_id:
            return
        with self._lock:
            self._pending.setdefault(session_id, []).append(request_id)

    def __bool__(self) -> bool:
        with self._lock:
            return bool(self._pending)

    def pending(self) -> dict[int, list[int]]:
        """A copy of the pending request ids by session (for tests and logs)."""
        with self._lock:
            return {sid: list(ids) for sid, ids in self._pending.items()}

    def take(self) -> list[pb.ReleasePinsRequest]:
        """Remove every pending id: one ReleasePins ack request per session, to send now.

        Give a request whose RPC failed back with :meth:`put_back`.
        """
        with self._lock:
            pending, self._pending = self._pending, {}
        return [
            pb.ReleasePinsRequest(session_id=sid, orphan_request_ids=ids)
            for sid, ids in pending.items()
        ]

    def put_back(self, request: pb.ReleasePinsRequest) -> None:
        """An ack that failed: keep its ids pending for the next call."""
        for request_id in request.orphan_request_ids:
            self.add(request.session_id, request_id)

    def send_in_background(
        self, start: Callable[[pb.ReleasePinsRequest], RpcFuture], background: Background
    ) -> None:
        """Start the ack RPC of every pending id and return without waiting for its answer.

        Args:
            start: starts one ReleasePins RPC (with :data:`ORPHAN_ACK_TIMEOUT_S`) and returns
                its future (``stub.future(req, ...)``, or an asyncio task).
            background: holds the started RPCs; an ack that fails goes back to pending.

        The client hook ``orphan_ack`` fires here, on the caller's thread; a ``grpc.RpcError``
        it raises counts as the ack's RPC failing (the ids stay pending).
        """
        for req in self.take():
            try:
                if _hooks._hook is not None:
                    _hooks.fire(
                        "orphan_ack", session_id=req.session_id,
                        request_ids=list(req.orphan_request_ids),
                    )
                fut = start(req)
            except grpc.RpcError:  # the node is unreachable: the next call sends it
                self.put_back(req)
                continue
            except BaseException:
                self.put_back(req)
                raise
            background.add(fut, self._put_back_if_failed(req))

    def _put_back_if_failed(self, req: pb.ReleasePinsRequest) -> Callable[[Any], None]:
        def done(fut: Any) -> None:
            if failed(fut):  # the next call, or close(), sends it again
                self.put_back(req)

        return done
