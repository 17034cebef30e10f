"""IndexColumns: the packed numpy storage of the master's block index, and its primitives.

The master holds metadata for every replica in the cluster (10M and more), so a replica is
not a Python object: it is one row of fixed-width numpy columns, and a block is one int slot
found through a per-namespace :class:`~kvstored.master.keytable.KeyTable`::

    key tables      {namespace_id: KeyTable(16-byte key -> block slot)}
    block columns   head[slot] -> first row | block_ns[slot] u2 | bkey[slot] 2 x u8
                    | factor[slot] u1 (wanted replicas; 0 = default 1)
    row columns     holder u4 | next i4 | block i4 | size u4 | gen u8 | tier u1
                    | state u1 (| COPY_BIT: a remote-fill copy) | hnext i4 | hprev i4
                    (34 bytes per replica, one contiguous
                    array per field; rows of one block form a singly linked list from
                    head[slot]; block[row] points back to the slot; rows of one holder
                    form a doubly linked list from holder_head[holder], for GC)
    holder columns  readable[holder] bool, retired bool, load f8, holder_rows i8,
                    holder_head i8

This module owns the storage and the moves that keep it consistent (allocating and freeing
slots and rows, growing the columns, linking and unlinking a row in its block's chain and its
holder's list); what the rows mean (holders, ranking, generations) lives in the modules that
compose it (master/holders.py, master/ranking.py, master/generations.py, master/index.py).

Invariants kept here:

- A block with no row is not in its namespace's key table, and its slot is free. Its
  replication factor, when above 1, is remembered in ``recent_factors`` (bounded, the
  oldest forgotten first) and given back if the block is indexed again: a top-up write's
  placeholders are dropped at its PutEnd, before the holders' events index their
  replicas, and the block must not forget its factor in between.
- A free row has state 0 and no links.

Columns are reallocated when they grow: hold the :class:`IndexColumns`, never an array.
Not thread-safe: the master mutates it from its event loop only.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvstored import native
from kvstored.errors import InvalidArgument
from kvstored.master.keytable import KEY_BYTES, KeyTable, key_digest

MAX_RECENT_FACTORS = 1 << 16
"""Factors of blocks that lost their last row, kept for when they are indexed again."""
NO_ROW = -1
"""The link value "no row" (end of a chain or list, an empty block, a free row)."""
FREE_STATE = 0
"""The ``state`` byte of a free row."""
ROW_FIELDS = (("holder", np.uint32), ("next", np.int32), ("block", np.int32),
              ("size", np.uint32), ("gen", np.uint64), ("tier", np.uint8), ("state", np.uint8),
              ("hnext", np.int32), ("hprev", np.int32))
"""The columns of a replica row: 34 bytes per replica."""
_LINKS = ("next", "block", "hnext", "hprev")
HOT_CHAIN_ROWS = 16
"""A block's chain found longer than this gets hot maps (:class:`PyHotChains`, or the C
``HotChains``; a hot block: a system prompt's blocks have a replica on every node), so
finding a holder's row and its predecessor costs O(1) instead of a walk of up to one row per
node. A chain left with fewer than half this many rows drops them (walked again)."""


class HotChain:
    """Maps of one long chain: ``rows`` (holder * 4 + tier -> row) and ``prev`` (row -> its
    predecessor in the chain, -1 for the head). Python dicts (:class:`PyHotChains`, the
    fallback: ~140 B per row of a hot block, none for the others)."""

    __slots__ = ("prev", "rows")

    def __init__(self) -> None:
        self.rows: dict[int, int] = {}
        self.prev: dict[int, int] = {}

    def add_head(self, row: int, old_head: int, holder_tier: int) -> None:
        """``row`` became the chain's head before ``old_head`` (-1: it was empty)."""
        self.rows[holder_tier] = row
        self.prev[row] = NO_ROW
        if old_head != NO_ROW:
            self.prev[old_head] = row

    def remove(self, row: int, nxt: int, holder_tier: int) -> None:
        """``row`` (followed by ``nxt``) left the chain."""
        p = self.prev.pop(row)
        if nxt != NO_ROW:
            self.prev[nxt] = p
        if self.rows.get(holder_tier) == row:
            del self.rows[holder_tier]


HotSnapshot = tuple[dict[int, int], dict[int, dict[int, int]], dict[int, int]]
"""``(counts, rows, prev)`` of :meth:`PyHotChains.snapshot`."""


class PyHotChains:
    """The hot chains' maps of an index (a block whose chain is found longer than
    :data:`HOT_CHAIN_ROWS`): per hot slot, holder * 4 + tier -> row and row -> predecessor.

    This is the pure-Python version (a dict of :class:`HotChain` per slot), used when the C
    extension is not built; ``kvstored._native_master.HotChains`` (native/master_hot.h:
    open-addressing tables of plain integers, ~50-100 B per hot row instead of ~140, and the
    C loops of native/master.c use it without a Python call) has the same interface and
    gives the same answers (tests/unit/master/test_master_native.py compares snapshots).
    ``ht`` below is ``holder * 4 + tier``; rows and slots are ints >= 0, -1 = none.
    """

    __slots__ = ("_chains",)

    def __init__(self) -> None:
        self._chains: dict[int, HotChain] = {}

    def __len__(self) -> int:
        return len(self._chains)

    def __contains__(self, slot: object) -> bool:
        return slot in self._chains

    def find(self, slot: int, ht: int) -> tuple[int, int] | None:
        """``(row, predecessor)`` of ``ht`` in a hot slot's chain (``(-1, -1)``: none); None
        when the slot is not hot."""
        hc = self._chains.get(slot)
        if hc is None:
            return None
        row = hc.rows.get(ht, NO_ROW)
        return (row, hc.prev[row]) if row != NO_ROW else (NO_ROW, NO_ROW)

    def prev_of(self, slot: int, row: int) -> int | None:
        """A row's predecessor in a hot slot's chain (-1: the head); None when the slot is
        not hot.

        Raises:
            KeyError: the row is not in the slot's maps.
        """
        hc = self._chains.get(slot)
        return None if hc is None else hc.prev[row]

    def make(self, slot: int, rows: list[int], hts: list[int]) -> None:
        """Maps for a slot's chain: ``rows`` from its head, ``hts`` theirs.

        Raises:
            ValueError: the slot is hot already.
        """
        if slot in self._chains:
            raise ValueError(f"HotChains.make: slot {slot} is hot already")
        hc = self._chains[slot] = HotChain()
        prev = NO_ROW
        for row, ht in zip(rows, hts, strict=True):
            hc.rows[ht] = row
            hc.prev[row] = prev
            prev = row

    def add_head(self, slot: int, row: int, old_head: int, ht: int) -> None:
        """``row`` became the hot slot's head before ``old_head`` (-1: none).

        Raises:
            KeyError: the slot is not hot.
        """
        self._chains[slot].add_head(row, old_head, ht)

    def remove(self, slot: int, row: int, nxt: int, ht: int) -> int:
        """``row`` (followed by ``nxt``, -1 none) left the slot's chain.

        Returns:
            The rows left in the chain's maps; -1 when the slot is not hot (nothing done).
        """
        hc = self._chains.get(slot)
        if hc is None:
            return -1
        hc.remove(row, nxt, ht)
        return len(hc.prev)

    def drop(self, slot: int, rows: list[int], hts: list[int]) -> None:
        """The slot's maps dropped (``rows``: its chain's rows now, ``hts`` theirs; the C
        version deletes their entries)."""
        del rows, hts
        self._chains.pop(slot, None)

    def slots(self) -> list[int]:
        """The hot slots, ascending."""
        return sorted(self._chains)

    def snapshot(self) -> HotSnapshot:
        """``({slot: rows in its maps}, {slot: {ht: row}}, {row: predecessor})``: what the
        tests compare between the two versions."""
        counts = {s: len(h.prev) for s, h in self._chains.items()}
        rows = {s: dict(h.rows) for s, h in self._chains.items()}
        prev: dict[int, int] = {}
        for h in self._chains.values():
            prev.update(h.prev)
        return counts, rows, prev

    @property
    def num_rows(self) -> int:
        """Rows in every hot chain's maps."""
        return sum(len(h.prev) for h in self._chains.values())

    @property
    def nbytes(self) -> int:
        """Bytes of the dicts (``sys.getsizeof``; the int objects they hold excluded)."""
        return sum(sys.getsizeof(h.rows) + sys.getsizeof(h.prev) for h in self._chains.values()) \
            + sys.getsizeof(self._chains)


def new_hot_chains() -> PyHotChains:
    """The maps of a new index: the C ``HotChains`` when the extension is built (and
    :data:`kvstored.native.master_index` is set now), else :class:`PyHotChains`."""
    impl = native.master_index
    hot_type = getattr(impl, "HotChains", None) if impl is not None else None
    return hot_type() if hot_type is not None else PyHotChains()


def grow(arr: np.ndarray, need: int, fill: float = 0) -> np.ndarray:
    """``arr`` with at least ``need`` items (doubled, at least 1024; new items ``fill``)."""
    if need <= len(arr):
        return arr
    new_len = max(need, 2 * len(arr), 1024)
    out = np.full(new_len, fill, dtype=arr.dtype)
    out[: len(arr)] = arr
    return out


class IndexColumns:
    """Namespaces, key tables and the block, row and holder columns (see the module docstring).

    Attributes are the columns themselves (read and written by the index's modules).

    Args:
        initial_blocks: block slots and replica rows allocated up front (grown by doubling).
    """

    # row columns, set by _alloc_row_columns (one per ROW_FIELDS entry)
    holder: np.ndarray
    next: np.ndarray
    block: np.ndarray
    size: np.ndarray
    gen: np.ndarray
    tier: np.ndarray
    state: np.ndarray
    hnext: np.ndarray
    hprev: np.ndarray

    def __init__(self, initial_blocks: int = 1024) -> None:
        n = max(16, int(initial_blocks))
        self.ns_ids: list[bytes] = []
        self.ns_index: dict[bytes, int] = {}
        self.tables: list[KeyTable] = []
        # block columns
        self.head = np.full(n, NO_ROW, dtype=np.int32)
        self.block_ns = np.zeros(n, dtype=np.uint16)
        self.bkey = np.zeros((n, 2), dtype=np.uint64)  # the key's words (for deletion)
        self.factor = np.zeros(n, dtype=np.uint8)  # wanted replication factor (0 = 1)
        self.num_slots = 0  # high-water mark of block slots
        self.free_blocks: list[int] = []
        self.long_keys: dict[tuple[int, bytes], bytes] = {}  # digest -> key of len != 16
        # (ns, 16-byte key form) -> factor > 1 of a block whose last row went (bounded)
        self.recent_factors: dict[tuple[int, bytes], int] = {}
        self.hot = new_hot_chains()  # the maps of hot chains (PyHotChains, or C's HotChains)
        # row columns: one contiguous array per field (numpy gathers from contiguous columns
        # are ~50x faster than from a packed record array, measured: 0.7 vs 35 us for 512)
        self._alloc_row_columns(n)
        self.num_rows_used = 0  # high-water mark
        self.free_rows: list[int] = []
        # holder columns
        self.readable = np.zeros(16, dtype=np.bool_)
        self.retired = np.zeros(16, dtype=np.bool_)
        self.load = np.zeros(16, dtype=np.float64)
        self.holder_rows = np.zeros(16, dtype=np.int64)  # rows per holder (live + dead)
        self.holder_head = np.full(16, NO_ROW, dtype=np.int64)  # first row of its row list

    def _alloc_row_columns(self, n: int, old: dict[str, np.ndarray] | None = None) -> None:
        for name, dtype in ROW_FIELDS:
            arr = np.full(n, NO_ROW if name in _LINKS else 0, dtype=dtype)
            if old is not None:
                arr[: len(old[name])] = old[name]
            setattr(self, name, arr)

    # ---- sizes -----------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        """Blocks with at least one row."""
        return sum(len(t) for t in self.tables)

    def column_bytes(self) -> int:
        """Bytes held by the numpy columns (capacity included; dicts and keys excluded)."""
        arrays = (self.head, self.block_ns, self.bkey, self.factor, self.holder, self.next,
                  self.block, self.size, self.gen, self.tier, self.state, self.hnext,
                  self.hprev, self.readable, self.retired, self.load, self.holder_rows,
                  self.holder_head)
        return sum(a.nbytes for a in arrays)

    def table_bytes(self) -> int:
        """Bytes of the key tables (capacity included)."""
        return sum(t.nbytes for t in self.tables)

    # ---- namespaces and keys ---------------------------------------------------------
    def ns(self, namespace_id: bytes, *, create: bool) -> int | None:
        """The namespace's small id (None when absent and not ``create``).

        Raises:
            InvalidArgument: creating the 65536th namespace.
        """
        got = self.ns_index.get(namespace_id)
        if got is None and create:
            if len(self.ns_ids) >= 0xFFFF:
                raise InvalidArgument(
                    f"too many namespaces in the index ({len(self.ns_ids)}); the limit is 65535"
                )
            got = len(self.ns_ids)
            self.ns_ids.append(namespace_id)
            self.ns_index[namespace_id] = got
            self.tables.append(KeyTable())
        return got

    def slot(self, ns: int | None, key: bytes) -> int | None:
        """The block slot of ``key`` in namespace ``ns``, or None."""
        if ns is None:
            return None
        got = self.tables[ns].get(key)
        return None if got < 0 else got

    def key_bytes(self, slot: int) -> bytes:
        """The 16-byte form of a slot's key (a longer key's digest)."""
        return self.bkey[slot].astype("<u8").tobytes()

    def key_of(self, slot: int) -> tuple[bytes, bytes]:
        """``(namespace_id, key)`` of a block slot, the key as it was indexed."""
        ns = int(self.block_ns[slot])
        key = self.key_bytes(slot)
        return self.ns_ids[ns], self.long_keys.get((ns, key), key)

    # ---- allocation ------------------------------------------------------------------
    def _grow_blocks(self, need: int) -> None:
        if need > len(self.head):
            self.head = grow(self.head, need, NO_ROW)
            self.block_ns = grow(self.block_ns, need, 0)
            self.factor = grow(self.factor, need, 0)
            grown = np.zeros((len(self.head), 2), dtype=np.uint64)
            grown[: len(self.bkey)] = self.bkey
            self.bkey = grown

    def _new_slots(self, count: int) -> np.ndarray:
        take = min(count, len(self.free_blocks))
        reused = [self.free_blocks.pop() for _ in range(take)]
        start = self.num_slots
        self.num_slots += count - take
        self._grow_blocks(self.num_slots)
        return np.concatenate([np.asarray(reused, dtype=np.int64),
                               np.arange(start, self.num_slots, dtype=np.int64)])

    def new_blocks(self, ns: int, words: np.ndarray, keys: Sequence[bytes]) -> np.ndarray:
        """Block slots for distinct absent keys (``words`` their 16-byte forms; ``keys`` the
        keys themselves when any is not 16 bytes long, else empty)."""
        slots = self._new_slots(len(words))
        self.head[slots] = NO_ROW
        self.block_ns[slots] = ns
        self.factor[slots] = 0
        self.bkey[slots] = words
        if self.recent_factors:  # blocks indexed again get their factor back
            recent = self.recent_factors
            for i, slot in enumerate(slots.tolist()):
                f = recent.pop((ns, words[i].astype("<u8").tobytes()), 0)
                if f:
                    self.factor[slot] = f
        for k in keys:
            if len(k) != KEY_BYTES:
                self.long_keys[(ns, key_digest(k))] = bytes(k)
        self.tables[ns].insert_many(words, slots)
        return slots

    def new_block(self, ns: int, key: bytes) -> int:
        """The slot of a new block for one absent key (scalar path of :meth:`new_blocks`)."""
        if self.free_blocks:
            slot = self.free_blocks.pop()
        else:
            slot = self.num_slots
            self.num_slots += 1
            self._grow_blocks(self.num_slots)
        d = key_digest(key)
        lo, hi = int.from_bytes(d[:8], "little"), int.from_bytes(d[8:], "little")
        self.head[slot] = NO_ROW
        self.block_ns[slot] = ns
        self.factor[slot] = self.recent_factors.pop((ns, d), 0) if self.recent_factors else 0
        self.bkey[slot, 0] = lo
        self.bkey[slot, 1] = hi
        if len(key) != KEY_BYTES:
            self.long_keys[(ns, d)] = bytes(key)
        self.tables[ns].insert_words(lo, hi, slot)
        return slot

    def new_row(self) -> int:
        """One free row (scalar path of :meth:`new_rows`)."""
        if self.free_rows:
            return self.free_rows.pop()
        return int(self.new_rows(1)[0])

    def new_rows(self, count: int) -> np.ndarray:
        """``count`` free rows (reused ones first, then fresh ones; columns grow as needed)."""
        take = min(count, len(self.free_rows))
        rows = [self.free_rows.pop() for _ in range(take)]
        fresh = count - take
        if fresh:
            start = self.num_rows_used
            end = start + fresh
            if end > len(self.holder):
                old = {name: getattr(self, name) for name, _ in ROW_FIELDS}
                self._alloc_row_columns(max(end, 2 * len(self.holder)), old)
            self.num_rows_used = end
            return np.concatenate([np.asarray(rows, dtype=np.int64),
                                   np.arange(start, end, dtype=np.int64)])
        return np.asarray(rows, dtype=np.int64)

    def reserve(self, rows: int, slots: int) -> None:
        """Grow the row and block columns (by doubling, as :meth:`new_rows` and
        :meth:`new_blocks` would) so that ``rows`` rows and ``slots`` block slots can be
        taken from the free lists and the spare capacity without growing (native/master.c
        ``apply_events`` cannot reallocate them)."""
        fresh = rows - len(self.free_rows)
        if fresh > 0 and self.num_rows_used + fresh > len(self.holder):
            old = {name: getattr(self, name) for name, _ in ROW_FIELDS}
            self._alloc_row_columns(max(self.num_rows_used + fresh, 2 * len(self.holder)), old)
        fresh = slots - len(self.free_blocks)
        if fresh > 0:
            self._grow_blocks(self.num_slots + fresh)

    def grow_holders(self, need: int) -> None:
        """Holder columns for at least ``need`` holders (new ones unreadable, not retired)."""
        self.readable = grow(self.readable, need, False)
        self.retired = grow(self.retired, need, False)
        self.load = grow(self.load, need, 0.0)
        self.holder_rows = grow(self.holder_rows, need, 0)
        self.holder_head = grow(self.holder_head, need, NO_ROW)

    # ---- chains ----------------------------------------------------------------------
    def _ht(self, row: int) -> int:
        return int(self.holder[row]) * 4 + int(self.tier[row])

    def _chain(self, slot: int) -> tuple[list[int], list[int]]:
        """The rows of a block's chain from its head, and their holder * 4 + tier."""
        rows: list[int] = []
        row = int(self.head[slot])
        while row != NO_ROW:
            rows.append(row)
            row = int(self.next[row])
        return rows, [self._ht(r) for r in rows]

    def find_row(self, slot: int, holder: int, tier: int) -> tuple[int, int]:
        """(row, previous row) of (holder, tier) in a block's chain, or (-1, -1).

        A hot chain (:class:`PyHotChains`) answers from its maps; a short one is walked (a
        chain that turns out longer than :data:`HOT_CHAIN_ROWS` becomes hot here)."""
        got = self.hot.find(slot, holder * 4 + tier) if self.hot else None
        if got is not None:
            return got
        prev = NO_ROW
        row = int(self.head[slot])
        depth = 0
        while row != NO_ROW:
            if int(self.holder[row]) == holder and int(self.tier[row]) == tier:
                return row, prev
            prev, row = row, int(self.next[row])
            depth += 1
        if depth > HOT_CHAIN_ROWS:
            self.make_hot(slot)
        return NO_ROW, NO_ROW

    def find_row_exact(self, slot: int, target: int) -> tuple[int, int]:
        """(``target``, previous row) in a block's chain (``target`` is in it)."""
        prev = self.hot.prev_of(slot, target) if self.hot else None
        if prev is not None:
            return target, prev
        prev, row = NO_ROW, int(self.head[slot])
        while row != NO_ROW and row != target:
            prev, row = row, int(self.next[row])
        return row, prev

    def make_hot(self, slot: int) -> None:
        """Give a block's chain its hot maps (one walk of the chain; none if it has them)."""
        if slot not in self.hot:
            self.hot.make(slot, *self._chain(slot))

    def native_loops(self) -> Any:
        """The C extension when it is built and this index's hot maps are its ``HotChains``
        (the C loops read and change them), else None (the numpy and Python code runs)."""
        impl = native.master_index
        return None if impl is None or isinstance(self.hot, PyHotChains) else impl

    def find_rows(self, slots: np.ndarray, holder: int, tiers: np.ndarray) -> np.ndarray:
        """Per slot: the row of (``holder``, tier) in its chain, or -1 (int64; vectorized).

        Short chains are walked one level per step (at most :data:`HOT_CHAIN_ROWS` steps:
        a longer chain met here becomes hot), hot chains answer from their maps, so the
        cost does not grow with the replicas of a hot block. One C call (native/master.c
        ``find_rows``) when the extension is built, else :meth:`py_find_rows`."""
        impl = self.native_loops()
        if impl is None:
            return self.py_find_rows(slots, holder, tiers)
        n = len(slots)
        found = np.empty(n, dtype=np.int64)
        if n == 0:
            return found
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        tiers = np.ascontiguousarray(tiers, dtype=np.int64)
        impl.find_rows(self.head, self.next, self.holder, self.tier,
                       slots, int(holder), tiers, self.hot, HOT_CHAIN_ROWS, found)
        return found

    def py_find_rows(self, slots: np.ndarray, holder: int, tiers: np.ndarray) -> np.ndarray:
        """:meth:`find_rows` in numpy (the fallback, and the reference of the C walk)."""
        n = len(slots)
        found = np.full(n, NO_ROW, dtype=np.int64)
        if n == 0:
            return found
        cur = self.head[slots].astype(np.int64)
        hot = self.hot
        if hot:
            sl = slots.tolist()
            is_hot = [s in hot for s in sl]
            if any(is_hot):
                tl = tiers.tolist()
                for i, h in enumerate(is_hot):
                    if h:
                        got = hot.find(sl[i], holder * 4 + int(tl[i]))
                        assert got is not None
                        found[i] = got[0]
                        cur[i] = NO_ROW
        idx = np.flatnonzero(cur >= 0)
        depth = 0
        while len(idx):
            r = cur[idx]
            match = (self.holder[r] == holder) & (self.tier[r] == tiers[idx])
            found[idx[match]] = r[match]
            nxt = self.next[r]
            cur[idx] = nxt
            idx = idx[~match & (nxt >= 0)]
            depth += 1
            if depth > HOT_CHAIN_ROWS and len(idx):
                for i in idx.tolist():
                    self.make_hot(int(slots[i]))
                    got = hot.find(int(slots[i]), holder * 4 + int(tiers[i]))
                    assert got is not None
                    found[i] = got[0]
                break
        return found

    def link_rows(self, slots: np.ndarray, rows: np.ndarray) -> None:
        """Put new rows at the front of their blocks' chains (``block[row]`` set here).

        Distinct slots are linked in one vectorized step; a slot repeated in the batch takes
        its rows one by one, in order (the last is the new head)."""
        if len(rows) == 0:
            return
        self.block[rows] = slots
        if len(np.unique(slots)) == len(slots):
            self.next[rows] = self.head[slots]
            self.head[slots] = rows
        else:
            for s, r in zip(slots.tolist(), rows.tolist(), strict=True):
                self.next[r] = self.head[s]
                self.head[s] = r
        hot = self.hot
        if hot:
            for s, r in zip(slots.tolist(), rows.tolist(), strict=True):
                if s in hot:
                    hot.add_head(s, r, int(self.next[r]), self._ht(r))

    def link_row(self, slot: int, row: int) -> None:
        """Put one new row at the front of its block's chain (scalar :meth:`link_rows`)."""
        old = int(self.head[slot])
        self.next[row] = old
        self.block[row] = slot
        self.head[slot] = row
        if self.hot and slot in self.hot:
            self.hot.add_head(slot, row, old, self._ht(row))

    def link_holder(self, holder: int, rows: np.ndarray) -> None:
        """Put new rows at the front of their holder's row list (one vectorized step)."""
        if len(rows) == 0:
            return
        old = int(self.holder_head[holder])
        self.hnext[rows[:-1]] = rows[1:]
        self.hprev[rows[1:]] = rows[:-1]
        self.hprev[rows[0]] = NO_ROW
        last = int(rows[-1])
        self.hnext[last] = old
        if old != NO_ROW:
            self.hprev[old] = last
        self.holder_head[holder] = int(rows[0])

    def link_holder_one(self, holder: int, row: int) -> None:
        """Put one new row at the front of its holder's row list (scalar)."""
        old = int(self.holder_head[holder])
        self.hnext[row] = old
        self.hprev[row] = NO_ROW
        if old != NO_ROW:
            self.hprev[old] = row
        self.holder_head[holder] = row

    def _unlink_holder(self, row: int) -> None:
        nxt, prv = int(self.hnext[row]), int(self.hprev[row])
        if prv == NO_ROW:
            self.holder_head[int(self.holder[row])] = nxt
        else:
            self.hnext[prv] = nxt
        if nxt != NO_ROW:
            self.hprev[nxt] = prv
        self.hnext[row] = self.hprev[row] = NO_ROW

    def unlink(self, slot: int, row: int, prev: int) -> None:
        """Free ``row`` (``prev`` its predecessor in the block's chain): out of its holder's
        list and its block's chain; a block left with no row leaves its key table.

        The caller keeps ``holder_rows`` (and any dead-row count) in step.
        """
        self._unlink_holder(row)
        nxt = int(self.next[row])
        if prev == NO_ROW:
            self.head[slot] = nxt
        else:
            self.next[prev] = nxt
        left = self.hot.remove(slot, row, nxt, self._ht(row)) if self.hot else -1
        if left >= 0 and ((nxt == NO_ROW and prev == NO_ROW) or left < HOT_CHAIN_ROWS // 2):
            self.hot.drop(slot, *self._chain(slot))  # empty, or short again: walked, no maps
        self.state[row] = FREE_STATE
        self.next[row] = NO_ROW
        self.block[row] = NO_ROW
        self.free_rows.append(row)
        if nxt == NO_ROW and prev == NO_ROW:  # the block has no row left
            self._free_block(slot)

    def _free_block(self, slot: int) -> None:
        """A block lost its last row: out of its key table, its slot free (its factor kept)."""
        ns = int(self.block_ns[slot])
        if self.factor[slot] > 1:  # kept for when it is indexed again (bounded)
            if len(self.recent_factors) >= MAX_RECENT_FACTORS:
                del self.recent_factors[next(iter(self.recent_factors))]
            self.recent_factors[(ns, self.key_bytes(slot))] = int(self.factor[slot])
        lo, hi = (int(w) for w in self.bkey[slot])
        deleted = self.tables[ns].delete_words(lo, hi)
        assert deleted
        if self.long_keys:
            self.long_keys.pop((ns, self.key_bytes(slot)), None)
        self.free_blocks.append(slot)

    def unlink_many(self, slots: np.ndarray, rows: np.ndarray) -> None:
        """:meth:`unlink` of distinct rows (``slots`` their blocks), each with the predecessor
        its chain has when its turn comes: the rows of chains without hot maps first, in
        order, then those of hot chains, in order. One C call (native/master.c
        ``unlink_rows``, hot chains' rows through the C maps) when the extension is built,
        else :meth:`unlink` row by row.

        The caller keeps ``holder_rows`` (and any dead-row count) in step."""
        sl, rl = slots.tolist(), rows.tolist()
        hot = self.hot
        if hot:
            is_hot = [s in hot for s in sl]
            if any(is_hot):
                sl = [s for s, h in zip(sl, is_hot, strict=True) if not h] + \
                    [s for s, h in zip(sl, is_hot, strict=True) if h]
                rl = [r for r, h in zip(rl, is_hot, strict=True) if not h] + \
                    [r for r, h in zip(rl, is_hot, strict=True) if h]
        impl = self.native_loops()
        if impl is not None and rl:
            order = np.asarray(rl, dtype=np.int64)
            emptied = np.zeros(len(order), dtype=np.bool_)
            if impl.unlink_rows(self.head, self.next, self.block, self.holder,
                                self.tier, self.state, self.hnext, self.hprev, self.holder_head,
                                self.hot, HOT_CHAIN_ROWS, order, emptied):
                for i in np.flatnonzero(emptied).tolist():
                    self._free_block(sl[i])
            self.free_rows.extend(rl)
            return
        for s, r in zip(sl, rl, strict=True):
            _, prev = self.find_row_exact(s, r)
            self.unlink(s, r, prev)
