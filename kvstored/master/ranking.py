"""Ranking of a block's replicas: which one a lookup returns (vectorized over many blocks).

Best = local DRAM > local SSD > remote DRAM > remote SSD, then an original over a remote-fill
copy (its owner is the safer, and usually the less busy, source), then the least loaded
holder, then the lowest holder id (deterministic). As one score per row (lower is better)::

    score = (tier rank + 0.5 x copy) x RANK_SCORE + min(load, LOAD_CLIP)
    tier rank: local DRAM 0, local SSD 1, remote DRAM 2, remote SSD 3;  unreadable: inf

A block with more than :data:`MAX_RANKED_REPLICAS` rows (a hot block held by many nodes) is
ranked among its newest rows only, unless none of them is readable, so a lookup's cost does
not grow with the node count (at 1,000 nodes a system prompt's blocks have 1,000 replicas).
Reads the columns only: never pins, touches or changes anything.
"""

from __future__ import annotations

import numpy as np

from kvstored import native
from kvstored.master.columns import NO_ROW, IndexColumns
from kvstored.master.holders import LOAD_CLIP
from kvstored.master.types import COPY_BIT, STATE_MASK, ReplicaState
from kvstored.types import Tier

MAX_RANKED_REPLICAS = 8
"""Rows of one block a lookup ranks (newest first) once it has found a readable one."""
RANK_SCORE = 4 * LOAD_CLIP
"""Score per tier rank; a copy adds half of it, the load at most a quarter."""
_LOCAL_SSD_SCORE = RANK_SCORE  # scores below: a local DRAM replica (rank 0)
_COMMITTED = int(ReplicaState.COMMITTED)
_STATE_MASK = int(STATE_MASK)
_COPY_BIT = int(COPY_BIT)
_SSD = int(Tier.SSD)


def best_rows(cols: IndexColumns, slots: np.ndarray, local_holder: int
              ) -> tuple[np.ndarray, np.ndarray]:
    """The best readable COMMITTED replica of each block slot (see the module docstring).

    One C call (native/master.c ``best_rows``: the same walk, block by block) when the
    extension is built, else :func:`py_best_rows`.

    Args:
        cols: the index's columns.
        slots: ``(num_blocks,)`` int64 block slots, each with at least one row.
        local_holder: the asking node's holder id (-1: every replica is remote).

    Returns:
        ``(rows, holders)``, each ``(num_blocks,)`` int64: the best row of each block, or -1
        when none is readable, and that row's holder (when none is readable: the holder of
        the block's first row).
    """
    impl = native.master_index
    if impl is None:
        return py_best_rows(cols, slots, local_holder)
    n = len(slots)
    rows, holders = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    impl.best_rows(cols.head, cols.next, cols.holder, cols.state, cols.tier, cols.readable,
                   cols.load, np.ascontiguousarray(slots, dtype=np.int64), int(local_holder),
                   rows, holders, _COMMITTED, _STATE_MASK, _COPY_BIT, _SSD, float(RANK_SCORE),
                   float(LOAD_CLIP), MAX_RANKED_REPLICAS)
    return rows, holders


def py_best_rows(cols: IndexColumns, slots: np.ndarray, local_holder: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`best_rows` in numpy, level by level over all blocks (the fallback, and the
    reference of the C walk)."""
    # level 0: every block's first row (a block in the table always has one); most
    # blocks have one replica, so later levels touch few blocks
    first = cols.head[slots].astype(np.int64)
    best_row, best_score, best_holder = score_rows(cols, first, local_holder)
    cur = cols.next[first].astype(np.int64)
    idx = np.flatnonzero((cur >= 0) & (best_score >= _LOCAL_SSD_SCORE))
    level = 1
    while len(idx):
        r = cur[idx]
        row, score, h = score_rows(cols, r, local_holder)
        bs = best_score[idx]
        better = (row >= 0) & ((score < bs) | ((score == bs) & (h < best_holder[idx])))
        sel = idx[better]
        best_row[sel] = r[better]
        best_score[sel] = score[better]
        best_holder[sel] = h[better]
        nxt = cols.next[r]
        cur[idx] = nxt
        # a local DRAM replica cannot be beaten: that block's walk ends; past
        # MAX_RANKED_REPLICAS rows only blocks without a readable replica walk on
        keep = (nxt >= 0) & (best_score[idx] >= _LOCAL_SSD_SCORE)
        level += 1
        if level >= MAX_RANKED_REPLICAS:
            keep &= best_row[idx] < 0
        idx = idx[keep]
    return best_row, best_holder


def score_rows(cols: IndexColumns, rows: np.ndarray, local_holder: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row or -1 if unreadable, score: lower is better, holder) of some rows (int64)."""
    # (plain int constants: an enum member read through its class costs ~2 us, measured)
    h = cols.holder[rows].astype(np.int64)
    st = cols.state[rows]
    ok = ((st & _STATE_MASK) == _COMMITTED) & cols.readable[h]
    rank = np.where(h == local_holder, 0.0, 2.0) + (cols.tier[rows] == _SSD) \
        + 0.5 * (st >= _COPY_BIT)
    score = rank * RANK_SCORE + np.minimum(cols.load[h], LOAD_CLIP)
    score[~ok] = np.inf
    return np.where(ok, rows, NO_ROW), score, h
