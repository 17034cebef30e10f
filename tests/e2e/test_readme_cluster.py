"""README "Operating a cluster": its bash and python blocks run as written, ports substituted.

The blocks marked ``<!-- readme-test: skip run by tests/e2e/test_readme_cluster.py ... -->``
are run here, in README order, from an empty temporary directory: every ``HOST:PORT`` of
the README (loopback ports of the one-host example, the 10.0.0.x hosts of the several-host
one) is mapped to a free loopback port; a line ending in ``&`` starts a daemon (waited for
until it prints ``ready``; each with its own HOME so default directories never collide);
any other line runs with ``bash -c`` and must exit 0. ``kvstored`` and ``kvstorectl`` are
shims onto this checkout's entry points. Daemons are stopped with SIGTERM and must exit 0.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from test_readme import Block, read_blocks
from thread_helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]
MARK = "test_readme_cluster.py"
ADDRESS = re.compile(r"\b(\d{1,3}(?:\.\d{1,3}){3}):(\d{2,5})\b")
READY_S = 60.0
WAIT_S = 30.0


def cluster_blocks() -> list[Block]:
    """The README blocks this module runs, in README order."""
    return [b for b in read_blocks((ROOT / "README.md").read_text())
            if b.skip_reason and MARK in b.skip_reason]


def commands(code: str) -> list[str]:
    """Shell commands of a block: continuation lines joined, comments and blanks dropped."""
    out, cur = [], ""
    for line in code.splitlines():
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        cur += line
        cmd = re.sub(r"(^|\s)#.*$", "", cur).strip()
        cur = ""
        if cmd:
            out.append(cmd)
    return out


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


class Runner:
    """Runs README commands in one directory with one address map."""

    def __init__(self, workdir: Path, texts: list[str]) -> None:
        self.workdir = workdir
        found = sorted({m.group(0) for t in texts for m in ADDRESS.finditer(t)})
        self.map = dict(zip(found, (f"127.0.0.1:{p}" for p in _free_ports(len(found))),
                            strict=True))
        bin_dir = workdir / "bin"
        bin_dir.mkdir()
        for name, module in (("kvstored", "kvstored.cli.main"),
                             ("kvstorectl", "kvstored.cli.kvstorectl")):
            shim = bin_dir / name
            shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m {module} \"$@\"\n")
            shim.chmod(0o755)
        self.env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                                os.environ.get("PYTHONPATH")]))}
        self.env = {k: v for k, v in self.env.items() if not k.startswith("KVSTORED_")}
        self.daemons: list[subprocess.Popen[str]] = []

    def sub(self, text: str) -> str:
        return ADDRESS.sub(lambda m: self.map.get(m.group(0), m.group(0)), text)

    def run(self, cmd: str, *, check: bool = True) -> subprocess.CompletedProcess[str]:
        """One command: a daemon (``&``) started and waited for, or a command that must pass
        (``check=False``: that may fail; the caller checks its exit code)."""
        cmd = self.sub(cmd)
        if cmd.endswith("&"):
            self._daemon(cmd[:-1].strip())
            return subprocess.CompletedProcess(cmd, 0, "", "")
        r = subprocess.run(["bash", "-c", f"set -o pipefail; {cmd}"], cwd=self.workdir,
                           env=self.env, capture_output=True, text=True, timeout=120)
        assert not check or r.returncode == 0, f"{cmd!r} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
        return r

    def _daemon(self, cmd: str) -> None:
        home = self.workdir / f"home{len(self.daemons)}"
        home.mkdir()
        log = open(self.workdir / f"daemon{len(self.daemons)}.log", "w")
        proc = subprocess.Popen(["bash", "-c", f"exec {cmd}"], cwd=self.workdir,
                                env={**self.env, "HOME": str(home), "XDG_RUNTIME_DIR": str(home)},
                                stdout=subprocess.PIPE, stderr=log, text=True)
        log.close()
        self.daemons.append(proc)
        ready = threading.Event()

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.strip() == "ready":
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + READY_S
        while not ready.wait(0.1):
            assert proc.poll() is None and time.monotonic() < deadline, (
                f"{cmd!r} did not become ready (rc={proc.poll()}):\n"
                + (self.workdir / f"daemon{len(self.daemons) - 1}.log").read_text()[-3000:])

    def ctl_json(self, master: str, *args: str) -> dict:
        r = self.run(f"kvstorectl --address {master} {' '.join(args)} --output json")
        return json.loads(r.stdout)

    def stop(self) -> list[int | None]:
        for p in self.daemons:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes = []
        for p in reversed(self.daemons):
            try:
                codes.append(p.wait(timeout=60))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(p.wait(30))
        return codes


def _wait(what: str, cond: Callable[[], object]) -> object:
    """``cond()``'s first truthy value, polled every 0.2 s for up to ``WAIT_S``."""
    return wait_until(cond, WAIT_S, what, interval_s=0.2)


def test_the_readme_has_the_cluster_blocks() -> None:
    blocks = cluster_blocks()
    assert [b.lang for b in blocks] == ["bash", "python", "bash", "bash"], blocks
    assert [len(commands(blocks[i].code)) for i in (0, 2, 3)] == [3, 5, 4]
    assert commands("a \\\n  b   # c\n# d\ne &  # f\n") == ["a    b", "e &"]


def test_one_host_cluster_commands_run_as_written(workdir: Path) -> None:
    daemons, python, ctl, _ = cluster_blocks()
    run = Runner(workdir, [daemons.code, python.code, ctl.code])
    try:
        for cmd in commands(daemons.code):
            run.run(cmd)
        master = run.map["127.0.0.1:7080"]
        _wait("both nodes healthy", lambda: sorted(
            (n["node_id"], n["health"]) for n in run.ctl_json(master, "nodes")["nodes"])
            == [("a", "healthy"), ("b", "healthy")])
        r = subprocess.run([sys.executable, "-c", run.sub(python.code)], cwd=workdir,
                           env=run.env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "put through a, got 100000 bytes through b"
        key = bytes(range(16)).hex()
        _wait("b's copy indexed (one heartbeat)", lambda: sorted(
            x["node_id"] for x in run.ctl_json(master, "where", key)["blocks"][0]["replicas"])
            == ["a", "b"])
        outs = [run.run(cmd) for cmd in commands(ctl.code)]
        assert "healthy" in outs[0].stdout and "1 leading blocks present" in outs[1].stdout
        assert key in outs[2].stdout  # blocks --node a
        assert "evicted 2 replicas" in outs[3].stdout
        assert 'kvstored_master_nodes{state="healthy"} 2.0' in outs[4].stdout
        _wait("the evicted block gone from the index", lambda: run.ctl_json(
            master, "where", key)["blocks"][0]["replicas"] == [])
    finally:
        codes = run.stop()
    assert codes == [0, 0, 0]


def test_several_hosts_commands_run_with_hosts_mapped_to_loopback(workdir: Path) -> None:
    block = cluster_blocks()[3]
    run = Runner(workdir, [block.code])
    try:
        outs = [run.run(cmd) for cmd in commands(block.code)]
        assert outs[-1].returncode == 0
        master = run.map["10.0.0.1:7080"]
        _wait("gpu1 and gpu2 healthy", lambda: sorted(
            (n["node_id"], n["health"], n["data_address"])
            for n in run.ctl_json(master, "nodes")["nodes"]) == [
            ("gpu1", "healthy", run.map["10.0.0.11:7071"]),
            ("gpu2", "healthy", run.map["10.0.0.12:7071"])])
    finally:
        codes = run.stop()
    assert codes == [0, 0, 0]
