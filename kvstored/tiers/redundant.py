"""Which of this node's blocks are redundant replicas: another live node holds the block.

A node that must drop a block for good (its pool is full: no free space, no copy, no
demotion the SSD takes as is, no peer with room) should drop a *redundant replica*, a
block another node also holds, before a *sole copy*: the first costs the pool a replica,
the second a block. The store cannot see other nodes, so this module keeps what the node
was told, as marks::

    mark(store key, keeper node id, generation)   "the keeper holds these very bytes too"
    a mark counts only while:   trusted (the node's master link answers, same term)
                                its keeper has not left (forget_keeper on PEER_LEFT)
                                the replica here is still that generation (a re-put of
                                the key has another one: its mark no longer applies)

Fail safe by construction: anything unknown is a sole copy. A node marks a block only when
it knows the keeper holds an *original* (the writer of a ``put(replicas=N)`` marks its own
replica once a peer stored one and the master ended that write); the marks are cleared
whenever the node cannot hear about departures (its link to the master fails, or a new
master term starts), and a departed keeper's marks go when the master says it left. A
block has at most one unmarked replica per marker rule: the writer marks its own, never
the peers' (so two holders never both think the other keeps it).

Bounded: at most :data:`MAX_MARKS` marks (oldest forgotten first: forgetting is safe).
Pure metadata: callers hold the store lock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator

MAX_MARKS = 1 << 22
"""Most marks a node keeps (about 4M blocks; older ones are forgotten: then sole copies)."""


class RedundantMarks:
    """The node's redundant-replica marks (module docstring). Lock: the store's."""

    def __init__(self, max_marks: int = MAX_MARKS) -> None:
        if max_marks < 1:
            raise ValueError(f"max_marks must be >= 1, got {max_marks}")
        self.max_marks = int(max_marks)
        self.trusted = False
        """Whether marks count now (set by the node's master link: it hears departures)."""
        self._marks: OrderedDict[bytes, tuple[str, int]] = OrderedDict()
        self._by_keeper: dict[str, set[bytes]] = {}
        self.num_dropped = 0
        """Redundant replicas this node dropped for good instead of a sole copy."""

    def __len__(self) -> int:
        return len(self._marks)

    def mark(self, skey: bytes, keeper: str, generation: int) -> None:
        """Mark the replica ``skey`` of ``generation`` redundant: ``keeper`` holds it too."""
        if not keeper or not generation:
            return  # unknown keeper or replica: no mark (a sole copy)
        self.unmark(skey)
        self._marks[skey] = (keeper, int(generation))
        self._by_keeper.setdefault(keeper, set()).add(skey)
        while len(self._marks) > self.max_marks:
            self.unmark(next(iter(self._marks)))

    def unmark(self, skey: bytes) -> None:
        """Forget the mark of ``skey`` (absent: nothing)."""
        old = self._marks.pop(skey, None)
        if old is not None:
            keys = self._by_keeper.get(old[0])
            if keys is not None:
                keys.discard(skey)
                if not keys:
                    del self._by_keeper[old[0]]

    def forget_keeper(self, keeper: str) -> int:
        """The keeper left the pool: its marks go (those blocks are sole copies here now).
        Returns how many marks went."""
        keys = self._by_keeper.pop(keeper, set())
        for skey in keys:
            self._marks.pop(skey, None)
        return len(keys)

    def clear(self) -> None:
        """Forget every mark (the link cannot vouch for any keeper any more)."""
        self._marks.clear()
        self._by_keeper.clear()

    def is_redundant(self, skey: bytes, generation: int) -> bool:
        """Whether the replica ``skey`` of ``generation`` counts as redundant now."""
        if not self.trusted:
            return False
        m = self._marks.get(skey)
        return m is not None and m[1] == generation

    def keeper_of(self, skey: bytes) -> str | None:
        """The keeper a mark names (whether or not it counts now), or None."""
        m = self._marks.get(skey)
        return m[0] if m is not None else None

    def keys(self) -> Iterator[bytes]:
        """Marked store keys, oldest mark first (a snapshot: safe to change the marks)."""
        return iter(list(self._marks))

    def marked_in(self, skeys: Iterable[bytes]) -> list[bytes]:
        """Those of ``skeys`` that carry a mark (whether or not it counts now)."""
        marks = self._marks
        return [k for k in skeys if k in marks]


__all__ = ["MAX_MARKS", "RedundantMarks"]
