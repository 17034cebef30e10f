"""The systemd unit and its example configuration, checked by what they do.

The unit's own ExecStart runs (as this user, its paths moved under a temporary directory) with
the unit's Environment= and the example EnvironmentFile, NOTIFY_SOCKET pointed at a datagram
socket the test reads, and is stopped with the unit's KillSignal; ``systemd-analyze verify``
checks the unit file itself.
"""

from __future__ import annotations

import configparser
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kvstored import Client
from kvstored.config import load_config

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "kvstored-node.service"
ENV_EXAMPLE = ROOT / "systemd" / "kvstored-node.env.example"
TOML_EXAMPLE = ROOT / "systemd" / "node.toml.example"
NO_SYSTEMD_ANALYZE = "systemd-analyze (Debian/Ubuntu package `systemd`) is not installed"


def _unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(UNIT)
    return parser


def _env_file(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, value = line.split("=", 1)
            env[key] = value
    return env


@pytest.fixture
def tmp(workdir: Path) -> Path:
    """The suite's short ``workdir`` (unix socket paths)."""
    return workdir


def _relocate(text: str, tmp: Path) -> str:
    """The unit's RuntimeDirectory and StateDirectory moved under ``tmp``, ports to 0."""
    text = text.replace("/run/kvstored", str(tmp / "run")).replace("/var/lib/kvstored", str(tmp / "state"))
    for port in ("7070", "7071", "7072"):
        text = text.replace(f"127.0.0.1:{port}", "127.0.0.1:0")
    return text


def test_unit_execstart_notifies_ready_and_stops_cleanly_on_its_kill_signal(tmp: Path) -> None:
    svc = _unit()["Service"]
    assert svc["Type"] == "notify"  # so systemd waits for the READY=1 checked below
    argv = shlex.split(svc["ExecStart"])
    assert Path(argv[0]).name == "kvstored" and "--config" in argv
    # /etc/kvstored/node.toml and node.env are the installed copies of the two examples
    assert argv[argv.index("--config") + 1] == "/etc/kvstored/node.toml"
    assert svc["EnvironmentFile"] == "-/etc/kvstored/node.env"
    config = tmp / "node.toml"
    config.write_text(_relocate(TOML_EXAMPLE.read_text(), tmp))
    argv[argv.index("--config") + 1] = str(config)
    argv[:1] = [sys.executable, "-m", "kvstored.cli.main"]  # the console script's entry point
    (tmp / "run").mkdir()  # RuntimeDirectory= and StateDirectory= are created by systemd
    (tmp / "state").mkdir()
    env = {k: _relocate(v, tmp) for k, v in _env_file(ENV_EXAMPLE).items()}
    for assignment in shlex.split(svc["Environment"]):
        key, value = assignment.split("=", 1)
        env[key] = value
    # the example's 8 GiB / 200 GiB tiers, scaled down for a test
    env |= {"KVSTORED_NODE__DRAM_SIZE_BYTES": "16MiB", "KVSTORED_NODE__SSD_SIZE_BYTES": "64MiB"}
    notify_path = str(tmp / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(notify_path)
        notify.settimeout(30)
        stderr = open(tmp / "stderr.log", "w+")
        proc = subprocess.Popen(
            argv, env={**_base_env(), **env, "NOTIFY_SOCKET": notify_path},
            stdout=subprocess.DEVNULL, stderr=stderr, text=True, cwd=tmp,
        )
        try:
            ready = notify.recv(4096).decode()
            sock = tmp / "run" / "node.sock"
            lines = ready.split("\n")
            assert lines[0] == "READY=1" and lines[1].startswith(f"STATUS=serving on unix:{sock}, 127.0.0.1:"), ready
            with Client(f"unix:{sock}") as c:  # it really serves once it said so
                assert c.stats()["node_id"] == env["KVSTORED_NODE__NODE_ID"]
                key = b"k" * 16
                assert c.put([key], [b"v" * 1000])[0].stored and c.get([key]) == [b"v" * 1000]
            proc.send_signal(signal.Signals[svc["KillSignal"]])
            assert notify.recv(4096).decode() == "STOPPING=1"
            rc = proc.wait(timeout=float(svc["TimeoutStopSec"]))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
        stderr.seek(0)
        log = stderr.read()
        stderr.close()
    assert rc == 0, log[-3000:]  # Restart=on-failure must not restart a clean stop
    assert not (tmp / "run" / "node.sock").exists()
    events = [json.loads(line)["event"] for line in log.splitlines() if line.strip()]  # LOG_JSON
    assert "node_draining" in events and events[-1] == "node_stopped"
    assert (tmp / "state" / "ssd").is_dir()  # the SSD tier lives in StateDirectory


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("KVSTORED_")}


def test_example_env_and_toml_load() -> None:
    env = _env_file(ENV_EXAMPLE)
    cfg = load_config(TOML_EXAMPLE, environ={**env, "KVSTORED_NODE__LOG_JSON": "true"})
    assert cfg.node.log_json is True
    assert cfg.node.listen[0] == "unix:/run/kvstored/node.sock"
    assert cfg.node.dram_size_bytes == 8 << 30
    # the stop timeout covers the drain grace the example configures
    assert cfg.node.drain_grace_s < float(_unit()["Service"]["TimeoutStopSec"])


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason=NO_SYSTEMD_ANALYZE)
def test_systemd_analyze_verify_is_clean(tmp: Path) -> None:
    """The unit as shipped, with ExecStart pointed at an existing binary (the only change)."""
    text = UNIT.read_text()
    exec_start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    args = shlex.split(exec_start.split("=", 1)[1])[1:]
    shim = shlex.join([sys.executable, "-m", "kvstored.cli.main", *args])
    unit = tmp / UNIT.name
    unit.write_text(text.replace(exec_start, f"ExecStart={shim}"))
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr


def test_unit_shares_socket_and_arena_with_its_group() -> None:
    # issue 6: the arena was 0600 for user kvstored, so an engine user could not map it
    svc = _unit()["Service"]
    assert svc["Group"] == "kvstored" and svc["RuntimeDirectoryMode"] == "0750"
    env = dict(item.split("=", 1) for item in svc["Environment"].split())
    cfg = load_config(ROOT / "systemd" / "node.toml.example", environ=env).node
    assert cfg.socket_mode == 0o660 and cfg.arena_mode == 0o660
    assert cfg.arena_group is None  # the socket's group, i.e. Group=kvstored
