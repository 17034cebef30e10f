"""The node's put paths without a lease: reserve, copy in, commit or abort, a batch at a time.

::

    reserve_batch --> validate each item (its own error) --> TieredStore.reserve_many (one
                      lock, one extent) --> per item: Reservation | PutOutcome
    commit_items  --> TieredStore.commit_many (one lock, head last so it is most recent)
                      --> per item: stored / existed / error
    put_inline    --> the same reserve --> copy the request's values in --> commit
                      (gRPC Put, and the control channel's one-round-trip put of small batches)
    reserve_one   --> one item at a time, reserved once its payload arrives (the data plane)

The writer of these reservations is the node itself (a gRPC handler copying a request's
values, a data-plane thread receiving into them, a remote fill copying a peer's block), so
they carry no lease: the writer aborts only after its own copy returned (self-fenced). The
shared-memory put, whose writer is a client, takes the same reservations under a lease and
a session in kvstored/node/grants.py.

Per batch, not per key: the store lock and the transfer metrics are taken once; per key
there remain the item checks, the store's index insert and change-feed event, and one
response item. ``may_block=False`` (the event loop) reserves only what fits in free space
and answers :data:`~kvstored.tiers.base.NEEDS_IO` (nothing reserved, nothing counted) when
an eviction, which may demote to SSD, would be needed; the servicer then runs the call again
in its store executor.

Thread-safe (the store is).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvstored.errors import BlockTooLarge, KvstoredError, NoCapacity
from kvstored.keys import format_hash
from kvstored.node.limits import MAX_META_BYTES
from kvstored.tiers.base import NEEDS_IO
from kvstored.types import PutOutcome, Reservation

if TYPE_CHECKING:
    from kvstored.node.limits import DrainGate, RequestLimits
    from kvstored.node.metrics import NodeMetrics
    from kvstored.tiers.tiered import TieredStore


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
"""One item of a reservation: reserved, or its final outcome (existed, or an error)."""


class LocalPuts:
    """Reserve / commit / abort and the inline put of one node (see the module docstring).

    Args:
        store: the block store (thread-safe).
        limits: the request limits (item checks, item error counts).
        gate: the drain gate (a draining node refuses new puts).
        metrics: where to count transfers; None = nowhere.
    """

    def __init__(
        self, store: TieredStore, limits: RequestLimits, gate: DrainGate,
        metrics: NodeMetrics | None,
    ) -> None:
        self._store = store
        self._limits = limits
        self._gate = gate
        self._metrics = metrics

    def reserve_items(
        self,
        items: Sequence[tuple[bytes, int, bytes]],
        namespace_id: bytes,
        *,
        copy: bool = False,
        spare_only: bool = False,
    ) -> list[Reservation | PutOutcome]:
        """Validate and reserve each item (no lease): a Reservation, or the item's outcome.

        A key repeated within the batch is an ok no-op after its first (valid) occurrence:
        first writer wins, as across batches. ``copy``: the items are remote-fill copies of
        blocks a peer holds (``TieredStore.reserve(copy=True)``: a copy never evicts a block
        the pool holds nowhere else; no room is the item's NoCapacity, not counted as an
        item error). ``spare_only``: new replicas of blocks another node holds (a master's
        COPY), kept as originals, with room made as for a copy only
        (``TieredStore.reserve(spare_only=True)``; no room is the item's NoCapacity).

        The caller must commit (``commit_reserved``) or abort (``abort_reserved``) every
        returned Reservation; if this raises, what it reserved is aborted.
        """
        out: list[Reservation | PutOutcome] = []
        seen: set[bytes] = set()
        try:
            for i, (key, size, meta) in enumerate(items):
                out.append(self.reserve_one(i, key, size, meta, namespace_id, seen=seen,
                                            copy=copy, spare_only=spare_only))
        except BaseException:
            self.abort_reserved(out)
            raise
        return out

    def reserve_one(
        self, index: int, key: bytes, size_bytes: int, meta: bytes, namespace_id: bytes,
        *, seen: set[bytes] | None = None, copy: bool = False,
        handoff_age_s: float | None = None, spare_only: bool = False,
        spare_or_redundant: bool = False,
    ) -> Reservation | PutOutcome:
        """Validate and reserve item ``index`` of a batch (no lease).

        Used by the data plane to reserve each item only once its payload starts arriving.

        Returns:
            A Reservation the caller must commit or abort, or the item's outcome (already
            stored, or its own error, counted in metrics). ``seen`` (the batch's keys so far)
            makes a later duplicate of a key in the same batch an ok no-op: first writer wins
            within a batch too. ``handoff_age_s``: a peer's pool-LRU hand-off
            (``TieredStore.reserve``); its refusal (NoCapacity) is the item's outcome, not
            counted as an item error. ``spare_or_redundant``: a peer's spill or replica
            PUT (PUT_FLAG_SPARE; ``TieredStore.reserve``): room only that drops no sole
            copy; its refusal (NoCapacity) is quiet too.
        """
        limits = self._limits
        err = limits.put_item_error(index, key, size_bytes, meta)
        if err is not None:
            return PutOutcome(False, limits.count_item_error(err))
        if seen is not None:
            if key in seen:
                return PutOutcome(False)
            seen.add(key)
        try:
            if spare_only:
                res = self._store.reserve(key, size_bytes, namespace_id=namespace_id,
                                          meta=meta, spare_only=True)
            elif spare_or_redundant:
                res = self._store.reserve(key, size_bytes, namespace_id=namespace_id,
                                          meta=meta, spare_or_redundant=True)
            else:
                res = self._store.reserve(key, size_bytes, namespace_id=namespace_id,
                                          meta=meta, copy=copy, handoff_age_s=handoff_age_s)
        except NoCapacity as exc:
            quiet = copy or spare_only or spare_or_redundant or handoff_age_s is not None
            return PutOutcome(False, exc if quiet else limits.count_item_error(exc))
        except KvstoredError as exc:
            return PutOutcome(False, limits.count_item_error(exc))
        return PutOutcome(False) if res is None else res

    def commit_reserved(self, items: Sequence[Reservation | PutOutcome]) -> list[PutOutcome]:
        """Commit every Reservation among ``items`` (head first, so the head is most recent)."""
        reservations = [x for x in items if isinstance(x, Reservation)]
        flags = iter(self._store.commit_many(reservations))
        return [PutOutcome(next(flags)) if isinstance(x, Reservation) else x for x in items]

    def abort_reserved(self, items: Sequence[object]) -> None:
        """Abort every Reservation among ``items`` (idempotent)."""
        for x in items:
            if isinstance(x, Reservation):
                self._store.abort(x)

    def reserve_batch(
        self, items: Sequence[tuple[bytes, int, bytes]], namespace_id: bytes, may_block: bool
    ) -> tuple[list[ReservedItem], int, bool] | object:
        """Validate and reserve a batch (no lease): ``(items, bytes reserved, any reserved)``,
        or NEEDS_IO (``may_block=False``: nothing reserved or counted).

        The caller commits (:meth:`commit_items`) or aborts every Reservation returned.

        Raises:
            Draining: the node is shutting down (nothing reserved).
        """
        limits = self._limits
        cfg = limits.cfg
        lo, hi = max(cfg.min_key_bytes, 1), cfg.max_key_bytes
        store_max = self._store.max_block_bytes
        max_block = min(cfg.max_block_bytes, store_max)
        errors: list[tuple[int, KvstoredError]] = []
        valid: list[int] = []
        for i, (key, size, meta) in enumerate(items):
            if lo <= len(key) <= hi and 0 <= size <= max_block and len(meta) <= MAX_META_BYTES:
                valid.append(i)
                continue
            err = limits.put_item_error(i, key, size, meta)
            if err is None and size > store_max:
                err = BlockTooLarge(
                    f"block #{i} (key {format_hash(key)}) is {size} bytes; the store's limit is "
                    f"{store_max} bytes"
                )
            if err is None:
                valid.append(i)
            else:
                errors.append((i, err))
        with self._gate.put_in_flight():
            got = self._store.reserve_many(
                items if len(valid) == len(items) else [items[i] for i in valid],
                namespace_id=namespace_id, may_block=may_block,
            )
        if got is NEEDS_IO:
            return NEEDS_IO
        assert isinstance(got, list)
        out: list[ReservedItem] = [EXISTED] * len(items)
        for i, err in errors:
            out[i] = PutOutcome(False, limits.count_item_error(err))
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
                out[i] = PutOutcome(False, limits.count_item_error(r))
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
                batch needs an eviction (see :meth:`reserve_batch`).

        Returns:
            Per item, in order: stored, already present, or its own error (or NEEDS_IO).

        Raises:
            Draining: the node is shutting down.
            BatchTooLarge, InvalidArgument: for the whole call.
        """
        self._limits.check_batch(len(items))
        self._limits.check_namespace_id(namespace_id)
        with self._gate.put_in_flight():
            got = self.reserve_batch([(k, len(v), m) for k, v, m in items], namespace_id,
                                     may_block)
            if got is NEEDS_IO:
                return NEEDS_IO
            reserved: list[ReservedItem]
            num_bytes: int
            reserved, num_bytes, _ = got  # type: ignore[misc]  # got is not NEEDS_IO (an object sentinel) here
            try:
                for (_, value, _), r in zip(items, reserved, strict=True):
                    if isinstance(r, Reservation):
                        r.view[:] = value
            except BaseException:
                self.abort_reserved(reserved)
                raise
            out = self.commit_items(reserved)
        if self._metrics is not None:
            self._metrics.count_transfer("grpc", "in", sum(1 for o in out if o.stored), num_bytes)
        return out

    def commit_items(self, items: Sequence[ReservedItem]) -> list[PutOutcome]:
        """Commit the Reservations among ``items`` (one store call); per item its outcome
        (the shared :data:`STORED` / :data:`EXISTED`, or the item's own outcome)."""
        reservations = [x for x in items if isinstance(x, Reservation)]
        flags = self._store.commit_many(reservations)
        if len(reservations) == len(items):
            return [STORED if f else EXISTED for f in flags]
        it = iter(flags)
        return [
            (STORED if next(it) else EXISTED) if isinstance(x, Reservation) else x
            for x in items
        ]


__all__ = [
    "EXISTED", "MAX_META_BYTES", "STORED", "LocalPuts", "PutOutcome", "ReserveOutcome",
    "ReservedItem",
]
