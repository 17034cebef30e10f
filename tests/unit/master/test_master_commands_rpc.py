"""The command queue and the repair admin RPCs over real gRPC (a MasterDaemon on a
FakeClock): SetReplication -> a COPY on the target's Heartbeat answer (the source named
with its data address, size and generation), sent again until acked, gone once acked;
DrainNode marks the node draining in ListNodes; bad input names what was wrong."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from helpers import key
from master_helpers import NS, blocks, spec

from kvstored.client.master_admin import MasterAdminClient
from kvstored.clock import FakeClock
from kvstored.config import MasterConfig
from kvstored.errors import InvalidArgument, NotFound
from kvstored.master.daemon import MasterDaemon
from kvstored.v1 import master_pb2 as pb
from kvstored.v1 import master_pb2_grpc as pb_grpc


def test_copy_commands_ride_on_heartbeats_until_acked_and_drain_is_listed(tmp_path: Path) -> None:
    clock = FakeClock()
    daemon = MasterDaemon(MasterConfig(listen=["127.0.0.1:0"], data_dir=tmp_path,
                                       node_lease_s=5.0), clock=clock)

    async def main() -> None:
        await daemon.start()
        try:
            assert daemon.state is not None
            m = daemon.state.membership
            m.register(spec("a", port=7000))
            m.sync_inventory("a", 1, sync_id=1, blocks=blocks([1]), last_chunk=True)
            m.register(spec("b", port=7100))
            m.sync_inventory("b", 1, sync_id=1, blocks=[], last_chunk=True)
            addr = daemon.grpc_addresses[0]
            gen = m.index.replicas(NS, key(1))[0].generation

            def calls() -> None:
                with MasterAdminClient(addr, timeout_s=10) as c:
                    with pytest.raises(InvalidArgument, match="replicas must be 1..8, got 0"):
                        c.set_replication(NS, [key(1)], 0)
                    assert c.set_replication(NS, [key(1)], 2) == 1
                    with pytest.raises(NotFound, match="'zz' is not registered"):
                        c.drain_node("zz")
                with grpc.insecure_channel(addr) as ch:
                    stub = pb_grpc.MasterServiceStub(ch)
                    hb = pb.HeartbeatRequest(node_id="b", epoch=1)
                    [cmd] = stub.Heartbeat(hb, timeout=10).commands
                    assert (cmd.kind, cmd.target_epoch, cmd.namespace_id, cmd.key) == (
                        pb.NODE_COMMAND_KIND_COPY, 1, NS, key(1))
                    assert (cmd.source_node_id, cmd.source_epoch, cmd.source_data_address,
                            cmd.size_bytes, cmd.generation) == ("a", 1, "127.0.0.1:7001",
                                                                4096, gen)
                    assert list(stub.Heartbeat(hb, timeout=10).commands) == []  # sent
                    clock.advance(5.0)  # one node lease: not acked, sent again
                    m.heartbeat("a", 1)
                    again = stub.Heartbeat(hb, timeout=10).commands
                    assert [c.command_id for c in again] == [cmd.command_id]
                    acked = pb.HeartbeatRequest(node_id="b", epoch=1,
                                                acked_command_ids=[cmd.command_id])
                    assert list(stub.Heartbeat(acked, timeout=10).commands) == []
                    assert daemon.state is not None
                    assert daemon.state.commands.num_pending() == 0
                with MasterAdminClient(addr, timeout_s=10) as c:
                    p = c.drain_node("a")
                    assert (p["num_blocks"], p["num_blocks_to_move"], p["leave_sent"]) == (
                        1, 1, False)  # b's copy is acked, not yet reported: a stays
                    listed = {n["node_id"]: n["draining"] for n in c.list_nodes()["nodes"]}
                    assert listed == {"a": True, "b": False}

            await asyncio.to_thread(calls)
        finally:
            await daemon.stop()

    asyncio.run(main())


def test_wait_commands_is_answered_when_a_copy_is_queued_and_carries_acks(tmp_path: Path) -> None:
    clock = FakeClock()
    daemon = MasterDaemon(MasterConfig(listen=["127.0.0.1:0"], data_dir=tmp_path,
                                       node_lease_s=5.0), clock=clock)

    async def main() -> None:
        await daemon.start()
        try:
            assert daemon.state is not None
            m, q = daemon.state.membership, daemon.state.commands
            m.register(spec("a", port=7000))
            m.sync_inventory("a", 1, sync_id=1, blocks=blocks([1]), last_chunk=True)
            m.register(spec("b", port=7100))
            m.sync_inventory("b", 1, sync_id=1, blocks=[], last_chunk=True)
            ch = grpc.aio.insecure_channel(daemon.grpc_addresses[0])
            stub = pb_grpc.MasterServiceStub(ch)
            poll = asyncio.ensure_future(stub.WaitCommands(
                pb.WaitCommandsRequest(node_id="b", epoch=1, wait_ms=60_000), timeout=30))
            while not q.is_waited("b"):  # the call is held at the master
                await asyncio.sleep(0.001)
            daemon.state.repair.set_factor(NS, [key(1)], 2)
            daemon.state.repair.tick()
            # answered now: without the wake it would come back empty after MAX_WAIT_S
            [cmd] = (await poll).commands
            assert (cmd.kind, cmd.key, cmd.source_node_id) == (pb.NODE_COMMAND_KIND_COPY,
                                                               key(1), "a")
            assert q.num_pending("b") == 1
            done = await stub.WaitCommands(pb.WaitCommandsRequest(
                node_id="b", epoch=1, acked_command_ids=[cmd.command_id], wait_ms=0),
                timeout=30)
            assert list(done.commands) == [] and q.num_pending("b") == 0  # the ack landed
            await ch.close()
        finally:
            await daemon.stop()

    asyncio.run(main())


def test_a_node_link_takes_a_copy_through_the_poll_and_runs_a_round_once_it_is_applied(
    tmp_path: Path,
) -> None:
    """Heartbeats every 20 minutes here: the COPY can only come through WaitCommands, and
    the round after it (events, acks) only because the replicator woke the link."""
    from kvstored.config import ClusterConfig
    from kvstored.node.cluster import MasterLink
    from kvstored.node.remote import FetchResult
    from kvstored.node.replicate import Replicator
    from kvstored.tiers.tiered import TieredStore

    daemon = MasterDaemon(MasterConfig(listen=["127.0.0.1:0"], data_dir=tmp_path / "m",
                                       node_lease_s=3600.0))
    asked: list[bytes] = []

    def copy_from(items: object, ns: bytes) -> FetchResult:
        got = list(items)  # type: ignore[call-overload]
        asked.extend(k for k, _ in got)
        return FetchResult(num_found=len(got), num_fetched=len(got))

    async def main() -> None:
        await daemon.start()
        store = TieredStore(dram_size_bytes=1 << 20, arena_dir=None, node_id="b",
                            ssd_dir=tmp_path / "ssd", ssd_size_bytes=8 << 20)
        link = MasterLink(ClusterConfig(master_address=daemon.grpc_addresses[0],
                                        heartbeat_interval_s=1200.0),
                          node_id="b", epoch=5, grpc_address="127.0.0.1:9000",
                          data_address="127.0.0.1:9001", store=store, load=lambda: 0.0)
        rep = Replicator(epoch=5, copy_from=copy_from, keep_copies=lambda b: 0,
                         remove=lambda k, ns: [False] * len(k), leave=lambda: None,
                         on_applied=link.wake)
        await rep.start()
        link.replicator = rep
        try:
            assert daemon.state is not None
            m, q = daemon.state.membership, daemon.state.commands
            m.register(spec("a", port=7000))
            m.sync_inventory("a", 1, sync_id=1, blocks=blocks([1]), last_chunk=True)
            await link.start()
            async with asyncio.timeout(30):  # hang guards, not timings
                while not (link.synced and q.is_waited("b")):  # first round done, poll held
                    await asyncio.sleep(0.005)
            rounds = link.num_rounds
            daemon.state.repair.set_factor(NS, [key(1)], 2)
            daemon.state.repair.tick()
            async with asyncio.timeout(30):
                while not asked:
                    await asyncio.sleep(0.005)
                while link.num_rounds == rounds:  # woken: no heartbeat was due for 20 min
                    await asyncio.sleep(0.005)
                while q.num_pending("b"):  # the ack reached the master
                    await asyncio.sleep(0.005)
            assert asked == [key(1)] and link.num_polls >= 1
        finally:
            await link.stop()
            await rep.stop()
            await daemon.stop()

    asyncio.run(main())
