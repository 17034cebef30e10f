"""README "Operating kvstored securely": its bash and python blocks run as written, ports
substituted, with the runner of tests/e2e/test_readme_cluster.py (a line ending in ``&``
starts a daemon and waits for ``ready``; any other line must exit 0). A refusal is written
``! kvstorectl ...`` (it must fail); it runs here without the ``!`` so that its exit code
and message are checked too: a refusal for the wrong reason would not pass.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from test_readme import Block, read_blocks
from test_readme_cluster import ROOT, Runner, commands

MARK = "test_readme_security.py"


def security_blocks() -> list[Block]:
    """The README blocks this module runs, in README order."""
    return [b for b in read_blocks((ROOT / "README.md").read_text())
            if b.skip_reason and MARK in b.skip_reason]


def test_the_readme_has_the_security_blocks() -> None:
    blocks = security_blocks()
    assert [b.lang for b in blocks] == ["bash", "python", "bash"], blocks
    assert [len(commands(blocks[i].code)) for i in (0, 2)] == [4, 4]


def test_secure_cluster_commands_run_as_written(workdir: Path) -> None:
    daemons, python, ctl = security_blocks()
    run = Runner(workdir, [daemons.code, python.code, ctl.code])
    try:
        for cmd in commands(daemons.code):
            run.run(cmd)
        r = subprocess.run(["python", "-c", run.sub(python.code)], cwd=workdir, env=run.env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "put through a, got 100000 bytes through b, over mTLS"
        outs = []
        for cmd in commands(ctl.code):  # "! cmd" must fail: run without the "!" to see how
            if cmd.startswith("! "):
                outs.append(subprocess.run(["bash", "-c", run.sub(cmd.removeprefix("! "))],
                                           cwd=workdir, env=run.env, capture_output=True,
                                           text=True, timeout=120))
            else:
                outs.append(run.run(cmd))
        assert "healthy" in outs[0].stdout and "127.0.0.1" in outs[0].stdout
        assert outs[1].returncode == 3 and "UNAVAILABLE" in outs[1].stderr, outs[1]
        assert "if the server uses TLS, pass --tls-cert" in outs[1].stderr
        assert outs[2].returncode == 4, outs[2]
        assert "PERMISSION_DENIED: NodeService.Remove needs role admin" in outs[2].stdout, outs[2]
        assert "evicted 2 replicas" in outs[3].stdout
    finally:
        codes = run.stop()
    assert codes == [0, 0, 0]
