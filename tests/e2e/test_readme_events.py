"""README "Operating a cluster", **KV events for routers**: its bash and python blocks run as
written.

The blocks marked ``<!-- readme-test: skip run by tests/e2e/test_readme_events.py ... -->``
run here in README order, with the runner of tests/e2e/test_readme_cluster.py (ports mapped
to free loopback ports, ``tcp://`` endpoints included; daemons waited for until ``ready``
and stopped with SIGTERM).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from test_readme import Block, read_blocks
from test_readme_cluster import ROOT, Runner, _wait, commands

MARK = "test_readme_events.py"


def event_blocks() -> list[Block]:
    """The README blocks this module runs, in README order."""
    return [b for b in read_blocks((ROOT / "README.md").read_text())
            if b.skip_reason and MARK in b.skip_reason]


def test_events_commands_run_as_written(workdir: Path) -> None:
    blocks = event_blocks()
    assert [b.lang for b in blocks] == ["bash", "python", "bash"], blocks
    daemons, python, ctl = blocks
    run = Runner(workdir, [b.code for b in blocks])
    try:
        for cmd in commands(daemons.code):
            run.run(cmd)
        master = run.map["127.0.0.1:7580"]
        _wait("both nodes healthy", lambda: sorted(
            (n["node_id"], n["health"]) for n in run.ctl_json(master, "nodes")["nodes"])
            == [("e1", "healthy"), ("e2", "healthy")])
        r = subprocess.run([sys.executable, "-c", run.sub(python.code)], cwd=workdir,
                           env=run.env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "route to e1: 3 of 4 blocks cached"
        where = run.ctl_json(master, "where", *(bytes([i]).hex() * 16 for i in range(4)))
        holders = [{x["node_id"] for x in b["replicas"]} for b in where["blocks"]]
        assert holders == [{"e1"}, {"e1"}, {"e1"}, set()]  # the router's pick is the master's
        [out] = [run.run(cmd) for cmd in commands(ctl.code)]
        lines = out.stdout.splitlines()
        assert lines[0].split()[:3] == ["seq", "type", "node"]
        assert lines[1].split()[:2] == ["0", "AllBlocksCleared"]
        stored = {tuple(x.split()[1:3]) for x in lines[2:]}
        assert {("BlockStored", "e1"), ("BlockStored", "e2")} <= stored
    finally:
        codes = run.stop()
    assert codes == [0, 0, 0]
