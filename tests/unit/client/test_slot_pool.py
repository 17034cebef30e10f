"""The client's pool of reserve-ahead slots (kvstored/client/_slots.py): what a put takes,
what lapses into the returns, and whose slots a late refill may add."""

from __future__ import annotations

import pytest

from kvstored.client import _slots
from kvstored.client._slots import SlotPool

OWNER = (7, 1)
K = 256 << 10


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    t = [1000.0]
    monkeypatch.setattr(_slots.time, "monotonic", lambda: t[0])
    return t


def _grant(pool: SlotPool, first: int, n: int, size: int = K, at: float = 1000.0, lease_s: float = 30.0,
           owner: tuple[int, int] = OWNER, **kw: bool) -> None:
    pool.add(owner, [(first + j, (first + j) * size, size) for j in range(n)], lease_s, at, **kw)


def test_take_all_is_all_or_nothing_and_oldest_first(now: list[float]) -> None:
    pool = SlotPool(64 << 20)
    pool.take_returns(OWNER)  # the pool belongs to OWNER's session
    _grant(pool, 0, 4)
    _grant(pool, 10, 4, at=1001.0)
    assert pool.take_all(OWNER, {K: 9}) is None  # 8 held: nothing taken
    assert pool.held_bytes() == 8 * K
    got = pool.take_all(OWNER, {K: 6})
    assert got == {K: ([0, 1, 2, 3, 10, 11], [0, K, 2 * K, 3 * K, 10 * K, 11 * K])}
    assert pool.slot_ids() == {12, 13}
    assert pool.take_all(OWNER, {K: 1, 2 * K: 1}) is None  # no slot of the other size


def test_slots_near_their_lease_end_are_returned_not_taken(now: list[float]) -> None:
    pool = SlotPool(64 << 20)
    pool.take_returns(OWNER)
    _grant(pool, 0, 2, lease_s=8.0)  # use by 1000 + 8 - 2
    _grant(pool, 5, 2, lease_s=30.0, at=1001.0)
    now[0] = 1006.5
    got = pool.take_all(OWNER, {K: 2})
    assert got == {K: ([5, 6], [5 * K, 6 * K])}
    assert pool.take_returns(OWNER) == [0, 1]


def test_a_later_grant_with_an_earlier_lease_end_never_extends_the_ones_before(now: list[float]) -> None:
    pool = SlotPool(64 << 20)
    pool.take_returns(OWNER)
    _grant(pool, 0, 2, lease_s=30.0)  # use by 1028
    _grant(pool, 5, 1, lease_s=8.0)  # use by 1006: the first two must not be kept past it
    now[0] = 1007.0
    assert pool.take_all(OWNER, {K: 1}) is None
    assert sorted(pool.take_returns(OWNER)) == [0, 1, 5]


def test_a_late_refill_of_another_session_is_not_added(now: list[float]) -> None:
    pool = SlotPool(64 << 20)
    pool.take_returns(OWNER)
    _grant(pool, 0, 2)
    _grant(pool, 5, 2, owner=(6, 1), current_only=True)  # the session that asked ended
    assert pool.slot_ids() == {0, 1}
    _grant(pool, 9, 1, current_only=True)
    assert pool.slot_ids() == {0, 1, 9}


def test_demand_of_two_puts_is_scaled_to_the_budget(now: list[float]) -> None:
    pool = SlotPool(64 << 20)
    pool.note_demand({K: 16}, 64 << 20, 2)
    assert pool.wants() == [(K, 32)]
    pool.note_demand({4 << 20: 16}, 64 << 20, 1)  # most recent first: it takes the room
    assert pool.wants() == [(4 << 20, 16)]
