"""Repair, drain and hot blocks on a FakeClock (kvstored/master/repair.py): exact copy
commands (source, target, order), the byte rate limit, zones, the hot-block cap."""

from __future__ import annotations

import pytest
from helpers import key
from master_helpers import LEASE_S, NS, Cluster, blocks

from kvstored.errors import InvalidArgument, NotFound
from kvstored.master.commands import CommandKind
from kvstored.master.repair import RepairSettings
from kvstored.master.types import BlockEvent, BlockRef, EventKind, PlacementPolicy, ReplicaState
from kvstored.types import Tier

SIZE = 4096


def copies(c: Cluster, node_id: str) -> list[tuple[bytes, str]]:
    """(key, source node) of the COPY commands queued for a node, in queue order."""
    return [(cmd.key, cmd.source.node_id) for cmd in c.state.commands.pending(node_id)
            if cmd.kind is CommandKind.COPY and cmd.source is not None]


def lapse(c: Cluster, dead: str, alive: list[str]) -> None:
    """Let ``dead``'s lease lapse while ``alive`` keep heartbeating, then one maintenance step."""
    c.clock.advance(LEASE_S * 0.9)
    for n in alive:
        c.members.heartbeat(n, 1)
    c.clock.advance(LEASE_S * 0.2)
    gone, _, _ = c.state.maintain(65536)
    assert gone == [dead]


def report_added(c: Cluster, node_id: str, keys: list[int], seq0: int = 1) -> None:
    evs = [BlockEvent(seq0 + j, EventKind.ADDED, BlockRef(NS, key(i), Tier.DRAM, SIZE))
           for j, i in enumerate(keys)]
    c.members.report_events(node_id, 1, evs)


def test_a_holder_leaving_queues_copies_of_its_blocks_whose_factor_is_above_one() -> None:
    c = Cluster()
    c.join("a", inventory=blocks([1, 2, 3]))
    c.join("b", inventory=blocks([1, 2, 3]))
    c.join("c")
    c.state.repair.set_factor(NS, [key(1), key(2)], 2)  # block 3: factor 1, never repaired
    c.state.maintain(65536)
    assert copies(c, "c") == []  # two replicas each: nothing to do
    lapse(c, "a", ["b", "c"])
    assert copies(c, "c") == [(key(1), "b"), (key(2), "b")]
    assert c.state.commands.pending("b", CommandKind.COPY) == []  # b holds them: no target
    assert [cmd.key for cmd in c.state.commands.pending("b")] == [b"a"]  # PEER_LEFT(a)
    c.state.maintain(65536)  # in flight: not queued twice
    assert len(c.state.commands.pending("c", CommandKind.COPY)) == 2
    cmd = c.state.commands.pending("c", CommandKind.COPY)[0]
    b_row = [r for r in c.index.replicas(NS, key(1)) if r.holder == c.holder("b")]
    assert cmd.source is not None and cmd.source.size_bytes == SIZE
    assert cmd.source.generation == b_row[0].generation  # the copy is verified against it


def test_the_factor_a_put_recorded_in_the_index_is_repaired_too() -> None:
    c = Cluster()
    c.join("a", inventory=blocks([1, 2]))
    c.join("b", inventory=blocks([1, 2]))
    c.join("c")
    assert c.index.record_replication_factor(NS, key(2), 2)  # put(replicas=2)'s factor
    lapse(c, "a", ["b", "c"])
    assert copies(c, "c") == [(key(2), "b")]


def test_repair_stops_once_the_new_replica_is_reported() -> None:
    c = Cluster()
    c.join("a", inventory=blocks([1]))
    c.join("b", inventory=blocks([1]))
    c.join("c")
    c.state.repair.set_factor(NS, [key(1)], 2)
    lapse(c, "a", ["b", "c"])
    [cmd] = c.state.commands.pending("c", CommandKind.COPY)
    c.state.commands.ack("c", 1, [cmd.command_id])
    report_added(c, "c", [1])
    c.state.maintain(65536)
    assert c.state.commands.pending("c", CommandKind.COPY) == []
    assert c.state.repair.num_under_replicated == 0


def test_the_repair_rate_limit_paces_copy_commands_in_bytes_per_second() -> None:
    c = Cluster(repair=RepairSettings(repair_bytes_per_s=2 * SIZE))
    c.join("a", inventory=blocks(range(6)))
    c.join("b", inventory=blocks(range(6)))
    c.join("c")
    c.state.repair.set_factor(NS, [key(i) for i in range(6)], 2)
    c.clock.advance(1.0)  # the bucket starts full: 2 blocks' worth
    lapse(c, "a", ["b", "c"])
    assert [k for k, _ in copies(c, "c")] == [key(0), key(1)]
    assert c.state.repair.num_rate_limited >= 1 and c.state.repair.num_waiting == 4
    c.clock.advance(0.5)  # one block's worth more
    c.state.maintain(65536)
    assert [k for k, _ in copies(c, "c")] == [key(0), key(1), key(2)]
    c.clock.advance(1.0)
    c.state.maintain(65536)
    assert [k for k, _ in copies(c, "c")] == [key(i) for i in range(5)]
    c.clock.advance(1.0)
    c.state.maintain(65536)
    assert [k for k, _ in copies(c, "c")] == [key(i) for i in range(6)]
    assert c.state.repair.num_bytes_issued == 6 * SIZE


def test_a_target_in_another_zone_is_chosen_first() -> None:
    c = Cluster()
    zones = {"a": "z1", "b": "z1", "c": "z2", "d": "z1"}
    c.state.repair.zone_of = lambda rec: zones[rec.spec.node_id]
    c.join("a", inventory=blocks([1]))
    c.join("b", dram_used=0)  # most room, but a's zone
    c.join("c", dram_used=32 << 20)
    c.state.repair.set_factor(NS, [key(1)], 2)
    c.state.maintain(65536)
    assert copies(c, "c") == [(key(1), "a")] and copies(c, "b") == []


def test_a_node_holding_a_copy_is_asked_to_keep_it_before_any_transfer() -> None:
    c = Cluster()
    c.join("a", inventory=blocks([1]))
    c.join("b")
    c.join("c", inventory=[BlockRef(NS, key(1), Tier.DRAM, SIZE, copy=True)])
    c.state.repair.set_factor(NS, [key(1)], 2)
    c.state.maintain(65536)
    assert copies(c, "c") == [(key(1), "a")] and copies(c, "b") == []
    assert c.state.repair.num_bytes_issued == 0  # kept in place: no bytes move


def test_drain_re_homes_single_replica_blocks_then_sends_leave() -> None:
    c = Cluster()
    c.join("a", inventory=blocks([1, 2, 3]))
    c.join("b", inventory=blocks([3]))  # block 3 has another original: not moved
    c.join("c", dram_used=60 << 20)  # little room: b takes them
    p = c.state.repair.drain("a")
    assert (p.num_blocks, p.num_blocks_to_move, p.num_copies_issued, p.leave_sent) == (3, 2, 2, False)
    assert copies(c, "b") == [(key(1), "a"), (key(2), "a")]
    rec = c.members.node("a")
    assert rec is not None and rec.draining
    placed = c.placement.order_candidates(SIZE, "a", PlacementPolicy.LOCAL_FIRST)
    assert [r.spec.node_id for r in placed] == ["b", "c"]  # never the draining node
    assert c.where([1, 2]) == [("a", Tier.DRAM), ("a", Tier.DRAM)]  # still served by a
    report_added(c, "b", [1])
    c.state.maintain(65536)
    assert [cmd.kind for cmd in c.state.commands.pending("a")] == []  # block 2 not yet
    report_added(c, "b", [2], seq0=2)
    c.state.maintain(65536)
    assert [cmd.kind for cmd in c.state.commands.pending("a")] == [CommandKind.LEAVE]
    assert c.state.repair.drain("a").leave_sent
    c.members.unregister("a", 1)
    with pytest.raises(NotFound, match="not registered"):
        c.state.repair.drain("a")


def test_hot_blocks_get_one_extra_replica_on_the_reader_up_to_the_cap() -> None:
    c = Cluster(repair=RepairSettings(hot_reads_per_window=3, hot_window_s=10.0,
                                      hot_max_extra_replicas=1))
    c.join("a", inventory=blocks([1]))
    c.join("b")
    c.join("c")
    r = c.state.repair
    for _ in range(3):
        r.note_lookup("b", NS, [(key(1), "a")])
    c.state.maintain(65536)
    assert copies(c, "b") == []  # 3 reads: not more than the threshold
    r.note_lookup("b", NS, [(key(1), "b")])  # a local answer is no remote read
    c.state.maintain(65536)
    assert copies(c, "b") == []
    r.note_lookup("b", NS, [(key(1), "a")])
    c.state.maintain(65536)
    assert copies(c, "b") == [(key(1), "a")] and r.num_hot_copies == 1
    report_added(c, "b", [1])
    for _ in range(5):
        r.note_lookup("c", NS, [(key(1), "a")])
    c.state.maintain(65536)
    assert copies(c, "c") == []  # the cap: one extra replica


def test_hot_reads_outside_the_window_do_not_add_up() -> None:
    c = Cluster(repair=RepairSettings(hot_reads_per_window=2, hot_window_s=1.0))
    c.join("a", inventory=blocks([1]))
    c.join("b")
    for _ in range(4):
        c.state.repair.note_lookup("b", NS, [(key(1), "a")])
        c.clock.advance(0.6)  # every second read starts a new window
    c.members.heartbeat("a", 1)
    c.members.heartbeat("b", 1)
    c.state.maintain(65536)
    assert copies(c, "b") == []


def test_set_factor_names_the_bad_value() -> None:
    with pytest.raises(InvalidArgument, match="replicas must be 1..8, got 9"):
        Cluster().state.repair.set_factor(NS, [key(1)], 9)



def drops(c: Cluster) -> list[tuple[str, bytes]]:
    """(node, key) of every DROP command queued, by node."""
    return [(n, cmd.key) for n in ("a", "b", "c", "d")
            for cmd in c.state.commands.pending(n, CommandKind.DROP)]


def test_a_replica_above_the_factor_is_dropped_once_from_the_fullest_node() -> None:
    c = Cluster()
    c.join("a", inventory=blocks([1, 2]), dram_used=8 << 20)
    c.join("b", inventory=blocks([1, 2]), dram_used=60 << 20)  # the fullest
    c.join("c", inventory=blocks([1]), dram_used=30 << 20)
    r = c.state.repair
    r.set_factor(NS, [key(1)], 2)  # 3 originals of block 1 (a node came back, say)
    c.state.maintain(65536)
    assert drops(c) == [("b", key(1))] and r.num_drops_issued == 1
    assert c.state.commands.pending("b", CommandKind.DROP)[0].term == c.state.commands.term()
    c.state.maintain(65536)
    assert drops(c) == [("b", key(1))]  # in flight: never a second one
    [cmd] = c.state.commands.pending("b", CommandKind.DROP)
    c.state.commands.ack("b", 1, [cmd.command_id])  # acked before its REMOVED event came
    r.set_factor(NS, [key(1)], 2)  # looked at again meanwhile
    c.state.maintain(65536)
    assert drops(c) == []  # b's replica still indexed counts as gone: no DROP elsewhere
    c.members.report_events("b", 1, [BlockEvent(1, EventKind.REMOVED,
                                                BlockRef(NS, key(1), Tier.DRAM, SIZE))])
    r.set_factor(NS, [key(1)], 2)
    c.state.maintain(65536)
    assert drops(c) == [] and r.num_drops_issued == 1  # 2 originals = the factor
    assert {n for n, _ in c.where([1])} <= {"a", "c"}


def test_the_last_replica_and_a_block_at_its_factor_are_never_dropped() -> None:
    c = Cluster()
    c.join("a", inventory=blocks([1, 2]))
    c.join("b", inventory=blocks([2]))
    r = c.state.repair
    r.set_factor(NS, [key(1)], 1)  # one original: the last one
    r.set_factor(NS, [key(2)], 2)  # two originals, factor 2
    c.state.maintain(65536)
    assert drops(c) == [] and r.num_drops_issued == 0


def test_no_drop_while_a_copy_of_the_block_is_in_flight_or_a_replica_is_being_written() -> None:
    c = Cluster()
    c.join("a", inventory=blocks([1, 2]))
    c.join("b", inventory=blocks([2]))
    c.join("c")
    r = c.state.repair
    r.set_factor(NS, [key(1)], 2)
    c.state.maintain(65536)
    assert copies(c, "b") == [(key(1), "a")]  # the COPY to b is in flight
    c.join("d", inventory=blocks([1]))  # two more originals turn up meanwhile
    c.sync("c", 1, blocks([1]))
    r.set_factor(NS, [key(1)], 2)  # looked at again: 3 originals + 1 copy coming
    c.state.maintain(65536)
    assert drops(c) == [] and r.num_drops_deferred >= 1  # not while the COPY is in flight
    # block 2: one above its factor while a write of it lands on c (a WRITING row)
    c.index.add_replica(NS, key(2), holder=c.holder("c"), tier=Tier.DRAM, size_bytes=SIZE,
                        generation=99, state=ReplicaState.WRITING)
    r.set_factor(NS, [key(2)], 1)
    c.state.maintain(65536)
    assert all(k != key(2) for _, k in drops(c))


def test_a_hot_blocks_extra_replica_is_dropped_once_it_cooled() -> None:
    c = Cluster(repair=RepairSettings(hot_reads_per_window=1, hot_window_s=2.0))
    c.join("a", inventory=blocks([1]), dram_used=40 << 20)
    c.join("b")
    r = c.state.repair
    for _ in range(2):
        r.note_lookup("b", NS, [(key(1), "a")])
    c.state.maintain(65536)
    assert copies(c, "b") == [(key(1), "a")]
    report_added(c, "b", [1])
    [cmd] = c.state.commands.pending("b", CommandKind.COPY)
    c.state.commands.ack("b", 1, [cmd.command_id])
    c.state.maintain(65536)
    assert drops(c) == []  # hot: its extra replica stays
    c.clock.advance(3.0)
    for _ in range(2):
        r.note_lookup("b", NS, [(key(1), "a")])  # still hot in a later window: kept
    c.clock.advance(3.0)
    c.members.heartbeat("a", 1)
    c.members.heartbeat("b", 1)
    c.state.maintain(65536)
    assert drops(c) == []
    c.clock.advance(2.5)  # two windows without being hot
    c.members.heartbeat("a", 1)
    c.members.heartbeat("b", 1)
    c.state.maintain(65536)
    assert drops(c) == [("a", key(1))]  # the fuller node gives its replica back


def test_a_replica_being_written_counts_so_no_copy_races_the_puts_own_second_replica() -> None:
    # put(replicas=2) through a: a's original is committed, its second replica is landing on
    # b (a WRITING row). A COPY to c now would make a third original, and the DROP trimming
    # it would take a's, the writer's own (the CI flake of test_e2e_cluster_repair.py).
    c = Cluster()
    c.join("a", inventory=blocks([1]))
    c.join("b")
    c.join("c")
    c.index.add_replica(NS, key(1), holder=c.holder("b"), tier=Tier.DRAM, size_bytes=SIZE,
                        generation=99, state=ReplicaState.WRITING)
    c.state.repair.set_factor(NS, [key(1)], 2)
    c.state.maintain(65536)
    assert copies(c, "b") == [] and copies(c, "c") == []


def test_a_committed_replica_whose_event_is_on_the_way_counts_so_no_copy_makes_a_third() -> None:
    # put(replicas=2) through a, the node writes the second replica (holder_reports): the
    # write commits before b's own ADDED event indexes b's replica (end_put drops the
    # WRITING placeholder). A COPY to c in that window makes a third original once b's event
    # lands, and the DROP trimming it goes to the fullest node: the writer's own (node a
    # without A's blocks in the whole-system test's replicas=2 runs).
    c = Cluster()
    c.join("a", inventory=blocks([1]))
    c.join("b")
    c.join("c")
    out = c.placement.start_replicas(NS, key(1), SIZE, writer_node_id="a", replicas=2)
    [placed] = out.replicas
    assert c.placement.end_put(NS, key(1), out.generation, commit=True) == 0  # event to come
    c.state.maintain(65536)
    assert all(c.state.commands.pending(n) == [] for n in "abc")
    report_added(c, placed.node_id, [1])  # the event lands: two originals, nothing to do
    assert c.placement.reporting_holders(NS, key(1)) == frozenset()
    c.state.maintain(65536)
    assert all(c.state.commands.pending(n) == [] for n in "abc")


def test_a_replica_whose_event_never_comes_is_repaired_after_the_write_lease() -> None:
    c = Cluster()
    c.join("a", inventory=blocks([1]))
    c.join("b")
    c.join("c")
    out = c.placement.start_replicas(NS, key(1), SIZE, writer_node_id="a", replicas=2)
    [placed] = out.replicas
    c.placement.end_put(NS, key(1), out.generation, commit=True)
    c.state.maintain(65536)
    assert all(c.state.commands.pending(n) == [] for n in "abc")  # b's event is due
    waited = 0.0
    while waited <= c.placement.write_lease_s:  # the nodes stay alive meanwhile
        c.clock.advance(LEASE_S / 2)
        waited += LEASE_S / 2
        for n in "abc":
            c.members.heartbeat(n, 1)
    c.state.maintain(65536)  # the write lease passed, b never reported it: a COPY now
    queued = [n for n in "bc" if copies(c, n) == [(key(1), "a")]]
    assert len(queued) == 1, {n: copies(c, n) for n in "bc"}
    assert c.placement.reporting_holders(NS, key(1)) == frozenset()
    assert placed.node_id in "bc"


def test_a_node_leaving_sends_peer_left_to_every_live_node_never_given_up_nor_dropped() -> None:
    c = Cluster()
    c.join("a", inventory=blocks([1]))
    c.join("b", inventory=blocks([1]))
    c.join("c")
    lapse(c, "a", ["b", "c"])
    for n in ("b", "c"):
        [cmd] = c.state.commands.pending(n, CommandKind.PEER_LEFT)
        assert cmd.key == b"a" and cmd.epoch == 1
    q = c.state.commands
    for _ in range(q.max_sends + 2):  # unacked sends: a COPY would be given up by now
        c.clock.advance(q.resend_after_s + 1)
        assert [x.kind for x in q.take("c", 1)] == [CommandKind.PEER_LEFT]
    q.max_pending_per_node = 1
    q.add("c", 1, CommandKind.DROP, NS, key(7))  # over the bound: the DROP goes, not it
    assert [x.kind for x in q.pending("c")] == [CommandKind.PEER_LEFT]
