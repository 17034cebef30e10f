"""Holders of the master's block index: readability, load, retirement, row lists and GC.

A mixin of :class:`~kvstored.master.index.BlockIndex` (split out to keep index.py short);
it owns the holder columns and each holder's doubly linked row list (``hnext``/``hprev``
row columns from ``holder_head[holder]``), which GC walks instead of scanning the index.
While GC unlinks a retired holder's original, it can report the blocks left with copies
only (``on_only_copies``: the membership promotes one, master/copies.py), since a holder
that died, left or resynced loses its rows without REMOVED events.
Not thread-safe (the master's loop only).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from kvstored.errors import InvalidArgument
from kvstored.master.records import COPY_BIT, STATE_MASK, ReplicaState
from kvstored.types import Tier

_NO_ROW = -1
_LOAD_CLIP = 1e9
_COMMITTED = int(ReplicaState.COMMITTED)  # (a plain int: numpy scalars compare faster)


def _grow(arr: np.ndarray, need: int, fill: int | float | bool = 0) -> np.ndarray:
    if need <= len(arr):
        return arr
    new_len = max(need, 2 * len(arr), 1024)
    out = np.full(new_len, fill, dtype=arr.dtype)
    out[: len(arr)] = arr
    return out


class HolderRows:
    """Holder state and per-holder row lists of a BlockIndex (a mixin; see the module)."""

    if TYPE_CHECKING:
        _readable: np.ndarray
        _retired: np.ndarray
        _load: np.ndarray
        _holder_rows: np.ndarray
        _holder_head: np.ndarray
        _garbage_holders: list[int]
        _num_holders: int
        _num_dead_rows: int
        _holder: np.ndarray
        _hnext: np.ndarray
        _hprev: np.ndarray
        _block: np.ndarray
        _block_ns: np.ndarray
        _head: np.ndarray
        _next: np.ndarray
        _state: np.ndarray
        _tier: np.ndarray
        _ns_ids: list[bytes]
        _long_keys: dict[tuple[int, bytes], bytes]

        def _find_row_exact(self, slot: int, target: int) -> tuple[int, int]: ...

        def _unlink(self, slot: int, row: int, prev: int) -> None: ...

        def _key_bytes(self, slot: int) -> bytes: ...

    # ---- holders ---------------------------------------------------------------------
    def add_holder(self) -> int:
        """A new holder id (starts unreadable; never reused)."""
        h = self._num_holders
        self._num_holders += 1
        self._readable = _grow(self._readable, h + 1, False)
        self._retired = _grow(self._retired, h + 1, False)
        self._load = _grow(self._load, h + 1, 0.0)
        self._holder_rows = _grow(self._holder_rows, h + 1, 0)
        self._holder_head = _grow(self._holder_head, h + 1, _NO_ROW)
        return h

    def _check_holder(self, holder: int) -> None:
        if not 0 <= holder < self._num_holders:
            raise InvalidArgument(f"unknown holder {holder} (holders: {self._num_holders})")

    def set_readable(self, holder: int, readable: bool) -> None:
        """Let lookups return (or stop returning) this holder's committed replicas.

        Raises:
            InvalidArgument: unknown holder, or making a retired holder readable.
        """
        self._check_holder(holder)
        if readable and self._retired[holder]:
            raise InvalidArgument(f"holder {holder} is retired and can never be readable again")
        self._readable[holder] = readable

    def is_readable(self, holder: int) -> bool:
        """Whether lookups may return this holder's replicas."""
        return 0 <= holder < self._num_holders and bool(self._readable[holder])

    def set_load(self, holder: int, load: float) -> None:
        """The holder's load (lower is preferred among replicas of equal rank)."""
        self._check_holder(holder)
        self._load[holder] = load if math.isfinite(load) and load >= 0 else _LOAD_CLIP

    def retire_holder(self, holder: int) -> int:
        """Drop every replica of a holder at once (O(1)); rows are unlinked by GC later.

        Returns:
            How many rows the holder had (all of them are now garbage).
        """
        self._check_holder(holder)
        if self._retired[holder]:
            return 0
        self._readable[holder] = False
        self._retired[holder] = True
        n = int(self._holder_rows[holder])
        self._num_dead_rows += n
        if n:
            self._garbage_holders.append(holder)
        return n

    def num_holder_replicas(self, holder: int) -> int:
        """Replica rows of a holder (0 once retired)."""
        self._check_holder(holder)
        return 0 if self._retired[holder] else int(self._holder_rows[holder])

    # ---- holder row lists -------------------------------------------------------------
    def _link_holder(self, holder: int, rows: np.ndarray) -> None:
        """Put new rows at the front of their holder's row list (one vectorized step)."""
        if len(rows) == 0:
            return
        old = int(self._holder_head[holder])
        self._hnext[rows[:-1]] = rows[1:]
        self._hprev[rows[1:]] = rows[:-1]
        self._hprev[rows[0]] = _NO_ROW
        last = int(rows[-1])
        self._hnext[last] = old
        if old != _NO_ROW:
            self._hprev[old] = last
        self._holder_head[holder] = int(rows[0])

    def _link_holder_one(self, holder: int, row: int) -> None:
        """Put one new row at the front of its holder's row list (scalar)."""
        old = int(self._holder_head[holder])
        self._hnext[row] = old
        self._hprev[row] = _NO_ROW
        if old != _NO_ROW:
            self._hprev[old] = row
        self._holder_head[holder] = row

    def _unlink_holder(self, row: int) -> None:
        nxt, prv = int(self._hnext[row]), int(self._hprev[row])
        if prv == _NO_ROW:
            self._holder_head[int(self._holder[row])] = nxt
        else:
            self._hnext[prv] = nxt
        if nxt != _NO_ROW:
            self._hprev[nxt] = prv
        self._hnext[row] = self._hprev[row] = _NO_ROW

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
        done = 0
        lost: list[int] = []  # slots whose unlinked row was a committed original
        while self._garbage_holders and done < max_rows:
            h = self._garbage_holders[-1]
            row = int(self._holder_head[h])
            if row == _NO_ROW:
                self._garbage_holders.pop()
                continue
            slot = int(self._block[row])
            if on_only_copies is not None and int(self._state[row]) == _COMMITTED:
                lost.append(slot)  # (no COPY_BIT: an original)
            _, prev = self._find_row_exact(slot, row)
            self._holder_rows[h] -= 1
            self._num_dead_rows -= 1
            self._unlink(slot, row, prev)
            done += 1
        if lost and on_only_copies is not None:
            # slots are not reused within this call (GC never adds a block); a slot freed
            # by it has no row left, so it is no candidate
            for slot in self._only_copies_left(np.unique(np.asarray(lost, dtype=np.int64))):
                ns = int(self._block_ns[slot])
                key = self._key_bytes(slot)
                on_only_copies(self._ns_ids[ns], self._long_keys.get((ns, key), key))
        return done

    def _only_copies_left(self, slots: np.ndarray) -> list[int]:
        """The slots whose rows of holders not retired are all committed copies (at least
        one): a vectorized walk of their chains, one level per step."""
        bad = np.zeros(len(slots), dtype=np.bool_)
        found = np.zeros(len(slots), dtype=np.bool_)
        cur = self._head[slots].astype(np.int64)
        idx = np.flatnonzero(cur >= 0)
        while len(idx):
            r = cur[idx]
            live = ~self._retired[self._holder[r]]
            st = self._state[r]
            copy = ((st & STATE_MASK) == _COMMITTED) & ((st & COPY_BIT) != 0)
            found[idx] |= live
            bad[idx] |= live & ~copy
            cur[idx] = self._next[r]
            idx = idx[(cur[idx] >= 0) & ~bad[idx]]
        return slots[found & ~bad].tolist()

    def holder_keys(self, holder: int) -> list[tuple[bytes, bytes, Tier]]:
        """(namespace_id, key, tier) of every row of a holder (admin and tests; O(its rows))."""
        out: list[tuple[bytes, bytes, Tier]] = []
        row = int(self._holder_head[holder]) if 0 <= holder < self._num_holders else _NO_ROW
        while row != _NO_ROW:
            slot = int(self._block[row])
            ns = int(self._block_ns[slot])
            key = self._key_bytes(slot)
            key = self._long_keys.get((ns, key), key)
            out.append((self._ns_ids[ns], key, Tier(int(self._tier[row]))))
            row = int(self._hnext[row])
        return out
