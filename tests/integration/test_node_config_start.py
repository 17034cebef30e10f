"""A bad configuration stops the daemon before it binds a port or creates its arena."""

from __future__ import annotations

import asyncio
import os
import pathlib

import pytest

from kvstored.config import load_config
from kvstored.errors import ConfigInvalid
from kvstored.node.daemon import NodeDaemon


def _arena_files(arena_dir: pathlib.Path) -> list[str]:
    return [n for n in os.listdir(arena_dir) if n.endswith(".arena")]


def test_ssd_cap_larger_than_the_disk_fails_before_anything_is_bound(
    sock_dir: str, tmp_path: pathlib.Path
) -> None:
    arena_dir = tmp_path / "shm"
    arena_dir.mkdir()
    st = os.statvfs(tmp_path)
    disk = st.f_blocks * st.f_frsize
    sock = f"{sock_dir}/n.sock"
    cfg = load_config(
        environ={"KVSTORED_NODE__SSD_SIZE_BYTES": str(disk + (1 << 30))},
        overrides={"node": {
            "listen": [f"unix:{sock}"], "data_address": "127.0.0.1:0", "metrics_address": "",
            "dram_size_bytes": "1MiB", "arena_dir": str(arena_dir),
            "ssd_dir": str(tmp_path / "ssd"),
        }},
    ).node
    daemon = NodeDaemon(cfg, enable_scheduler=False)
    with pytest.raises(ConfigInvalid, match=r"KVSTORED_NODE__SSD_SIZE_BYTES"):
        asyncio.run(daemon.start())
    assert not os.path.exists(sock)
    assert _arena_files(arena_dir) == []
    assert not (tmp_path / "ssd").exists()
    asyncio.run(daemon.stop())  # a no-op after a failed start
