"""A node that holds originals leaves without REMOVED events (lease lapse, Unregister, a new
epoch, a resync without the block): GC, unlinking its retired rows, queues a promotion for
every block left with copies only, on a FakeClock (master/copies.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
from helpers import key
from master_helpers import LEASE_S, NS, Cluster, spec

from kvstored.clock import FakeClock
from kvstored.config import MasterConfig
from kvstored.master.daemon import MasterDaemon
from kvstored.master.index import BlockIndex
from kvstored.master.types import BlockRef
from kvstored.types import Tier
from kvstored.v1 import master_pb2 as pb
from kvstored.v1 import master_pb2_grpc as pb_grpc

GEN = 1 << 40


def _ref(i: int, *, copy: bool = False, tier: Tier = Tier.DRAM) -> BlockRef:
    return BlockRef(NS, key(i), tier, 4096, GEN + i, copy)


def _gc(c: Cluster) -> int:
    total = 0
    while n := c.members.collect_garbage(max_rows=2):  # small batches: several passes
        total += n
    return total


def _three_nodes() -> Cluster:
    # a: originals of 1-4 (1 on both tiers); b: copies of 1, 2, 4; c: an original of 2
    # and a copy of 4
    c = Cluster()
    c.join("a", inventory=[_ref(1), _ref(1, tier=Tier.SSD), _ref(2), _ref(3), _ref(4)])
    c.join("b", inventory=[_ref(1, copy=True), _ref(2, copy=True), _ref(4, copy=True)])
    c.join("c", inventory=[_ref(2), _ref(4, copy=True)])
    return c


def test_a_lapsed_lease_promotes_the_copies_left_without_an_original() -> None:
    c = _three_nodes()
    c.clock.advance(LEASE_S * 0.9)
    c.members.heartbeat("b", 1)
    c.members.heartbeat("c", 1)
    c.clock.advance(LEASE_S * 0.2)
    assert c.members.expire_lapsed() == ["a"]  # a's rows retired at once, unlinked by GC
    assert c.members.promotions.take("b") == []  # nothing yet: GC has not walked them
    assert _gc(c) == 5
    # 1 and 4: copies only -> the lowest readable copy holder (b) keeps them; 2: c holds an
    # original; 3: no replica left
    assert sorted(c.members.promotions.take("b")) == [(NS, key(1)), (NS, key(4))]
    assert c.members.promotions.take("c") == []
    assert c.members.collect_garbage() == 0 and c.members.promotions.take("b") == []


def test_unregister_and_a_resync_without_the_block_promote_too() -> None:
    c = _three_nodes()
    assert c.members.unregister("a", 1)
    _gc(c)
    assert sorted(c.members.promotions.take("b")) == [(NS, key(1)), (NS, key(4))]
    # c resyncs without its original of 2: b's copy is the last replica
    c.sync("c", 1, [_ref(4, copy=True)])
    _gc(c)
    assert c.members.promotions.take("b") == [(NS, key(2))]


def test_a_new_epoch_promotes_only_what_its_inventory_lacks() -> None:
    c = _three_nodes()
    c.members.register(spec("a", epoch=2))  # restart: epoch 1's holder retired at once
    c.sync("a", 2, [_ref(1, tier=Tier.SSD)])  # its SSD block came back; 4 did not
    _gc(c)
    assert c.members.promotions.take("b") == [(NS, key(4))]


def test_no_promotion_for_a_copy_that_goes_or_an_unreadable_copy_holder() -> None:
    c = Cluster(failures=1)
    c.join("a", inventory=[_ref(1)])
    c.join("b", inventory=[_ref(1, copy=True), _ref(2, copy=True)])
    c.join("d", inventory=[_ref(2, copy=True)])
    assert c.members.unregister("d", 1)  # a copy left: nothing changed for originals
    _gc(c)
    assert c.members.promotions.take("b") == []
    c.members.report_transfer("b", 1, ok=False)  # b unhealthy: its copy is not readable
    assert c.members.unregister("a", 1)
    _gc(c)
    assert c.members.promotions.take("b") == []


def test_the_daemon_gc_tick_asks_the_copy_holder_on_its_heartbeat(tmp_path: Path) -> None:
    clock = FakeClock()
    lease_s = 5.0
    daemon = MasterDaemon(MasterConfig(listen=["127.0.0.1:0"], data_dir=tmp_path,
                                       node_lease_s=lease_s), clock=clock)

    async def main() -> None:
        await daemon.start()
        try:
            assert daemon.state is not None
            m = daemon.state.membership
            m.register(spec("a", port=7000))
            m.sync_inventory("a", 1, sync_id=1, blocks=[_ref(1), _ref(2)], last_chunk=True)
            m.register(spec("b", port=7100))
            m.sync_inventory("b", 1, sync_id=1, blocks=[_ref(1, copy=True)], last_chunk=True)
            clock.advance(lease_s * 0.9)
            m.heartbeat("b", 1)
            clock.advance(lease_s * 0.2)  # a's lease lapses
            gone, _, unlinked = daemon.maintain_once()
            assert (gone, unlinked) == (["a"], 2)

            def heartbeat() -> pb.HeartbeatResponse:
                with grpc.insecure_channel(daemon.grpc_addresses[0]) as ch:
                    return pb_grpc.MasterServiceStub(ch).Heartbeat(
                        pb.HeartbeatRequest(node_id="b", epoch=1), timeout=10)

            got = await asyncio.to_thread(heartbeat)
            # a promotion is a PROMOTE command of the command queue (master/commands.py)
            # (and a's departure, PEER_LEFT, announced to b: kvstored/tiers/redundant.py)
            assert [(c.kind, c.namespace_id, c.key) for c in got.commands
                    if c.kind != pb.NODE_COMMAND_KIND_PEER_LEFT] == [
                (pb.NODE_COMMAND_KIND_PROMOTE, NS, key(1))]
            assert list(got.promote_copies) == []
            again = await asyncio.to_thread(heartbeat)
            assert list(again.commands) == []  # sent once
        finally:
            await daemon.stop()

    asyncio.run(main())


def test_gc_reports_a_block_in_the_pass_that_unlinks_its_last_live_original() -> None:
    # rows of other retired holders still linked in a chain are neither originals nor copies
    ix = BlockIndex(16)
    a, z, b = ix.add_holder(), ix.add_holder(), ix.add_holder()
    for h in (a, z, b):
        ix.set_readable(h, True)
    for h in (a, z):  # k: originals on a and z, a copy on b; j: originals on a and z only
        for k in (key(1), key(2)):
            ix.add_replica(NS, k, holder=h, tier=Tier.DRAM, size_bytes=1, generation=h + 1)
    ix.add_replica(NS, key(1), holder=b, tier=Tier.DRAM, size_bytes=1, generation=9, copy=True)
    ix.retire_holder(a)
    ix.retire_holder(z)  # GC takes z's rows first: a's stay linked meanwhile
    seen: list[bytes] = []
    assert ix.collect_garbage(2, on_only_copies=lambda _ns, k: seen.append(k)) == 2
    assert seen == [key(1)]  # key 2 has no live replica: nothing to promote
    assert ix.collect_garbage(2, on_only_copies=lambda _ns, k: seen.append(k)) == 2
    assert seen == [key(1), key(1)]
