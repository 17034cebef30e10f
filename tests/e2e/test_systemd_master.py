"""kvstored-master.service, and kvstored-node.service pointed at it through its env file.

Both units' own ExecStart lines run (as this user, /var/lib/kvstored and /run/kvstored moved
under a temporary directory, loopback ports set to 0) with their Environment= lines and
NOTIFY_SOCKET pointed at datagram sockets the test reads: the master (with the WATCHDOG_USEC its
WatchdogSec= gives) pings WATCHDOG=1 and says READY=1, the node
unit joins it with nothing but ``KVSTORED_CLUSTER__MASTER_ADDRESS`` added to its env, the
master's /metrics counts it, and both stop cleanly (exit 0) on their KillSignal.
``systemd-analyze verify`` checks the master unit file.
"""

from __future__ import annotations

import configparser
import json
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from kvstored.client.master import MasterClient
from kvstored.config import load_config

ROOT = Path(__file__).resolve().parents[2]
SYSTEMD = ROOT / "systemd"
MASTER_UNIT = SYSTEMD / "kvstored-master.service"
NODE_UNIT = SYSTEMD / "kvstored-node.service"


def _unit(path: Path) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(path)
    return parser["Service"]


def _env_file(path: Path) -> dict[str, str]:
    pairs = (ln.strip().split("=", 1) for ln in path.read_text().splitlines()
             if ln.strip() and not ln.strip().startswith("#"))
    return dict(pairs)  # type: ignore[arg-type]


def _relocate(text: str, tmp: Path) -> str:
    text = text.replace("/run/kvstored", str(tmp / "run")).replace("/var/lib/kvstored", str(tmp / "state"))
    return re.sub(r"127\.0\.0\.1:70\d\d", "127.0.0.1:0", text)


def _base_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("KVSTORED_")}


@pytest.fixture
def tmp(workdir: Path) -> Path:
    """The suite's short ``workdir`` (unix socket paths) with the unit's run/ and state/."""
    (workdir / "run").mkdir()
    (workdir / "state").mkdir()
    return workdir


def _start(unit: Path, config: Path, env: dict[str, str], tmp: Path, name: str
           ) -> tuple[subprocess.Popen[str], socket.socket]:
    """The unit's ExecStart (its --config replaced by ``config``), notify socket bound."""
    svc = _unit(unit)
    assert svc["Type"] == "notify"
    argv = shlex.split(svc["ExecStart"])
    assert Path(argv[0]).name == "kvstored" and "--config" in argv
    argv[argv.index("--config") + 1] = str(config)
    argv[:1] = [sys.executable, "-m", "kvstored.cli.main"]
    for assignment in shlex.split(svc.get("Environment", "")):
        key, value = assignment.split("=", 1)
        env[key] = value
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp / f"{name}.notify"))
    notify.settimeout(60)
    with open(tmp / f"{name}.log", "w") as log:
        proc = subprocess.Popen(argv, env={**_base_env(), **env,
                                           "NOTIFY_SOCKET": str(tmp / f"{name}.notify")},
                                stdout=subprocess.PIPE, stderr=log, text=True, cwd=tmp)
    return proc, notify


def _stop(proc: subprocess.Popen[str], unit: Path) -> int:
    svc = _unit(unit)
    proc.send_signal(signal.Signals[svc["KillSignal"]])
    return proc.wait(timeout=float(svc["TimeoutStopSec"]))


def test_master_unit_serves_and_the_node_unit_joins_it_by_env(tmp: Path) -> None:
    svc = _unit(MASTER_UNIT)
    argv = shlex.split(svc["ExecStart"])
    assert argv[argv.index("--config") + 1] == "/etc/kvstored/master.toml"
    assert argv[1] == "master"
    master_cfg = tmp / "master.toml"
    master_cfg.write_text(_relocate((SYSTEMD / "master.toml.example").read_text(), tmp))
    node_cfg = tmp / "node.toml"
    node_cfg.write_text(_relocate((SYSTEMD / "node.toml.example").read_text(), tmp))
    procs: list[subprocess.Popen[str]] = []
    socks: list[socket.socket] = []
    try:
        # WATCHDOG_USEC as systemd derives it from WatchdogSec= (whole seconds in the unit)
        watchdog_usec = str(int(svc["WatchdogSec"].removesuffix("s")) * 1_000_000)
        master, m_notify = _start(MASTER_UNIT, master_cfg, {"WATCHDOG_USEC": watchdog_usec}, tmp, "master")
        procs.append(master)
        socks.append(m_notify)
        notes = [m_notify.recv(4096).decode()]
        while not notes[-1].startswith("READY=1"):
            notes.append(m_notify.recv(4096).decode())
        assert notes[0] == "WATCHDOG=1", notes  # the master's loop pings (from before READY)
        ready = notes[-1].split("\n")
        assert ready[0] == "READY=1" and ready[1].startswith("STATUS=master serving on 127.0.0.1:")
        address = ready[1].rsplit(" ", 1)[1]
        assert master.stdout is not None
        lines = [master.stdout.readline().strip() for _ in range(4)]
        assert lines[-1] == "ready", lines
        metrics = next(ln.split()[2] for ln in lines if ln.startswith("listening metrics "))
        assert (tmp / "state" / "master" / "master.json").is_file()  # StateDirectory
        # the node unit, pointed at the master by its env file alone
        env = {k: _relocate(v, tmp) for k, v in _env_file(SYSTEMD / "kvstored-node.env.example").items()}
        env |= {"KVSTORED_NODE__DRAM_SIZE_BYTES": "16MiB", "KVSTORED_NODE__SSD_SIZE_BYTES": "64MiB",
                "KVSTORED_CLUSTER__MASTER_ADDRESS": address}
        node, n_notify = _start(NODE_UNIT, node_cfg, env, tmp, "node")
        procs.append(node)
        socks.append(n_notify)
        assert n_notify.recv(4096).decode().startswith("READY=1")
        deadline = time.monotonic() + 30
        with MasterClient(address) as m:
            while True:
                nodes = m.list_nodes()["nodes"]
                if [(n["node_id"], n["health"]) for n in nodes] == [
                        (env["KVSTORED_NODE__NODE_ID"], "healthy")]:
                    break
                assert time.monotonic() < deadline, nodes
                time.sleep(0.2)

        def healthy() -> float:
            with urllib.request.urlopen(metrics, timeout=10) as r:
                text = r.read().decode()
            return float(re.search(r'^kvstored_master_nodes\{state="healthy"\} (\S+)$', text,
                                   re.M).group(1))  # type: ignore[union-attr]

        while healthy() != 1.0:  # sampled once per maintenance tick
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert _stop(node, NODE_UNIT) == 0
        assert _stop(master, MASTER_UNIT) == 0
        log = (tmp / "master.log").read_text()
        events = [json.loads(ln)["event"] for ln in log.splitlines() if ln.strip()]  # LOG_JSON
        assert "node_unregistered" in events and events[-1] == "master_stopped"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(30)
        for s in socks:
            s.close()


def test_master_example_loads() -> None:
    cfg = load_config(SYSTEMD / "master.toml.example", environ={}).master
    assert cfg.listen == ["127.0.0.1:7080"] and cfg.metrics_listen == "127.0.0.1:7082"
    assert str(cfg.data_dir).startswith("/var/lib/kvstored")  # inside the unit's StateDirectory
    assert "/var/lib/kvstored" in _unit(MASTER_UNIT)["ReadWritePaths"]
    node = load_config(SYSTEMD / "node.toml.example",
                       environ={"KVSTORED_CLUSTER__MASTER_ADDRESS": "10.0.0.1:7080"})
    assert node.cluster.master_address == "10.0.0.1:7080"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze (Debian/Ubuntu package `systemd`) is not installed")
def test_master_unit_passes_systemd_analyze_verify(tmp: Path) -> None:
    text = MASTER_UNIT.read_text()
    exec_start = next(ln for ln in text.splitlines() if ln.startswith("ExecStart="))
    args = shlex.split(exec_start.split("=", 1)[1])[1:]
    unit = tmp / MASTER_UNIT.name
    unit.write_text(text.replace(exec_start, "ExecStart="
                                 + shlex.join([sys.executable, "-m", "kvstored.cli.main", *args])))
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr
