"""Rule-based tests of TieredStore: random puts, reservations, pins, removes, with/without SSD.

Invariants checked after every step: no arena byte owned twice (committed blocks,
reservations and promotions in flight), usage within the caps, a pinned block is never evicted
or moved and its bytes never change, every DRAM block holds exactly the bytes last committed
for its key, and any block served (from either tier) carries those bytes. Keys live in two
namespaces (a key's identity is ``(namespace, key)``).

With an SSD tier, ``hold_io`` starts a promotion (a get of an SSD-only block) or a demotion (a
put that must evict a DRAM-only block) in a thread whose disk I/O the test holds on an Event:
the block is PROMOTING or DEMOTING while the metadata rules (exists, lookup, stats, commit,
abort, unpin, remove, DRAM pins) keep running; ``release_io`` lets it finish and checks it.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import threading

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvstored.errors import NoCapacity
from kvstored.tiers.ssd_format import store_key
from kvstored.tiers.tiered import TieredStore
from kvstored.types import PinnedBlock, Reservation, Tier

K = 4096
NUM_KEYS = 10
sizes = st.integers(min_value=0, max_value=3 * K + 1)


NAMESPACES = (b"", b"ns-b")


def key(i: int) -> bytes:
    """Keys 0..NUM_KEYS-1 in namespace b"", NUM_KEYS.. the same keys in b"ns-b"."""
    return b"key-%012d" % (i % NUM_KEYS)


def ns(i: int) -> bytes:
    return NAMESPACES[i // NUM_KEYS]


def sk(i: int) -> bytes:
    return store_key(ns(i), key(i))


keys = st.integers(min_value=0, max_value=2 * NUM_KEYS - 1)


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
        self.expected: dict[bytes, bytes] = {}  # last committed bytes per store key
        self.open: list[tuple[int, Reservation, bytes]] = []
        self.pins: list[tuple[int, PinnedBlock, bytes]] = []
        # a held disk I/O: (thread, release event, result box, kind, index)
        self.held: tuple[threading.Thread, threading.Event, list[object], str, int] | None = None

    def _data(self, size: int) -> bytes:
        self.version += 1
        return bytes([self.version % 256]) * size

    def _check_no_capacity_is_legit(self) -> None:
        # with nothing pinned and nothing being written, any block <= arena size must fit
        assert self.pins or self.open, "NoCapacity although nothing is pinned or reserved"

    def not_held(self) -> bool:
        return self.held is None

    # rules that may allocate (and so wait for a held demotion) run only while nothing is held
    @precondition(lambda self: self.held is None)
    @rule(k=keys, size=sizes)
    def put(self, k: int, size: int) -> None:
        data = self._data(size)
        try:
            stored = self.s.put(key(k), data, namespace_id=ns(k))
        except NoCapacity:
            self._check_no_capacity_is_legit()
            return
        if stored:
            self.expected[sk(k)] = data
        else:
            assert sk(k) in self.expected

    @precondition(lambda self: self.held is None)
    @rule(k=keys, size=sizes)
    def reserve(self, k: int, size: int) -> None:
        try:
            r = self.s.reserve(key(k), size, namespace_id=ns(k))
        except NoCapacity:
            self._check_no_capacity_is_legit()
            return
        if r is None:
            assert self.s.exists([key(k)], namespace_id=ns(k)) == [True]
            return
        data = self._data(size)
        r.view[:] = data
        self.open.append((k, r, data))

    @precondition(lambda self: self.open)
    @rule(data=st.data(), commit=st.booleans())
    def finish(self, data: st.DataObject, commit: bool) -> None:
        i = data.draw(st.integers(min_value=0, max_value=len(self.open) - 1))
        k, r, payload = self.open.pop(i)
        if not commit:
            self.s.abort(r)
            return
        present_before = self.s.exists([r.key], namespace_id=ns(k)) == [True]
        assert self.s.commit(r) is (not present_before)
        if not present_before:
            self.expected[sk(k)] = payload

    @rule(ks=st.lists(keys, min_size=1, max_size=4))
    def pin(self, ks: list[int]) -> None:
        if self.held is not None:  # only DRAM hits: they must never wait for the held I/O
            ks = [k for k in ks if self.s.lookup_prefix([key(k)], namespace_id=ns(k)) == [Tier.DRAM]]
        for k in ks:
            (p,) = self.s.pin_many([key(k)], namespace_id=ns(k))
            if p is None:
                continue
            if isinstance(p, NoCapacity):
                self._check_no_capacity_is_legit()
                continue
            assert isinstance(p, PinnedBlock) and p.key == key(k)
            assert bytes(p.view) == self.expected[sk(k)]
            self.pins.append((k, p, self.expected[sk(k)]))

    @precondition(lambda self: self.pins)
    @rule(data=st.data())
    def unpin(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(min_value=0, max_value=len(self.pins) - 1))
        _, p, _ = self.pins.pop(i)
        self.s.unpin(p)

    @precondition(lambda self: self.held is None)
    @rule(k=keys)
    def get(self, k: int) -> None:
        try:
            got = self.s.get(key(k), namespace_id=ns(k))
        except NoCapacity:
            self._check_no_capacity_is_legit()
            return
        if got is not None:
            assert got[0] == self.expected[sk(k)]

    @rule(k=keys)
    def remove(self, k: int) -> None:
        pinned = any(j == k for j, _, _ in self.pins)
        present = self.s.exists([key(k)], namespace_id=ns(k)) == [True]
        assert self.s.remove([key(k)], namespace_id=ns(k)) == [present and not pinned]
        assert self.s.exists([key(k)], namespace_id=ns(k)) == [pinned and present]

    @rule(ks=st.lists(keys, min_size=1, max_size=4))
    def probe(self, ks: list[int]) -> None:
        # never waits for a held I/O; a block is present in exactly one namespace slot
        for k in ks:
            tiers = self.s.lookup_prefix([key(k)], namespace_id=ns(k))
            assert (tiers != []) == (self.s.exists([key(k)], namespace_id=ns(k)) == [True])
        self.s.stats()

    # ---- held disk I/O (SSD machine only) ------------------------------------------------
    def _start_held(self, kind: str, k: int, fn: object) -> None:
        ssd = self.s._state.ssd
        assert ssd is not None
        entered, release = threading.Event(), threading.Event()
        target = sk(k)
        op = "read" if kind == "promote" else "write"

        def hook(o: str, skey: bytes) -> None:
            if o == op and (skey == target or kind == "demote") and not entered.is_set():
                entered.set()
                assert release.wait(30), "held I/O never released"

        box: list[object] = []
        ssd.io_hook = hook

        def run() -> None:
            try:
                box.append(fn())  # type: ignore[operator]
            except BaseException as exc:  # surfaced by release_io
                box.append(exc)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        while not entered.is_set() and t.is_alive():
            entered.wait(0.01)
        self.held = (t, release, box, kind, k)

    @precondition(lambda self: self.ssd_units and self.held is None)
    @rule(data=st.data())
    def hold_promotion(self, data: st.DataObject) -> None:
        on_ssd = [
            j for j in range(2 * NUM_KEYS)
            if self.s.lookup_prefix([key(j)], namespace_id=ns(j)) == [Tier.SSD]
        ]
        if not on_ssd:
            return
        k = data.draw(st.sampled_from(on_ssd))
        self._start_held("promote", k, lambda: self.s.pin_many([key(k)], namespace_id=ns(k))[0])
        t, release, box, _, _ = self.held  # type: ignore[misc]
        if box:  # finished without reaching the read (e.g. NoCapacity): nothing held
            t.join()
            self._finish_held()

    @precondition(lambda self: self.ssd_units and self.held is None)
    @rule(k=keys, units=st.integers(min_value=2, max_value=8))
    def hold_demotion(self, k: int, units: int) -> None:
        # a large put evicts; the first demotion write it makes is held (if it makes one)
        data = self._data(units * K - 1)
        self._start_held("demote", k, lambda: (self.s.put(key(k), data, namespace_id=ns(k)), k, data))
        if self.held is not None and self.held[2]:
            self.held[0].join()
            self._finish_held()

    @precondition(lambda self: self.held is not None)
    @rule()
    def release_io(self) -> None:
        t, release, _, _, _ = self.held  # type: ignore[misc]
        release.set()
        t.join(30)
        assert not t.is_alive()
        self._finish_held()

    def _finish_held(self) -> None:
        t, release, box, kind, k = self.held  # type: ignore[misc]
        release.set()
        self.held = None
        assert self.s._state.ssd is not None
        self.s._state.ssd.io_hook = None
        (res,) = box
        if isinstance(res, NoCapacity):
            self._check_no_capacity_is_legit()
            return
        assert not isinstance(res, BaseException), res
        if kind == "promote":
            if isinstance(res, PinnedBlock):
                assert bytes(res.view) == self.expected[sk(k)]
                self.pins.append((k, res, self.expected[sk(k)]))
        else:
            stored, j, data = res  # type: ignore[misc]
            if stored:
                self.expected[sk(j)] = data

    # ---- invariants ----------------------------------------------------------------------
    @invariant()
    def no_byte_owned_twice_and_within_cap(self) -> None:
        dram = self.s._state.dram
        alloc = dram.allocator
        alloc.check_invariants()
        regions = [(e.offset, alloc.round_up(e.size_bytes)) for e in dram.entries.values()]
        regions += [(p.offset, alloc.round_up(p.size_bytes)) for p in self.s._state.pending.values()]
        ssd = self.s._state.ssd
        for t in self.s._state.promoting.values():
            regions.append((t.offset, alloc.round_up(t.size_bytes)))
        for t in self.s._state.demoting.values():
            if t.removed:  # unindexed by remove, still owned until its write ends
                assert t.entry is not None
                regions.append((t.entry.offset, alloc.round_up(t.entry.size_bytes)))
        regions.sort()
        for (o1, l1), (o2, _) in itertools.pairwise(regions):
            assert o1 + l1 <= o2, "arena bytes owned twice"
        assert sum(ln for _, ln in regions) == alloc.used_bytes <= alloc.capacity_bytes
        assert [(e.offset, e.skey) for e in dram.by_offset] == sorted(
            (e.offset, k) for k, e in dram.entries.items()
        )
        if ssd is not None:
            assert ssd.used_bytes <= ssd.capacity_bytes

    @invariant()
    def pinned_blocks_stay_put(self) -> None:
        counts: dict[bytes, int] = {}
        for k, p, payload in self.pins:
            entry = self.s._state.dram.entries.get(sk(k))
            assert entry is not None and entry.offset == p.offset, "pinned block evicted"
            assert bytes(p.view) == payload
            counts[sk(k)] = counts.get(sk(k), 0) + 1
        for k, e in self.s._state.dram.entries.items():
            assert e.pins == counts.get(k, 0)
        assert self.s.stats().pinned_blocks == len(counts)

    @invariant()
    def dram_bytes_are_the_committed_ones(self) -> None:
        arena = self.s.arena
        for k, e in self.s._state.dram.entries.items():
            assert bytes(arena[e.offset : e.offset + e.size_bytes]) == self.expected[k]

    def teardown(self) -> None:
        if self.held is not None:
            self.held[1].set()
            self.held[0].join(30)
            self._finish_held()
        for _, p, _ in self.pins:
            self.s.unpin(p)
        for _, r, _ in self.open:
            self.s.abort(r)
        self.pins.clear()
        self.open.clear()
        assert self.s.stats().pinned_blocks == 0
        self.s.close()
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)


class StoreWithSsdMachine(StoreMachine):
    """Same rules with a 12-unit SSD tier under the 8-unit arena (demotion/promotion), plus
    held promotions and demotions."""

    ssd_units = 12

    @invariant()
    def ssd_blocks_match_files(self) -> None:
        ssd = self.s._state.ssd
        assert ssd is not None
        for skey, e in ssd.entries.items():
            if skey in self.expected:
                assert e.size_bytes == len(self.expected[skey])


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)
TestStoreWithSsdMachine = StoreWithSsdMachine.TestCase
TestStoreWithSsdMachine.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)
