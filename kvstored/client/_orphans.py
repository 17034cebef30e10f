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
pending here and is sent again before this client's next RPC and at ``close()``.

Thread-safe.
"""

from __future__ import annotations

import itertools
import threading

from kvstored.v1 import node_pb2 as pb

ORPHAN_ACK_TIMEOUT_S = 2.0
"""Time given to one orphan ack RPC (a failed one stays pending for the next call)."""

_request_ids = itertools.count(1)
_request_ids_lock = threading.Lock()


def next_request_id() -> int:
    """A new ``request_id`` for a ReservePut/PinBlocks request (unique in this process)."""
    with _request_ids_lock:
        return next(_request_ids)


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
