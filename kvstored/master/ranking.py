"""Ranking of a block's replicas: which one a lookup returns (vectorized over many blocks).

Best = local DRAM > local SSD > remote DRAM > remote SSD, then an original over a remote-fill
copy (its owner is the safer, and usually the less busy, source), then the least loaded
holder, then the lowest holder id (deterministic). As one score per row (lower is better)::

    score = (tier rank + 0.5 x copy) x RANK_SCORE + min(load, LOAD_CLIP)
    tier rank: local DRAM 0, local SSD 1, remote DRAM 2, remote SSD 3;  unreadable: inf

A read that asks for alternates (read fallback: the asker tries the next holder when the
best one is unreachable) gets the block's readable replicas on distinct holders in that
order (:func:`ranked_rows`); holders the asker names as ``avoid`` (nodes it found
unreachable) score :data:`AVOID_SCORE` more, so they rank after every other readable
replica but are still answered when nothing else is readable (a suspect only reorders).

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
AVOID_SCORE = 4 * RANK_SCORE
"""Added to the score of an avoided holder's rows: above any other readable row's score
(at most 3.5 x RANK_SCORE + LOAD_CLIP)."""
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


def native_args(cols: IndexColumns) -> tuple[tuple[np.ndarray, ...], tuple[int | float, ...]]:
    """``(columns, constants)`` as native/master_lookup.c takes them (``ranked_rows``,
    ``lookup_wire``): the row and holder columns a ranking reads, and its scores' constants.
    Built per call: the columns are reallocated when they grow."""
    return ((cols.head, cols.next, cols.holder, cols.state, cols.tier, cols.readable, cols.load,
             cols.size, cols.gen), _CONSTS)


_CONSTS = (_COMMITTED, _STATE_MASK, _COPY_BIT, _SSD, float(RANK_SCORE), float(LOAD_CLIP),
           float(AVOID_SCORE), MAX_RANKED_REPLICAS)


def ranked_rows(cols: IndexColumns, slots: np.ndarray, local_holder: int, *,
                avoid: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """The readable COMMITTED replicas of each block slot on distinct holders, best first
    (the order of :func:`best_rows`, avoided holders last; see the module docstring).

    Ranks each block's first :data:`MAX_RANKED_REPLICAS` rows (newest first) by score, then
    the lowest holder, then the newest row; a block none of whose first rows is readable
    gets :func:`best_rows`' answer (which walks on) and no alternates. Of two rows of one
    holder (its DRAM and SSD replica) only the better one is kept: a second try on the same
    node is no fallback.

    One C call (native/master_lookup.c ``ranked_rows``: the same ranking, block by block)
    when the extension is built, else :func:`py_ranked_rows`.

    Args:
        cols: the index's columns.
        slots: ``(num_blocks,)`` int64 block slots, each with at least one row.
        local_holder: the asking node's holder id (-1: every replica is remote).
        avoid: int64 holder ids to rank last (may be empty).
        width: columns wanted (1 = the best replica only), 1..MAX_RANKED_REPLICAS.

    Returns:
        ``(rows, holders)``, each ``(num_blocks, width)`` int64: column 0 the best row of
        each block (-1 when none is readable), then the next ones; -1 pads a block with
        fewer readable holders.

    Raises:
        ValueError: ``width`` outside 1..MAX_RANKED_REPLICAS.
    """
    if not 1 <= width <= MAX_RANKED_REPLICAS:
        raise ValueError(f"width must be in 1..{MAX_RANKED_REPLICAS}, got {width}")
    impl = native.master_index
    if impl is None:
        return py_ranked_rows(cols, slots, local_holder, avoid=avoid, width=width)
    n = len(slots)
    rows, holders = np.empty((n, width), dtype=np.int64), np.empty((n, width), dtype=np.int64)
    columns, consts = native_args(cols)
    impl.ranked_rows(columns, consts, np.ascontiguousarray(slots, dtype=np.int64), int(local_holder),
                     np.ascontiguousarray(avoid, dtype=np.int64), width, rows, holders)
    return rows, holders


def py_ranked_rows(cols: IndexColumns, slots: np.ndarray, local_holder: int, *,
                   avoid: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`ranked_rows` in numpy, level by level over all blocks (the fallback, and the
    reference of the C ranking)."""
    if not 1 <= width <= MAX_RANKED_REPLICAS:
        raise ValueError(f"width must be in 1..{MAX_RANKED_REPLICAS}, got {width}")
    n = len(slots)
    level_rows: list[np.ndarray] = []
    level_scores: list[np.ndarray] = []
    level_holders: list[np.ndarray] = []
    cur = cols.head[slots].astype(np.int64)
    for _ in range(MAX_RANKED_REPLICAS):  # one column per level of the blocks' chains
        here = cur >= 0
        if not here.any():
            break
        at = np.where(here, cur, 0)
        row, score, h = score_rows(cols, at, local_holder)
        if len(avoid):
            score += np.where(np.isin(h, avoid), AVOID_SCORE, 0.0)
        score[~here] = np.inf
        level_rows.append(row)
        level_scores.append(score)
        level_holders.append(h)
        cur = np.where(here, cols.next[at], NO_ROW)
    rows = np.stack(level_rows, axis=1)  # (n, levels walked): most blocks have 1-3 rows
    scores = np.stack(level_scores, axis=1)
    holders = np.stack(level_holders, axis=1)
    if rows.shape[1] > 1:
        ar = np.arange(n)[:, None]
        order = np.lexsort((holders, scores), axis=1)  # by score, then the lowest holder
        rows, scores, holders = rows[ar, order], scores[ar, order], holders[ar, order]
        valid = np.isfinite(scores)
        for j in range(1, rows.shape[1]):  # a holder's second row (other tier): no alternate
            valid[:, j] &= ~(holders[:, :j] == holders[:, j:j + 1]).any(axis=1)
        keep = np.argsort(~valid, axis=1, kind="stable")[:, :width]  # valid first, in order
        rows, holders, valid = rows[ar, keep], holders[ar, keep], valid[ar, keep]
    else:
        valid = np.isfinite(scores)
    rows = np.where(valid, rows[:, :width], NO_ROW)
    holders = np.where(valid, holders[:, :width], -1)
    if rows.shape[1] < width:  # pad: fewer rows walked than columns asked
        pad = np.full((n, width - rows.shape[1]), NO_ROW, np.int64)
        rows, holders = np.hstack([rows, pad]), np.hstack([holders, pad])
    deep = np.flatnonzero((rows[:, 0] < 0) & (cur >= 0))  # unreadable so far, more rows
    if len(deep):
        rows[deep, 0], holders[deep, 0] = best_rows(cols, slots[deep], local_holder)
        holders[deep, 0] = np.where(rows[deep, 0] >= 0, holders[deep, 0], -1)
    return rows, holders
