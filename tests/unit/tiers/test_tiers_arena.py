"""DramArena: refuses an arena larger than its tmpfs, prefaults in the background."""

from __future__ import annotations

import errno
import os
import pathlib
from types import SimpleNamespace

import pytest

from kvstored.tiers.dram import DramArena


def test_arena_larger_than_free_tmpfs_space_is_refused(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "statvfs", lambda _p: SimpleNamespace(f_bavail=10, f_frsize=4096))
    with pytest.raises(OSError, match=r"has 40960 bytes free but the DRAM tier needs \d+ \(1048576 of blocks") as exc:
        DramArena(1 << 20, arena_dir=tmp_path)
    assert exc.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []  # nothing left behind


def _mapping_rss_bytes(path: str) -> int:
    """Resident bytes of this process's mapping of ``path`` (/proc/self/smaps ``Rss:``)."""
    rss_kib, in_mapping = 0, False
    for line in pathlib.Path("/proc/self/smaps").read_text().splitlines():
        first = line.split(maxsplit=1)[0]
        if "-" in first and not first.endswith(":"):  # a mapping header line
            in_mapping = line.rstrip().endswith(" " + path)
        elif in_mapping and first == "Rss:":
            rss_kib += int(line.split()[1])
    return rss_kib << 10


def test_prefault_runs_in_background_and_close_stops_it(tmp_path: pathlib.Path) -> None:
    size = 8 << 20
    arena = DramArena(size, arena_dir=tmp_path)
    assert arena.path is not None
    arena.view[:5] = b"hello"
    # mapped lazily: one page of blocks touched so far (plus the slot headers, stamped odd)
    assert _mapping_rss_bytes(arena.path) <= (1 << 20) + arena.layout.index_off - size
    arena.start_prefault(chunk_bytes=1 << 20)
    assert arena._prefault_thread is not None
    arena._prefault_thread.join(30)
    assert not arena._prefault_thread.is_alive()
    # every page populated, not just attempted (the slot headers and index after the blocks too)
    assert _mapping_rss_bytes(arena.path) == arena.layout.total_bytes
    assert bytes(arena.view[:5]) == b"hello"  # populating never changes written bytes
    path = arena.path
    arena.close()
    assert path is not None and not os.path.exists(path)
    arena.start_prefault()  # after close: a no-op, not a crash


def test_stale_arena_of_dead_daemon_is_reclaimed(tmp_path: pathlib.Path) -> None:
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(dead.stdout)
    stale = tmp_path / f"kvstored-node-{dead_pid}.arena"
    live = tmp_path / f"kvstored-other-{os.getppid()}.arena"
    unrelated = tmp_path / "not-ours.arena"
    for p in (stale, live, unrelated):
        p.write_bytes(b"x")
    arena = DramArena(1 << 20, arena_dir=tmp_path)
    try:
        assert not stale.exists()
        assert live.exists() and unrelated.exists()
    finally:
        arena.close()
