"""DRAM victim choice that frees a *contiguous* extent: LRU first, neighbours by address.

With blocks of mixed sizes, evicting LRU blocks one by one until an allocation fits can free
far more than needed: when the LRU order alternates by address, each victim leaves an isolated
hole (measured with plain LRU: 64 MiB of 1 MiB blocks, one 4 MiB put evicted 34 blocks).
Instead, the LRU victim ``v`` is taken together with just enough of its address neighbours::

    arena:  | b0 | v  | b2 | b3 | b4 | b5 |      need = 4 units, every block 1 unit
             <-left---  ---right------->
    windows containing v:  [b0 v b2 b3]  [v b2 b3 b4]   -> cost 3 other blocks each;
    ties go to the window reaching furthest right of v (fewest blocks left of v, which
    the allocator placed earlier: usually older chain heads), so [v b2 b3 b4] is chosen.

A window is a run of adjacent extents around ``v``, each either free (cost 0) or an evictable
block (cost = its bytes); a pinned block, a block in transit, a reservation or a promotion in
flight ends the run. Among the windows of at least ``need`` bytes the cheapest (fewest evicted
bytes, then fewest blocks, then fewest left neighbours) is chosen. A victim that alone (with
its free neighbours) makes room is the plain LRU choice, so uniform sizes evict in exact LRU
order. If no window around ``v`` can reach ``need``, ``v`` is skipped (evicting it would not
help this allocation) and the next LRU block is tried.

Bounded cost: a window may take at most :data:`MAX_WINDOW_ITEMS` extents on each side of
``v`` (O(k log n) per candidate, k <= 2 x MAX_WINDOW_ITEMS), and one allocation tries at most
:data:`MAX_WINDOW_TRIES` candidates whose window cannot reach ``need``; after that it falls
back to plain LRU eviction (evict ``v`` alone: its space merges with later victims'). So
the scan stays O(1) per victim even when small blocks (4 KiB probes, say) sit at the LRU
head and a 4 MiB allocation could only be met by 1024 of them.
Pure metadata: callers hold the store lock.
"""

from __future__ import annotations

from collections.abc import Callable

from kvstored.tiers.dram import DramTier

MAX_WINDOW_ITEMS = 64
"""Most extents (free or blocks) a window takes on each side of its LRU victim."""
MAX_WINDOW_TRIES = 4
"""Most LRU candidates per allocation whose window is tried in vain before plain LRU."""

# (length_bytes, store key or None for a free extent)
_Item = tuple[int, bytes | None]


def _free_ending_at(tier: DramTier, pos: int) -> int:
    bo = tier.allocator._by_offset  # noqa: SLF001 (same package; read-only)
    idx = bo.bisect_left(pos)
    if idx == 0:
        return 0
    off, ln = bo.peekitem(idx - 1)
    return int(ln) if off + ln == pos else 0


def _walk(
    tier: DramTier, start: int, end: int, budget: int, leftwards: bool,
    evictable: Callable[[bytes], bool],
) -> list[_Item]:
    """Adjacent extents beyond ``start`` (leftwards) or ``end`` (rightwards), up to ``budget``."""
    items: list[_Item] = []
    span = 0
    pos = start if leftwards else end
    free_starts = tier.allocator._by_offset  # noqa: SLF001
    while span < budget and len(items) < MAX_WINDOW_ITEMS:
        if leftwards:
            ln = _free_ending_at(tier, pos)
            if ln:
                items.append((ln, None))
                pos -= ln
                span += ln
                continue
            e = tier.entry_ending_at(pos)
            if e is None or not evictable(e.skey):
                break
            ln = tier.round_up(e.size_bytes)
            items.append((ln, e.skey))
            pos = e.offset
        else:
            ln = free_starts.get(pos, 0)
            if ln:
                items.append((int(ln), None))
                pos += ln
                span += ln
                continue
            e = tier.entry_at(pos)
            if e is None or not evictable(e.skey):
                break
            ln = tier.round_up(e.size_bytes)
            items.append((ln, e.skey))
            pos += ln
        span += ln
    return items


def victim_window(
    tier: DramTier, victim: bytes, need_bytes: int, evictable: Callable[[bytes], bool]
) -> list[bytes] | None:
    """The blocks to evict, ``victim`` first, so that a ``need_bytes`` extent becomes free.

    Args:
        tier: the DRAM tier (lock held).
        victim: store key of the LRU evictable block.
        need_bytes: the allocation's rounded size.
        evictable: whether a neighbour may be evicted (unpinned, not in transit).

    Returns:
        ``[victim, neighbours...]`` (neighbours nearest first, right side before left), or
        None when no window around ``victim`` reaches ``need_bytes``.
    """
    e = tier.entries[victim]
    start = e.offset
    base = tier.round_up(e.size_bytes)
    end = start + base
    left = _walk(tier, start, end, need_bytes - base, True, evictable)
    right = _walk(tier, start, end, need_bytes - base, False, evictable)

    def prefix(items: list[_Item]) -> tuple[list[int], list[int], list[int]]:
        span, cost, nblk = [0], [0], [0]
        for ln, k in items:
            span.append(span[-1] + ln)
            cost.append(cost[-1] + (ln if k is not None else 0))
            nblk.append(nblk[-1] + (k is not None))
        return span, cost, nblk

    ls, lc, ln_ = prefix(left)
    rs, rc, rn = prefix(right)
    best: tuple[int, int, int, int, int] | None = None
    j = len(right)
    for i in range(len(left) + 1):
        # smallest j with base + ls[i] + rs[j] >= need (j only shrinks as i grows)
        while j > 0 and base + ls[i] + rs[j - 1] >= need_bytes:
            j -= 1
        if base + ls[i] + rs[j] < need_bytes:
            continue
        cand = (lc[i] + rc[j], ln_[i] + rn[j], i, i, j)
        if best is None or cand[:3] < best[:3]:
            best = cand
    if best is None:
        return None
    _, _, _, i, j = best
    out = [victim]
    out += [k for _, k in right[:j] if k is not None]
    out += [k for _, k in left[:i] if k is not None]
    return out
