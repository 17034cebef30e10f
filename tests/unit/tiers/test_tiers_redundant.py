"""Eviction for good drops a redundant replica (another live node keeps it) before a sole copy.

The marks (kvstored/tiers/redundant.py) are injected through ``TieredStore.mark_redundant``
with the generation of the replica stored here, as the writer of a ``put(replicas=N)`` does
once a peer stored its replica; ``set_marks_trusted`` stands for the node's master link.
Exact eviction orders on full stores, no timing. The first tests fail on main, which evicts
in plain LRU order whatever other nodes hold.
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


def _generation(s: TieredStore, i: int) -> int:
    st = s._state  # noqa: SLF001 (white box: the generation the writer's export carries)
    skey = store_key(b"", key(i))
    e = st.dram.entries.get(skey) or (st.ssd.entries.get(skey) if st.ssd is not None else None)
    assert e is not None
    return e.generation


def _mark(s: TieredStore, ids: list[int], keeper: str = "peer") -> None:
    s.set_marks_trusted(True)
    assert s.mark_redundant([(key(i), keeper, _generation(s, i)) for i in ids]) == len(ids)


def _held(s: TieredStore, ids: range | list[int]) -> list[int]:
    return [i for i, e in zip(ids, s.exists([key(i) for i in ids]), strict=True) if e]


def test_a_full_dram_only_store_drops_its_redundant_replicas_before_any_sole_copy(
    stores: list[TieredStore],
) -> None:
    s = _store(stores, None, dram_blocks=4)
    for i in range(4):
        assert s.put(key(i), val(i))  # LRU order 0, 1, 2, 3
    _mark(s, [2, 3])  # the two most recent are replicas a peer keeps
    assert s.put(key(10), val(10))
    assert _held(s, range(4)) == [0, 1, 3]  # the coldest redundant one, not block 0
    assert s.put(key(11), val(11))
    assert _held(s, range(4)) == [0, 1]
    assert s.num_redundant_dropped == 2
    assert s.put(key(12), val(12))  # none left: plain LRU, a sole copy
    assert _held(s, range(4)) == [1]


def test_marks_not_trusted_count_for_nothing_and_a_departed_keeper_takes_its_marks(
    stores: list[TieredStore],
) -> None:
    s = _store(stores, None, dram_blocks=4)
    for i in range(4):
        assert s.put(key(i), val(i))
    _mark(s, [3], keeper="b")
    _mark(s, [2], keeper="c")
    assert s.forget_keeper("b") == 1  # PEER_LEFT(b): block 3 is a sole copy here again
    assert s.put(key(10), val(10))
    assert _held(s, range(4)) == [0, 1, 3]  # block 2 (keeper c) went
    _mark(s, [1], keeper="c")
    s.set_marks_trusted(False)  # the link failed: every mark goes (fail safe)
    s.set_marks_trusted(True)
    assert s.put(key(11), val(11))
    assert _held(s, range(4)) == [1, 3]  # plain LRU: block 0, not the once-marked block 1
    s.set_marks_trusted(False)
    assert s.mark_redundant([(key(1), "c", _generation(s, 1))]) == 0  # untrusted: no mark


def test_a_mark_of_another_generation_does_not_apply_to_a_re_put_block(
    stores: list[TieredStore],
) -> None:
    s = _store(stores, None, dram_blocks=4)
    for i in range(4):
        assert s.put(key(i), val(i))
    s.set_marks_trusted(True)
    old = _generation(s, 3)
    assert s.mark_redundant([(key(3), "peer", old + 1)]) == 0  # not the bytes held here
    _mark(s, [3])
    assert s.remove([key(3)]) == [True]
    assert s.put(key(3), val(3))  # a new replica: new generation, the old mark is moot
    assert _generation(s, 3) != old
    assert s.put(key(10), val(10))
    assert _held(s, range(4)) == [1, 2, 3]  # plain LRU


def test_a_tiered_store_drops_a_redundant_dram_block_instead_of_demoting_into_a_full_ssd(
    stores: list[TieredStore], tmp_path: pathlib.Path,
) -> None:
    s = _store(stores, tmp_path, dram_blocks=2, ssd_blocks=2)
    for i in range(4):
        assert s.put(key(i), val(i))  # 0, 1 demoted to SSD (full); 2, 3 in DRAM
    _mark(s, [3])
    assert s.put(key(10), val(10))
    assert _held(s, range(4)) == [0, 1, 2]  # block 3 dropped, no SSD block evicted
    assert s.num_redundant_dropped == 1


def test_an_ssd_allocation_evicts_a_redundant_ssd_block_before_a_sole_one(
    stores: list[TieredStore], tmp_path: pathlib.Path,
) -> None:
    s = _store(stores, tmp_path, dram_blocks=2, ssd_blocks=2)
    for i in range(4):
        assert s.put(key(i), val(i))  # SSD: 0, 1 (LRU first); DRAM: 2, 3
    _mark(s, [1])  # SSD-only, not the SSD's LRU block
    assert s.put(key(10), val(10))  # demotes 2 into the full SSD
    assert _held(s, range(4)) == [0, 2, 3]  # the SSD dropped block 1, not block 0


def test_a_repair_copy_takes_only_spare_room_never_a_sole_copy_nor_a_redundant_one(
    stores: list[TieredStore],
) -> None:
    s = _store(stores, None, dram_blocks=4)
    for i in range(3):
        assert s.put(key(i), val(i))
    r = s.reserve(key(20), BLOCK, copy=True)  # a remote-fill copy: the store is full now
    assert r is not None
    r.view[:] = val(20)
    assert s.commit(r)
    _mark(s, [2])
    r = s.reserve(key(21), BLOCK, spare_only=True)  # the copy is spare room
    assert r is not None
    r.view[:] = val(21)
    assert s.commit(r)
    assert _held(s, [0, 1, 2, 20, 21]) == [0, 1, 2, 21]
    assert not {b.key: b for b in s.list_blocks()[0]}[key(21)].copy  # kept as an original
    with pytest.raises(NoCapacity, match="without dropping"):
        s.reserve(key(22), BLOCK, spare_only=True)  # a redundant one would move a deficit
    assert _held(s, [0, 1, 2, 21]) == [0, 1, 2, 21]  # nothing evicted
    assert s.num_redundant_dropped == 0


def test_a_hand_off_is_taken_by_dropping_a_redundant_replica_whatever_its_age(
    stores: list[TieredStore],
) -> None:
    s = _store(stores, None, dram_blocks=4)
    for i in range(4):
        assert s.put(key(i), val(i))  # all young: a hand-off by age alone is refused
    with pytest.raises(NoCapacity, match="refused"):
        s.reserve(key(30), BLOCK, handoff_age_s=3600.0)
    assert s.has_redundant_victims() is False
    _mark(s, [2])
    assert s.has_redundant_victims() is True
    r = s.reserve(key(30), BLOCK, handoff_age_s=3600.0)
    assert r is not None
    r.view[:] = val(30)
    assert s.commit(r)
    assert _held(s, range(4)) == [0, 1, 3]  # the redundant one went, no sole copy


def test_a_spill_or_replica_reservation_takes_spare_room_or_a_redundant_replica_never_a_sole_copy(
    stores: list[TieredStore], tmp_path: pathlib.Path,
) -> None:
    """Issue 17 §3: a peer's spill or replica PUT (PUT_FLAG_SPARE,
    ``reserve(spare_or_redundant=True)``) is taken into free room, a copy, a DRAM block
    also on SSD, or a redundant replica's room, and refused (NoCapacity, nothing evicted)
    when only a sole copy's would do. (Fails on main, which has no such reservation: a
    peer's PUT evicted the least recent original.)"""
    s = _store(stores, None, dram_blocks=4)
    for i in range(4):
        assert s.put(key(i), val(i))  # four sole copies: full
    with pytest.raises(NoCapacity, match="spill or replica"):
        s.reserve(key(30), BLOCK, spare_or_redundant=True)
    assert _held(s, range(4)) == [0, 1, 2, 3]
    assert s.stats().tiers[0].evictions == 0 and s.spare_puts_refused == 1
    _mark(s, [2])  # another live node keeps block 2
    r = s.reserve(key(30), BLOCK, spare_or_redundant=True)
    assert r is not None
    r.view[:] = val(30)
    assert s.commit(r)
    assert _held(s, [0, 1, 2, 3, 30]) == [0, 1, 3, 30]  # the redundant replica made room
    assert not {b.key: b for b in s.list_blocks()[0]}[key(30)].copy  # kept as an original
    assert s.num_redundant_dropped == 1
    with pytest.raises(NoCapacity, match="spill or replica"):
        s.reserve(key(31), BLOCK, spare_or_redundant=True)  # sole copies only again
    # A tiered node: a DRAM block demoted into free SSD room costs nothing.
    t = _store(stores, tmp_path, dram_blocks=2, ssd_blocks=4)
    for i in range(2):
        assert t.put(key(i), val(i))
    r = t.reserve(key(40), BLOCK, spare_or_redundant=True)
    assert r is not None
    r.view[:] = val(40)
    assert t.commit(r)
    assert _held(t, [0, 1, 40]) == [0, 1, 40]
