"""BlockIndex: exact replica ranking, prefix stop, holder retirement, GC, a model check."""

from __future__ import annotations

import pytest
from helpers import key
from hypothesis import given, settings
from hypothesis import strategies as st
from master_helpers import NS

from kvstored.errors import InvalidArgument
from kvstored.master.index import BlockIndex
from kvstored.master.types import MAX_SIZE_BYTES, ReplicaState
from kvstored.types import Tier

DRAM, SSD = Tier.DRAM, Tier.SSD


def _index(num_holders: int) -> tuple[BlockIndex, list[int]]:
    ix = BlockIndex(16)
    holders = [ix.add_holder() for _ in range(num_holders)]
    for h in holders:
        ix.set_readable(h, True)
    return ix, holders


def _add(ix: BlockIndex, i: int, holder: int, tier: Tier, **kw: object) -> bool:
    return ix.add_replica(NS, key(i), holder=holder, tier=tier, size_bytes=100 + i,
                          generation=1, **kw)  # type: ignore[arg-type]


def test_best_replica_is_local_dram_then_local_ssd_then_remote_dram_then_remote_ssd() -> None:
    ix, (local, remote) = _index(2)
    # block 0: everything; 1: no local DRAM; 2: only remote copies; 3: only remote SSD
    for t, h in ((SSD, remote), (DRAM, remote), (SSD, local), (DRAM, local)):
        _add(ix, 0, h, t)
    for t, h in ((DRAM, remote), (SSD, local), (SSD, remote)):
        _add(ix, 1, h, t)
    _add(ix, 2, remote, SSD)
    _add(ix, 2, remote, DRAM)
    _add(ix, 3, remote, SSD)
    got = ix.lookup_prefix(NS, [key(i) for i in range(4)], local_holder=local)
    assert [(r.holder, r.tier) for r in got] == [
        (local, DRAM), (local, SSD), (remote, DRAM), (remote, SSD)
    ]
    assert [r.size_bytes for r in got] == [100, 101, 102, 103]
    # asked from the other node, the same blocks rank the other way round
    got = ix.lookup_prefix(NS, [key(i) for i in range(4)], local_holder=remote)
    assert [(r.holder, r.tier) for r in got] == [
        (remote, DRAM), (remote, DRAM), (remote, DRAM), (remote, SSD)
    ]


def test_equal_rank_goes_to_the_least_loaded_then_the_lowest_holder() -> None:
    ix, (a, b, c) = _index(3)
    for h in (a, b, c):
        _add(ix, 0, h, DRAM)
    assert [r.holder for r in ix.lookup_prefix(NS, [key(0)])] == [a]  # all load 0: lowest id
    ix.set_load(a, 5.0)
    ix.set_load(b, 2.0)
    ix.set_load(c, 3.0)
    assert [r.holder for r in ix.lookup_prefix(NS, [key(0)])] == [b]
    ix.set_load(b, 9.0)
    assert [r.holder for r in ix.lookup_prefix(NS, [key(0)])] == [c]
    # load never outranks locality: the local SSD copy beats an idle remote DRAM one
    _add(ix, 0, a, SSD)
    assert [(r.holder, r.tier) for r in ix.lookup_prefix(NS, [key(0)], local_holder=a)] == [
        (a, DRAM)
    ]


def test_prefix_stops_at_the_first_block_missing_cluster_wide() -> None:
    ix, (a, b) = _index(2)
    for i in (0, 1, 3, 4):
        _add(ix, i, a if i % 2 else b, DRAM)
    assert len(ix.lookup_prefix(NS, [key(i) for i in range(5)])) == 2  # key 2 absent
    # a block whose only replica is being written counts as missing
    _add(ix, 2, a, DRAM, state=ReplicaState.WRITING)
    assert len(ix.lookup_prefix(NS, [key(i) for i in range(5)])) == 2
    assert ix.commit_generation(NS, key(2), 1) == 1
    assert len(ix.lookup_prefix(NS, [key(i) for i in range(5)])) == 5
    # a block whose only holder is unreadable counts as missing too
    ix.set_readable(a, False)
    assert len(ix.lookup_prefix(NS, [key(i) for i in range(5)])) == 1
    # another namespace sees nothing
    assert len(ix.lookup_prefix(b"\x22" * 16, [key(0)])) == 0


def test_lookup_each_answers_every_present_block_past_misses_with_the_prefix_ranking() -> None:
    ix, (a, b) = _index(2)
    for i in (0, 1, 3, 6):
        _add(ix, i, a, SSD)
    for i in (1, 6):
        _add(ix, i, b, DRAM)
    _add(ix, 4, a, DRAM, state=ReplicaState.WRITING)  # being written: missing
    keys = [key(i) for i in range(8)]
    positions, hit = ix.lookup_each(NS, keys, local_holder=a)
    assert positions.tolist() == [0, 1, 3, 6]
    # the same best replica lookup_prefix picks (local SSD beats remote DRAM)
    assert hit.holders.tolist() == [a, a, a, a] and hit.tiers.tolist() == [SSD] * 4
    positions, hit = ix.lookup_each(NS, keys, local_holder=-1)
    assert (positions.tolist(), hit.holders.tolist()) == ([0, 1, 3, 6], [a, b, a, b])
    assert hit.sizes.tolist() == [100, 101, 103, 106]
    ix.set_readable(b, False)  # an unreadable holder's replicas are not answered
    ix.set_readable(a, False)
    assert ix.lookup_each(NS, keys)[0].tolist() == []
    assert ix.lookup_each(b"\x22" * 16, keys)[0].tolist() == []


def test_retired_holder_is_never_returned_and_gc_unlinks_its_rows_in_bounded_batches() -> None:
    ix, (a, b) = _index(2)
    n = ix.add_replicas_bulk(NS, [key(i) for i in range(50)], holder=a, tiers=[1] * 50,
                             sizes=[10] * 50, generation=1)
    assert n == 50
    _add(ix, 0, b, SSD)
    assert ix.retire_holder(a) == 50
    assert ix.num_replicas == 1 and ix.num_garbage_rows == 50
    assert [(r.holder, r.tier) for r in ix.lookup_prefix(NS, [key(0), key(1)])] == [(b, SSD)]
    with pytest.raises(InvalidArgument, match="retired"):
        ix.set_readable(a, True)
    with pytest.raises(InvalidArgument, match="retired"):
        _add(ix, 7, a, DRAM)
    assert ix.collect_garbage(max_rows=20) == 20
    assert ix.num_garbage_rows == 30
    assert ix.collect_garbage() == 30
    assert ix.num_garbage_rows == 0 and ix.num_blocks == 1
    assert ix.holder_keys(b) == [(NS, key(0), SSD)]
    # freed rows and block slots are reused; nothing of the retired holder comes back
    c = ix.add_holder()
    ix.set_readable(c, True)
    _add(ix, 5, c, DRAM)
    assert [(r.holder, r.tier) for r in ix.lookup_prefix(NS, [key(5)])] == [(c, DRAM)]
    assert ix.replicas(NS, key(0)) == ix.replicas(NS, key(0), readable_only=True)


def test_bulk_add_drops_duplicates_and_rejects_bad_rows_naming_them() -> None:
    ix, (a,) = _index(1)
    n = ix.add_replicas_bulk(NS, [key(1), key(1), key(1)], holder=a, tiers=[1, 1, 2],
                             sizes=[5, 5, 5], generation=3)
    assert n == 2
    assert sorted(r.tier for r in ix.replicas(NS, key(1))) == [DRAM, SSD]
    with pytest.raises(InvalidArgument, match="got 3"):
        ix.add_replicas_bulk(NS, [key(2)], holder=a, tiers=[3], sizes=[1], generation=1)
    with pytest.raises(InvalidArgument, match="size_bytes"):
        ix.add_replica(NS, key(2), holder=a, tier=DRAM, size_bytes=MAX_SIZE_BYTES + 1,
                       generation=1)
    with pytest.raises(InvalidArgument, match="unknown holder 9"):
        ix.add_replica(NS, key(2), holder=9, tier=DRAM, size_bytes=1, generation=1)
    assert ix.replicas(NS, key(2)) == []


def test_commit_and_abort_touch_only_their_generation() -> None:
    ix, (a, b) = _index(2)
    ix.add_replica(NS, key(0), holder=a, tier=DRAM, size_bytes=1, generation=7,
                   state=ReplicaState.WRITING)
    ix.add_replica(NS, key(0), holder=b, tier=DRAM, size_bytes=1, generation=8,
                   state=ReplicaState.WRITING)
    assert ix.commit_generation(NS, key(0), 6) == 0
    assert ix.abort_generation(NS, key(0), 7) == 1
    assert [(r.holder, r.generation, r.state) for r in ix.replicas(NS, key(0))] == [
        (b, 8, ReplicaState.WRITING)
    ]
    assert ix.commit_generation(NS, key(0), 8) == 1
    assert ix.commit_generation(NS, key(0), 8) == 0  # already committed: nothing open
    assert [r.holder for r in ix.lookup_prefix(NS, [key(0)])] == [b]


OPS = st.lists(
    st.tuples(st.sampled_from(["add", "remove", "retire", "gc", "unread"]),
              st.integers(0, 5), st.integers(0, 7), st.sampled_from([DRAM, SSD])),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_lookup_matches_a_dict_model_under_random_operations(ops: list) -> None:  # type: ignore[type-arg]
    ix = BlockIndex(16)
    holders = [ix.add_holder() for _ in range(6)]
    for h in holders:
        ix.set_readable(h, True)
    model: dict[int, set[tuple[int, Tier]]] = {}
    retired: set[int] = set()
    unreadable: set[int] = set()
    for op, h, k, tier in ops:
        if op == "add" and h not in retired:
            ix.add_replica(NS, key(k), holder=h, tier=tier, size_bytes=k, generation=1)
            model.setdefault(k, set()).add((h, tier))
        elif op == "remove":
            ix.remove_replica(NS, key(k), holder=h, tier=tier)
            model.get(k, set()).discard((h, tier))
        elif op == "retire":
            ix.retire_holder(h)
            retired.add(h)
        elif op == "unread" and h not in retired:
            ix.set_readable(h, False)
            unreadable.add(h)
        elif op == "gc":
            ix.collect_garbage(max_rows=3)
    got = ix.lookup_prefix(NS, [key(k) for k in range(8)], local_holder=2)
    expected = []
    for k in range(8):
        live = [(h, t) for h, t in model.get(k, set()) if h not in retired | unreadable]
        if not live:
            break
        expected.append(min(live, key=lambda ht: ((0 if ht[0] == 2 else 2) + (ht[1] == SSD), ht[0])))
    assert [(r.holder, r.tier) for r in got] == expected
    assert ix.num_replicas == sum(
        1 for reps in model.values() for h, _ in reps if h not in retired
    )
    gc_rounds = 0
    while ix.collect_garbage(max_rows=2):  # bounded passes until nothing is left
        gc_rounds += 1
    assert ix.num_garbage_rows == 0
    assert ix.num_blocks == sum(
        1 for reps in model.values() if any(h not in retired for h, _ in reps)
    )


def test_a_block_repeated_across_inventory_chunks_is_indexed_once() -> None:
    ix, (a, b) = _index(2)
    _add(ix, 0, b, DRAM)  # another node holds it too: the block pre-exists
    for _ in range(2):  # two chunks of one sync both list block 0 in DRAM, block 1 on SSD
        ix.add_replicas_bulk(NS, [key(0), key(1)], holder=a, tiers=[1, 2], sizes=[9, 9],
                             generation=2)
    assert ix.num_holder_replicas(a) == 2 and ix.num_replicas == 3
    assert ix.remove_replica(NS, key(0), holder=a, tier=DRAM)
    assert [(r.holder, r.tier) for r in ix.replicas(NS, key(0))] == [(b, DRAM)]
    assert ix.remove_replica(NS, key(1), holder=a, tier=SSD)
    assert len(ix.lookup_prefix(NS, [key(1)])) == 0  # no stale duplicate left behind
