"""Pool LRU's input on the master, over real gRPC (a MasterDaemon on a FakeClock): a node's
Heartbeat carries the age of its coldest original (``coldest_age_ms``); ListNodes shows it
as ``coldest_age_s``, aged by the time since that heartbeat; 0 when the node said none."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from master_helpers import spec

from kvstored.clock import FakeClock
from kvstored.config import MasterConfig
from kvstored.master.daemon import MasterDaemon
from kvstored.transport.master_rpc import MasterClient
from kvstored.v1 import master_pb2 as pb
from kvstored.v1 import master_pb2_grpc as pb_grpc


def test_listnodes_shows_each_nodes_coldest_age_aged_since_its_heartbeat(tmp_path: Path) -> None:
    clock = FakeClock()
    daemon = MasterDaemon(MasterConfig(listen=["127.0.0.1:0"], data_dir=tmp_path,
                                       node_lease_s=60.0), clock=clock)

    async def main() -> None:
        await daemon.start()
        try:
            assert daemon.state is not None
            m = daemon.state.membership
            for n, port in (("a", 7000), ("b", 7100)):
                m.register(spec(n, port=port))
                m.sync_inventory(n, 1, sync_id=1, blocks=[], last_chunk=True)
            addr = daemon.grpc_addresses[0]

            def calls() -> None:
                with grpc.insecure_channel(addr) as ch:
                    stub = pb_grpc.MasterServiceStub(ch)
                    stub.Heartbeat(pb.HeartbeatRequest(node_id="a", epoch=1,
                                                       coldest_age_ms=5000), timeout=10)
                    stub.Heartbeat(pb.HeartbeatRequest(node_id="b", epoch=1), timeout=10)
                clock.advance(2.0)
                with MasterClient(addr, timeout_s=10) as c:
                    ages = {n["node_id"]: n["coldest_age_s"] for n in c.list_nodes()["nodes"]}
                assert ages["a"] == pytest.approx(7.0) and ages["b"] == 0.0
                with grpc.insecure_channel(addr) as ch:  # a newer heartbeat replaces it
                    pb_grpc.MasterServiceStub(ch).Heartbeat(
                        pb.HeartbeatRequest(node_id="a", epoch=1, coldest_age_ms=250), timeout=10)
                with MasterClient(addr, timeout_s=10) as c:
                    ages = {n["node_id"]: n["coldest_age_s"] for n in c.list_nodes()["nodes"]}
                assert ages["a"] == pytest.approx(0.25)

            await asyncio.to_thread(calls)
        finally:
            await daemon.stop()

    asyncio.run(main())
