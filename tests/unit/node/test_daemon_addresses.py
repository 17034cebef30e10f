"""A node's listen and data-plane addresses are refused with the setting, the flag and the reason."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kvstored.config import load_config
from kvstored.errors import ConfigInvalid
from kvstored.node.daemon import NodeDaemon
from kvstored.tiers.tiered import TieredStore


@pytest.mark.parametrize(("flag", "field", "value", "expected"), [
    ("--listen", "listen", ["127.0.0.1:99999"],
     "node.listen (flag --listen) entry '127.0.0.1:99999' is neither unix:PATH nor a valid HOST:PORT: "
     "expected HOST:PORT for a TCP address with a port in 0..65535, got '127.0.0.1:99999' "
     "(port 99999 out of range)"),
    ("--listen", "listen", ["bogus"],
     "node.listen (flag --listen) entry 'bogus' is neither unix:PATH nor a valid HOST:PORT: "
     "expected HOST:PORT for a TCP address, got 'bogus'"),
    ("--data-address", "data_address", "127.0.0.1:70000",
     "node.data_address (flag --data-address) '127.0.0.1:70000' is not a valid HOST:PORT: expected "
     "HOST:PORT for a TCP address with a port in 0..65535, got '127.0.0.1:70000' (port 70000 out of range)"),
])
def test_a_bad_address_names_its_flag_and_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flag: str,
                                              field: str, value: object, expected: str) -> None:
    opened: list[object] = []
    monkeypatch.setattr(TieredStore, "from_config", lambda *a, **kw: opened.append(a) or 1 / 0)
    base = {"listen": [f"unix:{tmp_path}/n.sock"], "data_address": "", "metrics_address": "",
            "dram_size_bytes": 1 << 20, "ssd_size_bytes": 0, "arena_dir": str(tmp_path), "node_id": "x"}
    cfg = load_config(overrides={"node": base | {field: value}}, environ={},
                      override_sources={f"node.{field}": flag}).node
    with pytest.raises(ConfigInvalid) as err:
        asyncio.run(NodeDaemon(cfg).start())
    assert str(err.value) == expected
    assert opened == []  # refused before the arena was opened


@pytest.mark.parametrize(("spec", "detail"), [
    ("nohost", "(bad entry 'nohost')"),
    ("127.0.0.1:99999", "(port 99999 out of range)"),
    ("etcd://127.0.0.1:2379", "expected etcd://HOST:PORT[,HOST:PORT]/PREFIX"),
])
def test_a_bad_master_address_exits_2_naming_the_flag_before_the_arena(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str, detail: str) -> None:
    from click.testing import CliRunner

    from kvstored.cli.main import main

    opened: list[object] = []
    monkeypatch.setattr(TieredStore, "from_config", lambda *a, **kw: opened.append(a) or 1 / 0)
    result = CliRunner().invoke(main, [
        "node", "--master", spec, "--listen", f"unix:{tmp_path}/n.sock", "--dram-size", "1MiB",
        "--ssd-size", "0", "--arena-dir", str(tmp_path), "--node-id", "x"])
    assert result.exit_code == 2, result.output
    assert "cluster.master_address (flag --master)" in result.output and detail in result.output
    assert repr(spec) in result.output
    assert opened == []  # refused before the arena was opened
