"""The ports between transport/ and the node: transport/ imports neither node/ nor tiers/,
and NodeCore implements the calls a server makes into it (BlockServer, GrantingServer)."""

from __future__ import annotations

import ast
import pathlib

import pytest

import kvstored.transport
from kvstored.config import NodeConfig
from kvstored.node.core import NodeCore
from kvstored.tiers.tiered import TieredStore
from kvstored.transport.base import BlockServer, GrantingServer

TRANSPORT_DIR = pathlib.Path(kvstored.transport.__file__).parent
FORBIDDEN = ("kvstored.node", "kvstored.tiers", "kvstored.client")


def _imported_modules(path: pathlib.Path) -> list[str]:
    """Every module a file imports, TYPE_CHECKING blocks and function bodies included."""
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
    return out


@pytest.mark.parametrize("path", sorted(TRANSPORT_DIR.glob("*.py")), ids=lambda p: p.name)
def test_transport_imports_nothing_from_node_tiers_or_client(path: pathlib.Path) -> None:
    bad = [m for m in _imported_modules(path)
           if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]
    assert bad == [], f"{path.name} imports {bad}: pass behaviour in through transport/base.py"


def test_the_import_scan_sees_a_forbidden_import(tmp_path: pathlib.Path) -> None:
    f = tmp_path / "x.py"
    f.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                 "    from kvstored.node.core import NodeCore\n")
    assert "kvstored.node.core" in _imported_modules(f)


def test_node_core_implements_the_server_ports() -> None:
    cfg = NodeConfig(node_id="ports", dram_size_bytes=1 << 20, ssd_size_bytes=0,
                     max_block_bytes=64 << 10)
    store = TieredStore(dram_size_bytes=cfg.dram_size_bytes, arena_dir=None,
                        max_block_bytes=cfg.max_block_bytes)
    try:
        core = NodeCore(store, cfg, epoch=1)
        assert isinstance(core, BlockServer)
        assert isinstance(core, GrantingServer)
        assert not isinstance(object(), BlockServer)
    finally:
        store.close()
