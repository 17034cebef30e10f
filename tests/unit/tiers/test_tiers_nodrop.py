"""A store never drops a block the pool could keep (issue 17 section 3), in-process.

- Spare victims first: every allocation (a put, a promotion) evicts, before anything in
  plain LRU order, what drops no block: copies, DRAM blocks already on SSD, demotions the
  SSD takes as is (tiers/transit.py ``_spare_window``).
- An SSD allocation evicts a block DRAM also holds first (its SSD copy only).
- Backpressure: a put with no spare victim asks the pool (``TieredStore.set_pool_room``,
  the spiller in a node) and looks again while it made room, within a bound; a pool that
  answers "no room" gets LRU eviction at once. The bound runs on a fake clock.
"""

from __future__ import annotations

import pathlib
import types
from collections.abc import Iterator

import pytest
from helpers import key

from kvstored.tiers import transit
from kvstored.tiers.tiered import TieredStore
from kvstored.types import Tier

K = 4096
BLOCK = 2 * K + 100  # 3 units in DRAM and on SSD (with its trailer)


def val(i: int) -> bytes:
    return bytes([i % 256]) * BLOCK


@pytest.fixture
def stores(tmp_path: pathlib.Path) -> Iterator[list[TieredStore]]:
    opened: list[TieredStore] = []
    yield opened
    for s in opened:
        s.close()


def _store(opened: list[TieredStore], tmp: pathlib.Path, dram_blocks: int,
           ssd_blocks: int = 0) -> TieredStore:
    s = TieredStore(dram_size_bytes=dram_blocks * 3 * K, arena_dir=None,
                    ssd_dir=tmp / "ssd" if ssd_blocks else None,
                    ssd_size_bytes=ssd_blocks * 3 * K)
    opened.append(s)
    return s


def _tier(s: TieredStore, tier: Tier) -> object:
    return next(t for t in s.stats().tiers if t.tier == tier)


def test_a_put_frees_a_dram_block_already_on_ssd_before_demoting_into_a_full_ssd(
    stores: list[TieredStore], tmp_path: pathlib.Path
) -> None:
    s = _store(stores, tmp_path, dram_blocks=2, ssd_blocks=2)
    s.put(key(0), val(0))
    s.put(key(1), val(1))
    assert s.spill_to_ssd() == 2  # SSD [0, 1] full; DRAM [0, 1]
    s.put(key(2), val(2))  # frees DRAM 0 (on SSD): DRAM [1, 2]
    pinned = s.pin_many([key(1)])  # 1 (on SSD too) is now the most recent
    s.unpin_many(pinned)  # type: ignore[arg-type]
    # DRAM LRU order: 2 (DRAM only), then 1 (on SSD). Plain LRU would demote 2 into the
    # full SSD, which then evicts 0, an SSD-only block: gone.
    s.put(key(3), val(3))
    assert s.exists([key(i) for i in range(4)]) == [True] * 4
    assert _tier(s, Tier.SSD).evictions == 0  # type: ignore[attr-defined]
    assert s.lookup_prefix([key(1)]) == [Tier.SSD]  # its DRAM space went; the SSD copy stays


def test_an_ssd_allocation_evicts_the_ssd_copy_of_a_dram_block_before_an_ssd_only_block(
    stores: list[TieredStore], tmp_path: pathlib.Path
) -> None:
    s = _store(stores, tmp_path, dram_blocks=2, ssd_blocks=2)
    s.put(key(0), val(0))
    s.put(key(1), val(1))
    assert s.spill_to_ssd() == 2
    s.put(key(2), val(2))  # DRAM [1 (on SSD), 2]; SSD [0 (SSD only), 1]
    held = s.pin_many([key(1)])  # 1 cannot leave DRAM: no spare victim for the next put
    try:
        s.put(key(3), val(3))  # demotes 2 into the full SSD: it evicts 1's SSD copy, not 0
        assert s.exists([key(i) for i in range(4)]) == [True] * 4
        assert s.lookup_prefix([key(0), key(1), key(2)]) == [Tier.SSD, Tier.DRAM, Tier.SSD]
    finally:
        s.unpin_many(held)  # type: ignore[arg-type]


def test_a_put_with_no_spare_victim_waits_for_the_pool_and_evicts_nothing(
    stores: list[TieredStore], tmp_path: pathlib.Path
) -> None:
    s = _store(stores, tmp_path, dram_blocks=2)
    s.put(key(0), val(0))
    s.put(key(1), val(1))
    asked: list[int] = []

    def pool_room(need_bytes: int, deadline: float) -> bool:  # the spiller, moving 0 away
        asked.append(need_bytes)
        assert s.remove([key(0)]) == [True]  # the store lock is not held here
        return True

    s.set_pool_room(pool_room, wait_s=60.0)
    assert s.put(key(2), val(2))
    assert asked == [3 * K] and s.pool_waits == 1
    assert s.exists([key(1), key(2)]) == [True, True]
    assert _tier(s, Tier.DRAM).evictions == 0  # type: ignore[attr-defined]
    assert s.evictions_for_good == 0


def test_a_full_pool_answers_no_room_and_the_put_evicts_the_lru_block_at_once(
    stores: list[TieredStore], tmp_path: pathlib.Path
) -> None:
    s = _store(stores, tmp_path, dram_blocks=2)
    s.put(key(0), val(0))
    s.put(key(1), val(1))
    calls: list[float] = []
    s.set_pool_room(lambda need, deadline: calls.append(deadline) or False, wait_s=60.0)
    assert s.put(key(2), val(2))
    assert len(calls) == 1  # one answer "no room", no second ask
    assert s.exists([key(0), key(1), key(2)]) == [False, True, True]
    assert s.evictions_for_good == 1


def test_the_wait_is_bounded_even_when_the_pool_keeps_saying_it_made_room(
    stores: list[TieredStore], tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr(transit, "time", types.SimpleNamespace(monotonic=lambda: now[0]))  # this module only
    s = _store(stores, tmp_path, dram_blocks=2)
    s.put(key(0), val(0))
    s.put(key(1), val(1))
    deadlines: list[float] = []

    def liar(need_bytes: int, deadline: float) -> bool:  # says yes, frees nothing
        deadlines.append(deadline)
        now[0] += 0.75
        return True

    s.set_pool_room(liar, wait_s=2.0)
    assert s.put(key(2), val(2))  # returns: the bound is over after 3 asks (0.75 s each)
    assert deadlines == [1002.0] * 3
    assert s.exists([key(0), key(1), key(2)]) == [False, True, True]


def test_a_copy_never_waits_for_the_pool(
    stores: list[TieredStore], tmp_path: pathlib.Path
) -> None:
    from kvstored.errors import NoCapacity

    s = _store(stores, tmp_path, dram_blocks=2)
    s.put(key(0), val(0))
    s.put(key(1), val(1))
    s.set_pool_room(lambda need, deadline: pytest.fail("a copy asked the pool"), wait_s=60.0)
    with pytest.raises(NoCapacity):
        s.reserve(key(2), BLOCK, copy=True)


def test_set_pool_room_refuses_a_negative_wait(
    stores: list[TieredStore], tmp_path: pathlib.Path
) -> None:
    from kvstored.errors import InvalidArgument

    s = _store(stores, tmp_path, dram_blocks=2)
    with pytest.raises(InvalidArgument, match="wait_s must be >= 0 seconds, got -1"):
        s.set_pool_room(None, wait_s=-1)


def _full_dram_and_ssd_of_originals(s: TieredStore) -> None:
    """DRAM [2, 3] (DRAM only), SSD [0, 1] (SSD only, full): every block an original,
    and no victim whose eviction drops nothing."""
    s.put(key(0), val(0))
    s.put(key(1), val(1))
    assert s.spill_to_ssd() == 2  # SSD [0, 1] full
    s.put(key(2), val(2))  # frees DRAM 0 (on SSD)
    s.put(key(3), val(3))  # frees DRAM 1 (on SSD)
    assert s.lookup_prefix([key(2), key(3)]) == [Tier.DRAM, Tier.DRAM]
    assert s.exists([key(0), key(1)]) == [True, True]


def test_a_promotion_whose_wait_for_the_spiller_runs_out_evicts_no_original(
    stores: list[TieredStore], tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CI loss of test_reads_through_two_small_tiered_nodes_lose_nothing: a read of an
    SSD-only block into a node whose DRAM and SSD hold only originals waited for the spiller,
    the spiller was held past the bound (``spill_put_wait_s``), and the promotion then
    demoted a DRAM-only block into the full SSD, which evicted an SSD-only original. The
    promoted block was on SSD already: its promotion is skipped instead (NoCapacity for the
    pin: served from SSD by the node's read paths), and nothing leaves the store."""
    from kvstored.errors import NoCapacity

    now = [1000.0]  # transit's clock only (the SSD tier's I/O keeps the real one)
    monkeypatch.setattr(transit, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    s = _store(stores, tmp_path, dram_blocks=2, ssd_blocks=2)
    _full_dram_and_ssd_of_originals(s)
    dram_evictions = _tier(s, Tier.DRAM).evictions  # type: ignore[attr-defined]  # 0 and 1 (on SSD)
    held: list[float] = []

    def spiller_held(need_bytes: int, deadline: float) -> bool:  # held past the bound
        held.append(deadline)
        now[0] = deadline + 1
        return False

    s.set_pool_room(spiller_held, wait_s=2.0)
    got = s.pin_many([key(0)])
    assert held == [1002.0], "the promotion asks the pool first"
    assert len(got) == 1 and isinstance(got[0], NoCapacity), got
    assert s.exists([key(i) for i in range(4)]) == [True] * 4
    assert s.lookup_prefix([key(0)]) == [Tier.SSD]  # still SSD only: not promoted
    assert _tier(s, Tier.SSD).evictions == 0  # type: ignore[attr-defined]
    assert _tier(s, Tier.DRAM).evictions == dram_evictions  # type: ignore[attr-defined]
    assert s.evictions_for_good == 0
    # A batch read (promote_many, then one promotion per key) skips the same way.
    got = s.pin_many([key(0), key(1)])
    assert all(isinstance(g, NoCapacity) for g in got), got
    assert s.exists([key(i) for i in range(4)]) == [True] * 4
    assert s.evictions_for_good == 0


def test_a_promotion_still_uses_a_victim_that_drops_nothing(
    stores: list[TieredStore], tmp_path: pathlib.Path
) -> None:
    s = _store(stores, tmp_path, dram_blocks=2, ssd_blocks=3)
    _full_dram_and_ssd_of_originals(s)  # SSD has room for one demotion: 2 or 3 may go there
    s.set_pool_room(lambda need, deadline: pytest.fail("a spare victim exists"), wait_s=60.0)
    got = s.pin_many([key(0)])
    assert got[0] is not None and not isinstance(got[0], Exception)
    s.unpin_many(got)  # type: ignore[arg-type]
    assert s.exists([key(i) for i in range(4)]) == [True] * 4
    assert s.evictions_for_good == 0


def test_a_reserve_ahead_refill_never_drops_an_original_on_a_node_in_a_pool(
    stores: list[TieredStore], tmp_path: pathlib.Path
) -> None:
    # Regression (bench_spill's full pool: 10 blocks lost for 8 puts, 2 of them not the
    # pool's coldest): a CommitSlots refill, slots granted before any put asks for them,
    # evicted originals locally, past the pool's LRU hand-off, for slots that may never be
    # written. A refill now takes only what drops nothing; a put at hand still evicts.
    s = _store(stores, tmp_path, dram_blocks=2)
    s.put(key(0), val(0))
    s.put(key(1), val(1))
    calls: list[float] = []
    s.set_pool_room(lambda need, deadline: calls.append(deadline) or False, wait_s=60.0)
    assert s.reserve_slots(BLOCK, 1, ahead=True) == []  # a refill: fewer (none) granted
    assert s.exists([key(0), key(1)]) == [True, True] and s.evictions_for_good == 0
    assert calls == []  # and it never waited on the pool
    got = s.reserve_slots(BLOCK, 1)  # the grant of a put at hand evicts, as the put would
    assert isinstance(got, list) and len(got) == 1
    assert s.exists([key(0), key(1)]) == [False, True] and s.evictions_for_good == 1
    s.abort(got[0])


def test_a_reserve_ahead_refill_on_a_standalone_node_evicts_in_lru_order(
    stores: list[TieredStore], tmp_path: pathlib.Path
) -> None:
    s = _store(stores, tmp_path, dram_blocks=2)  # no pool: the node is the whole pool
    s.put(key(0), val(0))
    s.put(key(1), val(1))
    got = s.reserve_slots(BLOCK, 1, ahead=True)
    assert isinstance(got, list) and len(got) == 1
    assert s.exists([key(0), key(1)]) == [False, True]
    s.abort(got[0])
