"""The master's admin views (kvstorectl where / blocks --node / evict): every replica, pages,
bad input, and that they are probes (nothing pinned, renewed or changed)."""

from __future__ import annotations

import pytest
from helpers import key
from master_helpers import NS, Cluster, blocks

from kvstored.errors import InvalidArgument, NotFound
from kvstored.master.admin import list_node_blocks, list_replicas
from kvstored.master.types import BlockRef, ReplicaState
from kvstored.types import Tier


def _where(c: Cluster, keys: list[bytes]) -> list[list[tuple[str, Tier, str, bool]]]:
    return [[(v.node_id, v.tier, v.state.name, v.readable) for v in views]
            for views in list_replicas(c.members, NS, keys)]


def test_every_replica_of_every_block_in_the_callers_order(cluster: Cluster) -> None:
    c = cluster
    c.join("a", inventory=blocks([1, 2, 3]), port=7000)
    c.join("b", inventory=blocks([2, 3], Tier.SSD) + blocks([3]), port=7100)
    order = [key(3), key(9), key(1), key(2)]  # not sorted; key 9 missing cluster-wide
    got = _where(c, order)
    assert got == [
        [("a", Tier.DRAM, "COMMITTED", True), ("b", Tier.DRAM, "COMMITTED", True),
         ("b", Tier.SSD, "COMMITTED", True)],
        [],
        [("a", Tier.DRAM, "COMMITTED", True)],
        [("a", Tier.DRAM, "COMMITTED", True), ("b", Tier.SSD, "COMMITTED", True)],
    ]
    views = list_replicas(c.members, NS, [key(1)])[0]
    assert views[0].grpc_address == "127.0.0.1:7000" and views[0].data_address == "127.0.0.1:7001"
    # the best replica is one of them (the lookup answers only that one)
    assert c.where([3]) == [("a", Tier.DRAM)]
    # another namespace is another block
    assert list_replicas(c.members, b"other", [key(1)]) == [[]]


def test_unreadable_and_writing_replicas_are_shown_as_such(cluster: Cluster) -> None:
    c = cluster
    c.join("a", inventory=blocks([1]), port=7000)
    c.join("b", inventory=blocks([1]), port=7100)
    out = c.placement.start_put(NS, key(5), 4096, writer_node_id="a")
    for _ in range(3):  # b's data plane keeps failing: unhealthy, not readable
        c.members.report_transfer("b", 1, ok=False)
    got = _where(c, [key(1), key(5)])
    assert got[0] == [("a", Tier.DRAM, "COMMITTED", True), ("b", Tier.DRAM, "COMMITTED", False)]
    assert got[1] == [("a", Tier.DRAM, "WRITING", False)]
    assert list_replicas(c.members, NS, [key(5)])[0][0].generation == out.generation


def test_listing_replicas_is_a_probe(cluster: Cluster) -> None:
    c = cluster
    c.join("a", inventory=blocks(range(4)))
    c.placement.start_put(NS, key(50), 4096, writer_node_id="a")
    rec = c.members.node("a")
    assert rec is not None
    beat = rec.last_heartbeat_s
    replicas = c.index.num_replicas
    c.clock.advance(6.0)
    for _ in range(5):
        list_replicas(c.members, NS, [key(i) for i in (*range(4), 50)])
        list_node_blocks(c.members, "a")
    assert rec.last_heartbeat_s == beat  # no lease renewed
    assert c.index.num_replicas == replicas
    c.clock.advance(25.0)  # past the 30 s write lease: the probes did not renew it either
    assert c.placement.reclaim_expired_writes() == 1
    c.clock.advance(10.0)  # and the node's 10 s lease lapses as if nobody had asked
    assert list_replicas(c.members, NS, [key(0)]) == [[]]


def test_node_blocks_come_in_pages_in_key_order_with_details(cluster: Cluster) -> None:
    c = cluster
    inv = blocks(range(25), size=1000) + blocks(range(5), Tier.SSD, size=2000)
    inv += [BlockRef(b"ns2", key(7), Tier.DRAM, 3000)]
    c.join("a", inventory=inv)
    c.join("b", inventory=blocks(range(100, 103)))
    seen, token, pages = [], b"", 0
    while True:
        page, token, epoch, num = list_node_blocks(c.members, "a", limit=10, page_token=token)
        pages += 1
        seen += page
        assert epoch == 1 and num == 31
        if not token:
            break
    assert pages == 4 and len(seen) == 31
    rows = [(e.namespace_id, e.key, int(e.tier)) for e in seen]
    assert rows == sorted(rows) and len(set(rows)) == 31  # ordered, nothing twice
    first = next(e for e in seen if e.key == key(3) and e.tier is Tier.SSD)
    assert first.size_bytes == 2000 and first.state is ReplicaState.COMMITTED
    only, token, _, _ = list_node_blocks(c.members, "a", namespace_id=b"ns2")
    assert [(e.key, e.size_bytes) for e in only] == [(key(7), 3000)] and token == b""
    # entries removed between pages never shift the rest
    _, token, _, _ = list_node_blocks(c.members, "a", namespace_id=NS, limit=10)
    c.index.remove_replica(NS, key(2), holder=c.holder("a"), tier=Tier.DRAM)
    rest, _, _, _ = list_node_blocks(c.members, "a", namespace_id=NS, limit=100,
                                     page_token=token)
    assert len(rest) == 30 - 10


def test_node_blocks_bad_input_names_what_was_wrong(cluster: Cluster) -> None:
    c = cluster
    c.join("a", inventory=blocks(range(3)))
    with pytest.raises(NotFound, match=r"no live node 'zz'.*live nodes: a"):
        list_node_blocks(c.members, "zz")
    with pytest.raises(InvalidArgument, match=r"limit must be in 1\.\.10000, got 10001"):
        list_node_blocks(c.members, "a", limit=10001)
    with pytest.raises(InvalidArgument, match="page_token"):
        list_node_blocks(c.members, "a", page_token=b"\x07garbage")
    assert len(list_node_blocks(c.members, "a", limit=0)[0]) == 3  # 0 = the default page
