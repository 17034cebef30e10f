"""Pool LRU in one store (issue 17 section 3: a full pool drops its coldest originals first).

- ``TieredStore.coldest_original_age_s``: the age of the block this node's next eviction
  for good would drop: remote-fill copies do not count, a read hit makes a block young
  again, a block demoted to SSD keeps the age of its last use in DRAM.
- A peer's hand-off (``reserve(handoff_age_s=...)``): taken by evicting this node's coldest
  original only if that one is older than the block offered, decided under the store lock;
  refused otherwise (NoCapacity, nothing evicted); taken into free space without evicting.

Ages are set by moving a block's last-use stamp back (``_age``), never by sleeping.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest
from helpers import key

from kvstored.errors import NoCapacity
from kvstored.tiers.ssd_format import store_key
from kvstored.tiers.tiered import TieredStore

K = 4096
BLOCK = 2 * K + 100  # 3 units in DRAM and on SSD (with its trailer)


def val(i: int) -> bytes:
    return bytes([i % 256]) * BLOCK


@pytest.fixture
def stores() -> Iterator[list[TieredStore]]:
    opened: list[TieredStore] = []
    yield opened
    for s in opened:
        s.close()


def _store(opened: list[TieredStore], tmp: pathlib.Path | None, dram_blocks: int,
           ssd_blocks: int = 0) -> TieredStore:
    s = TieredStore(dram_size_bytes=dram_blocks * 3 * K, arena_dir=None,
                    ssd_dir=tmp / "ssd" if tmp is not None and ssd_blocks else None,
                    ssd_size_bytes=ssd_blocks * 3 * K)
    opened.append(s)
    return s


def _age(s: TieredStore, i: int, seconds: float) -> None:
    """Make block ``key(i)``'s last use ``seconds`` older, in every tier holding it."""
    st = s._state  # noqa: SLF001 (white box: the stamp the age is computed from)
    skey = store_key(b"", key(i))
    for entries in (st.dram.entries, st.ssd.entries if st.ssd is not None else {}):
        e = entries.get(skey)
        if e is not None:
            e.touched -= seconds


def _copy(s: TieredStore, i: int) -> None:
    r = s.reserve(key(i), BLOCK, copy=True)
    assert r is not None
    r.view[:] = val(i)
    assert s.commit(r)


def test_the_coldest_originals_age_skips_copies_and_a_read_makes_a_block_young(
    stores: list[TieredStore],
) -> None:
    s = _store(stores, None, dram_blocks=8)
    assert s.coldest_original_age_s() == 0.0  # holds nothing
    for i in range(3):
        assert s.put(key(i), val(i))
    _copy(s, 9)
    _age(s, 9, 500.0)  # the oldest block is a copy: a peer holds it, it is no original
    _age(s, 0, 100.0)
    _age(s, 1, 50.0)
    assert 100.0 <= s.coldest_original_age_s() < 101.0
    [pinned] = s.pin_many([key(0)])  # a read hit: block 0 was just used
    assert pinned is not None
    s.unpin(pinned)
    assert 50.0 <= s.coldest_original_age_s() < 51.0


def test_a_block_demoted_to_ssd_keeps_the_age_of_its_last_use(
    stores: list[TieredStore], tmp_path: pathlib.Path
) -> None:
    s = _store(stores, tmp_path, dram_blocks=2, ssd_blocks=8)
    assert s.put(key(0), val(0))
    assert s.put(key(1), val(1))
    _age(s, 0, 200.0)
    _age(s, 1, 10.0)
    assert s.put(key(2), val(2))  # DRAM holds 2: block 0 (the LRU) goes to SSD only
    st = s._state  # noqa: SLF001
    assert store_key(b"", key(0)) not in st.dram.entries
    assert store_key(b"", key(0)) in st.ssd.entries  # type: ignore[union-attr]
    assert 200.0 <= s.coldest_original_age_s() < 201.0


def _full(opened: list[TieredStore]) -> TieredStore:
    """A full DRAM-only store of blocks 0..3, block 0 used 100 s ago, the others 10 s ago."""
    s = _store(opened, None, dram_blocks=4)
    for i in range(4):
        assert s.put(key(i), val(i))
    _age(s, 0, 100.0)
    for i in (1, 2, 3):
        _age(s, i, 10.0)
    return s


def test_a_hand_off_younger_than_our_coldest_original_evicts_that_one_to_take_it(
    stores: list[TieredStore],
) -> None:
    s = _full(stores)
    r = s.reserve(key(50), BLOCK, handoff_age_s=60.0)
    assert r is not None
    r.view[:] = val(50)
    assert s.commit(r)
    assert s.exists([key(i) for i in (0, 1, 2, 3, 50)]) == [False, True, True, True, True]
    assert s.handoffs_taken == 1 and s.handoffs_declined == 0
    assert s.evictions_for_good == 1  # block 0 left the pool: it was the coldest of both


def test_a_hand_off_older_than_every_original_here_is_refused_and_evicts_nothing(
    stores: list[TieredStore],
) -> None:
    s = _full(stores)
    with pytest.raises(NoCapacity, match="hand-off of a .* refused"):
        s.reserve(key(50), BLOCK, handoff_age_s=100.5)
    assert s.exists([key(i) for i in range(4)]) == [True] * 4
    assert s.handoffs_taken == 0 and s.handoffs_declined == 1
    assert s.evictions_for_good == 0
    with pytest.raises(NoCapacity):  # equal ages: refused too (the sender keeps the order)
        s.reserve(key(51), BLOCK, handoff_age_s=200.0)
    assert s.handoffs_declined == 2


def test_a_hand_off_into_free_space_or_spare_victims_drops_nothing_whatever_its_age(
    stores: list[TieredStore],
) -> None:
    s = _store(stores, None, dram_blocks=4)
    for i in range(3):
        assert s.put(key(i), val(i))
    r = s.reserve(key(50), BLOCK, handoff_age_s=1e6)  # free room: no decision needed
    assert r is not None
    s.abort(r)
    _copy(s, 3)  # now full; the copy is a spare victim
    r = s.reserve(key(51), BLOCK, handoff_age_s=1e6)
    assert r is not None
    s.abort(r)
    assert s.exists([key(i) for i in range(4)]) == [True, True, True, False]
    assert s.handoffs_taken == 0 and s.handoffs_declined == 0 and s.evictions_for_good == 0


def test_a_full_tiered_node_takes_a_hand_off_by_dropping_its_coldest_ssd_block(
    stores: list[TieredStore], tmp_path: pathlib.Path
) -> None:
    s = _store(stores, tmp_path, dram_blocks=2, ssd_blocks=2)
    for i in range(4):  # DRAM: 2, 3; SSD only: 0, 1 (both tiers full)
        assert s.put(key(i), val(i))
    _age(s, 0, 100.0)
    for i in (1, 2, 3):
        _age(s, i, 10.0)
    with pytest.raises(NoCapacity):  # older than block 0: refused, nothing moves
        s.reserve(key(51), BLOCK, handoff_age_s=150.0)
    assert s.exists([key(i) for i in range(4)]) == [True] * 4
    r = s.reserve(key(50), BLOCK, handoff_age_s=50.0)
    assert r is not None
    r.view[:] = val(50)
    assert s.commit(r)
    # block 2 (DRAM's LRU) was demoted, and the SSD made room by dropping block 0
    assert s.exists([key(i) for i in (0, 1, 2, 3, 50)]) == [False, True, True, True, True]
    assert s.get(key(2)) == (val(2), b"")
    assert (s.handoffs_taken, s.handoffs_declined) == (1, 1)


def test_a_stamp_left_from_a_clock_ahead_of_this_one_is_never_handed_out() -> None:
    # A test that patched time.monotonic forward (tests/integration/test_slot_puts.py) left
    # a shared stamp in the future: every later block got it, and ages came out negative.
    import time

    from kvstored.tiers import ssd_format

    ssd_format._TOUCHED[0] = time.monotonic() + 10_000.0
    before = time.monotonic()
    stamp = ssd_format.touch_time()
    assert before <= stamp <= time.monotonic()
