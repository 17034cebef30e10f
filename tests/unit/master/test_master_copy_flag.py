"""The master knows which replicas are remote-fill copies (BlockRef.copy).

- The index keeps the flag per replica (packed in the state byte: 34 bytes a replica still),
  from inventories and events; an ADDED event of an indexed replica sets or clears it.
- Spill's ``exists`` counts only originals: a copy elsewhere never lets a spiller drop (or
  skip moving) the block it copies.
- Lookups prefer an original over a copy at equal tier rank, whatever the loads; a copy
  still beats a worse tier rank, and a local DRAM copy beats everything remote.
"""

from __future__ import annotations

import pytest
from helpers import key
from master_helpers import NS, Cluster, MiB

from kvstored.errors import InvalidArgument
from kvstored.master.admin import list_replicas
from kvstored.master.columns import ROW_FIELDS, IndexColumns
from kvstored.master.index import BlockIndex
from kvstored.master.types import (
    BlockEvent,
    BlockRef,
    EventKind,
    NodeAction,
    ReplicaState,
    TierUsage,
)
from kvstored.types import Tier

GEN = 1 << 40


def _ref(i: int, *, copy: bool = False, tier: Tier = Tier.DRAM, gen: int = GEN) -> BlockRef:
    return BlockRef(NS, key(i), tier, 4096, gen + i, copy)


def _copies(c: Cluster, i: int) -> dict[str, bool]:
    out = {}
    for r in c.index.replicas(NS, key(i)):
        rec = c.members.record_of_holder(r.holder)
        assert rec is not None
        out[rec.spec.node_id] = r.copy
    return out


def test_index_keeps_the_flag_per_replica_and_an_added_event_sets_or_clears_it() -> None:
    idx = BlockIndex(16)
    h = idx.add_holder()
    idx.set_readable(h, True)
    idx.add_replica(NS, key(1), holder=h, tier=Tier.DRAM, size_bytes=10, generation=5, copy=True)
    (r,) = idx.replicas(NS, key(1), readable_only=True)
    assert (r.copy, r.state, r.generation) == (True, ReplicaState.COMMITTED, 5)
    idx.add_replica(NS, key(1), holder=h, tier=Tier.DRAM, size_bytes=10, generation=5,
                    replace_generation=True)  # the holder re-reports it as an original
    assert [r.copy for r in idx.replicas(NS, key(1))] == [False]
    idx.add_replica(NS, key(1), holder=h, tier=Tier.DRAM, size_bytes=10, generation=5,
                    replace_generation=True, copy=True)
    assert [r.copy for r in idx.replicas(NS, key(1), readable_only=True)] == [True]
    # a WRITING placeholder is never a copy; committing it by the holder's event sets it
    idx.add_replica(NS, key(2), holder=h, tier=Tier.DRAM, size_bytes=10, generation=6,
                    state=ReplicaState.WRITING, copy=True)
    assert [(r.state, r.copy) for r in idx.replicas(NS, key(2))] == [(ReplicaState.WRITING, False)]
    idx.add_replica(NS, key(2), holder=h, tier=Tier.DRAM, size_bytes=10, generation=6, copy=True)
    assert [(r.state, r.copy) for r in idx.replicas(NS, key(2))] == [(ReplicaState.COMMITTED, True)]
    n = idx.add_replicas_bulk(NS, [key(3), key(4)], holder=h, tiers=[1, 1], sizes=[1, 2],
                              generation=[7, 8], copies=[True, False])
    assert n == 2
    assert [r.copy for r in idx.replicas(NS, key(3))] == [True]
    assert [r.copy for r in idx.replicas(NS, key(4))] == [False]
    with pytest.raises(InvalidArgument, match="copies must have one entry per key"):
        idx.add_replicas_bulk(NS, [key(5)], holder=h, tiers=[1], sizes=[1], generation=9,
                              copies=[True, True])
    cols = IndexColumns(16)
    assert sum(getattr(cols, n).itemsize for n, _ in ROW_FIELDS) == 34
    assert idx.remove_replica(NS, key(3), holder=h, tier=Tier.DRAM)
    assert idx.replicas(NS, key(3)) == []


def test_inventory_and_events_carry_the_flag_to_the_index_and_admin_view() -> None:
    c = Cluster()
    c.join("a", inventory=[_ref(1), _ref(2)])
    c.join("b", inventory=[_ref(1, copy=True)])
    assert _copies(c, 1) == {"a": False, "b": True}
    assert c.members.report_events("b", 1, [BlockEvent(1, EventKind.ADDED, _ref(2, copy=True))])[1] == 1
    assert _copies(c, 2) == {"a": False, "b": True}
    # a local put on b: the same replica re-reported as an original
    assert c.members.report_events("b", 1, [BlockEvent(2, EventKind.ADDED, _ref(2))])[1] == 2
    assert _copies(c, 2) == {"a": False, "b": False}
    views = list_replicas(c.members, NS, [key(1)])[0]
    assert {(v.node_id, v.copy) for v in views} == {("a", False), ("b", True)}


def _usage(c: Cluster, node_id: str, used: int = 0) -> None:
    c.clock.advance(0.001)
    c.members.heartbeat(node_id, 1, tiers=(TierUsage(Tier.DRAM, 100 * MiB, used),
                                           TierUsage(Tier.SSD, 0, 0)))


def _spill_start(c: Cluster, i: int, writer: str):
    return c.placement.start_put(NS, key(i), 4096, writer_node_id=writer, exclude_writer=True,
                                 max_used_fraction=0.9, holder_reports=True)


def test_spill_exists_counts_only_originals() -> None:
    c = Cluster()
    c.join("a", inventory=[_ref(1)])  # the original, on the spilling node
    c.join("b", inventory=[_ref(1, copy=True)])  # b filled a copy of it
    c.join("c")
    for n in ("a", "b", "c"):
        _usage(c, n)
    out = _spill_start(c, 1, "a")
    assert not out.exists, "a copy made the original 'exist': a would drop the pool's only original"
    assert out.replicas
    c.placement.end_put(NS, key(1), out.generation, commit=False)
    # b's copy becomes an original (a local put there): now the block exists elsewhere
    c.members.report_events("b", 1, [BlockEvent(1, EventKind.ADDED, _ref(1))])
    assert _spill_start(c, 1, "a").exists
    # a non-spill put still counts every readable replica (nothing is dropped for it)
    c.join("d", inventory=[_ref(2, copy=True)])
    assert c.placement.start_put(NS, key(2), 4096, writer_node_id="a").exists


@pytest.mark.parametrize("copy_load", [0.0, 1e12])
def test_lookup_prefers_an_original_over_a_copy_at_equal_tier_rank(copy_load: float) -> None:
    c = Cluster()
    c.join("a", inventory=[_ref(1, copy=True), _ref(2, copy=True)])  # lowest id, idle: copy
    c.join("b", inventory=[_ref(1), _ref(2, tier=Tier.SSD)])  # busy, holds the originals
    c.join("l", inventory=[_ref(3, copy=True)])
    c.join("m", inventory=[_ref(3)])
    c.members.heartbeat("a", 1, load=copy_load)
    c.members.heartbeat("b", 1, load=1e12)
    assert c.where([1]) == [("b", Tier.DRAM)]  # the original, though busier
    assert c.where([2]) == [("a", Tier.DRAM)]  # a DRAM copy still beats an SSD original
    assert c.where([3], local="l") == [("l", Tier.DRAM)]  # local DRAM copy: no network
    assert c.where([3], local="a") == [("m", Tier.DRAM)]
    c.members.report_events("a", 1, [BlockEvent(1, EventKind.ADDED, _ref(1))])
    if copy_load == 0.0:  # both originals now: the idle one
        assert c.where([1]) == [("a", Tier.DRAM)]


def test_a_removed_original_that_leaves_only_copies_queues_one_promotion() -> None:
    c = Cluster()
    c.join("a", inventory=[_ref(1), _ref(2), _ref(3)])
    c.join("b", inventory=[_ref(1, copy=True), _ref(2, copy=True)])
    c.join("c", inventory=[_ref(1, copy=True), _ref(2)])
    rm = [BlockEvent(s, EventKind.REMOVED, _ref(i)) for s, i in ((1, 1), (2, 2), (3, 3))]
    assert c.members.report_events("a", 1, rm)[1] == 3
    # key 1: copies only on b and c -> the lowest holder (b) keeps it; key 2: c holds an
    # original; key 3: no replica left
    assert c.members.promotions.take("b") == [(NS, key(1))]
    assert c.members.promotions.take("c") == []
    assert c.members.promotions.take("b") == []  # sent once
    # b's copy re-reported as an original: nothing to promote when c's copy goes
    c.members.report_events("b", 1, [BlockEvent(1, EventKind.ADDED, _ref(1))])
    c.members.report_events("c", 1, [BlockEvent(1, EventKind.REMOVED, _ref(1, copy=True))])
    assert c.members.promotions.take("b") == [] and _copies(c, 1) == {"b": False}


def test_a_promotion_is_sent_again_until_the_holder_settles_it_and_then_never() -> None:
    # regression (session 2 note): a promotion whose heartbeat answer was lost was never
    # re-sent, so the pool's last replicas stayed "evict first"
    from kvstored.master.copies import MAX_PROMOTION_SENDS

    c = Cluster()
    c.join("a", inventory=[_ref(1), _ref(2)])
    c.join("b", inventory=[_ref(1, copy=True), _ref(2, copy=True)])
    rm = [BlockEvent(s, EventKind.REMOVED, _ref(i)) for s, i in ((1, 1), (2, 2))]
    c.members.report_events("a", 1, rm)
    p = c.members.promotions
    assert sorted(p.take("b")) == [(NS, key(1)), (NS, key(2))]  # this answer is lost
    c.clock.advance(p.resend_after_s * 0.9)
    c.members.heartbeat("b", 1)
    assert p.take("b") == []  # not yet: the answer may still be on its way
    c.clock.advance(p.resend_after_s * 0.2)
    c.members.heartbeat("b", 1)
    assert sorted(p.take("b")) == [(NS, key(1)), (NS, key(2))]
    # b promotes 1 (ADDED, an original now) and evicted its copy of 2 (REMOVED): settled
    c.members.report_events("b", 1, [BlockEvent(1, EventKind.ADDED, _ref(1)),
                                     BlockEvent(2, EventKind.REMOVED, _ref(2, copy=True))])
    assert p.num_pending("b") == 0 and _copies(c, 1) == {"b": False}
    c.clock.advance(p.resend_after_s * 0.9)
    c.members.heartbeat("b", 1)
    c.clock.advance(p.resend_after_s * 0.9)
    assert p.take("b") == []
    # a holder that never acts on one: sent MAX_PROMOTION_SENDS times, then given up
    c.join("d", inventory=[_ref(3, copy=True)])
    c.join("e", inventory=[_ref(3)])
    c.members.report_events("e", 1, [BlockEvent(1, EventKind.REMOVED, _ref(3))])
    sends = 0
    for _ in range(MAX_PROMOTION_SENDS + 3):
        assert c.members.heartbeat("d", 1) is NodeAction.NONE  # d stays in, never settles
        sends += len(p.take("d"))
        c.clock.advance(p.resend_after_s * 0.5)
        c.members.heartbeat("d", 1)
        c.clock.advance(p.resend_after_s * 0.5)
    assert sends == MAX_PROMOTION_SENDS and p.num_pending("d") == 0


def test_no_promotion_while_an_original_remains_on_an_unreadable_node() -> None:
    c = Cluster(failures=1)
    c.join("a", inventory=[_ref(1)])
    c.join("b", inventory=[_ref(1)])
    c.join("d", inventory=[_ref(1, copy=True)])
    c.members.report_transfer("b", 1, ok=False)  # b unhealthy: its original may come back
    c.members.report_events("a", 1, [BlockEvent(1, EventKind.REMOVED, _ref(1))])
    assert c.members.promotions.take("d") == []
