"""Placement of a put's extra replicas (``Placement.start_replicas``, PutStartBatch top_up).

Exact orders: distinct nodes, never the writer's, new zones first (policy order within),
the writer and every readable original counted as holders, copies not; fewer than the
factor placed when fewer nodes have room (the caller reports it short), NoCapacity when
none has.
"""

from __future__ import annotations

import pytest
from helpers import key
from master_helpers import NS, Cluster, MiB, spec

from kvstored.errors import InvalidArgument, ReplicaNotReady
from kvstored.master.types import BlockEvent, BlockRef, EventKind, NodeSpec, TierUsage
from kvstored.types import Tier


def _join(c: Cluster, node_id: str, zone: str = "", *, free_mib: int = 64,
          inventory: list[BlockRef] | None = None) -> None:
    s = spec(node_id)
    c.members.register(NodeSpec(s.node_id, s.epoch, s.grpc_address, s.data_address,
                                (TierUsage(Tier.DRAM, 64 * MiB, (64 - free_mib) * MiB),),
                                zone=zone))
    c.sync(node_id, 1, inventory or [])


def _top_up(c: Cluster, i: int, factor: int, writer: str = "w", **kw: object):
    return c.placement.start_replicas(NS, key(i), 4096, writer_node_id=writer, replicas=factor,
                                      **kw)  # type: ignore[arg-type]  # test passthrough


def _nodes(out) -> list[str]:  # type: ignore[no-untyped-def]  # a PutStartOutcome
    return [r.node_id for r in out.replicas]


def test_extra_replicas_go_to_distinct_nodes_never_the_writer_most_free_first() -> None:
    c = Cluster()
    _join(c, "w", free_mib=64)  # the writer: most free, but it holds the first replica
    _join(c, "a", free_mib=10)
    _join(c, "b", free_mib=30)
    _join(c, "c", free_mib=20)
    out = _top_up(c, 1, 3)
    assert (out.exists, out.num_held, _nodes(out)) == (False, 1, ["b", "c"])
    assert c.index.replication_factor(NS, key(1)) == 3
    with pytest.raises(ReplicaNotReady):  # one write of a block at a time
        _top_up(c, 1, 3)
    c.placement.end_put(NS, key(1), out.generation, commit=False)


def test_new_zones_first_then_the_same_zone_on_distinct_nodes() -> None:
    c = Cluster()
    _join(c, "w", "z1")
    _join(c, "a", "z1", free_mib=60)  # most free, but the writer's zone
    _join(c, "b", "z2", free_mib=20)
    _join(c, "c", "z2", free_mib=30)
    _join(c, "d", "z3", free_mib=10)
    assert _nodes(_top_up(c, 1, 3)) == ["c", "d"]  # one per new zone, most free within
    assert _nodes(_top_up(c, 2, 5)) == ["c", "d", "a", "b"]  # zones exhausted: distinct nodes
    _join(c, "n", "", free_mib=50)  # declares no zone: after the new zones
    assert _nodes(_top_up(c, 3, 3)) == ["c", "d"]
    assert _nodes(_top_up(c, 4, 4)) == ["c", "d", "a"]


def test_holders_are_counted_copies_are_not_and_a_full_block_exists() -> None:
    c = Cluster()
    _join(c, "w", inventory=[BlockRef(NS, key(1), Tier.DRAM, 4096, 5)])
    _join(c, "a", inventory=[BlockRef(NS, key(1), Tier.DRAM, 4096, 6)], free_mib=60)
    _join(c, "b", inventory=[BlockRef(NS, key(1), Tier.DRAM, 4096, 7, copy=True)],
          free_mib=50)
    _join(c, "c", free_mib=10)
    out = _top_up(c, 1, 3)  # w and a hold originals; b's copy does not count (b may take one)
    assert (out.num_held, _nodes(out)) == (2, ["b"])
    c.placement.end_put(NS, key(1), out.generation, commit=False)
    out = _top_up(c, 1, 2)  # a lower factor never lowers the recorded one (3)
    assert (out.exists, out.num_held, _nodes(out)) == (False, 2, ["b"])
    c.placement.end_put(NS, key(1), out.generation, commit=False)
    c.members.report_events("c", 1, [BlockEvent(1, EventKind.ADDED,
                                                 BlockRef(NS, key(1), Tier.DRAM, 4096, 8))])
    out = _top_up(c, 1, 3)
    assert (out.exists, out.num_held, out.replicas) == (True, 3, ())
    # the writer counts even before its own replica is indexed
    out = _top_up(c, 9, 2, writer="c")
    assert (out.num_held, _nodes(out)) == (1, ["w"])


def test_fewer_nodes_than_asked_places_fewer_and_none_with_room_is_no_capacity() -> None:
    c = Cluster()
    _join(c, "w")
    _join(c, "a", free_mib=30)
    _join(c, "b", free_mib=0)  # no room for 4096 bytes
    out = _top_up(c, 1, 4)
    assert (out.num_held, _nodes(out)) == (1, ["a"])  # 2 of 4: the caller reports it short
    c.placement.end_put(NS, key(1), out.generation, commit=False)
    out = _top_up(c, 2, 2, max_used_fraction=0.1)  # every peer past 10 %: nothing opened
    assert (out.exists, out.generation, out.replicas, out.num_held) == (False, 0, (), 1)
    assert c.placement.num_open_writes == 0
    # nothing placed: the block is not indexed, so no factor is recorded for it
    assert c.index.replication_factor(NS, key(2)) == 0  # not indexed: nothing to record on
    with pytest.raises(InvalidArgument, match=r"replicas \(the wanted replication factor\) must "
                                              r"be in 1\.\.8, got 0"):
        _top_up(c, 3, 0)
    with pytest.raises(InvalidArgument, match="needs the writer's node id"):
        _top_up(c, 3, 2, writer="")


def test_batch_top_up_answers_per_item_with_its_factor() -> None:
    c = Cluster()
    _join(c, "w")
    _join(c, "a", free_mib=30)
    _join(c, "b", free_mib=20)
    outs = c.placement.start_put_batch([(NS, key(1), 4096), (NS, key(2), 4096)], factors=[2, 3],
                                       top_up=True, writer_node_id="w", exclude_writer=True,
                                       holder_reports=True)
    assert [_nodes(o) for o in outs] == [["a"], ["a", "b"]]
    assert list(c.index.replication_factors(NS, [key(1), key(2)])) == [2, 3]
