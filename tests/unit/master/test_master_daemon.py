"""MasterDaemon pieces without a network: epochs across restarts, maintenance, CLI errors."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from master_helpers import NS, blocks, spec

from kvstored.clock import FakeClock
from kvstored.config import MasterConfig
from kvstored.master.daemon import STATE_FILE, MasterDaemon, next_master_epoch


def test_master_epochs_increase_even_when_the_clock_steps_back(tmp_path: Path) -> None:
    first = next_master_epoch(tmp_path / "m", now_ns=5_000)
    assert first == 5_000
    assert next_master_epoch(tmp_path / "m", now_ns=4_000) == 5_001  # clock went back
    assert next_master_epoch(tmp_path / "m", now_ns=9_000) == 9_000
    (tmp_path / "m" / STATE_FILE).write_text("not json")
    assert next_master_epoch(tmp_path / "m", now_ns=100) == 100  # unreadable: warn, go on


def test_maintenance_expires_nodes_aborts_writes_and_collects_garbage(tmp_path: Path) -> None:
    clock = FakeClock()
    cfg = MasterConfig(listen=["127.0.0.1:0"], data_dir=tmp_path, node_lease_s=5.0,
                       write_lease_s=2.0)
    daemon = MasterDaemon(cfg, clock=clock)

    async def main() -> None:
        await daemon.start()
        try:
            assert daemon.state is not None
            m, p = daemon.state.membership, daemon.state.placement
            m.register(spec("a"))
            m.sync_inventory("a", 1, sync_id=1, blocks=blocks(range(10)), last_chunk=True)
            m.register(spec("b"))
            m.sync_inventory("b", 1, sync_id=1, blocks=[], last_chunk=True)
            p.start_put(NS, b"k" * 16, 100, writer_node_id="b")
            assert daemon.maintain_once() == ([], 0, 0)
            clock.advance(3.0)
            m.heartbeat("a", 1)
            m.heartbeat("b", 1)
            assert daemon.maintain_once() == ([], 1, 0)  # the write's lease lapsed
            clock.advance(5.5)  # both silent past the 5 s lease
            assert daemon.maintain_once() == (["a", "b"], 0, 10)  # a's 10 rows unlinked
            index = daemon.state.index
            assert index.num_blocks == 0 and index.num_garbage_rows == 0
        finally:
            await daemon.stop()

    asyncio.run(main())
    assert daemon.grpc_addresses and not daemon.grpc_addresses[0].endswith(":0")


def test_kvstored_master_refuses_a_bad_listen_address_with_exit_2(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kvstored.cli.main", "master", "--listen", "nonsense",
         "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 2
    assert "master.listen entry 'nonsense' is not HOST:PORT" in out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "kvstored.cli.main", "master", "--node-lease-s", "0",
         "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 2 and "master.node_lease_s" in out.stderr
