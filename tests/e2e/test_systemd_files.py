"""The systemd unit and its example configuration are well-formed and load."""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

from kvstored.config import load_config

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "kvstored-node.service"


def _unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(UNIT)
    return parser


def test_unit_is_notify_with_unlimited_memlock_and_json_logs() -> None:
    svc = _unit()["Service"]
    assert svc["Type"] == "notify"
    assert svc["LimitMEMLOCK"] == "infinity"
    assert svc["Environment"].split()[0] == "KVSTORED_NODE__LOG_JSON=true"
    assert svc["KillSignal"] == "SIGTERM"
    assert svc["ExecStart"].split()[1:3] == ["serve", "--config"]


def test_example_env_and_toml_load() -> None:
    env = {}
    for line in (ROOT / "systemd" / "kvstored-node.env.example").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, value = line.split("=", 1)
            env[key] = value
    cfg = load_config(ROOT / "systemd" / "node.toml.example", environ={**env, "KVSTORED_NODE__LOG_JSON": "true"})
    assert cfg.node.log_json is True
    assert cfg.node.listen[0] == "unix:/run/kvstored/node.sock"
    assert cfg.node.dram_size_bytes == 8 << 30


def test_unit_shares_socket_and_arena_with_its_group() -> None:
    # issue 6: the arena was 0600 for user kvstored, so an engine user could not map it
    svc = _unit()["Service"]
    assert svc["Group"] == "kvstored" and svc["RuntimeDirectoryMode"] == "0750"
    env = dict(item.split("=", 1) for item in svc["Environment"].split())
    cfg = load_config(ROOT / "systemd" / "node.toml.example", environ=env).node
    assert cfg.socket_mode == 0o660 and cfg.arena_mode == 0o660
    assert cfg.arena_group is None  # the socket's group, i.e. Group=kvstored


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_finds_nothing_but_the_missing_binary() -> None:
    r = subprocess.run(["systemd-analyze", "verify", str(UNIT)], capture_output=True, text=True, timeout=60)
    problems = [
        line for line in (r.stdout + r.stderr).splitlines()
        if line.strip() and "is not executable" not in line
    ]
    assert not problems, problems
