"""README "HA with etcd": its bash block runs as written (ports substituted), then the leader dies.

The block marked ``<!-- readme-test: skip run by tests/e2e/test_readme_ha.py ... -->`` is run
with the runner of tests/e2e/test_readme_cluster.py (every ``HOST:PORT`` mapped to a free
loopback port; ``&`` lines are daemons waited for until they print ``ready``), except that
the ``etcd`` line is waited for until its client port accepts connections (etcd prints no
``ready``). Then the leading master is SIGKILLed, as the README says, and the same
``kvstorectl`` command must show node ``a`` healthy at the other master.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from etcd_helpers import require_etcd
from test_readme import read_blocks
from test_readme_cluster import ROOT, Runner, _wait, commands

from kvstored.client.master import MasterClient

pytestmark = pytest.mark.etcd
MARK = "test_readme_ha.py"


class HaRunner(Runner):
    """:class:`Runner` that also starts etcd (waited for on its client port)."""

    def _daemon(self, cmd: str) -> None:
        if not cmd.startswith("etcd "):
            super()._daemon(cmd)
            return
        log = open(self.workdir / "etcd.log", "w")  # noqa: SIM115 (kept open for the process)
        proc = subprocess.Popen(["bash", "-c", f"exec {cmd}"], cwd=self.workdir, env=self.env,
                                stdout=log, stderr=subprocess.STDOUT, text=True)
        log.close()
        self.daemons.append(proc)
        port = int(self.map["127.0.0.1:2379"].rsplit(":", 1)[1])
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, \
                    (self.workdir / "etcd.log").read_text()[-3000:]
                time.sleep(0.05)


def test_ha_commands_run_as_written_and_the_node_follows_a_failover(workdir: Path) -> None:
    require_etcd()
    blocks = [b for b in read_blocks((ROOT / "README.md").read_text())
              if b.skip_reason and MARK in b.skip_reason]
    assert [b.lang for b in blocks] == ["bash"] and len(commands(blocks[0].code)) == 5
    run = HaRunner(workdir, [blocks[0].code])
    cmds = commands(blocks[0].code)
    try:
        for cmd in cmds[:-1]:
            run.run(cmd)
        masters = f"{run.map['127.0.0.1:7080']},{run.map['127.0.0.1:7081']}"
        _wait("a healthy at the leader", lambda: [
            (n["node_id"], n["health"]) for n in run.ctl_json(masters, "nodes")["nodes"]]
            == [("a", "healthy")])
        assert "healthy" in run.run(cmds[-1]).stdout
        with MasterClient(masters) as m:
            m.list_nodes()
            leader, term = m.address, m.fence.term
        which = [run.map["127.0.0.1:7080"], run.map["127.0.0.1:7081"]].index(leader)
        run.daemons[1 + which].send_signal(signal.SIGKILL)  # daemons: etcd, m1, m2, node

        def follows() -> bool:
            with MasterClient(masters, timeout_s=2) as m:
                ok = [(n["node_id"], n["health"]) for n in m.list_nodes()["nodes"]] \
                    == [("a", "healthy")]
                return ok and m.address != leader and m.fence.term > term

        _wait("a healthy at the new leader", lambda: _try(follows))
        assert "healthy" in run.run(cmds[-1]).stdout
    finally:
        codes = run.stop()
    assert codes[0] == 0 and codes[1 + which] == 0  # (reversed) the node, the surviving master


def _try(fn: object) -> bool:
    try:
        return bool(fn())  # type: ignore[operator]  # a callable
    except Exception:  # noqa: BLE001 (no leader yet)
        return False
