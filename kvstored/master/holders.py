"""HolderRows: the holders of the master's block index (readability, load, retirement, GC).

A *holder* is one incarnation of a node as the membership sees it: (node id, epoch, sync).
A replica is readable only while its holder is readable (alive, healthy, synced): dropping a
node, a lapsed lease or a superseded epoch flips one flag (O(1)), and its rows can never be
returned again; :meth:`HolderRows.collect_garbage` unlinks such rows later, in bounded
batches taken from the holder's row list (``hnext``/``hprev`` row columns from
``holder_head[holder]``: cost proportional to the garbage, no scan), so no call ever walks
millions of rows on the loop. While GC unlinks a retired holder's original, it can report
the blocks left with copies only (``on_only_copies``: the membership promotes one,
master/copies.py), since a holder that died, left or resynced loses its rows without
REMOVED events.

Composed into :class:`~kvstored.master.index.BlockIndex` over the same
:class:`~kvstored.master.columns.IndexColumns`. Retired holders never become readable again
(ids are not reused). Not thread-safe (the master's loop only).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from kvstored.errors import InvalidArgument
from kvstored.master.columns import NO_ROW, IndexColumns
from kvstored.master.types import COPY_BIT, STATE_MASK, ReplicaState
from kvstored.types import Tier

LOAD_CLIP = 1e9
"""Largest load a holder is ranked by (a non-finite or negative report counts as this)."""
_COMMITTED = int(ReplicaState.COMMITTED)  # (a plain int: numpy scalars compare faster)


class HolderRows:
    """Holder state and per-holder row lists of a block index (see the module docstring).

    Args:
        cols: the index's columns (shared with the index that composes this).
    """

    def __init__(self, cols: IndexColumns) -> None:
        self._cols = cols
        self.num_holders = 0
        self.num_dead_rows = 0  # rows of retired holders not unlinked yet
        self._garbage: list[int] = []  # retired holders whose rows are not unlinked yet

    # ---- holders ---------------------------------------------------------------------
    def add_holder(self) -> int:
        """A new holder id (starts unreadable; never reused)."""
        h = self.num_holders
        self.num_holders += 1
        self._cols.grow_holders(h + 1)
        return h

    def check_holder(self, holder: int) -> None:
        """Raises InvalidArgument for a holder id never handed out."""
        if not 0 <= holder < self.num_holders:
            raise InvalidArgument(f"unknown holder {holder} (holders: {self.num_holders})")

    def set_readable(self, holder: int, readable: bool) -> None:
        """Let lookups return (or stop returning) this holder's committed replicas.

        Raises:
            InvalidArgument: unknown holder, or making a retired holder readable.
        """
        self.check_holder(holder)
        c = self._cols
        if readable and c.retired[holder]:
            raise InvalidArgument(f"holder {holder} is retired and can never be readable again")
        c.readable[holder] = readable

    def is_readable(self, holder: int) -> bool:
        """Whether lookups may return this holder's replicas."""
        return 0 <= holder < self.num_holders and bool(self._cols.readable[holder])

    def set_load(self, holder: int, load: float) -> None:
        """The holder's load (lower is preferred among replicas of equal rank)."""
        self.check_holder(holder)
        self._cols.load[holder] = load if math.isfinite(load) and load >= 0 else LOAD_CLIP

    def retire_holder(self, holder: int) -> int:
        """Drop every replica of a holder at once (O(1)); rows are unlinked by GC later.

        Returns:
            How many rows the holder had (all of them are now garbage).
        """
        self.check_holder(holder)
        c = self._cols
        if c.retired[holder]:
            return 0
        c.readable[holder] = False
        c.retired[holder] = True
        n = int(c.holder_rows[holder])
        self.num_dead_rows += n
        if n:
            self._garbage.append(holder)
        return n

    def num_holder_replicas(self, holder: int) -> int:
        """Replica rows of a holder (0 once retired)."""
        self.check_holder(holder)
        c = self._cols
        return 0 if c.retired[holder] else int(c.holder_rows[holder])

    # ---- garbage ---------------------------------------------------------------------
    def collect_garbage(self, max_rows: int = 65536, *,
                        on_only_copies: Callable[[bytes, bytes], None] | None = None) -> int:
        """Unlink up to ``max_rows`` rows of retired holders (bounded Python work per call).

        Each holder keeps its rows in a doubly linked row list (``hnext``/``hprev``), so a
        call takes the rows of retired holders straight from their lists: its cost is
        proportional to the rows it unlinks (and their blocks' short chains), never to the
        size of the index.

        Args:
            on_only_copies: called with ``(namespace_id, key)`` when an unlinked row was a
                committed original and the block's remaining rows of holders not retired
                are all committed copies (at least one): the block lost its last original
                without a REMOVED event (once per block and call; after this call's rows
                are unlinked).

        Returns:
            Rows unlinked (0 when there is no garbage).
        """
        c = self._cols
        done = 0
        lost: list[int] = []  # slots whose unlinked row was a committed original
        while self._garbage and done < max_rows:
            h = self._garbage[-1]
            row = int(c.holder_head[h])
            if row == NO_ROW:
                self._garbage.pop()
                continue
            slot = int(c.block[row])
            if on_only_copies is not None and int(c.state[row]) == _COMMITTED:
                lost.append(slot)  # (no COPY_BIT: an original)
            _, prev = c.find_row_exact(slot, row)
            c.holder_rows[h] -= 1
            self.num_dead_rows -= 1
            c.unlink(slot, row, prev)
            done += 1
        if lost and on_only_copies is not None:
            # slots are not reused within this call (GC never adds a block); a slot freed
            # by it has no row left, so it is no candidate
            for slot in self._only_copies_left(np.unique(np.asarray(lost, dtype=np.int64))):
                on_only_copies(*c.key_of(slot))
        return done

    def _only_copies_left(self, slots: np.ndarray) -> list[int]:
        """The slots whose rows of holders not retired are all committed copies (at least
        one): a vectorized walk of their chains, one level per step."""
        c = self._cols
        bad = np.zeros(len(slots), dtype=np.bool_)
        found = np.zeros(len(slots), dtype=np.bool_)
        cur = c.head[slots].astype(np.int64)
        idx = np.flatnonzero(cur >= 0)
        while len(idx):
            r = cur[idx]
            live = ~c.retired[c.holder[r]]
            st = c.state[r]
            copy = ((st & STATE_MASK) == _COMMITTED) & ((st & COPY_BIT) != 0)
            found[idx] |= live
            bad[idx] |= live & ~copy
            cur[idx] = c.next[r]
            idx = idx[(cur[idx] >= 0) & ~bad[idx]]
        return slots[found & ~bad].tolist()

    def holder_keys(self, holder: int) -> list[tuple[bytes, bytes, Tier]]:
        """(namespace_id, key, tier) of every row of a holder (admin and tests; O(its rows))."""
        c = self._cols
        out: list[tuple[bytes, bytes, Tier]] = []
        row = int(c.holder_head[holder]) if 0 <= holder < self.num_holders else NO_ROW
        while row != NO_ROW:
            ns_id, key = c.key_of(int(c.block[row]))
            out.append((ns_id, key, Tier(int(c.tier[row]))))
            row = int(c.hnext[row])
        return out
