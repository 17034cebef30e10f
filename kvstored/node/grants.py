"""Grants: every lease-bearing operation of a node, and the rule that a grant needs a session.

A *grant* is arena space handed to a holder the node does not run itself (a shared-memory
client copying into a reservation or out of a pin): pin, reserve, commit, release, orphan
acks, the reaper's quarantine, session ends and shutdown all live here, over one
:class:`~kvstored.node.sessions.LeaseBook`. The fencing rule is in kvstored/node/sessions.py:
space is freed only on the holder's ack or when its session ended; a lapsed lease
(:meth:`Grants.reap_expired`, called periodically by the daemon) only moves the space into
quarantine. Ids are random 63-bit numbers, so an id from before a restart never names
something of the new process.

::

    reserve_put --> id -> Lease([Reservation | PutOutcome ...]) --> commit_put (or abort)
    pin_blocks  --> id -> Lease([PinnedBlock ...])              --> release_pins
                      | lease lapses: quarantine (nothing freed) | session ends: release all

**A grant needs a session** (:meth:`Grants.require_session`), checked before anything else,
for every caller (the gRPC servicer, the control channel, in-process code and tests): if a
grant's lease lapses, it is quarantined until the holder acknowledges it or its session
ends, and only then can the space be reused without a late copy touching it. A caller
without a session could never be known to be gone, so its lapsed grants would stay
quarantined for good (a crashed sessionless caller would hold its DRAM until a
restart).

The node's own writers and readers (the data plane, the inline put and get, a remote fill)
take no lease: kvstored/node/local_put.py and kvstored/node/reads.py.

Locking: the lease book has its own lock, never held while calling the store, so it cannot
deadlock against the store's lock.

Thread-safe: called from the event loop, the gRPC executor threads and the store executor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import structlog

from kvstored.errors import (
    InvalidArgument,
    KvstoredError,
    LeaseExpired,
    NotFound,
    Unavailable,
)
from kvstored.node.local_put import EXISTED, STORED, ReservedItem, ReserveOutcome
from kvstored.node.sessions import NO_SESSION, Lease, LeaseBook, LeaseState
from kvstored.tiers.base import NEEDS_IO
from kvstored.types import PinnedBlock, PutOutcome, Reservation

if TYPE_CHECKING:
    from kvstored.node.limits import DrainGate, RequestLimits
    from kvstored.node.local_put import LocalPuts
    from kvstored.node.metrics import NodeMetrics
    from kvstored.node.reads import Reads

log = structlog.get_logger(__name__)


def require_session(method: str, session_id: int) -> None:
    """Refuse a grant without a session.

    Args:
        method: the operation, as named in the error (``"PinBlocks"``, ``"ReservePut"``).
        session_id: the caller's session (:meth:`Grants.open_session`).

    Raises:
        InvalidArgument: ``session_id`` is 0 (no session).
    """
    if session_id == NO_SESSION:
        raise InvalidArgument(
            f"{method} grants shared-memory space and needs a session: open one with "
            "OpenSession (a stream; the session ends with it) and pass its session_id (got 0)"
        )


class Grants:
    """Pins and reservations under leases and sessions (see the module docstring).

    Args:
        limits: the request limits (batch, namespace, epoch, the lease a client may ask for).
        gate: the drain gate (a draining node refuses new pins and reservations).
        reads: the read paths (pins the keys; unpins released grants).
        puts: the lease-free put paths (reserves the items; commits or aborts released
            grants).
        leases: the lease book (sessions, active leases, quarantine).
        metrics: where to count transfers and lapsed leases; None = nowhere.

    Attributes:
        test_hook: None, or ``fn(event)`` called at ``"reserve_put_held"`` / ``"pin_blocks_held"``
            once a reservation/pin is recorded and before the call returns (tests hold an RPC
            in flight there); costs one attribute test when unset.
    """

    def __init__(
        self,
        *,
        limits: RequestLimits,
        gate: DrainGate,
        reads: Reads,
        puts: LocalPuts,
        leases: LeaseBook,
        metrics: NodeMetrics | None,
    ) -> None:
        self._limits = limits
        self._gate = gate
        self._reads = reads
        self._puts = puts
        self.leases = leases
        self._metrics = metrics
        self.test_hook: Callable[[str], None] | None = None

    # ---- grants ----------------------------------------------------------------------------
    def pin_blocks(
        self,
        keys: Sequence[bytes],
        namespace_id: bytes,
        *,
        session_id: int,
        lease_ms: int = 0,
        epoch: int = 0,
        may_block: bool = True,
        request_id: int = 0,
    ) -> tuple[int, list[PinnedBlock | None | KvstoredError]]:
        """Pin blocks for the shared-memory get path, under a lease and a session.

        Returns:
            ``(pin_id, per key: PinnedBlock | None (miss) | error)``; ``pin_id`` is 0 when
            nothing was pinned. Release with :meth:`release_pins`; a pin whose lease lapses
            stays pinned (quarantined) until released or its session ends. With
            ``may_block=False`` (the event loop's fast path) a block that needs disk I/O makes
            every item ``NEEDS_IO`` and nothing is pinned (see ``TieredStore.pin_many``).

        Raises:
            InvalidArgument: no session (``session_id`` 0); a namespace id too long.
            Draining (the node is shutting down), Unavailable (epoch mismatch; session not
            open), BatchTooLarge, NoCapacity (the session's quarantine is over its bound).
        """
        require_session("PinBlocks", session_id)
        self._gate.check_reads_allowed()
        limits = self._limits
        limits.check_epoch(epoch)
        limits.check_batch(len(keys))
        limits.check_namespace_id(namespace_id)
        self.leases.check_session(session_id)
        # cut: the shm client reads again from the first NoCapacity after the first key
        got = self._reads.pin_items(keys, namespace_id, may_block=may_block, cut=True)
        pinned = [b for b in got if isinstance(b, PinnedBlock)]
        if not pinned:
            return 0, got
        num_bytes = sum(b.size_bytes for b in pinned)
        pin_id = self._record_lease("pin", session_id, list(pinned), num_bytes, lease_ms, request_id)
        if self._metrics is not None:
            self._metrics.count_transfer("shm", "out", len(pinned), num_bytes)
        return pin_id, got

    def reserve_put(
        self,
        items: Sequence[tuple[bytes, int, bytes]],
        namespace_id: bytes,
        *,
        session_id: int,
        lease_ms: int = 0,
        epoch: int = 0,
        request_id: int = 0,
    ) -> tuple[int, list[ReserveOutcome]]:
        """Reserve arena space for the shared-memory put path, under a lease and a session.

        Returns:
            ``(reservation_id, outcomes)``; ``reservation_id`` is 0 when nothing was reserved
            (every item existed or failed). Commit or abort with :meth:`commit_put`; a lease
            not committed within ``lease_ms`` is quarantined by :meth:`reap_expired` (freed on
            the client's CommitPut or when its session ends, never on a timer).

        Raises:
            InvalidArgument: no session (``session_id`` 0); a namespace id too long.
            Draining, Unavailable (epoch mismatch; session not open), BatchTooLarge,
            NoCapacity (the session's quarantine is over its bound).
        """
        rid, got = self.reserve_put_items(
            items, namespace_id, lease_ms=lease_ms, epoch=epoch, session_id=session_id,
            request_id=request_id,
        )
        assert isinstance(got, list)
        return rid, [
            ReserveOutcome(offset=x.offset)
            if isinstance(x, Reservation)
            else ReserveOutcome(exists=x.error is None, error=x.error)
            for x in got
        ]

    def reserve_put_items(
        self,
        items: Sequence[tuple[bytes, int, bytes]],
        namespace_id: bytes,
        *,
        session_id: int,
        lease_ms: int = 0,
        epoch: int = 0,
        request_id: int = 0,
        may_block: bool = True,
    ) -> tuple[int, list[ReservedItem] | object]:
        """:meth:`reserve_put` without the per-item outcome objects (the servicer's form).

        Args:
            may_block: False (the event loop): reserve only from free space, else answer
                ``(0, NEEDS_IO)`` with nothing reserved, recorded or counted.

        Returns:
            ``(reservation_id, items)``: per item a Reservation (write at its offset), or its
            PutOutcome (``error`` None: stored already or repeated in the batch). Or
            ``(0, NEEDS_IO)``.

        Raises:
            As :meth:`reserve_put`.
        """
        require_session("ReservePut", session_id)
        limits = self._limits
        limits.check_epoch(epoch)
        limits.check_batch(len(items))
        limits.check_namespace_id(namespace_id)
        self.leases.check_session(session_id)
        got = self._puts.reserve_batch(items, namespace_id, may_block)
        if got is NEEDS_IO:
            return 0, NEEDS_IO
        out: list[ReservedItem]
        num_bytes: int
        reserved: bool
        out, num_bytes, reserved = got  # type: ignore[misc]  # got is not NEEDS_IO (an object sentinel) here
        if not reserved:
            return 0, out
        rid = self._record_lease(
            "reservation", session_id, out, num_bytes, lease_ms, request_id  # type: ignore[arg-type]  # a lease holds any item list
        )
        return rid, out

    def _record_lease(
        self,
        kind: str,
        session_id: int,
        items: list[object],
        num_bytes: int,
        lease_ms: int,
        request_id: int = 0,
    ) -> int:
        lease_id = self.leases.add(
            kind, session_id, items, num_bytes, self._limits.lease_s(lease_ms), request_id
        )
        if lease_id is None:  # nobody will ack: the session ended, or the client gave up on it
            self._release(kind, items)
            if self.leases.is_open(session_id):
                raise LeaseExpired(
                    f"request {request_id} of session {session_id} arrived after the client "
                    "acknowledged it never received its answer; nothing was granted"
                )
            raise Unavailable(f"session {session_id} ended during the call; open a new session")
        if self.test_hook is not None:
            self.test_hook(f"{'reserve_put' if kind == 'reservation' else 'pin_blocks'}_held")
        return lease_id

    def _release(self, kind: str, items: Sequence[object]) -> None:
        if kind == "pin":
            self._reads.unpin_all(items)
        else:
            self._puts.abort_reserved(items)

    # ---- acks ------------------------------------------------------------------------------
    def commit_put(self, reservation_id: int, *, abort: bool = False) -> list[PutOutcome]:
        """Commit (or abort) a reservation of :meth:`reserve_put` after the client wrote it.

        Either call is the client's acknowledgement: a quarantined reservation (lease lapsed)
        is freed by it, and a commit of one is refused.

        Returns:
            Per item of the original ReservePut, in order.

        Raises:
            LeaseExpired: the lease lapsed before the commit (or the session ended); nothing
                was stored and the space is freed now.
            NotFound: unknown id (already committed/aborted, or from before a restart).
        """
        state, lease = self.leases.take("reservation", reservation_id)
        if state is LeaseState.UNKNOWN:
            raise NotFound(
                f"reservation {reservation_id} is unknown: already committed or aborted, or "
                "the node restarted"
            )
        if lease is None:  # released when its session ended
            if abort:
                return []
            raise LeaseExpired(
                f"reservation {reservation_id} was already released (its lease lapsed or its "
                "session ended); nothing was stored, retry the put"
            )
        items = lease.items
        puts = self._puts
        if state is LeaseState.QUARANTINED and not abort:
            puts.abort_reserved(items)  # acked: the client's copy is over
            raise LeaseExpired(
                f"reservation {reservation_id} outlived its lease before the commit; nothing "
                "was stored, retry the put"
            )
        if abort:
            puts.abort_reserved(items)
            return [EXISTED if isinstance(x, Reservation) else x for x in items]  # type: ignore[misc]  # a reservation lease's items are Reservations and PutOutcomes
        out = puts.commit_items(items)  # type: ignore[arg-type]  # a reservation lease's items are Reservations and PutOutcomes
        if self._metrics is not None:
            self._metrics.count_transfer(
                "shm", "in", sum(o is STORED for o in out),
                sum(x.size_bytes for x in items if isinstance(x, Reservation)),
            )
        return out

    def release_pins(self, pin_ids: Sequence[int]) -> int:
        """Release pins of :meth:`pin_blocks`; unknown ids are ignored.

        Returns:
            How many of ``pin_ids`` were held in time and are released now (lapsed ones are
            released too: see :meth:`release_pins_report`).
        """
        return self.release_pins_report(pin_ids)[0]

    def release_pins_report(self, pin_ids: Sequence[int]) -> tuple[int, list[int]]:
        """Release pins of :meth:`pin_blocks` (the reader's ack); unknown ids are ignored.

        Returns:
            ``(number released now that were in time, ids whose lease had lapsed)``: a copy
            out of a lapsed pin must be reported as LeaseExpired by the reader. Lapsed pins
            were kept pinned (quarantined) until now, so their bytes never changed.
        """
        released: list[Lease] = []
        expired: list[int] = []
        num_in_time = 0
        for pin_id in pin_ids:
            state, lease = self.leases.take("pin", pin_id)
            if lease is not None:
                released.append(lease)
            if state is LeaseState.HELD:
                num_in_time += 1
            elif state is not LeaseState.UNKNOWN:
                expired.append(pin_id)
        if len(released) == 1:
            self._reads.unpin_all(released[0].items)
        elif released:
            self._reads.unpin_all([b for lease in released for b in lease.items])
        return num_in_time, expired

    def release_orphans(self, session_id: int, request_ids: Sequence[int]) -> int:
        """The client never received these ReservePut/PinBlocks answers: free their grants.

        The client's acknowledgement for a granting call that failed without a response
        (deadline, dropped connection): it never learnt the offsets, so it cannot be copying
        into or out of the space, active or quarantined. Idempotent; see
        :meth:`LeaseBook.release_orphans`.

        Returns:
            Number of grants freed now.
        """
        leases = self.leases.release_orphans(session_id, list(request_ids))
        for lease in leases:
            self._release(lease.kind, lease.items)
        if leases:
            log.info(
                "orphan_grants_released", session_id=session_id, num_leases=len(leases),
                num_bytes=sum(x.num_bytes for x in leases),
            )
        return len(leases)

    # ---- lapses, sessions, shutdown --------------------------------------------------------
    def reap_expired(self) -> int:
        """Quarantine pins and reservations whose lease ran out (stalled or dead clients).

        Nothing is freed here: the holder may still be copying (fencing rule,
        kvstored/node/sessions.py). Its ack or the end of its session frees the space.

        Returns:
            Number of leases quarantined now.
        """
        moved = self.leases.quarantine_lapsed()
        for lease in moved:
            log.info(
                "lease_expired", kind=lease.kind, lease_id=lease.lease_id,
                session_id=lease.session_id, num_blocks=len(lease.items),
                quarantined_bytes=lease.num_bytes,
            )
            if self._metrics is not None:
                self._metrics.count_lease_expired(lease.kind)
        return len(moved)

    def open_session(self, peer: str = "") -> int:
        """Open a client session (OpenSession); its id fences what it pins and reserves."""
        sid = self.leases.open_session(peer)
        log.debug("session_opened", session_id=sid, peer=peer)
        return sid

    def close_session(self, session_id: int) -> None:
        """The client's session ended (stream gone): release everything it held, at once."""
        leases = self.leases.close_session(session_id)
        for lease in leases:
            self._release(lease.kind, lease.items)
        if leases:
            log.info("session_closed_with_leases", session_id=session_id, num_leases=len(leases))

    def quarantined_bytes(self) -> int:
        """Bytes in quarantine over all sessions."""
        return self.leases.quarantined_bytes()

    def release_all(self) -> None:
        """Drop every lease (shutdown): unpin pins, abort reservations, quarantine included."""
        for lease in self.leases.release_all():
            self._release(lease.kind, lease.items)
