"""Block-cache models: exact eviction orders and hit-ratio curves with known answers."""

from __future__ import annotations

import pytest

from kvstored.errors import InvalidArgument
from kvstored.scheduler.cache import BlockCache, EvictionPolicy, hit_ratio_curve


def test_plain_lru_evicts_a_chain_head_first() -> None:
    c = BlockCache(4, EvictionPolicy.LRU)
    c.access([1, 2, 3])  # recency (old -> new): 1 2 3
    c.access([9, 8])  # 1 goes
    assert 1 not in c and c.prefix_blocks([1, 2, 3]) == 0  # the chain is useless now


def test_store_policy_evicts_chain_tails_first() -> None:
    c = BlockCache(4, EvictionPolicy.STORE)
    c.access([1, 2, 3])  # touched tail first: recency 3 2 1 (1 most recent)
    c.access([9, 8])  # 3 goes, then nothing else
    assert 3 not in c and c.prefix_blocks([1, 2, 3]) == 2
    c.touch([1, 2, 7])  # 7 absent: ignored, not inserted
    assert 7 not in c and len(c) == 4


def test_lfu_keeps_the_frequent_block() -> None:
    c = BlockCache(2, EvictionPolicy.LFU)
    c.access([1])
    c.access([1])
    c.access([2])
    c.access([3])  # 2 (count 1, older than 3) goes; 1 (count 2) stays
    assert 1 in c and 2 not in c and 3 in c
    assert c.num_evicted == 1


def test_unlimited_and_bad_capacity() -> None:
    c = BlockCache(None)
    c.access(list(range(1000)))
    assert len(c) == 1000
    with pytest.raises(InvalidArgument):
        BlockCache(0)


def test_hit_ratio_curve_known_answer() -> None:
    stream = [[1, 2, 3], [1, 2, 4], [5], [1, 2, 3]]  # 10 blocks
    curve = hit_ratio_curve(stream, [None, 3], [EvictionPolicy.LRU, EvictionPolicy.STORE])
    # unlimited: hits 0 + 2 + 0 + 3 = 5
    assert curve["lru"]["inf"] == pytest.approx(0.5)
    assert curve["store"]["inf"] == pytest.approx(0.5)
    # 3 blocks, LRU: [1,2,3] -> [1,2,4] hits 2 (evicts 3) -> [5] evicts 1 -> [1,2,3] hits 0
    assert curve["lru"]["3"] == pytest.approx(0.2)
    # store: after [1,2,4] recency 4 2 1; [5] evicts 4; [1,2,3] hits 2
    assert curve["store"]["3"] == pytest.approx(0.4)
