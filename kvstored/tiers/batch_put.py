"""Reserving a whole put batch under one lock: the shared-memory put's hot path.

A mixin of :class:`~kvstored.tiers.tiered.TieredStore`. ``reserve(key, ...)`` costs a lock,
the argument checks and two sorted-container updates of the allocator per block; a batch of
16 small blocks spent ~150 us there. :meth:`BatchPutMixin.reserve_many` takes the lock once,
checks the arguments once, and carves the batch out of **one** free extent when the arena
has one large enough (one allocator update instead of one per block)::

    one extent of sum(round_up(size_i)) bytes, best fit:
    | b0 (4K) | b1 (8K)     | b2 (4K) | ...      each block aligned at 4096, as if allocated
    base      base+4K       base+12K             alone; each is freed on its own later

The allocator keeps no per-allocation state (tiers/allocator.py), so a block carved out of
a batch extent is freed, evicted and coalesced exactly like one allocated alone. When no
single extent fits, each block is allocated on its own (``_allocate``: eviction, demotion).

The same invariants as :meth:`TieredStore.reserve`: a reserved block is invisible to readers
until committed; a block stored already (either tier) is an idempotent success with nothing
to write; ``may_block=False`` (the event loop) never waits for disk I/O: if any block would
need an eviction, nothing is reserved and the call answers :data:`NEEDS_IO` (call again with
``may_block=True`` from a thread that may block). Lock held while carving; released only by
``_allocate``'s demotions (transit.py).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvstored.errors import InvalidArgument, KeyInvalid, KvstoredError
from kvstored.tiers.base import NEEDS_IO
from kvstored.types import Reservation
from kvstored.tiers.ssd_format import store_key

if TYPE_CHECKING:
    from kvstored.tiers.dram import DramTier


class BatchPutMixin:
    """:meth:`reserve_many` for :class:`~kvstored.tiers.tiered.TieredStore`."""

    _lock: threading.Lock
    _dram: DramTier
    _reservations: dict[int, Any]
    _reservation_ids: Any
    _reserved_bytes: int
    arena: memoryview
    max_block_bytes: int

    def reserve_many(
        self,
        items: Sequence[tuple[bytes, int, bytes]],
        *,
        namespace_id: bytes = b"",
        may_block: bool = True,
    ) -> list[Reservation | KvstoredError | None] | object:
        """Reserve arena space for a batch of blocks of one namespace (a local put).

        Fill each ``reservation.view`` (outside any lock), then :meth:`commit_many` or
        :meth:`abort` each. A key repeated in the batch is reserved once (later occurrences
        are None: first writer wins within a batch too). The local put also unmarks a
        remote-fill copy of a key it finds stored (as ``reserve(copy=False)``).

        Args:
            items: ``(key, size_bytes, meta)`` per block, already validated by the caller
                (non-empty bytes key, ``0 <= size_bytes <= max_block_bytes``, bytes meta;
                NodeCore.put_item_error); anything else raises, reserving nothing.
            namespace_id: the blocks' namespace.
            may_block: False = never wait (for the event loop; see the module docstring).

        Returns:
            Per item: a Reservation the caller must commit or abort; None when the block is
            stored already (or repeated in the batch); or the item's error (NoCapacity,
            Unavailable once the store closed). Or :data:`NEEDS_IO` (``may_block=False``
            only): nothing was reserved or changed.

        Raises:
            InvalidArgument, KeyInvalid: an item the caller did not validate (nothing reserved).
            Unavailable: the store is closed.
        """
        if type(namespace_id) is not bytes:
            raise InvalidArgument(f"namespace_id must be bytes, got {type(namespace_id).__name__}")
        limit = self.max_block_bytes
        for i, (key, size, meta) in enumerate(items):
            if type(key) is not bytes or not key:
                raise KeyInvalid(f"item #{i}: a block key is non-empty bytes; got {key!r:.40}")
            if type(meta) is not bytes:
                raise InvalidArgument(f"item #{i}: meta must be bytes, got {type(meta).__name__}")
            if type(size) is not int or not 0 <= size <= limit:
                raise InvalidArgument(f"item #{i}: size_bytes must be an int in 0..{limit}, got {size!r}")
        n = len(items)
        skeys = [store_key(namespace_id, key) for key, _, _ in items]
        out: list[Reservation | KvstoredError | None] = [None] * n
        dram = self._dram
        align = dram.allocator.alignment_bytes
        mask = ~(align - 1)
        with self._lock:
            self._check_open()  # type: ignore[attr-defined]
            has = self._has  # type: ignore[attr-defined]
            todo: list[int] = []
            stored: list[bytes] = []
            seen: set[bytes] = set()
            total = 0
            for i, skey in enumerate(skeys):
                if skey in seen:
                    continue
                seen.add(skey)
                if has(skey):
                    stored.append(skey)
                    continue
                todo.append(i)
                total += ((items[i][1] or 1) + align - 1) & mask
            base = dram.allocator.allocate(total) if todo else 0
            if base is None and not may_block:
                return NEEDS_IO  # nothing changed
            copies = dram.copies
            if copies:
                for skey in stored:
                    copies.pop(skey, None)  # written here too: no mere duplicate
            if not todo:
                return out
            if base is not None:
                self._reserved_bytes += total
            intern_size, intern_info = self._intern_size, self._intern_info  # type: ignore[attr-defined]
            info = intern_info(namespace_id, b"")
            pending_cls = type(self)._pending_cls  # type: ignore[attr-defined]
            reservations, ids, arena = self._reservations, self._reservation_ids, self.arena
            offset = base
            for i in todo:
                key, size, meta = items[i]
                if base is not None:
                    off = offset
                    offset += ((size or 1) + align - 1) & mask
                else:
                    try:
                        off = self._allocate(size)  # type: ignore[attr-defined]
                    except KvstoredError as exc:  # NoCapacity; Unavailable once closed
                        out[i] = exc
                        continue
                    self._reserved_bytes += ((size or 1) + align - 1) & mask
                rid = next(ids)
                reservations[rid] = pending_cls(
                    skeys[i], off, intern_size(size),
                    intern_info(namespace_id, meta) if meta else info,
                )
                out[i] = Reservation(key, off, size, arena[off : off + size], rid)
        return out
