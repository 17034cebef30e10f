"""README "HA with etcd": its bash block runs as written (ports substituted), then the leader dies.

The block marked ``<!-- readme-test: skip run by tests/e2e/test_readme_ha.py ... -->`` is run
with the runner of tests/e2e/test_readme_cluster.py (every ``HOST:PORT`` mapped to a free
loopback port; ``&`` lines are daemons waited for until they print ``ready``), except that
the ``etcd`` line is waited for until its client port accepts connections (etcd prints no
``ready``). The failover the README describes next is tests/e2e/test_e2e_master_ha.py.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest
from etcd_helpers import require_etcd
from test_readme import read_blocks
from test_readme_cluster import ROOT, Runner, _wait, commands

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


def test_ha_commands_run_as_written(workdir: Path) -> None:
    require_etcd()
    blocks = [b for b in read_blocks((ROOT / "README.md").read_text())
              if b.skip_reason and MARK in b.skip_reason]
    assert [b.lang for b in blocks] == ["bash"] and len(commands(blocks[0].code)) == 6
    run = HaRunner(workdir, [blocks[0].code])
    cmds = commands(blocks[0].code)
    try:
        for cmd in cmds[:-2]:
            run.run(cmd)
        masters = f"{run.map['127.0.0.1:7080']},{run.map['127.0.0.1:7081']}"
        _wait("a healthy at the leader", lambda: [
            (n["node_id"], n["health"]) for n in run.ctl_json(masters, "nodes")["nodes"]]
            == [("a", "healthy")])
        for cmd in cmds[-2:]:  # through both masters' list, then through etcd
            out = run.run(cmd).stdout
            assert "healthy" in out and "term" in out  # the leader and its etcd term in the title
    finally:
        codes = run.stop()
    assert codes[:3] == [0, 0, 0]  # (reversed) the node and both masters


