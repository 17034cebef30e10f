"""README "Running under systemd" and the config commands: their bash blocks run as written.

The blocks marked ``<!-- readme-test: skip run by tests/e2e/test_readme_systemd.py ... -->``
run here, in README order, each command with ``bash -c`` from the repository root (the
install steps copy files out of a checkout), with ``DESTDIR`` set to a scratch root (empty on
a real host) and ``kvstored`` a shim onto this checkout's entry point. Every command must exit
0; then the scratch root must hold what the steps promise (the service user, the units, the
configs). The ``systemctl`` block needs a real systemd host (PID 1) and is only checked to be
marked so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_readme import read_blocks
from test_readme_cluster import commands

ROOT = Path(__file__).resolve().parents[2]
MARK = "test_readme_systemd.py"


def _blocks() -> list[str]:
    return [b.code for b in read_blocks((ROOT / "README.md").read_text())
            if b.lang == "bash" and b.skip_reason and MARK in b.skip_reason]


@pytest.mark.skipif(shutil.which("systemd-sysusers") is None,
                    reason="systemd-sysusers (Debian package `systemd`, scripts/setup-system.sh) is not installed")
def test_readme_systemd_and_config_blocks_run(tmp_path: Path) -> None:
    blocks = _blocks()
    assert len(blocks) == 2, "README lost its config or its systemd install block"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "kvstored"
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m kvstored.cli.main \"$@\"\n")
    shim.chmod(0o755)
    dest = tmp_path / "root"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSTORED_")}
    env |= {"PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", "DESTDIR": str(dest),
            "HOME": str(tmp_path), "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))}
    outputs = {}
    for cmd in (c for block in blocks for c in commands(block)):
        r = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"README command failed: {cmd}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
        outputs[cmd] = r.stdout
    shown = next(out for cmd, out in outputs.items() if "--output json" in cmd)
    assert json.loads(shown)["node"]["dram_size_bytes"] == {
        "value": 2 << 30, "source": "env var KVSTORED_NODE__DRAM_SIZE_BYTES"}
    assert any(out.endswith(": ok\n") for out in outputs.values())
    passwd = (dest / "etc" / "passwd").read_text()
    assert passwd.startswith("kvstored:") and ":/var/lib/kvstored:" in passwd
    assert (dest / "etc" / "group").read_text().startswith("kvstored:")
    for unit in ("kvstored-node.service", "kvstored-master.service"):
        assert (dest / "etc/systemd/system" / unit).read_bytes() == (ROOT / "systemd" / unit).read_bytes()
    assert {p.name for p in (dest / "etc/kvstored").iterdir()} == {"node.toml", "node.env", "master.toml"}


def test_the_systemctl_block_is_marked_as_needing_systemd() -> None:
    blocks = read_blocks((ROOT / "README.md").read_text())
    (block,) = [b for b in blocks if b.lang == "bash" and "systemctl enable --now kvstored-node" in b.code]
    assert block.skip_reason and "real systemd host" in block.skip_reason
