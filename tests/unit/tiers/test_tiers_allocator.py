"""BlockAllocator: best fit, coalescing, and invariants under random alloc/free sequences."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvstored.tiers.allocator import BlockAllocator

K = 4096


def test_capacity_rounds_down_and_rejects_tiny() -> None:
    a = BlockAllocator(10 * K + 100)
    assert a.capacity_bytes == 10 * K
    with pytest.raises(ValueError, match="at least one"):
        BlockAllocator(K - 1)
    with pytest.raises(ValueError, match="power of two"):
        BlockAllocator(10 * K, alignment_bytes=3000)


def test_offsets_aligned_and_sizes_rounded() -> None:
    a = BlockAllocator(16 * K)
    assert a.allocate(1) == 0
    assert a.allocate(K + 1) == K
    assert a.allocate(0) == 3 * K  # a zero-byte block still takes one aligned unit
    assert a.used_bytes == 4 * K
    a.check_invariants()


def test_best_fit_picks_smallest_adequate_hole() -> None:
    a = BlockAllocator(20 * K)
    offs = [a.allocate(K) for _ in range(20)]
    # holes: [2K at offset 1..2], [4K at 5..8], [1K at 11]
    a.free(offs[1], K)
    a.free(offs[2], K)
    for i in range(5, 9):
        a.free(offs[i], K)
    a.free(offs[11], K)
    a.check_invariants()
    assert a.allocate(K) == 11 * K  # exact 1-unit hole
    assert a.allocate(2 * K) == 1 * K  # exact 2-unit hole, not the 4-unit one
    assert a.allocate(3 * K) == 5 * K
    assert a.allocate(2 * K) is None  # only one unit left at 8
    assert a.allocate(K) == 8 * K
    a.check_invariants()


def test_free_coalesces_both_neighbours() -> None:
    a = BlockAllocator(3 * K)
    x, y, z = a.allocate(K), a.allocate(K), a.allocate(K)
    assert a.allocate(K) is None
    a.free(x, K)
    a.free(z, K)
    assert a.num_free_extents == 2
    a.free(y, K)
    assert a.free_extents() == [(0, 3 * K)]
    assert a.largest_free_bytes == 3 * K
    a.check_invariants()


def test_double_free_and_bad_ranges_raise_without_damage() -> None:
    a = BlockAllocator(4 * K)
    x = a.allocate(2 * K)
    a.free(x, 2 * K)
    with pytest.raises(ValueError, match="double free"):
        a.free(x, 2 * K)
    with pytest.raises(ValueError, match="misaligned"):
        a.free(100, K)
    with pytest.raises(ValueError, match="outside"):
        a.free(3 * K, 2 * K)
    with pytest.raises(ValueError):
        a.allocate(-1)
    a.check_invariants()
    assert a.free_extents() == [(0, 4 * K)]


class AllocatorMachine(RuleBasedStateMachine):
    """Random allocate/free: no byte owned twice, usage within cap, free space coalesces."""

    CAP_UNITS = 64

    def __init__(self) -> None:
        super().__init__()
        self.a = BlockAllocator(self.CAP_UNITS * K)
        self.live: dict[int, int] = {}  # offset -> size_bytes

    @rule(size=st.integers(min_value=0, max_value=20 * K))
    def allocate(self, size: int) -> None:
        need = self.a.round_up(size)
        fits = self.a.largest_free_bytes >= need
        off = self.a.allocate(size)
        assert (off is not None) == fits
        if off is not None:
            self.live[off] = size

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        off = data.draw(st.sampled_from(sorted(self.live)))
        self.a.free(off, self.live.pop(off))

    @invariant()
    def no_byte_owned_twice(self) -> None:
        owner = bytearray(self.CAP_UNITS)
        for off, size in self.live.items():
            for u in range(off // K, (off + self.a.round_up(size)) // K):
                assert owner[u] == 0, "unit allocated twice"
                owner[u] = 1
        for off, ln in self.a.free_extents():
            for u in range(off // K, (off + ln) // K):
                assert owner[u] == 0, "unit both free and allocated"
                owner[u] = 1
        assert all(owner), "unit neither free nor allocated (leak)"

    @invariant()
    def consistent_and_within_cap(self) -> None:
        self.a.check_invariants()
        assert self.a.used_bytes == sum(self.a.round_up(s) for s in self.live.values())
        assert self.a.used_bytes <= self.a.capacity_bytes

    def teardown(self) -> None:
        for off, size in list(self.live.items()):
            self.a.free(off, size)
        # everything freed -> one extent covering the arena (coalesced)
        assert self.a.free_extents() == [(0, self.a.capacity_bytes)]


TestAllocatorMachine = AllocatorMachine.TestCase
TestAllocatorMachine.settings = settings(max_examples=40, stateful_step_count=50, deadline=None)
