"""README "Scheduler and trace replay", **On a cluster**: its bash and python blocks run as
written (the runner of tests/e2e/test_readme_cluster.py: ports mapped to free loopback
ports, daemons waited for until ``ready`` and stopped with SIGTERM)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from test_readme import Block, read_blocks
from test_readme_cluster import ROOT, Runner, _wait, commands

MARK = "test_readme_scheduler.py"


def scheduler_blocks() -> list[Block]:
    """The README blocks this module runs, in README order."""
    return [b for b in read_blocks((ROOT / "README.md").read_text())
            if b.skip_reason and MARK in b.skip_reason]


def test_scheduler_on_a_cluster_runs_as_written(workdir: Path) -> None:
    blocks = scheduler_blocks()
    assert [b.lang for b in blocks] == ["bash", "python"], blocks
    daemons, python = blocks
    run = Runner(workdir, [b.code for b in blocks])
    try:
        for cmd in commands(daemons.code):
            run.run(cmd)
        master = run.map["127.0.0.1:7590"]
        _wait("both nodes healthy", lambda: sorted(
            (n["node_id"], n["health"]) for n in run.ctl_json(master, "nodes")["nodes"])
            == [("s1", "healthy"), ("s2", "healthy")])
        r = subprocess.run([sys.executable, "-c", run.sub(python.code)], cwd=workdir,
                           env=run.env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == [
            "prefill on B, prefix from s1: 8 blocks copied (524288 bytes)",
            "s2 holds 8 blocks before its engine asks"], r.stdout
    finally:
        codes = run.stop()
    assert codes == [0, 0, 0]
