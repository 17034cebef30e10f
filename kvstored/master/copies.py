"""Promotion of remote-fill copies: a block's last original left, a copy must stay.

A remote-fill copy (``BlockRef.copy``) is a duplicate its holder evicts first
(kvstored/tiers/spare.py): safe while the block's original is held elsewhere. When the
original's holder drops the block (a ``Remove``, a local eviction: its REMOVED event) while
copies remain, the pool's last replicas are all "evict first"; the master then picks one
copy holder and asks it, on its next ``Heartbeat`` answer (``promote_copies``), to keep that
copy as an original. The node unmarks it and re-reports it ADDED with ``copy=False``, so the
index converges through the ordinary event path (no second source of truth)::

    REMOVED (a, K, original)  ->  rows of K left: copies only (b, c)  ->  promote on b
    b's next heartbeat answer ->  b unmarks K  ->  ADDED (b, K, copy=False)  ->  original

A promotion is a hint: a copy already evicted when it arrives is simply absent (ignored),
a lost answer leaves the copy evictable first as before (no block is lost by a promotion,
only possibly not saved). Per node at most :data:`MAX_PENDING_PROMOTIONS` are queued (the
oldest are dropped first).

A holder that dies, unregisters, restarts (new epoch) or resyncs without the block sends
no REMOVED event: its rows are retired at once (O(1)) and unlinked later by GC, which
walks them anyway; for each original it unlinks that leaves only copies it queues the same
promotion (``Membership.collect_garbage``), so the promotion comes up to a GC backlog
later (8192 rows per ``gc_interval_s``). A node that restarts keeps its SSD blocks: if its
new inventory is not in yet, its block may be promoted on a copy holder too (a hint: two
originals, nothing lost).
"""

from __future__ import annotations

from collections import OrderedDict

from kvstored.master.index import BlockIndex
from kvstored.master.records import ReplicaState

MAX_PENDING_PROMOTIONS = 4096
"""Promotions queued for one node before the oldest are dropped (one heartbeat's worth)."""


def copy_to_promote(index: BlockIndex, namespace_id: bytes, key: bytes) -> int | None:
    """The holder whose copy of a block should become its original, if any.

    Returns:
        The holder (of a readable, COMMITTED copy; the lowest id: deterministic) when
        the block's remaining replicas of live holders are all copies; None when an
        original remains (readable or not: its holder may come back), a replica is still
        being written, or no readable copy is left.
    """
    best: int | None = None
    for r in index.replicas(namespace_id, key):
        if not r.copy or r.state is not ReplicaState.COMMITTED:
            return None
        if index.is_readable(r.holder) and (best is None or r.holder < best):
            best = r.holder
    return best


class Promotions:
    """Per node: the blocks whose copy it should keep, until its next heartbeat answer."""

    def __init__(self) -> None:
        self._pending: dict[str, OrderedDict[tuple[bytes, bytes], None]] = {}
        self.num_requested = 0

    def add(self, node_id: str, namespace_id: bytes, key: bytes) -> None:
        """Queue one promotion for ``node_id`` (bounded: the oldest drop first)."""
        q = self._pending.setdefault(node_id, OrderedDict())
        q[(namespace_id, key)] = None
        self.num_requested += 1
        while len(q) > MAX_PENDING_PROMOTIONS:
            q.popitem(last=False)

    def take(self, node_id: str) -> list[tuple[bytes, bytes]]:
        """The promotions queued for ``node_id`` (``(namespace_id, key)``), now forgotten."""
        q = self._pending.pop(node_id, None)
        return list(q) if q else []

    def forget(self, node_id: str) -> None:
        """Drop a node's queue (it left or registered a new epoch)."""
        self._pending.pop(node_id, None)


__all__ = ["MAX_PENDING_PROMOTIONS", "Promotions", "copy_to_promote"]
