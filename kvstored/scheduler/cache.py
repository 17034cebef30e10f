"""Block-cache models for the trace replay: per-node caches with a capacity in blocks.

Three eviction policies, all exact (no sampling):

- ``lru``: plain LRU; a request's blocks are touched head first, so its tail is the most recent
  and its head is evicted first.
- ``store``: the store's policy (kvstored.tiers.tiered; docs/architecture.md#tiers-and-eviction):
  LRU with chain-aware recency; hits are touched and new blocks inserted *tail first*, so the
  head of a chain is the most recent and chain tails go before heads (a lost head would orphan
  the rest).
- ``lfu``: least frequently used, ties broken by least recent.

Keys are any hashable (trace hash ids are ints). Not thread-safe.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from enum import StrEnum

from kvstored.errors import InvalidArgument


class EvictionPolicy(StrEnum):
    """Eviction policy of a modelled cache."""

    LRU = "lru"
    STORE = "store"
    LFU = "lfu"


class BlockCache:
    """A cache of block keys with a capacity in blocks.

    Args:
        capacity_blocks: most blocks held; None = unlimited.
        policy: eviction policy.

    Raises:
        InvalidArgument: capacity < 1.
    """

    def __init__(self, capacity_blocks: int | None, policy: EvictionPolicy = EvictionPolicy.STORE):
        if capacity_blocks is not None and capacity_blocks < 1:
            raise InvalidArgument(
                f"capacity_blocks must be >= 1 or None (unlimited), got {capacity_blocks}"
            )
        self.capacity_blocks = capacity_blocks
        self.policy = EvictionPolicy(policy)
        self._lru: OrderedDict[Hashable, None] = OrderedDict()
        # LFU: key -> (count, tick); heap of (count, tick, key) with lazy deletion
        self._freq: dict[Hashable, tuple[int, int]] = {}
        self._heap: list[tuple[int, int, Hashable]] = []
        self._tick = 0
        self.num_evicted = 0

    def __len__(self) -> int:
        return len(self._freq) if self.policy is EvictionPolicy.LFU else len(self._lru)

    def __contains__(self, key: Hashable) -> bool:
        return key in (self._freq if self.policy is EvictionPolicy.LFU else self._lru)

    def prefix_blocks(self, keys: Sequence[Hashable]) -> int:
        """Leading keys present (stops at the first miss). Does not change recency."""
        store = self._freq if self.policy is EvictionPolicy.LFU else self._lru
        n = 0
        for k in keys:
            if k not in store:
                break
            n += 1
        return n

    def touch(self, keys: Sequence[Hashable]) -> None:
        """Record a read of the present keys among ``keys`` (missing ones are ignored)."""
        self._access(keys, insert=False)

    def access(self, keys: Sequence[Hashable]) -> None:
        """Record a read of the present keys and insert the missing ones (evicting as needed)."""
        self._access(keys, insert=True)

    def _access(self, keys: Sequence[Hashable], *, insert: bool) -> None:
        order: Iterable[Hashable] = reversed(keys) if self.policy is EvictionPolicy.STORE else keys
        cap = self.capacity_blocks
        if self.policy is EvictionPolicy.LFU:
            freq, heap = self._freq, self._heap
            for k in order:
                self._tick += 1
                old = freq.get(k)
                if old is None:
                    if not insert:
                        continue
                    if cap is not None and len(freq) >= cap:
                        self._evict_lfu()
                    entry = (1, self._tick)
                else:
                    entry = (old[0] + 1, self._tick)
                freq[k] = entry
                heapq.heappush(heap, (entry[0], entry[1], k))
            if len(heap) > 4 * max(len(freq), 1024):  # drop stale heap entries
                self._heap = [(c, t, k) for k, (c, t) in freq.items()]
                heapq.heapify(self._heap)
            return
        lru = self._lru
        for k in order:
            if k in lru:
                lru.move_to_end(k)
            elif insert:
                if cap is not None and len(lru) >= cap:
                    lru.popitem(last=False)
                    self.num_evicted += 1
                lru[k] = None

    def _evict_lfu(self) -> None:
        freq, heap = self._freq, self._heap
        while heap:
            c, t, k = heapq.heappop(heap)
            if freq.get(k) == (c, t):
                del freq[k]
                self.num_evicted += 1
                return


def hit_ratio_curve(
    requests: Iterable[Sequence[Hashable]],
    capacities: Sequence[int | None],
    policies: Sequence[EvictionPolicy] = (EvictionPolicy.LRU, EvictionPolicy.STORE),
) -> dict[str, dict[str, float]]:
    """Prefix-hit ratio of a request stream through one cache, per policy and capacity.

    For each request (its block keys in order) the hit count is the number of leading keys
    present; then all its keys are accessed. The ratio is total hits / total keys.

    Args:
        requests: block keys of each request, in arrival order (iterated once per run).
        capacities: cache sizes in blocks; None = unlimited (reported as ``"inf"``).
        policies: eviction policies to compare.

    Returns:
        ``{policy: {capacity or "inf": hit_ratio}}``.
    """
    reqs = [list(r) for r in requests]
    total = sum(len(r) for r in reqs)
    out: dict[str, dict[str, float]] = {}
    for pol in policies:
        row: dict[str, float] = {}
        for cap in capacities:
            cache = BlockCache(cap, EvictionPolicy(pol))
            hits = 0
            for r in reqs:
                hits += cache.prefix_blocks(r)
                cache.access(r)
            row["inf" if cap is None else str(cap)] = hits / total if total else 0.0
        out[str(pol)] = row
    return out
