"""README "Operating a cluster", **Replicas**: its bash and python blocks run as written.

The blocks marked ``<!-- readme-test: skip run by tests/e2e/test_readme_replicas.py ... -->``
run here in README order, with the runner of tests/e2e/test_readme_cluster.py (ports mapped
to free loopback ports, daemons waited for until ``ready`` and stopped with SIGTERM).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from test_readme import Block, read_blocks
from test_readme_cluster import ROOT, Runner, _wait, commands

from kvstored.client.master_admin import MasterAdminClient

MARK = "test_readme_replicas.py"


def replica_blocks() -> list[Block]:
    """The README blocks this module runs, in README order."""
    return [b for b in read_blocks((ROOT / "README.md").read_text())
            if b.skip_reason and MARK in b.skip_reason]


def test_replicas_commands_run_as_written(workdir: Path) -> None:
    blocks = replica_blocks()
    assert [b.lang for b in blocks] == ["bash", "python", "bash"], blocks
    daemons, python, ctl = blocks
    run = Runner(workdir, [b.code for b in blocks])
    m = MasterAdminClient(run.map["127.0.0.1:7380"])  # polled in-process; the README's
    try:                                              # kvstorectl commands run below
        for cmd in commands(daemons.code):
            run.run(cmd)
        _wait("both nodes healthy", lambda: sorted(
            (n["node_id"], n["zone"], n["health"]) for n in m.list_nodes()["nodes"])  # type: ignore[attr-defined]  # list_nodes' JSON
            == [("r1", "rack1", "healthy"), ("r2", "rack2", "healthy")])
        r = subprocess.run([sys.executable, "-c", run.sub(python.code)], cwd=workdir,
                           env=run.env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "4 blocks on 2 nodes; replicas=3 got 2 NoCapacity"
        _wait("both replicas indexed (one heartbeat)", lambda: sorted(
            r["node_id"] for r in m.list_replicas(b"", [bytes(16)])[0][0] if r["readable"])
            == ["r1", "r2"])
        outs = [run.run(cmd) for cmd in commands(ctl.code)]
        assert "rack1" in outs[0].stdout and "rack2" in outs[0].stdout
        assert "2/3" in outs[1].stdout  # 2 readable replicas of the factor 3 the last put asked
    finally:
        m.close()
        codes = run.stop()
    assert codes == [0, 0, 0]
