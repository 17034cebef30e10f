"""A daemon removes only its own stale arena file; ``kvstored cleanup`` removes the others.

Arena files are ``kvstored-<node>-<pid>.arena`` in the arena directory (/dev/shm by default),
shared by every node daemon of the host. At start a node reclaims the file a dead earlier
daemon *of its own node id* left (its tmpfs memory is otherwise lost), never another node's:
that one is named by ``kvstored cleanup --dry-run`` and removed by ``kvstored cleanup``,
which says what it removes and refuses a file whose owner still runs. Real processes: a real
``kvstored serve`` in a private arena directory, the CLI as a user runs it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_helpers import ServeProcess
from thread_helpers import wait_until


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(30)
    return p.pid


def _cleanup(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvstored.cli.main", "cleanup", *args],
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def arena_dir() -> Iterator[Path]:
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    d = Path(tempfile.mkdtemp(prefix="kvarena", dir=base))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_a_node_reclaims_only_its_own_stale_arena_and_cleanup_removes_the_rest(
    arena_dir: Path,
) -> None:
    dead = _dead_pid()
    others = arena_dir / f"kvstored-other-{dead}.arena"  # another node of this host, dead
    own = arena_dir / f"kvstored-n1-{dead}.arena"  # this node's earlier daemon, dead
    for f in (others, own):
        f.write_bytes(b"\0" * 4096)
    work = Path(tempfile.mkdtemp(prefix="kvac", dir="/tmp"))
    node = ServeProcess(work, node_id="n1", extra=["--arena-dir", str(arena_dir)])
    try:
        node.start()
        live = Path(node.arena)
        assert live.parent == arena_dir and live.exists()
        assert not own.exists(), "the node left its own dead daemon's arena"
        assert others.exists(), "the node removed another node's arena file"

        listed = _cleanup("--arena-dir", str(arena_dir), "--dry-run")
        assert listed.returncode == 0, listed.stderr
        assert f"would remove {others}" in listed.stdout
        assert f"keep {live}" in listed.stdout and "running" in listed.stdout
        assert others.exists()

        refused = _cleanup("--arena-dir", str(arena_dir), str(live))
        assert refused.returncode == 1
        assert str(live) in refused.stderr and "running" in refused.stderr
        assert live.exists()

        done = _cleanup("--arena-dir", str(arena_dir))
        assert done.returncode == 0, done.stderr
        assert f"removed {others}" in done.stdout
        assert not others.exists() and live.exists()
    finally:
        node.kill()
        shutil.rmtree(work, ignore_errors=True)


def test_an_arena_whose_owner_is_a_zombie_is_stale(arena_dir: Path) -> None:
    # A SIGKILLed daemon stays a zombie until its parent reaps it; its mapping is gone, so
    # its arena file is stale though kill(pid, 0) still answers.
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        def exited_unreaped() -> bool:  # no wait() yet: a zombie
            stat = Path(f"/proc/{zombie.pid}/stat").read_bytes()
            return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] == b"Z"

        wait_until(exited_unreaped, 30.0, "the child to exit")
        stale = arena_dir / f"kvstored-z-{zombie.pid}.arena"
        stale.write_bytes(b"\0" * 4096)
        listed = _cleanup("--arena-dir", str(arena_dir), "--dry-run")
        assert listed.returncode == 0, listed.stderr
        assert f"would remove {stale}" in listed.stdout
    finally:
        zombie.wait(30)


def test_cleanup_of_a_missing_arena_dir_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    got = _cleanup("--arena-dir", str(missing))
    assert got.returncode == 2
    assert str(missing) in got.stderr and "does not exist" in got.stderr
