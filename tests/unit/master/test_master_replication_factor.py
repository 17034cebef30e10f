"""The master records each block's wanted replication factor (issue 17 section 2).

- The index keeps one small column per block (``factor``, u1: replicas stay 34 B); it only
  rises while the block is indexed and is forgotten with the block's last row.
- PutStart / PutStartBatch items carry it (``replicas``); inventories and ADDED events carry
  it (``BlockRef.replicas``), so a new master learns it from the nodes.
- ListReplicas answers it per block (``kvstorectl where``).
"""

from __future__ import annotations

import grpc
import pytest
from helpers import key
from master_helpers import NS, Cluster

from kvstored.errors import InvalidArgument
from kvstored.master.columns import ROW_FIELDS, IndexColumns
from kvstored.master.index import BlockIndex
from kvstored.master.service import MasterServicer
from kvstored.master.types import MAX_REPLICAS, BlockEvent, BlockRef, EventKind
from kvstored.types import Tier
from kvstored.v1 import master_pb2 as pb


def _ref(i: int, replicas: int = 0, *, tier: Tier = Tier.DRAM) -> BlockRef:
    return BlockRef(NS, key(i), tier, 4096, (1 << 40) + i, False, replicas)


def test_index_factor_defaults_to_one_only_rises_and_leaves_with_the_block() -> None:
    idx = BlockIndex(16)
    h = idx.add_holder()
    assert idx.replication_factor(NS, key(1)) == 0  # not indexed
    assert not idx.record_replication_factor(NS, key(1), 3)  # nothing to record it on
    idx.add_replica(NS, key(1), holder=h, tier=Tier.DRAM, size_bytes=1, generation=5)
    assert idx.replication_factor(NS, key(1)) == 1
    assert idx.record_replication_factor(NS, key(1), 3)
    assert idx.record_replication_factor(NS, key(1), 2)  # never lowers
    assert idx.replication_factor(NS, key(1)) == 3
    idx.add_replica(NS, key(1), holder=h, tier=Tier.SSD, size_bytes=1, generation=6, factor=4)
    assert idx.replication_factor(NS, key(1)) == 4
    assert idx.remove_replica(NS, key(1), holder=h, tier=Tier.DRAM)
    assert idx.replication_factor(NS, key(1)) == 4  # one row left
    assert idx.remove_replica(NS, key(1), holder=h, tier=Tier.SSD)
    assert idx.replication_factor(NS, key(1)) == 0
    # the freed slot is reused by the next block: it starts at the default again
    idx.add_replica(NS, key(2), holder=h, tier=Tier.DRAM, size_bytes=1, generation=7)
    assert idx.replication_factor(NS, key(2)) == 1
    with pytest.raises(InvalidArgument, match=r"replication factor must be in 0\.\.8.*got 9"):
        idx.record_replication_factor(NS, key(2), MAX_REPLICAS + 1)
    # bulk (inventory): per key, duplicates take the highest
    n = idx.add_replicas_bulk(NS, [key(3), key(4), key(3)], holder=h, tiers=[1, 1, 2],
                              sizes=[1, 1, 1], generation=9, factors=[2, 0, 3])
    assert n == 3
    assert list(idx.replication_factors(NS, [key(3), key(4), key(9)])) == [3, 1, 0]
    with pytest.raises(InvalidArgument, match="factors must have one entry per key"):
        idx.add_replicas_bulk(NS, [key(5)], holder=h, tiers=[1], sizes=[1], generation=9,
                              factors=[1, 2])
    with pytest.raises(InvalidArgument, match=r"every replication factor .* got 12"):
        idx.add_replicas_bulk(NS, [key(5)], holder=h, tiers=[1], sizes=[1], generation=9,
                              factors=[12])


def test_factor_column_costs_one_byte_per_block_and_nothing_per_replica() -> None:
    cols = IndexColumns(1024)
    assert sum(getattr(cols, n).itemsize for n, _ in ROW_FIELDS) == 34
    assert cols.factor.itemsize == 1 and len(cols.factor) == len(cols.head)


def test_put_start_records_the_factor_also_when_the_block_exists() -> None:
    c = Cluster()
    c.join("a")
    out = c.placement.start_put(NS, key(1), 4096, writer_node_id="a", replicas=3)
    assert c.index.replication_factor(NS, key(1)) == 3  # on the WRITING placeholder
    c.placement.end_put(NS, key(1), out.generation, commit=True)
    assert c.index.replication_factor(NS, key(1)) == 3
    c.join("b", inventory=[_ref(2)])
    assert c.placement.start_put(NS, key(2), 4096, writer_node_id="a", replicas=2).exists
    assert c.index.replication_factor(NS, key(2)) == 2
    with pytest.raises(InvalidArgument, match=r"replicas \(the wanted replication factor\)"
                                              r" must be in 0\.\.8 .*got 9"):
        c.placement.start_put(NS, key(3), 4096, writer_node_id="a", replicas=9)
    outs = c.placement.start_put_batch([(NS, key(4), 1), (NS, key(5), 1)], factors=[2, 0],
                                       writer_node_id="a")
    assert all(not isinstance(o, Exception) for o in outs)
    assert list(c.index.replication_factors(NS, [key(4), key(5)])) == [2, 1]
    with pytest.raises(InvalidArgument, match="factors must have one entry per item"):
        c.placement.start_put_batch([(NS, key(6), 1)], factors=[1, 2], writer_node_id="a")


def test_a_new_master_learns_factors_from_inventories_and_events() -> None:
    c = Cluster()  # a fresh master: nothing but what the nodes report
    c.join("a", inventory=[_ref(1, 2), _ref(2), _ref(3, 3)])
    c.join("b", inventory=[_ref(1, 0), _ref(3, 1)])  # b does not know 1's: kept at 2
    assert list(c.index.replication_factors(NS, [key(1), key(2), key(3)])) == [2, 1, 3]
    c.members.report_events("b", 1, [BlockEvent(1, EventKind.ADDED, _ref(2, 2))])
    assert c.index.replication_factor(NS, key(2)) == 2


def test_list_replicas_rpc_answers_the_factor_and_refuses_a_bad_one() -> None:
    import asyncio

    c = Cluster()
    c.join("a", inventory=[_ref(1, 2), _ref(2)])
    svc = MasterServicer(c.state)

    class Ctx:
        async def abort(self, code: grpc.StatusCode, details: str) -> None:
            raise RuntimeError(f"{code}: {details}")

        def peer(self) -> str:  # named on the call's log lines (kvstored/log.py)
            return "ipv4:127.0.0.1:1"

        def set_trailing_metadata(self, md: object) -> None:
            pass

        def set_code(self, code: object) -> None:
            pass

        def set_details(self, details: object) -> None:
            pass

    resp = asyncio.run(svc.ListReplicas(
        pb.ListReplicasRequest(namespace_id=NS, keys=[key(1), key(2), key(3)]),
        Ctx()))  # type: ignore[arg-type]  # a stand-in context: only abort/metadata are used
    assert [b.replication_factor for b in resp.blocks] == [2, 1, 0]
    from kvstored.master.service import _block

    with pytest.raises(InvalidArgument, match=r"replicas \(the block's replication factor\)"
                                              r" must be in 0\.\.8, got 9"):
        _block(pb.BlockRef(namespace_id=NS, key=key(1), tier=1, replicas=9), "event 1")


def test_a_top_up_whose_placeholders_go_before_the_holders_events_keeps_its_factor() -> None:
    # race: PutEnd of a holder_reports top-up drops its WRITING placeholders; if neither the
    # writer's nor the peer's ADDED event has arrived yet (they come a heartbeat later, and
    # the writer's may carry no factor), the block has no row for a moment
    c = Cluster()
    c.join("w")
    c.join("a")
    out = c.placement.start_replicas(NS, key(1), 4096, writer_node_id="w", replicas=3)
    c.placement.end_put(NS, key(1), out.generation, commit=True)
    assert c.index.replication_factor(NS, key(1)) == 0  # no row: not indexed
    c.members.report_events("w", 1, [BlockEvent(1, EventKind.ADDED, _ref(1, 0))])
    assert c.index.replication_factor(NS, key(1)) == 3  # given back, not the default
    # the same through an inventory (bulk path)
    out = c.placement.start_replicas(NS, key(2), 4096, writer_node_id="w", replicas=2)
    c.placement.end_put(NS, key(2), out.generation, commit=False)
    c.sync("a", 1, [_ref(2, 0)])
    assert c.index.replication_factor(NS, key(2)) == 2
