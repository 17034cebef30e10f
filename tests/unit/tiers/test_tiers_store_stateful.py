"""Rule-based tests of TieredStore: random puts, reservations, pins, removes, with/without SSD.

Invariants checked after every step: no arena byte owned twice (committed blocks and
reservations), usage within the caps, a pinned block is never evicted or moved and its bytes
never change, every DRAM block holds exactly the bytes last committed for its key, and any
block served (from either tier) carries those bytes.
"""

from __future__ import annotations

import shutil
import tempfile

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvstored.errors import NoCapacity
from kvstored.tiers.base import PinnedBlock, Reservation
from kvstored.tiers.tiered import TieredStore

K = 4096
NUM_KEYS = 10
keys = st.integers(min_value=0, max_value=NUM_KEYS - 1)
sizes = st.integers(min_value=0, max_value=3 * K + 1)


def key(i: int) -> bytes:
    return b"key-%012d" % i


class StoreMachine(RuleBasedStateMachine):
    """DRAM arena of 8 units; subclasses add an SSD tier."""

    ssd_units = 0

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="kvstored-stateful-") if self.ssd_units else None
        self.s = TieredStore(
            dram_size_bytes=8 * K, arena_dir=None, ssd_dir=self.tmp,
            ssd_size_bytes=self.ssd_units * K,
        )
        self.version = 0
        self.expected: dict[bytes, bytes] = {}  # last committed bytes per key
        self.open: list[tuple[Reservation, bytes]] = []
        self.pins: list[tuple[PinnedBlock, bytes]] = []

    def _data(self, size: int) -> bytes:
        self.version += 1
        return bytes([self.version % 256]) * size

    def _check_no_capacity_is_legit(self) -> None:
        # with nothing pinned and nothing being written, any block <= arena size must fit
        assert self.pins or self.open, "NoCapacity although nothing is pinned or reserved"

    @rule(k=keys, size=sizes)
    def put(self, k: int, size: int) -> None:
        data = self._data(size)
        try:
            stored = self.s.put(key(k), data)
        except NoCapacity:
            self._check_no_capacity_is_legit()
            return
        if stored:
            self.expected[key(k)] = data
        else:
            assert key(k) in self.expected

    @rule(k=keys, size=sizes)
    def reserve(self, k: int, size: int) -> None:
        try:
            r = self.s.reserve(key(k), size)
        except NoCapacity:
            self._check_no_capacity_is_legit()
            return
        if r is None:
            assert self.s.exists([key(k)]) == [True]
            return
        data = self._data(size)
        r.view[:] = data
        self.open.append((r, data))

    @precondition(lambda self: self.open)
    @rule(data=st.data(), commit=st.booleans())
    def finish(self, data: st.DataObject, commit: bool) -> None:
        i = data.draw(st.integers(min_value=0, max_value=len(self.open) - 1))
        r, payload = self.open.pop(i)
        if not commit:
            self.s.abort(r)
            return
        present_before = self.s.exists([r.key]) == [True]
        assert self.s.commit(r) is (not present_before)
        if not present_before:
            self.expected[r.key] = payload

    @rule(ks=st.lists(keys, min_size=1, max_size=4))
    def pin(self, ks: list[int]) -> None:
        for p in self.s.pin_many([key(k) for k in ks]):
            if p is None:
                continue
            if isinstance(p, NoCapacity):
                self._check_no_capacity_is_legit()
                continue
            assert isinstance(p, PinnedBlock)
            assert bytes(p.view) == self.expected[p.key]
            self.pins.append((p, self.expected[p.key]))

    @precondition(lambda self: self.pins)
    @rule(data=st.data())
    def unpin(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(min_value=0, max_value=len(self.pins) - 1))
        p, _ = self.pins.pop(i)
        self.s.unpin(p)

    @rule(k=keys)
    def get(self, k: int) -> None:
        try:
            got = self.s.get(key(k))
        except NoCapacity:
            self._check_no_capacity_is_legit()
            return
        if got is not None:
            assert got[0] == self.expected[key(k)]

    @rule(k=keys)
    def remove(self, k: int) -> None:
        pinned = any(p.key == key(k) for p, _ in self.pins)
        present = self.s.exists([key(k)]) == [True]
        assert self.s.remove([key(k)]) == [present and not pinned]
        if pinned:
            assert self.s.exists([key(k)]) == [True]

    @invariant()
    def no_byte_owned_twice_and_within_cap(self) -> None:
        dram = self.s._dram
        alloc = dram.allocator
        alloc.check_invariants()
        regions = [(e.offset, alloc.round_up(e.size_bytes)) for e in dram.entries.values()]
        regions += [(p.offset, alloc.round_up(p.size_bytes)) for p in self.s._reservations.values()]
        regions.sort()
        for (o1, l1), (o2, _) in zip(regions, regions[1:]):
            assert o1 + l1 <= o2, "arena bytes owned twice"
        assert sum(ln for _, ln in regions) == alloc.used_bytes <= alloc.capacity_bytes
        ssd = self.s._ssd
        if ssd is not None:
            assert ssd.used_bytes <= ssd.capacity_bytes

    @invariant()
    def pinned_blocks_stay_put(self) -> None:
        counts: dict[bytes, int] = {}
        for p, payload in self.pins:
            entry = self.s._dram.entries.get(p.key)
            assert entry is not None and entry.offset == p.offset, "pinned block evicted"
            assert bytes(p.view) == payload
            counts[p.key] = counts.get(p.key, 0) + 1
        for k, e in self.s._dram.entries.items():
            assert e.pins == counts.get(k, 0)
        assert self.s.stats().pinned_blocks == len(counts)

    @invariant()
    def dram_bytes_are_the_committed_ones(self) -> None:
        arena = self.s.arena
        for k, e in self.s._dram.entries.items():
            assert bytes(arena[e.offset : e.offset + e.size_bytes]) == self.expected[k]

    def teardown(self) -> None:
        for p, _ in self.pins:
            self.s.unpin(p)
        for r, _ in self.open:
            self.s.abort(r)
        self.pins.clear()
        self.open.clear()
        assert self.s.stats().pinned_blocks == 0
        self.s.close()
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)


class StoreWithSsdMachine(StoreMachine):
    """Same rules with a 12-unit SSD tier under the 8-unit arena (demotion/promotion)."""

    ssd_units = 12

    @invariant()
    def ssd_blocks_match_files(self) -> None:
        ssd = self.s._ssd
        assert ssd is not None
        from kvstored.tiers.ssd import round_up_page

        assert ssd.used_bytes == sum(round_up_page(e.size_bytes) for e in ssd.entries.values())


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)
TestStoreWithSsdMachine = StoreWithSsdMachine.TestCase
TestStoreWithSsdMachine.settings = settings(max_examples=20, stateful_step_count=30, deadline=None)
