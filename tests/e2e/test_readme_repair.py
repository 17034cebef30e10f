"""README "Replicas, repair and drain": its blocks run as written (ports substituted, with
test_readme_cluster's Runner): a master and two nodes, a block put through r1, its factor
set to 2 (the repair copies it to r2), r1 drained (it leaves only once its block has
another original), and the cluster views afterwards."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from test_readme import Block, read_blocks
from test_readme_cluster import ROOT, Runner, commands

MARK = "test_readme_repair.py"


def repair_blocks() -> list[Block]:
    """The README blocks this module runs, in README order."""
    return [b for b in read_blocks((ROOT / "README.md").read_text())
            if b.skip_reason and MARK in b.skip_reason]


def test_replicate_and_drain_commands_run_as_written(workdir: Path) -> None:
    daemons, python, ctl = repair_blocks()
    assert [b.lang for b in (daemons, python, ctl)] == ["bash", "python", "bash"]
    run = Runner(workdir, [daemons.code, python.code, ctl.code])
    try:
        for cmd in commands(daemons.code):
            run.run(cmd)
        r = subprocess.run([sys.executable, "-c", run.sub(python.code)], cwd=workdir,
                           env=run.env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "stored on r1"
        replicate, drain, nodes, where = (run.run(cmd) for cmd in commands(ctl.code))
        assert "replicas" in replicate.stdout and " 2 " in replicate.stdout
        assert "left" in drain.stdout  # kvstorectl drain waits until the node left
        assert "1 live, 1 departed" in nodes.stdout and "left" in nodes.stdout
        assert "r2" in where.stdout and "r1" not in where.stdout  # re-homed before r1 left
        ctl_argv = commands(ctl.code)[0].split(" replicate ")[0]  # kvstorectl --address MASTER
        unknown = run.run(f"{ctl_argv} drain no-such-node", check=False)
        assert unknown.returncode == 2, (unknown.returncode, unknown.stderr)  # README: unknown node id
        assert "no-such-node" in unknown.stderr
        over = run.run(f"{ctl_argv} replicate 101112131415161718191a1b1c1d1e1f --replicas 3")
        assert "more than the 1 live node" in over.stderr, over.stderr  # r2 alone: never silent
    finally:
        codes = run.stop()
    assert codes == [0, 0, 0]
