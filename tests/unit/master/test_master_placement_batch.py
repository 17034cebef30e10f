"""PutStartBatch / PutEndBatch: each item is exactly one PutStart / PutEnd (one rule per
test: per-item outcomes in order, a generation per item, earlier items counting against
later ones, a stale end refused alone, the item limit), then the same over gRPC."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from helpers import key
from master_helpers import NS, Cluster, MiB

from kvstored.client.master import MasterClient
from kvstored.clock import FakeClock
from kvstored.config import MasterConfig
from kvstored.errors import InvalidArgument, NoCapacity, NotFound, ReplicaNotReady
from kvstored.master.daemon import MasterDaemon
from kvstored.master.placement import MAX_BATCH_ITEMS
from kvstored.master.types import BlockRef, PutStartOutcome, TierUsage
from kvstored.types import Tier

SPILL = dict(writer_node_id="a", exclude_writer=True, max_used_fraction=0.9, holder_reports=True)


def _cluster(b_dram_mib: int = 100) -> Cluster:
    """a (the writer), b (empty, ``b_dram_mib`` of DRAM, no SSD), c (holds key 7)."""
    c = Cluster()
    c.join("a")
    c.join("b")
    c.join("c", inventory=[BlockRef(NS, key(7), Tier.DRAM, MiB)])
    c.clock.advance(0.001)
    c.members.heartbeat("b", 1, tiers=(TierUsage(Tier.DRAM, b_dram_mib * MiB, 0),
                                       TierUsage(Tier.SSD, 0, 0)))
    c.members.heartbeat("c", 1, tiers=(TierUsage(Tier.DRAM, MiB, MiB),
                                       TierUsage(Tier.SSD, MiB, MiB)))  # c: full
    return c


def test_each_item_gets_its_own_outcome_in_order_and_a_failure_never_stops_the_others() -> None:
    c = _cluster()
    items = [(NS, key(1), MiB), (NS, key(7), MiB), (NS, key(2), 200 * MiB), (NS, b"", MiB),
             (NS, key(3), MiB)]
    out = c.placement.start_put_batch(items, **SPILL)
    assert isinstance(out[0], PutStartOutcome) and not out[0].exists
    assert [r.node_id for r in out[0].replicas] == ["b"]
    assert isinstance(out[1], PutStartOutcome) and out[1].exists  # c holds it: drop, not move
    assert isinstance(out[2], NoCapacity)  # 200 MiB fits nowhere below 90 %
    assert isinstance(out[3], InvalidArgument) and "key must not be empty" in str(out[3])
    assert isinstance(out[4], PutStartOutcome) and not out[4].exists  # placed after errors
    assert c.placement.num_open_writes == 2


def test_each_placed_item_is_its_own_write_with_its_own_generation() -> None:
    c = _cluster()
    out = c.placement.start_put_batch([(NS, key(i), MiB) for i in (1, 2, 3)] + [(NS, key(1), MiB)],
                                      **SPILL)
    gens = [o.generation for o in out[:3]]  # type: ignore[union-attr]
    assert gens == sorted(set(gens)) and len(set(gens)) == 3  # fresh and increasing
    assert isinstance(out[3], ReplicaNotReady)  # the same key again: its write is open
    assert [r.generation for r in c.index.replicas(NS, key(2))] == [gens[1]]
    ended = c.placement.end_put_batch([(NS, key(i), g, False) for i, g in zip((1, 2, 3), gens, strict=True)])
    assert ended == [1, 1, 1] and c.placement.num_open_writes == 0


def test_items_placed_earlier_in_a_batch_count_against_the_later_ones() -> None:
    c = _cluster(b_dram_mib=10)  # room below 90 %: 9 MiB
    out = c.placement.start_put_batch([(NS, key(i), MiB) for i in range(10, 20)], **SPILL)
    assert all(isinstance(o, PutStartOutcome) for o in out[:9])
    assert isinstance(out[9], NoCapacity)  # the 9 placed before it filled b


def test_a_stale_end_in_a_batch_is_refused_alone_and_never_ends_the_newer_write() -> None:
    c = Cluster(write_lease_s=5.0)
    c.join("a")
    c.join("b")
    c.members.heartbeat("b", 1, tiers=(TierUsage(Tier.DRAM, 100 * MiB, 0),
                                       TierUsage(Tier.SSD, 0, 0)))
    old = c.placement.start_put_batch([(NS, key(1), MiB)], **SPILL)[0]
    c.clock.advance(6.0)  # key 1's write lease lapses
    for n in ("a", "b"):
        c.members.heartbeat(n, 1)
    new1, new2 = c.placement.start_put_batch([(NS, key(1), MiB), (NS, key(2), MiB)], **SPILL)
    assert isinstance(old, PutStartOutcome) and isinstance(new1, PutStartOutcome)
    assert isinstance(new2, PutStartOutcome) and new1.generation > old.generation
    ended = c.placement.end_put_batch([(NS, key(1), old.generation, True),
                                       (NS, key(2), new2.generation, True),
                                       (NS, key(3), 12345, False)])
    assert isinstance(ended[0], NotFound) and "late commit is refused" in str(ended[0])
    assert ended[1] == 0  # holder-reported: closed, its event still on the way
    assert isinstance(ended[2], NotFound)  # never opened
    assert c.placement.num_open_writes == 1  # key 1's newer write is still open
    assert [r.generation for r in c.index.replicas(NS, key(1))] == [new1.generation]


def test_a_batch_over_the_item_limit_is_refused_whole_and_opens_nothing() -> None:
    c = _cluster()
    too_many = [(NS, key(i), 1) for i in range(MAX_BATCH_ITEMS + 1)]
    limit = f"{MAX_BATCH_ITEMS + 1} items .* limit is {MAX_BATCH_ITEMS}"
    with pytest.raises(InvalidArgument, match=limit):
        c.placement.start_put_batch(too_many, **SPILL)
    with pytest.raises(InvalidArgument, match="limit is"):
        c.placement.end_put_batch([(NS, key(i), 1, False) for i in range(MAX_BATCH_ITEMS + 1)])
    assert c.placement.num_open_writes == 0


def test_the_batched_rpcs_over_the_wire_answer_like_the_single_calls(tmp_path: Path) -> None:
    clock = FakeClock()
    cfg = MasterConfig(listen=["127.0.0.1:0"], data_dir=tmp_path, node_lease_s=5.0,
                       write_lease_s=2.0)
    daemon = MasterDaemon(cfg, clock=clock)

    async def main() -> None:
        await daemon.start()
        try:
            assert daemon.state is not None
            m = daemon.state.membership
            from master_helpers import spec
            m.register(spec("a", port=7000))
            m.sync_inventory("a", 1, sync_id=1, blocks=[], last_chunk=True)
            m.register(spec("b", port=7100, dram_cap=10 * MiB, ssd_cap=0))
            m.sync_inventory("b", 1, sync_id=1, blocks=[BlockRef(NS, key(7), Tier.DRAM, MiB)],
                             last_chunk=True)

            def calls() -> None:
                with MasterClient(daemon.grpc_addresses[0], timeout_s=10) as mc:
                    out = mc.put_start_batch(
                        [(NS, key(1), MiB), (NS, key(7), MiB), (NS, key(2), 50 * MiB),
                         (NS, key(1), MiB)], writer_node_id="a", exclude_writer=True,
                        max_used_fraction=0.9, holder_reports=True)
                    placed = out[0]
                    assert isinstance(placed, tuple) and placed[0] is False
                    assert [(r.node_id, r.data_address, r.generation) for r in placed[2]] == [
                        ("b", "127.0.0.1:7101", placed[1])]
                    assert out[1] == (True, 0, [])  # b holds key 7
                    assert isinstance(out[2], NoCapacity) and "no registered" in str(out[2])
                    assert isinstance(out[3], ReplicaNotReady)
                    ended = mc.put_end_batch([(NS, key(1), placed[1] + 1, True),
                                              (NS, key(1), placed[1], True)])
                    assert isinstance(ended[0], NotFound) and ended[1] == 0
                    with pytest.raises(InvalidArgument, match="limit is"):
                        mc.put_end_batch([(NS, key(1), 1, False)] * (MAX_BATCH_ITEMS + 1))

            await asyncio.to_thread(calls)
            assert daemon.state is not None and daemon.state.placement.num_open_writes == 0
        finally:
            await daemon.stop()

    asyncio.run(main())


def test_a_master_without_the_batched_rpcs_is_asked_one_item_at_a_time() -> None:
    import grpc

    from kvstored.master.service import MasterServicer, add_master_service
    from kvstored.v1 import master_pb2_grpc as pb_grpc

    class OldMaster(MasterServicer):  # as a master before PutStartBatch: UNIMPLEMENTED
        PutStartBatch = pb_grpc.MasterServiceServicer.PutStartBatch
        PutEndBatch = pb_grpc.MasterServiceServicer.PutEndBatch

    c = _cluster()

    async def main() -> None:
        server = grpc.aio.server()
        add_master_service(server, OldMaster(c.state))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            def calls() -> None:
                with MasterClient(f"127.0.0.1:{port}", timeout_s=10) as mc:
                    out = mc.put_start_batch([(NS, key(1), MiB), (NS, key(7), MiB), (NS, b"", 1)],
                                             **SPILL)
                    assert isinstance(out[0], tuple) and not out[0][0] and out[1][0] is True
                    assert isinstance(out[2], InvalidArgument)
                    gen = out[0][1]
                    ended = mc.put_end_batch([(NS, key(1), gen + 1, True), (NS, key(1), gen, True)])
                    assert isinstance(ended[0], NotFound) and ended[1] == 0

            await asyncio.to_thread(calls)
        finally:
            await server.stop(None)

    asyncio.run(main())
    assert c.placement.num_open_writes == 0


def test_ends_carried_on_a_start_batch_apply_first_each_one_put_end(tmp_path: Path) -> None:
    cfg = MasterConfig(listen=["127.0.0.1:0"], data_dir=tmp_path, node_lease_s=5.0,
                       write_lease_s=2.0)
    daemon = MasterDaemon(cfg, clock=FakeClock())

    async def main() -> None:
        await daemon.start()
        try:
            assert daemon.state is not None
            m = daemon.state.membership
            from master_helpers import spec
            m.register(spec("a", port=7000))
            m.sync_inventory("a", 1, sync_id=1, blocks=[], last_chunk=True)
            m.register(spec("b", port=7100, dram_cap=10 * MiB, ssd_cap=0))  # room: 9 MiB
            m.sync_inventory("b", 1, sync_id=1, blocks=[], last_chunk=True)

            def calls() -> None:
                with MasterClient(daemon.grpc_addresses[0], timeout_s=10) as mc:
                    opened = mc.put_start_batch([(NS, key(i), MiB) for i in range(9)], **SPILL)
                    gens = [o[1] for o in opened]  # type: ignore[index]
                    ends = [(NS, key(i), g, False) for i, g in enumerate(gens)]
                    ends.append((NS, key(0), gens[0], False))  # the same end again: stale
                    ended, started = mc.put_end_and_start_batch(ends, [(NS, key(30), MiB)],
                                                                **SPILL)
                    assert ended[:9] == [1] * 9  # each abort dropped its placeholder
                    assert isinstance(ended[9], NotFound)
                    assert isinstance(started[0], tuple)  # fits: the aborts released b first
                    assert [r.node_id for r in started[0][2]] == ["b"]
                    assert mc.put_end_batch([(NS, key(30), started[0][1], False)]) == [1]

            await asyncio.to_thread(calls)
            assert daemon.state is not None and daemon.state.placement.num_open_writes == 0
        finally:
            await daemon.stop()

    asyncio.run(main())
