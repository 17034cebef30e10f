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
promotion, only possibly not saved). A promotion is one kind of command of the master's
command queue (kvstored/master/commands.py: PROMOTE), carried in
``HeartbeatResponse.commands``; ``promote_copies`` is no longer filled.

A holder that dies, unregisters, restarts (new epoch) or resyncs without the block sends
no REMOVED event: its rows are retired at once (O(1)) and unlinked later by GC, which
walks them anyway; for each original it unlinks that leaves only copies it queues the same
promotion (``Membership.collect_garbage``), so the promotion comes up to a GC backlog
later (8192 rows per ``gc_interval_s``). A node that restarts keeps its SSD blocks: if its
new inventory is not in yet, its block may be promoted on a copy holder too (a hint: two
originals, nothing lost).
"""

from __future__ import annotations

from collections.abc import Callable

from kvstored.master.commands import MAX_SENDS, CommandKind, CommandQueue
from kvstored.master.index import BlockIndex

MAX_PROMOTION_SENDS = MAX_SENDS
"""Heartbeat answers one promotion is sent on at most before the master gives up on it."""


def copy_to_promote(index: BlockIndex, namespace_id: bytes, key: bytes) -> int | None:
    """The holder whose copy of a block should become its original, if any.

    Returns:
        The holder (of a readable, COMMITTED copy; the lowest id: deterministic) when
        the block's remaining replicas of live holders are all copies; None when an
        original remains (readable or not: its holder may come back), a replica is still
        being written, or no readable copy is left.
    """
    return index.copy_holders_to_promote(namespace_id, [key])[0]


class Promotions:
    """Per node: the blocks whose copy it should keep, until its events settle them.

    A view of the master's one command queue (:mod:`kvstored.master.commands`): each
    promotion is a PROMOTE command to the copy holder's live epoch, sent on its heartbeat
    answers until acknowledged or settled by its events.

    Args:
        queue: the master's command queue.
        epoch_of: the live epoch of a node id (None: not registered: nothing is queued).
    """

    def __init__(self, queue: CommandQueue, epoch_of: Callable[[str], int | None]) -> None:
        self.queue = queue
        self.epoch_of = epoch_of
        self.num_requested = 0

    @property
    def resend_after_s(self) -> float:
        """A promotion sent this long ago and not settled is sent again (the queue's)."""
        return self.queue.resend_after_s

    def add(self, node_id: str, namespace_id: bytes, key: bytes) -> None:
        """Queue one promotion for ``node_id`` (bounded: the oldest drop first)."""
        epoch = self.epoch_of(node_id)
        if epoch is None:
            return
        self.queue.add(node_id, epoch, CommandKind.PROMOTE, namespace_id, key)
        self.num_requested += 1

    def take(self, node_id: str) -> list[tuple[bytes, bytes]]:
        """The promotions due for ``node_id`` now (``(namespace_id, key)``), as
        :meth:`CommandQueue.take` counts them sent; they stay queued until settled."""
        epoch = self.epoch_of(node_id)
        if epoch is None:
            return []
        return [(c.namespace_id, c.key)
                for c in self.queue.take(node_id, epoch, kinds=_PROMOTE_ONLY)]

    def settle(self, node_id: str, namespace_id: bytes, key: bytes) -> None:
        """``node_id`` reported the block (ADDED as an original, or REMOVED): done."""
        self.queue.settle(node_id, CommandKind.PROMOTE, namespace_id, key)

    def num_pending(self, node_id: str) -> int:
        """Promotions queued for ``node_id`` (sent or not), not settled yet."""
        return len(self.queue.pending(node_id, CommandKind.PROMOTE))

    def forget(self, node_id: str) -> None:
        """Drop a node's queue (it left or registered a new epoch)."""
        self.queue.forget(node_id)


_PROMOTE_ONLY = frozenset({CommandKind.PROMOTE})


__all__ = ["MAX_PROMOTION_SENDS", "Promotions", "copy_to_promote"]
