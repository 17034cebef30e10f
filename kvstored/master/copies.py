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

A promotion is a hint: a copy already evicted when it arrives is simply absent (ignored).
It stays queued until the holder's events settle it (ADDED with ``copy=False``: promoted;
REMOVED: the copy is gone) and is sent again on a heartbeat answer ``resend_after_s`` after
the last send (one node lease by default), at most :data:`MAX_PROMOTION_SENDS` times, so a
lost answer or a node that restarted its link meanwhile still gets it; a holder that never
settles it keeps the block marked as a copy, evictable first (no block is lost by a
promotion, only possibly not saved). Per node at most :data:`MAX_PENDING_PROMOTIONS` are
queued (the oldest are dropped first).

A holder that dies, unregisters, restarts (new epoch) or resyncs without the block sends
no REMOVED event: its rows are retired at once (O(1)) and unlinked later by GC, which
walks them anyway; for each original it unlinks that leaves only copies it queues the same
promotion (``Membership.collect_garbage``), so the promotion comes up to a GC backlog
later (8192 rows per ``gc_interval_s``). A node that restarts keeps its SSD blocks: if its
new inventory is not in yet, its block may be promoted on a copy holder too (a hint: two
originals, nothing lost).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from kvstored.master.index import BlockIndex
from kvstored.master.types import ReplicaState

MAX_PENDING_PROMOTIONS = 4096
"""Promotions queued for one node before the oldest are dropped (one heartbeat's worth)."""
MAX_PROMOTION_SENDS = 5
"""Heartbeat answers one promotion is sent on at most before the master gives up on it."""


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
    """Per node: the blocks whose copy it should keep, until its events settle them.

    Args:
        clock: monotonic seconds (the membership's).
        resend_after_s: a promotion sent this long ago and not settled is sent again.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 resend_after_s: float = 10.0) -> None:
        self.clock = clock
        self.resend_after_s = float(resend_after_s)
        # node -> (namespace_id, key) -> (last sent at, or None: never sent; sends so far)
        self._pending: dict[str, OrderedDict[tuple[bytes, bytes], tuple[float | None, int]]] = {}
        self.num_requested = 0
        self.num_resent = 0

    def add(self, node_id: str, namespace_id: bytes, key: bytes) -> None:
        """Queue one promotion for ``node_id`` (bounded: the oldest drop first)."""
        q = self._pending.setdefault(node_id, OrderedDict())
        q[(namespace_id, key)] = (None, 0)
        self.num_requested += 1
        while len(q) > MAX_PENDING_PROMOTIONS:
            q.popitem(last=False)

    def take(self, node_id: str) -> list[tuple[bytes, bytes]]:
        """The promotions to send ``node_id`` now (``(namespace_id, key)``): never sent, or
        sent ``resend_after_s`` ago and not settled. They stay queued until settled."""
        q = self._pending.get(node_id)
        if not q:
            return []
        now = self.clock()
        out: list[tuple[bytes, bytes]] = []
        for block, (sent_s, sends) in list(q.items()):
            if sent_s is not None and now - sent_s < self.resend_after_s:
                continue
            if sends >= MAX_PROMOTION_SENDS:
                del q[block]  # the holder never acted on it: give up (the copy stays a copy)
                continue
            q[block] = (now, sends + 1)
            self.num_resent += sends > 0
            out.append(block)
        if not q:
            del self._pending[node_id]
        return out

    def settle(self, node_id: str, namespace_id: bytes, key: bytes) -> None:
        """``node_id`` reported the block (ADDED as an original, or REMOVED): done."""
        q = self._pending.get(node_id)
        if q and q.pop((namespace_id, key), None) is not None and not q:
            del self._pending[node_id]

    def num_pending(self, node_id: str) -> int:
        """Promotions queued for ``node_id`` (sent or not), not settled yet."""
        return len(self._pending.get(node_id, ()))

    def forget(self, node_id: str) -> None:
        """Drop a node's queue (it left or registered a new epoch)."""
        self._pending.pop(node_id, None)


__all__ = ["MAX_PENDING_PROMOTIONS", "MAX_PROMOTION_SENDS", "Promotions", "copy_to_promote"]
