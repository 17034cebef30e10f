"""ListReplicas / ListNodeBlocks over gRPC (MasterAdminClient) and the master's /metrics
scraped over HTTP, moving by exactly what the calls did."""

from __future__ import annotations

import asyncio
import re
import urllib.request
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
from kvstored.types import Tier
from kvstored.v1 import master_pb2 as pb
from kvstored.v1 import master_pb2_grpc as pb_grpc


def scrape(address: str) -> dict[str, float]:
    """``name{labels}`` -> value of every sample on a /metrics page."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][\w:]*(?:\{[^}]*\})?) (\S+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def test_admin_rpcs_and_metrics_over_the_wire(tmp_path: Path) -> None:
    clock = FakeClock()
    cfg = MasterConfig(listen=["127.0.0.1:0"], data_dir=tmp_path, node_lease_s=5.0,
                       write_lease_s=2.0, metrics_listen="127.0.0.1:0")
    daemon = MasterDaemon(cfg, clock=clock)

    async def main() -> None:
        await daemon.start()
        try:
            assert daemon.state is not None
            m, p = daemon.state.membership, daemon.state.placement
            addr = daemon.grpc_addresses[0]
            assert daemon.metrics_address and not daemon.metrics_address.endswith(":0")
            before = await asyncio.to_thread(scrape, daemon.metrics_address)
            assert before["kvstored_master_nodes{state=\"healthy\"}"] == 0
            assert before["kvstored_master_lookups_total"] == 0
            m.register(spec("a", port=7000))
            m.sync_inventory("a", 1, sync_id=1, blocks=blocks(range(6)), last_chunk=True)
            m.register(spec("b", port=7100))
            m.sync_inventory("b", 1, sync_id=1, blocks=blocks([1, 2], Tier.SSD),
                             last_chunk=True)
            m.register(spec("c", port=7200))  # registered, never synced: syncing
            for _ in range(3):
                m.report_transfer("b", 1, ok=False)  # b: unhealthy (one mark)

            def calls() -> None:
                with MasterAdminClient(addr, timeout_s=10) as c:
                    assert c.is_master()
                    per_key, complete = c.list_replicas(NS, [key(2), key(40), key(0)])
                    assert not complete  # c is still syncing
                    assert [[(r["node_id"], r["tier"], r["readable"]) for r in reps]
                            for reps in per_key] == [
                        [("a", "DRAM", True), ("b", "SSD", False)], [], [("a", "DRAM", True)]]
                    assert per_key[0][0]["grpc_address"] == "127.0.0.1:7000"
                    page = c.list_node_blocks("a", limit=4)
                    assert [b["key"] for b in page["blocks"]] == [key(i).hex() for i in range(4)]
                    assert page["num_replicas"] == 6 and page["next_page_token"]
                    rest = list(c.iter_node_blocks("a", page_blocks=4))
                    assert len(rest) == 6
                    with pytest.raises(NotFound, match="'nope'"):
                        c.list_node_blocks("nope")
                    with pytest.raises(InvalidArgument, match="key 1 must have"):
                        c.list_replicas(NS, [key(1), b""])
                    for n in (1, 3, 512):  # 3 lookups of 1 + 3 + 512 blocks
                        c.lookup_prefix(NS, [key(i) for i in range(n)])
                channel = grpc.insecure_channel(addr)
                stub = pb_grpc.MasterServiceStub(channel)
                z = b"z" * 16
                start = stub.PutStart(pb.PutStartRequest(namespace_id=NS, key=z, size_bytes=10,
                                                         writer_node_id="a"), timeout=10)
                assert not start.exists and start.replicas[0].node_id == "a"
                end = pb.PutEndRequest(namespace_id=NS, key=z, generation=start.generation,
                                       commit=True)
                assert stub.PutEnd(end, timeout=10).num_replicas == 1
                with pytest.raises(grpc.RpcError) as stale:  # ended already: refused
                    stub.PutEnd(end, timeout=10)
                assert stale.value.code() == grpc.StatusCode.NOT_FOUND
                again = stub.PutStart(pb.PutStartRequest(namespace_id=NS, key=z, size_bytes=10,
                                                         writer_node_id="b"), timeout=10)
                assert again.exists
                channel.close()

            await asyncio.to_thread(calls)
            p.start_put(NS, b"w" * 16, 100, writer_node_id="a")  # direct: not counted
            clock.advance(3.0)
            m.heartbeat("a", 1)
            m.heartbeat("b", 1)
            m.heartbeat("c", 1)
            daemon.maintain_once()  # the write's 2 s lease lapsed; the sample is taken
            after = await asyncio.to_thread(scrape, daemon.metrics_address)
            assert after["kvstored_master_nodes{state=\"healthy\"}"] == 1
            assert after["kvstored_master_nodes{state=\"unhealthy\"}"] == 1
            assert after["kvstored_master_nodes{state=\"syncing\"}"] == 1
            assert after["kvstored_master_replicas"] == 9  # 6 + 2 + the committed put
            assert after["kvstored_master_put_starts_total{result=\"placed\"}"] == 1
            assert after["kvstored_master_put_starts_total{result=\"exists\"}"] == 1
            assert after["kvstored_master_put_ends_total{outcome=\"commit\",result=\"ok\"}"] == 1
            assert after[
                "kvstored_master_put_ends_total{outcome=\"commit\",result=\"NOT_FOUND\"}"] == 1
            assert after["kvstored_master_lookups_total"] == 3
            assert after["kvstored_master_lookup_blocks_total"] == 1 + 3 + 512
            assert after["kvstored_master_lookup_hit_blocks_total"] == 1 + 3 + 6
            assert after["kvstored_master_lookup_duration_seconds_count"] == 3
            assert after["kvstored_master_unhealthy_marks_total"] == 1
            assert after["kvstored_master_inventory_syncs_total"] == 2
            assert after["kvstored_master_write_lease_expiries_total"] == 1
            assert after["kvstored_master_admin_requests_total{method=\"ListReplicas\"}"] == 2
            assert after["kvstored_master_admin_requests_total{method=\"ListNodeBlocks\"}"] == 4
            assert after["kvstored_master_nodes{state=\"probation\"}"] == 0
            clock.advance(2.0)  # b unhealthy for one lease (its retry time) and heartbeating
            for n in ("a", "b", "c"):
                m.heartbeat(n, 1)
            daemon.maintain_once()
            tried = await asyncio.to_thread(scrape, daemon.metrics_address)
            assert tried["kvstored_master_nodes{state=\"probation\"}"] == 1  # b, on probation
            assert tried["kvstored_master_nodes{state=\"unhealthy\"}"] == 0
            assert tried["kvstored_master_nodes{state=\"healthy\"}"] == 1
            clock.advance(6.0)  # everyone silent past the 5 s lease
            daemon.maintain_once()
            gone = await asyncio.to_thread(scrape, daemon.metrics_address)
            assert gone["kvstored_master_node_lease_expiries_total"] == 3
            assert gone["kvstored_master_nodes{state=\"healthy\"}"] == 0
        finally:
            await daemon.stop()

    asyncio.run(main())


def test_kvstored_master_prints_its_metrics_address_and_refuses_a_bad_one(tmp_path: Path) -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "kvstored.cli.main", "master", "--listen", "127.0.0.1:0",
         "--data-dir", str(tmp_path), "--metrics-listen", "nonsense"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert "master.metrics_listen" in out.stderr and "'nonsense'" in out.stderr
