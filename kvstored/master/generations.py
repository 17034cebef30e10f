"""Generations: the source of write generations, and the rows of one write in the index.

A *generation* names one write of one block (``start_put``) or one replica a holder reported
without its own (an older node): strictly increasing, across master restarts too, since a
master term starts from its epoch. The index keeps it per replica row; a two-phase put's
commit or abort acts on exactly the WRITING rows of its generation::

    start_put   rows (block, holder, tier) WRITING under G
    commit G    those rows COMMITTED        abort G   those rows unlinked
    stale G'    nothing matches (0): the caller refuses it

Not thread-safe: the master's loop only.
"""

from __future__ import annotations

import numpy as np

from kvstored.errors import InvalidArgument
from kvstored.master.columns import NO_ROW, IndexColumns
from kvstored.master.types import ReplicaState

_WRITING = int(ReplicaState.WRITING)
_COMMITTED = int(ReplicaState.COMMITTED)


class Generations:
    """Source of write generations: strictly increasing, also across master restarts.

    Args:
        start: the first generation; the master passes its start epoch (ns since the Unix
            epoch, strictly greater than any earlier start's), so a generation handed out
            before a restart is never handed out again.
    """

    def __init__(self, start: int) -> None:
        if not 0 < start < (1 << 63):
            raise InvalidArgument(f"generation start must be in (0, 2**63), got {start}")
        self._next = int(start)

    def next(self) -> int:
        """A new generation, greater than every one before."""
        g = self._next
        self._next += 1
        return g

    def peek(self) -> int:
        """The generation :meth:`next` would hand out now (nothing is taken)."""
        return self._next

    def next_many(self, count: int) -> np.ndarray:
        """``count`` new generations, increasing (uint64), as ``count`` calls of :meth:`next`."""
        g = self._next
        self._next += count
        return np.arange(g, g + count, dtype=np.uint64)


def write_rows(cols: IndexColumns, slot: int | None, generation: int
               ) -> list[tuple[int, int, int]]:
    """``(slot, row, previous row)`` of the WRITING rows of ``generation`` in a block's
    chain (holders not retired), head first; empty for an absent block (``slot`` None)."""
    if slot is None:
        return []
    out = []
    prev, row = NO_ROW, int(cols.head[slot])
    while row != NO_ROW:
        if (int(cols.gen[row]) == generation and cols.state[row] == _WRITING
                and not cols.retired[int(cols.holder[row])]):
            out.append((slot, row, prev))
        prev, row = row, int(cols.next[row])
    return out


def commit_write(cols: IndexColumns, slot: int | None, generation: int) -> int:
    """Commit the WRITING rows of one write of the block at ``slot``.

    Returns:
        Rows committed; 0 when no WRITING row of that generation exists.
    """
    rows = write_rows(cols, slot, generation)
    for _, row, _ in rows:
        cols.state[row] = _COMMITTED
    return len(rows)


def abort_write(cols: IndexColumns, slot: int | None, generation: int) -> int:
    """Unlink the WRITING rows of one write of the block at ``slot``.

    Returns:
        Rows dropped (0: no such write in progress).
    """
    rows = write_rows(cols, slot, generation)
    for s, row, _ in reversed(rows):  # unlink tail-first so earlier prevs stay valid
        _, prev = cols.find_row_exact(s, row)
        cols.holder_rows[int(cols.holder[row])] -= 1
        cols.unlink(s, row, prev)
    return len(rows)
