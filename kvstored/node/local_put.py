"""The node's local put paths, a batch at a time (a NodeCore mixin).

::

    reserve_put --> validate each item (its own error) --> TieredStore.reserve_many (one
                    lock, one extent) --> Lease([Reservation | PutOutcome ...]) --> id
    commit_put  --> LeaseBook.take (the holder's ack) --> TieredStore.commit_many (one lock,
                    head last so it is most recent) --> per item: stored / existed / error
    put_inline  --> the same reserve (no lease) --> copy the request's values in --> commit
                    (gRPC Put, and the control channel's one-round-trip put of small batches)

Per batch, not per key: the store lock, the lease record and the transfer metrics are taken
once; per key there remain the item checks, the store's index insert and change-feed event,
and one response item. ``may_block=False`` (the event loop) reserves only what fits in free
space and answers :data:`~kvstored.tiers.base.NEEDS_IO` (nothing reserved, nothing counted)
when an eviction, which may demote to SSD, would be needed; the servicer then runs the call
again in its store executor.

Safety is unchanged (fencing: kvstored/node/sessions.py): a reservation is invisible to
readers until its commit; a lease that lapses quarantines its space, which only the client's
ack (CommitPut / abort, answered LeaseExpired) or its session's end frees; an orphaned
grant is freed by the client's orphan ack.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvstored.errors import BlockTooLarge, KvstoredError, LeaseExpired, NotFound
from kvstored.node.sessions import NO_SESSION, LeaseBook, LeaseState
from kvstored.tiers.base import NEEDS_IO
from kvstored.types import Reservation

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from kvstored.config import NodeConfig
    from kvstored.tiers.tiered import TieredStore

MAX_META_BYTES = 4096
"""Largest per-block metadata accepted, bytes."""


@dataclass(frozen=True, slots=True)
class PutOutcome:
    """Result of storing one block: ``stored`` False with no error = it already existed."""

    stored: bool
    error: KvstoredError | None = None


@dataclass(frozen=True, slots=True)
class ReserveOutcome:
    """Result of reserving one block: an arena offset to write at, already stored, or an error."""

    offset: int = 0
    exists: bool = False
    error: KvstoredError | None = None


STORED = PutOutcome(True)
EXISTED = PutOutcome(False)
"""Shared outcomes (frozen): no object per key on the hot path."""

ReservedItem = Reservation | PutOutcome
"""One item of a reservation lease: reserved, or its final outcome (existed, or an error)."""


class ShmPutMixin:
    """ReservePut / CommitPut of :class:`~kvstored.node.core.NodeCore` (see the module docstring)."""

    store: TieredStore
    cfg: NodeConfig
    leases: LeaseBook
    check_epoch: Callable[[int], None]
    check_batch: Callable[[int], None]
    check_namespace_id: Callable[[bytes], None]
    put_in_flight: Callable[[], AbstractContextManager[None]]
    put_item_error: Callable[[int, bytes, int, bytes], KvstoredError | None]
    _count_item_error: Callable[[KvstoredError], KvstoredError]
    _record_lease: Callable[..., int]
    abort_reserved: Callable[[Sequence[object]], None]
    count_transfer: Callable[[str, str, int, int], None]

    def reserve_put(
        self,
        items: Sequence[tuple[bytes, int, bytes]],
        namespace_id: bytes,
        *,
        lease_ms: int = 0,
        epoch: int = 0,
        session_id: int = NO_SESSION,
        request_id: int = 0,
    ) -> tuple[int, list[ReserveOutcome]]:
        """Reserve arena space for the shared-memory put path, under a lease and a session.

        Returns:
            ``(reservation_id, outcomes)``; ``reservation_id`` is 0 when nothing was reserved
            (every item existed or failed). Commit or abort with :meth:`commit_put`; a lease
            not committed within ``lease_ms`` is quarantined by :meth:`reap_expired` (freed on
            the client's CommitPut or when its session ends, never on a timer).

        Raises:
            Draining, Unavailable (epoch mismatch; session not open), BatchTooLarge,
            InvalidArgument, NoCapacity (the session's quarantine is over its bound).
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
        lease_ms: int = 0,
        epoch: int = 0,
        session_id: int = NO_SESSION,
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
        self.check_epoch(epoch)
        self.check_batch(len(items))
        self.check_namespace_id(namespace_id)
        self.leases.check_session(session_id)
        got = self._reserve_batch(items, namespace_id, may_block)
        if got is NEEDS_IO:
            return 0, NEEDS_IO
        out, num_bytes, reserved = got  # type: ignore[misc]
        if not reserved:
            return 0, out
        rid = self._record_lease("reservation", session_id, out, num_bytes, lease_ms, request_id)
        return rid, out

    def _reserve_batch(
        self, items: Sequence[tuple[bytes, int, bytes]], namespace_id: bytes, may_block: bool
    ) -> tuple[list[ReservedItem], int, bool] | object:
        """Validate and reserve a batch (no lease): ``(items, bytes reserved, any reserved)``,
        or NEEDS_IO (``may_block=False``: nothing reserved or counted)."""
        cfg = self.cfg
        lo, hi = max(cfg.min_key_bytes, 1), cfg.max_key_bytes
        store_max = self.store.max_block_bytes
        max_block = min(cfg.max_block_bytes, store_max)
        errors: list[tuple[int, KvstoredError]] = []
        valid: list[int] = []
        for i, (key, size, meta) in enumerate(items):
            if lo <= len(key) <= hi and 0 <= size <= max_block and len(meta) <= MAX_META_BYTES:
                valid.append(i)
                continue
            err = self.put_item_error(i, key, size, meta)
            if err is None and size > store_max:
                err = BlockTooLarge(
                    f"block #{i} is {size} bytes; the store's limit is {store_max} bytes"
                )
            if err is None:
                valid.append(i)
            else:
                errors.append((i, err))
        with self.put_in_flight():
            got = self.store.reserve_many(
                items if len(valid) == len(items) else [items[i] for i in valid],
                namespace_id=namespace_id, may_block=may_block,
            )
        if got is NEEDS_IO:
            return NEEDS_IO
        assert isinstance(got, list)
        out: list[ReservedItem] = [EXISTED] * len(items)
        for i, err in errors:
            out[i] = PutOutcome(False, self._count_item_error(err))
        num_bytes = 0
        reserved = False
        for i, r in zip(valid, got, strict=True):
            if r is None:
                continue
            if isinstance(r, Reservation):
                out[i] = r
                num_bytes += r.size_bytes
                reserved = True
            else:
                out[i] = PutOutcome(False, self._count_item_error(r))
        return out, num_bytes, reserved

    def put_inline(
        self, items: Sequence[tuple[bytes, memoryview | bytes, bytes]], namespace_id: bytes,
        *, may_block: bool = True,
    ) -> list[PutOutcome] | object:
        """Store small values carried in the request (gRPC Put, the control channel's Put).

        The node copies each value into its reservation and commits the batch; nothing is
        leased (the node is the writer, and its copy returns before the commit).

        Args:
            may_block: False (the event loop): answer NEEDS_IO, storing nothing, when the
                batch needs an eviction (see :meth:`reserve_put_items`).

        Returns:
            Per item, in order: stored, already present, or its own error (or NEEDS_IO).

        Raises:
            Draining: the node is shutting down.
            BatchTooLarge, InvalidArgument: for the whole call.
        """
        self.check_batch(len(items))
        self.check_namespace_id(namespace_id)
        with self.put_in_flight():
            got = self._reserve_batch([(k, len(v), m) for k, v, m in items], namespace_id,
                                      may_block)
            if got is NEEDS_IO:
                return NEEDS_IO
            reserved, num_bytes, _ = got  # type: ignore[misc]
            try:
                for (_, value, _), r in zip(items, reserved, strict=True):
                    if isinstance(r, Reservation):
                        r.view[:] = value
            except BaseException:
                self.abort_reserved(reserved)
                raise
            out = self._commit_items(reserved)
        self.count_transfer("grpc", "in", sum(1 for o in out if o.stored), num_bytes)
        return out

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
        if state is LeaseState.QUARANTINED and not abort:
            self.abort_reserved(items)  # acked: the client's copy is over
            raise LeaseExpired(
                f"reservation {reservation_id} outlived its lease before the commit; nothing "
                "was stored, retry the put"
            )
        if abort:
            self.abort_reserved(items)
            return [EXISTED if isinstance(x, Reservation) else x for x in items]  # type: ignore[misc]
        out = self._commit_items(items)  # type: ignore[arg-type]
        self.count_transfer(
            "shm", "in", sum(o is STORED for o in out),
            sum(x.size_bytes for x in items if isinstance(x, Reservation)),
        )
        return out

    def _commit_items(self, items: Sequence[ReservedItem]) -> list[PutOutcome]:
        """Commit the Reservations among ``items`` (one store call); per item its outcome."""
        reservations = [x for x in items if isinstance(x, Reservation)]
        flags = self.store.commit_many(reservations)
        if len(reservations) == len(items):
            return [STORED if f else EXISTED for f in flags]
        it = iter(flags)
        return [
            (STORED if next(it) else EXISTED) if isinstance(x, Reservation) else x  # type: ignore[misc]
            for x in items
        ]


__all__ = [
    "EXISTED", "MAX_META_BYTES", "STORED", "PutOutcome", "ReserveOutcome", "ReservedItem",
    "ShmPutMixin",
]
