"""Placement policies (exact orders) and generations of the two-phase put."""

from __future__ import annotations

import random

import pytest
from helpers import key
from master_helpers import LEASE_S, NS, Cluster, MiB, blocks

from kvstored.errors import InvalidArgument, NoCapacity, NotFound, ReplicaNotReady
from kvstored.master.types import PlacementPolicy, ReplicaState
from kvstored.types import Tier


def _three(c: Cluster) -> None:
    # free DRAM: a 10 MiB, b 30 MiB, c 20 MiB
    c.join("a", dram_cap=40 * MiB, dram_used=30 * MiB)
    c.join("b", dram_cap=40 * MiB, dram_used=10 * MiB)
    c.join("c", dram_cap=40 * MiB, dram_used=20 * MiB)


def _order(c: Cluster, policy: PlacementPolicy, writer: str = "", size: int = MiB) -> list[str]:
    return [r.spec.node_id for r in c.placement.order_candidates(size, writer, policy)]


def test_policy_orders_are_exact(cluster: Cluster) -> None:
    _three(cluster)
    assert _order(cluster, PlacementPolicy.MOST_FREE) == ["b", "c", "a"]
    assert _order(cluster, PlacementPolicy.LOCAL_FIRST, "a") == ["a", "b", "c"]
    assert _order(cluster, PlacementPolicy.LOCAL_FIRST, "zz") == ["b", "c", "a"]
    # the writer's node is skipped when it has no room
    assert _order(cluster, PlacementPolicy.LOCAL_FIRST, "a", 15 * MiB) == ["b", "c"]
    expected = random.Random(7).sample(["a", "b", "c"], 3)
    assert _order(cluster, PlacementPolicy.RANDOM) == expected


def test_start_put_places_writing_replicas_and_counts_their_bytes(cluster: Cluster) -> None:
    _three(cluster)
    p = cluster.placement
    out = p.start_put(NS, key(1), 8 * MiB, writer_node_id="a", num_replicas=2)
    assert [r.node_id for r in out.replicas] == ["a", "b"]
    assert all(r.tier is Tier.DRAM for r in out.replicas)
    assert cluster.where([1]) == []  # WRITING: invisible
    # a's 10 MiB now hold 8 MiB being written: the next 8 MiB block cannot go there
    out2 = p.start_put(NS, key(2), 8 * MiB, writer_node_id="a")
    assert [r.node_id for r in out2.replicas] == ["b"]
    assert p.end_put(NS, key(1), out.generation, commit=True) == 2
    assert cluster.where([1], local="b") == [("b", Tier.DRAM)]
    assert p.start_put(NS, key(1), 8 * MiB).exists  # committed: idempotent no-op
    out3 = p.start_put(NS, key(3), 8 * MiB, writer_node_id="a")  # a's bytes released
    assert [r.node_id for r in out3.replicas] == ["a"]


def test_a_late_commit_of_an_older_generation_is_refused() -> None:
    c = Cluster(write_lease_s=5.0)
    c.join("a")
    p = c.placement
    old = p.start_put(NS, key(1), MiB, writer_node_id="a")
    with pytest.raises(ReplicaNotReady, match="being written"):
        p.start_put(NS, key(1), MiB)
    c.clock.advance(5.001)  # the writer died: its write lease lapses (heartbeats go on)
    c.members.heartbeat("a", 1)
    new = p.start_put(NS, key(1), MiB, writer_node_id="a")
    assert new.generation > old.generation
    with pytest.raises(NotFound, match=f"generation {old.generation}.*late commit is refused"):
        p.end_put(NS, key(1), old.generation, commit=True)
    with pytest.raises(NotFound, match="late abort"):
        p.end_put(NS, key(1), old.generation, commit=False)
    assert c.where([1]) == []  # the stale end finalised nothing
    assert [(r.generation, r.state) for r in c.index.replicas(NS, key(1))] == [
        (new.generation, ReplicaState.WRITING)
    ]
    assert p.end_put(NS, key(1), new.generation, commit=True) == 1
    assert c.where([1]) == [("a", Tier.DRAM)]
    with pytest.raises(NotFound):
        p.end_put(NS, key(1), new.generation, commit=True)  # ended already


def test_abort_releases_everything_and_a_later_put_succeeds(cluster: Cluster) -> None:
    cluster.join("a", dram_cap=2 * MiB)
    p = cluster.placement
    w = p.start_put(NS, key(1), 2 * MiB)
    with pytest.raises(NoCapacity, match="no registered, healthy node has 2097152 bytes"):
        p.start_put(NS, key(2), 2 * MiB)
    assert p.end_put(NS, key(1), w.generation, commit=False) == 1
    assert cluster.index.replicas(NS, key(1)) == []
    assert p.num_open_writes == 0
    assert [r.node_id for r in p.start_put(NS, key(2), 2 * MiB).replicas] == ["a"]


def test_unhealthy_unsynced_and_expired_nodes_are_not_placed_on() -> None:
    c = Cluster(failures=1)
    c.join("a", dram_cap=100 * MiB)
    c.join("b", dram_cap=50 * MiB)
    c.join("c", dram_cap=10 * MiB)
    c.members.report_transfer("a", 1, ok=False)  # unhealthy
    from master_helpers import spec

    c.members.register(spec("d", dram_cap=500 * MiB))  # not synced yet
    assert _order(c, PlacementPolicy.MOST_FREE) == ["b", "c"]
    c.clock.advance(LEASE_S * 0.6)
    c.members.heartbeat("c", 1)
    c.clock.advance(LEASE_S * 0.6)  # b's lease lapsed, c renewed
    assert _order(c, PlacementPolicy.MOST_FREE) == ["c"]


def test_a_commit_after_every_chosen_node_left_stores_nothing(cluster: Cluster) -> None:
    cluster.join("a", inventory=blocks([]))
    w = cluster.placement.start_put(NS, key(1), MiB)
    cluster.members.unregister("a", 1)
    assert cluster.placement.end_put(NS, key(1), w.generation, commit=True) == 0
    assert cluster.where([1]) == []


@pytest.mark.parametrize(
    ("size", "replicas", "k", "match"),
    [(-1, 1, key(1), "size_bytes"), (1, 0, key(1), "num_replicas"), (1, 9, key(1), "num_replicas"),
     (1, 1, b"", "key")],
)
def test_bad_put_starts_name_the_argument(cluster: Cluster, size: int, replicas: int, k: bytes,
                                          match: str) -> None:
    cluster.join("a")
    with pytest.raises(InvalidArgument, match=match):
        cluster.placement.start_put(NS, k, size, num_replicas=replicas)
    assert cluster.placement.num_open_writes == 0


def test_a_commit_after_the_chosen_node_restarted_stores_nothing(cluster: Cluster) -> None:
    from master_helpers import spec

    cluster.join("a", epoch=1)
    w = cluster.placement.start_put(NS, key(1), MiB, writer_node_id="a")
    cluster.members.register(spec("a", epoch=2))  # the bytes went with epoch 1's DRAM
    assert cluster.placement.end_put(NS, key(1), w.generation, commit=True) == 0
    cluster.sync("a", 2, [])
    assert cluster.where([1]) == []
    assert cluster.index.replicas(NS, key(1)) == []
