"""Placement for spill: the writer excluded, last-tier watermark with headroom, and writes
whose replica the holder reports itself (one replica, never two)."""

from __future__ import annotations

import pathlib
from types import SimpleNamespace

import pytest
from helpers import key
from master_helpers import NS, Cluster, MiB

from kvstored.errors import InvalidArgument, NoCapacity, NotFound
from kvstored.master.service import _usage as _usage_of
from kvstored.master.types import (
    BlockEvent,
    BlockRef,
    EventKind,
    ReplicaState,
    TierUsage,
)
from kvstored.node.cluster import MasterLink
from kvstored.tiers.tiered import TieredStore
from kvstored.types import Tier
from kvstored.v1 import common_pb2 as cpb


def _usage(c: Cluster, node_id: str, *, dram: tuple[int, int], ssd: tuple[int, int] = (0, 0)) -> None:
    """Heartbeat ``(capacity, used)`` per tier for a node."""
    c.clock.advance(0.001)  # a new heartbeat time
    c.members.heartbeat(node_id, 1, tiers=(TierUsage(Tier.DRAM, *dram), TierUsage(Tier.SSD, *ssd)))


def _spill_start(c: Cluster, i: int, size: int = MiB, *, writer: str = "a", headroom: int = 0):
    return c.placement.start_put(NS, key(i), size, writer_node_id=writer, exclude_writer=True,
                                 max_used_fraction=0.9, headroom_bytes=headroom,
                                 holder_reports=True)


def test_spill_never_places_on_the_writer_and_needs_room_below_the_watermark() -> None:
    c = Cluster()
    for n in ("a", "b", "c"):
        c.join(n)
    _usage(c, "a", dram=(100 * MiB, 10 * MiB))  # the emptiest, but the writer
    _usage(c, "b", dram=(100 * MiB, 80 * MiB))  # 80 + 1 + 8 headroom <= 90: fits
    _usage(c, "c", dram=(100 * MiB, 85 * MiB), ssd=(100 * MiB, 50 * MiB))  # its SSD counts
    order = c.placement.order_candidates(MiB, "a", c.placement.policy, exclude_writer=True,
                                         max_used_fraction=0.9, headroom_bytes=8 * MiB)
    assert [r.spec.node_id for r in order] == ["c", "b"]  # by room in the last tier
    _usage(c, "b", dram=(100 * MiB, 82 * MiB))  # 82 + 1 + 8 > 90: out
    order = c.placement.order_candidates(MiB, "a", c.placement.policy, exclude_writer=True,
                                         max_used_fraction=0.9, headroom_bytes=8 * MiB)
    assert [r.spec.node_id for r in order] == ["c"]
    _usage(c, "c", dram=(100 * MiB, 85 * MiB), ssd=(100 * MiB, 89 * MiB))  # 1 + 5 < 1 + 8
    with pytest.raises(NoCapacity, match="other than the writer's"):
        _spill_start(c, 1, headroom=8 * MiB)
    with pytest.raises(InvalidArgument, match="max_used_fraction"):
        c.placement.start_put(NS, key(1), MiB, max_used_fraction=1.5)


def test_a_tiered_nodes_free_dram_counts_as_pool_room_while_its_ssd_is_past_the_watermark(
) -> None:
    """Issue 17 §3: two DRAM 8 + SSD 16 MiB nodes lost blocks once both SSDs were past the
    watermark while both DRAMs had room; the room is now SSD below the watermark (from 0)
    plus DRAM below it, so spill keeps placing into the peer's DRAM."""
    c = Cluster()
    for n in ("a", "b"):
        c.join(n)
    _usage(c, "b", dram=(8 * MiB, 2 * MiB), ssd=(16 * MiB, 16 * MiB))  # SSD full, DRAM not
    rec = c.members.node("b")
    assert rec is not None
    assert c.placement.last_tier_room_bytes(rec, 0.9) == int(0.9 * 8 * MiB) - 2 * MiB
    out = _spill_start(c, 1, headroom=2 * MiB)
    assert not out.exists and [r.node_id for r in out.replicas] == ["b"]
    c.placement.end_put(NS, key(1), out.generation, commit=False)
    _usage(c, "b", dram=(8 * MiB, 7 * MiB), ssd=(16 * MiB, 10 * MiB))  # both count
    assert c.placement.last_tier_room_bytes(rec, 0.9) == (
        int(0.9 * 16 * MiB) - 10 * MiB + int(0.9 * 8 * MiB) - 7 * MiB)
    _usage(c, "b", dram=(8 * MiB, 8 * MiB), ssd=(16 * MiB, 16 * MiB))  # both past it
    with pytest.raises(NoCapacity):
        _spill_start(c, 2)


def test_only_the_writer_holding_the_block_is_not_exists_but_another_holder_is() -> None:
    c = Cluster()
    c.join("a", inventory=[BlockRef(NS, key(1), Tier.DRAM, MiB)])
    c.join("b")
    _usage(c, "b", dram=(100 * MiB, 0))
    out = _spill_start(c, 1)
    assert not out.exists and [r.node_id for r in out.replicas] == ["b"]
    c.placement.end_put(NS, key(1), out.generation, commit=False)
    c.join("c", inventory=[BlockRef(NS, key(1), Tier.DRAM, MiB)])
    assert _spill_start(c, 1).exists  # c holds it: a may just drop its copy


@pytest.mark.parametrize("event_first", [True, False])
def test_a_holder_reported_write_is_one_replica_whatever_comes_first(event_first: bool) -> None:
    c = Cluster()
    c.join("a")
    c.join("b")
    _usage(c, "b", dram=(100 * MiB, 0), ssd=(200 * MiB, 0))
    out = _spill_start(c, 1)
    hb = c.holder("b")
    assert [(r.holder, r.state) for r in c.index.replicas(NS, key(1))] == [(hb, ReplicaState.WRITING)]

    def event(seq: int, tier: Tier) -> None:
        c.members.report_events("b", 1, [BlockEvent(seq, EventKind.ADDED, BlockRef(NS, key(1), tier, MiB))])

    if event_first:
        event(1, Tier.DRAM)  # b's MasterLink saw the block before the writer's PutEnd
        assert c.placement.end_put(NS, key(1), out.generation, commit=True) == 1
    else:
        assert c.placement.end_put(NS, key(1), out.generation, commit=True) == 0
        assert c.index.replicas(NS, key(1)) == []  # nothing indexed until b reports it
        event(1, Tier.DRAM)
    got = c.index.replicas(NS, key(1))
    assert [(r.holder, r.tier, r.state) for r in got] == [(hb, Tier.DRAM, ReplicaState.COMMITTED)]
    assert c.placement.num_open_writes == 0


def test_a_block_the_holder_demoted_before_reporting_is_never_named_in_dram() -> None:
    c = Cluster()
    c.join("a")
    c.join("b")
    _usage(c, "b", dram=(100 * MiB, 0), ssd=(200 * MiB, 0))
    out = _spill_start(c, 1)
    c.members.report_events("b", 1, [BlockEvent(1, EventKind.ADDED, BlockRef(NS, key(1), Tier.SSD, MiB))])
    assert c.placement.end_put(NS, key(1), out.generation, commit=True) == 1
    got = c.index.replicas(NS, key(1))
    assert [(r.tier, r.state) for r in got] == [(Tier.SSD, ReplicaState.COMMITTED)]


def test_a_stale_end_of_a_lapsed_spill_write_is_refused_and_the_new_write_stays_open() -> None:
    c = Cluster(write_lease_s=5.0)
    c.join("a")
    c.join("b")
    _usage(c, "b", dram=(100 * MiB, 0))
    old = _spill_start(c, 1)
    c.clock.advance(6.0)
    c.members.heartbeat("a", 1)
    _usage(c, "b", dram=(100 * MiB, 0))
    new = _spill_start(c, 1)
    assert new.generation > old.generation
    with pytest.raises(NotFound, match="late commit is refused"):
        c.placement.end_put(NS, key(1), old.generation, commit=True)
    assert c.placement.num_open_writes == 1
    assert [r.generation for r in c.index.replicas(NS, key(1))] == [new.generation]


def test_bytes_landed_since_the_last_heartbeat_still_count_against_the_target() -> None:
    c = Cluster()
    c.join("a")
    c.join("b")
    _usage(c, "b", dram=(10 * MiB, 0))
    for i in range(9):  # 9 MiB fit below 90 % of 10 MiB; b has not heartbeated meanwhile
        out = _spill_start(c, i)
        assert [r.node_id for r in out.replicas] == ["b"]
        c.placement.end_put(NS, key(i), out.generation, commit=True)
    with pytest.raises(NoCapacity):
        _spill_start(c, 9)
    _usage(c, "b", dram=(10 * MiB, 2 * MiB))  # b evicted meanwhile: its heartbeat is the truth
    assert [r.node_id for r in _spill_start(c, 9).replicas] == ["b"]


def test_two_spillers_never_both_drop_a_block_citing_each_others_copy() -> None:
    c = Cluster()
    inv = [BlockRef(NS, key(1), Tier.DRAM, MiB)]
    c.join("a", inventory=inv)
    c.join("b", inventory=inv)
    c.join("c")
    _usage(c, "c", dram=(100 * MiB, 0))
    assert _spill_start(c, 1, writer="a").exists  # a may drop: b holds it
    out = _spill_start(c, 1, writer="b")  # a's copy is on its way out: b must move, not drop
    assert not out.exists and [r.node_id for r in out.replicas] == ["c"]
    c.placement.end_put(NS, key(1), out.generation, commit=False)
    for _ in range(3):  # a's grant lapses after a node lease at the latest (all stay alive)
        c.clock.advance(c.members.node_lease_s / 2)
        for n in ("a", "b", "c"):
            c.members.heartbeat(n, 1)
    assert _spill_start(c, 1, writer="b").exists


def test_a_tiered_nodes_copies_and_blocks_also_on_its_ssd_are_room_not_use(
    tmp_path: pathlib.Path,
) -> None:
    """Issue 17 §3 (three DRAM 16 + SSD 32 MiB nodes, 125 blocks of 144 MiB: sole copies
    lost): a peer whose DRAM held only remote-fill copies and blocks also on its SSD (the
    same key in both tiers) heartbeated a full DRAM, so placement found no room below the
    watermark anywhere and the writer evicted its own sole copies. Evicting such blocks
    drops nothing: the store counts them (``TieredStore.spare_bytes``), the node
    heartbeats them as its DRAM tier's ``spare_bytes`` and placement counts them as room.
    (Fails on the old code: no such count, and the peer is no candidate.)"""
    k = 4096
    block = 2 * k + 100  # 3 allocation units in DRAM and on SSD (with its trailer)
    store = TieredStore(dram_size_bytes=4 * 3 * k, arena_dir=None, ssd_dir=tmp_path / "ssd",
                        ssd_size_bytes=5 * 3 * k)
    try:
        for i in range(4):
            store.put(key(i), bytes([i]) * block)
        assert store.spill_to_ssd() == 4  # DRAM [0..3] all on SSD too: 4 of 5 SSD slots
        assert store.spare_bytes() == 4 * 3 * k
        wire = MasterLink._tiers(SimpleNamespace(store=store))  # type: ignore[arg-type]
        by = {t.tier: t for t in wire}
        assert by[cpb.DRAM].used_bytes == 4 * 3 * k
        assert by[cpb.DRAM].spare_bytes == 4 * 3 * k and by[cpb.SSD].spare_bytes == 0
        c = Cluster()
        for n in ("a", "b"):
            c.join(n)
        # b heartbeats exactly that (scaled to MiB blocks the spill asks room for)
        scale = MiB // (3 * k)
        c.clock.advance(0.001)
        c.members.heartbeat("b", 1, tiers=tuple(
            TierUsage(u.tier, u.capacity_bytes * scale, u.used_bytes * scale, u.num_blocks,
                      u.spare_bytes * scale) for u in _usage_of(wire, "b")))
        rec = c.members.node("b")
        assert rec is not None
        dram, ssd = rec.tiers[Tier.DRAM], rec.tiers[Tier.SSD]
        ssd_room = int(0.9 * ssd.capacity_bytes) - ssd.used_bytes  # 4 of 5 used: < 1 MiB
        assert 0 < ssd_room < MiB
        # all of its DRAM is spare: the whole DRAM below the watermark is room
        assert c.placement.last_tier_room_bytes(rec, 0.9) == (
            int(0.9 * dram.capacity_bytes) + ssd_room)
        out = _spill_start(c, 1)  # 1 MiB: only the spare DRAM has it
        assert not out.exists and [r.node_id for r in out.replicas] == ["b"]
    finally:
        store.close()
