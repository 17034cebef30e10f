"""Membership on a FakeClock: leases, epochs, inventory reconcile, ordered events, health."""

from __future__ import annotations

import pytest
from helpers import key
from master_helpers import LEASE_S, NS, Cluster, blocks, spec
from structlog.testing import capture_logs

from kvstored.errors import AlreadyExists, InvalidArgument, NotFound
from kvstored.master.membership import Membership
from kvstored.master.types import (
    BlockEvent,
    BlockRef,
    EventKind,
    NodeAction,
    NodeHealth,
    PlacementPolicy,
)
from kvstored.types import Tier

DRAM, SSD = Tier.DRAM, Tier.SSD


def ev(seq: int, i: int, kind: EventKind = EventKind.ADDED, tier: Tier = DRAM) -> BlockEvent:
    return BlockEvent(seq, kind, BlockRef(NS, key(i), tier, 4096))


def test_a_node_past_its_lease_leaves_and_its_replicas_drop(cluster: Cluster) -> None:
    cluster.join("a", inventory=blocks(range(3)))
    cluster.join("b", inventory=blocks(range(3), SSD))
    assert cluster.where([0, 1, 2]) == [("a", DRAM)] * 3
    cluster.clock.advance(LEASE_S * 0.9)
    assert cluster.members.heartbeat("b", 1) is NodeAction.NONE  # b renews, a does not
    cluster.clock.advance(LEASE_S * 0.2)  # a is now 1.1 leases silent, b 0.2
    with capture_logs() as logs:
        assert cluster.members.expire_lapsed() == ["a"]
    assert [e["event"] for e in logs] == ["node_lease_expired"]
    assert logs[0]["node_id"] == "a" and logs[0]["num_replicas"] == 3
    assert cluster.where([0, 1, 2]) == [("b", SSD)] * 3
    assert [r.spec.node_id for r in cluster.members.nodes()] == ["b"]
    # a late heartbeat of the expired node is told to register again
    assert cluster.members.heartbeat("a", 1) is NodeAction.REREGISTER
    cluster.clock.advance(LEASE_S + 0.001)
    assert cluster.members.nodes() == []
    assert cluster.where([0]) == []


def test_exactly_at_the_lease_the_node_is_still_in() -> None:
    c = Cluster(lease_s=2.0)
    c.join("a", inventory=blocks([0]))
    c.clock.advance(2.0)
    assert c.members.expire_lapsed() == []
    c.clock.advance(0.001)
    assert c.members.expire_lapsed() == ["a"]


def test_restart_within_the_lease_is_a_new_epoch_that_keeps_its_ssd_blocks(cluster: Cluster) -> None:
    # epoch 1: blocks 0-1 in DRAM only, 2-3 in DRAM and on SSD
    cluster.join("a", epoch=1, inventory=blocks([0, 1, 2, 3]) + blocks([2, 3], SSD))
    assert cluster.where([0, 1, 2, 3], local="a") == [("a", DRAM)] * 4
    cluster.clock.advance(LEASE_S / 2)
    out = cluster.members.register(spec("a", epoch=2))
    assert out.superseded_epoch
    # the old epoch's replicas are gone at once (its DRAM is gone), nothing is served stale
    assert cluster.where([2, 3]) == []
    # the new epoch's inventory brings the SSD blocks back (reconcile)
    assert cluster.sync("a", 2, blocks([2, 3], SSD)) == 2
    assert cluster.where([2, 3], local="a") == [("a", SSD), ("a", SSD)]
    assert cluster.where([0]) == []
    # the old epoch's lease passes: it must never erase what epoch 2 reported
    for _ in range(4):
        cluster.clock.advance(LEASE_S / 2)
        assert cluster.members.heartbeat("a", 2) is NodeAction.NONE
    assert cluster.where([2, 3], local="a") == [("a", SSD), ("a", SSD)]
    # messages of the old daemon are refused
    assert cluster.members.heartbeat("a", 1) is NodeAction.REREGISTER
    assert cluster.members.report_events("a", 1, [ev(1, 9)]) == (NodeAction.REREGISTER, 0)
    with pytest.raises(InvalidArgument, match="older than its live epoch 2"):
        cluster.members.register(spec("a", epoch=1))
    assert cluster.where([9]) == []


def test_reconnect_of_the_same_epoch_keeps_serving_until_the_resync(cluster: Cluster) -> None:
    cluster.join("a", inventory=blocks([0, 1]), seq=4)
    out = cluster.members.register(spec("a", epoch=1))
    assert not out.superseded_epoch
    assert cluster.where([0, 1]) == [("a", DRAM)] * 2
    assert cluster.members.report_events("a", 1, [ev(5, 2)]) == (NodeAction.NONE, 5)
    assert cluster.sync("a", 1, blocks([1, 2])) == 2  # block 0 was evicted meanwhile
    assert cluster.where([1, 2]) == [("a", DRAM)] * 2
    assert cluster.where([0]) == []


def test_events_apply_in_order_duplicates_are_ignored_and_a_gap_forces_a_resync(
    cluster: Cluster,
) -> None:
    cluster.join("a", inventory=blocks([0]), seq=10)
    m = cluster.members
    assert m.report_events("a", 1, [ev(11, 1), ev(12, 2), ev(13, 0, EventKind.REMOVED)]) == (
        NodeAction.NONE, 13)
    assert cluster.where([1, 2]) == [("a", DRAM)] * 2
    assert cluster.where([0]) == []
    assert m.report_events("a", 1, [ev(12, 7), ev(13, 7)]) == (NodeAction.NONE, 13)  # replays
    assert cluster.where([7]) == []
    with capture_logs() as logs:
        assert m.report_events("a", 1, [ev(14, 3), ev(16, 4)]) == (NodeAction.RESYNC, 14)
    assert [e["event"] for e in logs] == ["node_event_gap"]
    # after a gap the master does not know what the node holds: nothing of it is served
    assert cluster.where([1]) == []
    assert m.node("a").health is NodeHealth.SYNCING  # type: ignore[union-attr]
    assert m.report_events("a", 1, [ev(15, 5)]) == (NodeAction.RESYNC, 14)
    assert m.heartbeat("a", 1, last_seq=16) is NodeAction.RESYNC
    assert cluster.sync("a", 1, blocks([1, 4]), seq=16) == 2
    assert cluster.where([1, 4]) == [("a", DRAM)] * 2
    assert m.report_events("a", 1, [ev(17, 6)]) == (NodeAction.NONE, 17)
    assert m.node("a").health is NodeHealth.HEALTHY  # type: ignore[union-attr]


def test_a_heartbeat_ahead_of_the_applied_seq_opens_a_gap(cluster: Cluster) -> None:
    cluster.join("a", inventory=blocks([0]), seq=3)
    assert cluster.members.heartbeat("a", 1, last_seq=3) is NodeAction.NONE
    assert cluster.members.heartbeat("a", 1, last_seq=5) is NodeAction.RESYNC  # events 4-5 lost
    assert cluster.where([0]) == []


def test_inventory_chunks_swap_in_only_with_the_last_one(cluster: Cluster) -> None:
    m = cluster.members
    cluster.join("a", inventory=blocks([0]))
    m.sync_inventory("a", 1, sync_id=50, blocks=blocks([1]), last_chunk=False)
    assert cluster.where([0]) == [("a", DRAM)] and cluster.where([1]) == []
    # a new sync id abandons the unfinished sync 50 (its chunk is never swapped in)
    m.sync_inventory("a", 1, sync_id=51, blocks=blocks([2]), last_chunk=False)
    assert m.sync_inventory("a", 1, sync_id=51, blocks=blocks([3]), last_chunk=True) == (
        NodeAction.NONE, 2)
    assert cluster.where([2, 3]) == [("a", DRAM)] * 2
    assert cluster.where([0]) == [] and cluster.where([1]) == []
    with pytest.raises(InvalidArgument, match="tier"):
        m.sync_inventory("a", 1, sync_id=52, blocks=[BlockRef(NS, key(4), 7, 1)],  # type: ignore[arg-type]
                         last_chunk=True)
    assert cluster.where([2]) == [("a", DRAM)]  # a bad sync never touches what is served


def test_a_registered_node_is_unreadable_until_its_inventory_is_synced(cluster: Cluster) -> None:
    m = cluster.members
    cluster.join("a", inventory=blocks([0]))
    m.register(spec("b"))
    assert m.node("b").health is NodeHealth.SYNCING  # type: ignore[union-attr]
    assert m.heartbeat("b", 1) is NodeAction.RESYNC
    assert m.report_events("b", 1, [ev(1, 1)]) == (NodeAction.RESYNC, 0)
    assert not m.is_complete()
    cluster.sync("b", 1, blocks([1], SSD))
    assert m.is_complete()
    assert cluster.where([0, 1]) == [("a", DRAM), ("b", SSD)]


def test_a_restarted_master_answers_only_from_nodes_that_registered_again() -> None:
    before = Cluster()
    before.join("a", inventory=blocks([0, 1]))
    before.join("b", inventory=blocks([1, 2]))
    after = Cluster()  # a fresh master: no memory of anything
    assert after.members.heartbeat("a", 1) is NodeAction.REREGISTER
    assert after.members.report_events("b", 1, [ev(1, 5)]) == (NodeAction.REREGISTER, 0)
    assert after.where([0]) == []
    after.join("b", inventory=blocks([1, 2]))
    assert after.where([0]) == []  # a's blocks are unknown, not guessed
    assert after.where([1, 2]) == [("b", DRAM)] * 2
    after.join("a", inventory=blocks([0, 1]))
    # block 1 is on both: equal rank and load, the earlier holder (b synced first) wins
    assert after.where([0, 1, 2]) == [("a", DRAM), ("b", DRAM), ("b", DRAM)]


def test_a_restarted_master_says_incomplete_for_its_rejoin_grace_whatever_has_synced() -> None:
    c = Cluster()
    m = Membership(c.index, c.clock, c.gens, node_lease_s=LEASE_S, rejoin_grace_s=LEASE_S)
    assert not m.is_complete()  # nobody has come back yet: that is not "everybody"
    m.register(spec("a"))
    m.sync_inventory("a", 1, sync_id=1, blocks=blocks([0]), last_chunk=True, seq=0)
    c.clock.advance(LEASE_S - 0.01)
    assert m.heartbeat("a", 1) is NodeAction.NONE
    assert not m.is_complete()  # a synced, others may still be on their way
    c.clock.advance(0.01)
    assert m.is_complete()
    assert c.members.is_complete()  # no grace (a first start): complete at once


def test_data_plane_failures_make_a_node_unhealthy_and_one_success_heals_it() -> None:
    c = Cluster(failures=3)
    c.join("a", inventory=blocks([0]))
    c.join("b", inventory=blocks([0]))
    m = c.members
    assert c.where([0]) == [("a", DRAM)]
    assert m.report_transfer("a", 1, ok=False) is NodeHealth.HEALTHY
    assert m.report_transfer("a", 1, ok=False) is NodeHealth.HEALTHY
    assert c.where([0]) == [("a", DRAM)]
    with capture_logs() as logs:
        assert m.report_transfer("a", 1, ok=False) is NodeHealth.UNHEALTHY
    assert [e["event"] for e in logs] == ["node_unhealthy"]
    assert c.where([0]) == [("b", DRAM)]  # still heartbeating, but not chosen
    assert m.heartbeat("a", 1) is NodeAction.NONE
    assert c.where([0]) == [("b", DRAM)]
    assert m.report_transfer("a", 2, ok=True) is NodeHealth.UNHEALTHY  # another epoch: ignored
    assert m.report_transfer("a", 1, ok=True) is NodeHealth.HEALTHY
    assert c.where([0]) == [("a", DRAM)]
    with pytest.raises(NotFound, match="'zz'"):
        m.report_transfer("zz", 1, ok=False)


def _spill_targets(c: Cluster) -> list[str]:
    return [r.spec.node_id for r in c.placement.order_candidates(
        4096, "b", PlacementPolicy.MOST_FREE, exclude_writer=True)]


def _mark_unhealthy(c: Cluster, node_id: str) -> None:
    for _ in range(3):
        c.members.report_transfer(node_id, 1, ok=False)
    assert c.members.node(node_id).health is NodeHealth.UNHEALTHY  # type: ignore[union-attr]


def test_an_unhealthy_node_that_heartbeats_is_tried_again_after_the_retry_time() -> None:
    # the half-open state of a circuit breaker: a node that stalled (SIGSTOP) and came back
    c = Cluster(failures=3)  # unhealthy_retry_s defaults to one node lease
    c.join("a", inventory=blocks([0]))
    c.join("b", inventory=blocks([0]))
    m = c.members
    assert m.unhealthy_retry_s == LEASE_S and m.unhealthy_retry_max_s == 8 * LEASE_S
    _mark_unhealthy(c, "a")
    assert c.where([0]) == [("b", DRAM)] and _spill_targets(c) == []
    c.clock.advance(LEASE_S * 0.6)
    assert m.heartbeat("a", 1) is NodeAction.NONE
    m.heartbeat("b", 1)
    c.clock.advance(LEASE_S * 0.39)  # 0.99 lease unhealthy: still closed
    m.heartbeat("a", 1)
    m.heartbeat("b", 1)
    assert c.where([0]) == [("b", DRAM)]
    c.clock.advance(LEASE_S * 0.01)
    with capture_logs() as logs:
        assert m.heartbeat("a", 1) is NodeAction.NONE
    assert [e["event"] for e in logs] == ["node_on_probation"]
    rec = m.node("a")
    assert rec is not None and rec.probation and rec.health is NodeHealth.UNHEALTHY
    assert c.where([0]) == [("a", DRAM)]  # readable again: a reader tries it...
    assert _spill_targets(c) == []  # ...but no new replica goes there before a success
    # the trial fails: unhealthy again at once, and the retry time doubles
    with capture_logs() as logs:
        assert m.report_transfer("a", 1, ok=False) is NodeHealth.UNHEALTHY
    assert [e["event"] for e in logs] == ["node_unhealthy"] and logs[0]["retry_s"] == 2 * LEASE_S
    assert not rec.probation and c.where([0]) == [("b", DRAM)]
    assert m.num_unhealthy_marks == 2
    for _ in range(3):  # 1.5 leases, heartbeating: still closed (the retry is 2 leases now)
        c.clock.advance(LEASE_S / 2)
        m.heartbeat("a", 1)
        m.heartbeat("b", 1)
    assert c.where([0]) == [("b", DRAM)]
    c.clock.advance(LEASE_S / 2)
    m.heartbeat("a", 1)
    assert rec.probation and c.where([0]) == [("a", DRAM)]
    # the trial succeeds: healed, a spill target again, and the retry time is reset
    assert m.report_transfer("a", 1, ok=True) is NodeHealth.HEALTHY
    assert not rec.probation and _spill_targets(c) == ["a"]
    _mark_unhealthy(c, "a")
    assert rec.retry_s == LEASE_S


def test_the_retry_time_backs_off_up_to_its_cap() -> None:
    c = Cluster(failures=1)
    c.members = m = Membership(c.index, c.clock, c.gens, node_lease_s=LEASE_S,
                               unhealthy_after_failures=1, unhealthy_retry_s=1.0,
                               unhealthy_retry_max_s=3.0)
    c.placement.membership = m
    c.join("a", inventory=blocks([0]))
    m.report_transfer("a", 1, ok=False)
    waits = []
    for _ in range(4):
        rec = m.node("a")
        assert rec is not None and not rec.probation
        waits.append(rec.retry_s)
        c.clock.advance(rec.retry_s)
        m.heartbeat("a", 1)
        assert rec.probation
        m.report_transfer("a", 1, ok=False)
    assert waits == [1.0, 2.0, 3.0, 3.0]
    with pytest.raises(InvalidArgument, match="unhealthy_retry_s"):
        Membership(c.index, c.clock, c.gens, unhealthy_retry_s=-1.0)


def test_a_silent_unhealthy_node_is_not_tried_again() -> None:
    # the probation needs a sign of life: one that stays silent leaves with its lease
    c = Cluster(failures=1)
    c.join("a", inventory=blocks([0]))
    c.join("b", inventory=blocks([0]))
    c.members.report_transfer("a", 1, ok=False)
    c.clock.advance(LEASE_S * 0.9)
    c.members.heartbeat("b", 1)
    assert c.where([0]) == [("b", DRAM)]
    c.clock.advance(LEASE_S * 0.2)
    assert c.members.expire_lapsed() == ["a"]


def test_unregister_drops_the_node_at_once(cluster: Cluster) -> None:
    cluster.join("a", inventory=blocks([0]))
    assert cluster.members.unregister("a", 2) is False
    assert cluster.members.unregister("a", 1) is True
    assert cluster.where([0]) == [] and cluster.members.nodes() == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"node_id": ""}, "node_id"),
        ({"epoch": 0}, "epoch"),
        ({"grpc_address": "nohost"}, "grpc_address"),
        ({"data_address": "h:0"}, "data_address"),
    ],
)
def test_bad_registrations_name_the_field(cluster: Cluster, kwargs: dict, match: str) -> None:  # type: ignore[type-arg]
    import dataclasses

    bad = dataclasses.replace(spec("a"), **kwargs)
    with pytest.raises(InvalidArgument, match=match):
        cluster.members.register(bad)
    assert cluster.members.nodes() == []


def _generations(cluster: Cluster, i: int) -> dict[tuple[str, Tier], int]:
    out = {}
    for r in cluster.index.replicas(NS, key(i), readable_only=True):
        owner = cluster.members.record_of_holder(r.holder)
        assert owner is not None
        out[(owner.spec.node_id, r.tier)] = r.generation
    return out


def test_the_master_indexes_the_holders_generation_from_inventory_and_events(
    cluster: Cluster,
) -> None:
    # the node's store stamps a generation per replica (kvstored/tiers/feed.py); its data
    # plane sends it with the block, so the master must index exactly that one
    cluster.join("a", inventory=[BlockRef(NS, key(0), DRAM, 4096, 1_000_001),
                                 BlockRef(NS, key(0), SSD, 4096, 1_000_001),
                                 BlockRef(NS, key(1), DRAM, 4096, 0)])  # an older node: 0
    assert _generations(cluster, 0) == {("a", DRAM): 1_000_001, ("a", SSD): 1_000_001}
    issued = _generations(cluster, 1)[("a", DRAM)]
    assert issued >= 100  # the master's own (Generations(100)) for a replica sent without one
    add = BlockEvent(1, EventKind.ADDED, BlockRef(NS, key(2), DRAM, 4096, 1_000_002))
    assert cluster.members.report_events("a", 1, [add]) == (NodeAction.NONE, 1)
    assert _generations(cluster, 2) == {("a", DRAM): 1_000_002}
    # remove + re-put within one round: two events, the re-put's new generation wins
    events = [BlockEvent(2, EventKind.REMOVED, BlockRef(NS, key(2), DRAM, 4096, 1_000_002)),
              BlockEvent(3, EventKind.ADDED, BlockRef(NS, key(2), DRAM, 4096, 1_000_003))]
    assert cluster.members.report_events("a", 1, events) == (NodeAction.NONE, 3)
    assert _generations(cluster, 2) == {("a", DRAM): 1_000_003}
    # an ADDED for a replica the master indexes already (e.g. under a generation it issued
    # for a write it placed): the holder's generation replaces it
    again = BlockEvent(4, EventKind.ADDED, BlockRef(NS, key(1), DRAM, 4096, 1_000_004))
    assert cluster.members.report_events("a", 1, [again]) == (NodeAction.NONE, 4)
    assert _generations(cluster, 1) == {("a", DRAM): 1_000_004}
    # events without a generation (an older node) still get fresh master generations
    old = BlockEvent(5, EventKind.ADDED, BlockRef(NS, key(3), DRAM, 4096))
    assert cluster.members.report_events("a", 1, [old]) == (NodeAction.NONE, 5)
    assert _generations(cluster, 3)[("a", DRAM)] > issued


def test_a_second_daemon_with_a_live_node_id_is_refused_and_the_first_keeps_its_blocks(
    cluster: Cluster,
) -> None:
    cluster.join("a", epoch=1, inventory=blocks([0, 1]), port=7000)
    m = cluster.members
    cluster.clock.advance(LEASE_S / 4)
    other = spec("a", epoch=2, port=7100)  # another process: neither of a's addresses
    live = m.duplicate_of(other)
    assert live is not None and live.spec.epoch == 1
    with capture_logs() as logs, pytest.raises(AlreadyExists) as err:
        m.register(other, live_epoch_answering=1)  # its data port answered the probe
    msg = str(err.value)
    for part in ("'a'", "epoch 1", "127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7100",
                 "127.0.0.1:7101", f"{LEASE_S * 0.75:.1f} s left", "--node-id"):
        assert part in msg, (part, msg)
    assert [e["event"] for e in logs] == ["node_id_duplicate_refused"]
    # the live daemon keeps its id, its epoch and its blocks
    assert m.heartbeat("a", 1) is NodeAction.NONE
    assert cluster.where([0, 1], local="a") == [("a", DRAM)] * 2
    assert m.heartbeat("a", 2) is NodeAction.REREGISTER


def test_a_restart_within_the_lease_is_not_a_duplicate() -> None:
    c = Cluster()
    c.join("a", epoch=1, inventory=blocks([0]), port=7000)
    m = c.members
    # the same gRPC or data address: the old process is gone (it held the port)
    assert m.duplicate_of(spec("a", epoch=2, port=7000)) is None
    moved_grpc = spec("a", epoch=2)
    moved_grpc = type(moved_grpc)(**{**{f: getattr(moved_grpc, f) for f in moved_grpc.__slots__},
                                     "grpc_address": "127.0.0.1:9999"})
    assert m.duplicate_of(moved_grpc) is None
    # an older or the same epoch is never a duplicate candidate (stale / reconnect)
    assert m.duplicate_of(spec("a", epoch=1, port=7100)) is None
    # new addresses whose old data port did not answer (SIGKILLed, ports changed): a restart
    assert m.duplicate_of(spec("a", epoch=2, port=7100)) is not None
    assert m.register(spec("a", epoch=2, port=7100)).superseded_epoch
    # a probe answer about an epoch no longer live refuses nothing
    assert m.register(spec("a", epoch=3, port=7200), live_epoch_answering=1).superseded_epoch
    assert m.node("a").spec.epoch == 3  # type: ignore[union-attr]
    # past the old lease, any address is fine
    c.clock.advance(LEASE_S + 1)
    assert m.duplicate_of(spec("a", epoch=4, port=7300)) is None


def test_the_duplicate_probe_tells_a_listening_data_port_from_a_closed_one() -> None:
    import asyncio
    import socket

    from kvstored.master.service import data_port_answers

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        addr = f"127.0.0.1:{srv.getsockname()[1]}"
        assert asyncio.run(data_port_answers(addr)) is True
    assert asyncio.run(data_port_answers(addr)) is False  # closed now: refused
