"""The batch pin/unpin of TieredStore (issue 9's get hot path): ``pin_many`` when every key
is a DRAM hit, and ``unpin_many``.

The all-DRAM-hit pass must pin, count and touch exactly like the per-key path it skips,
and ``unpin_many`` must release each pin once under one lock, report (not raise) stale
ones, and keep a block pinned until its last pin goes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from helpers import key

from kvstored.errors import NotFound
from kvstored.tiers.tiered import TieredStore
from kvstored.types import PinnedBlock, Tier

K = 4096


@pytest.fixture
def store() -> Iterator[TieredStore]:
    s = TieredStore(dram_size_bytes=8 * K, arena_dir=None)
    for i in range(4):
        assert s.put(key(i), bytes([i + 1]) * (K - i), meta=b"m%d" % i)
    yield s
    s.close()


def _order(s: TieredStore) -> list[bytes]:
    return [sk[-16:] for sk in s._state.dram.entries]  # LRU first


def test_all_dram_hits_pin_count_and_touch_like_the_per_key_path(store: TieredStore) -> None:
    keys = [key(2), key(0), key(2), key(1)]  # a duplicate is pinned (and counted) twice
    fast = store.pin_many(keys)  # every key a DRAM hit: the batch pass
    stats = store.stats()
    assert (stats.gets, stats.hits, stats.misses, stats.pinned_blocks) == (4, 4, 0, 3)
    assert stats.tiers[0].hits == 4
    assert _order(store)[-3:] == [key(1), key(0), key(2)]  # touched last-key-first: head newest
    # the per-key path (a miss in the batch) gives equal blocks for the same keys
    slow = store.pin_many(keys + [key(9)])
    assert slow[-1] is None
    assert fast == slow[:-1]  # key, offset, size, meta, tier, generation
    for f, s_, k in zip(fast, slow[:-1], keys, strict=True):
        assert isinstance(f, PinnedBlock) and f.tier is Tier.DRAM and f.entry is not None
        assert bytes(f.view) == bytes(s_.view) == bytes([int.from_bytes(k, "big") + 1]) * f.size_bytes
        assert f.view.readonly
    assert store.unpin_many(fast + slow[:-1]) == []
    assert store.stats().pinned_blocks == 0


def test_unpin_many_reports_stale_pins_and_releases_the_rest(store: TieredStore) -> None:
    a, b = store.pin_many([key(0), key(1)])
    assert isinstance(a, PinnedBlock) and isinstance(b, PinnedBlock)
    assert store.unpin_many([a]) == []
    assert store.unpin_many([a, b]) == [a]  # a released twice: reported; b still released
    assert store.stats().pinned_blocks == 0
    with pytest.raises(NotFound):
        store.unpin(b)


def test_a_block_stays_pinned_until_its_last_pin_is_released(store: TieredStore) -> None:
    first = store.pin_many([key(3)])
    second = store.pin_many([key(3)])
    store.unpin_many(first)
    assert store.remove([key(3)]) == [False]  # still pinned by the second reader
    store.unpin_many(second)
    assert store.remove([key(3)]) == [True]


def test_unpin_many_finds_a_block_without_its_entry_by_offset(store: TieredStore) -> None:
    (p,) = store.pin_many([key(1)])
    assert isinstance(p, PinnedBlock)
    bare = PinnedBlock(p.key, p.offset, p.size_bytes, p.meta, p.tier, p.view, p.generation)
    assert bare.entry is None and bare == p
    assert store.unpin_many([bare]) == []
    assert store.stats().pinned_blocks == 0
    wrong = PinnedBlock(key(0), p.offset, p.size_bytes, p.meta, p.tier, p.view)
    assert store.unpin_many([wrong]) == [wrong]  # another key at that offset: not its pin


def test_unpin_many_wakes_the_stores_waiters_once_per_batch(store: TieredStore) -> None:
    """Waiters on the store's condition (readers of a promotion in flight) are woken when
    pins drop to zero: once for the whole batch, not once per block."""
    pins = store.pin_many([key(i) for i in range(4)])
    woken = threading.Event()
    calls: list[int] = []
    real = store._state.cond.notify_all

    def counting() -> None:
        calls.append(1)
        real()
        woken.set()

    store._state.cond.notify_all = counting  # type: ignore[method-assign]
    store.unpin_many(pins)
    assert woken.is_set() and calls == [1]
