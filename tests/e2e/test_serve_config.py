"""``kvstored serve`` refuses bad settings with exit code 2 and a message naming the key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _serve(workdir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "kvstored.cli.main", "serve", "--listen", f"unix:{workdir}/x.sock",
           "--metrics-address", "", "--data-address", "127.0.0.1:0", "--arena-dir", str(workdir),
           "--ssd-dir", str(workdir / "ssd"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})}, cwd=workdir)


def test_serve_max_block_bytes_2gib_is_a_config_error_not_an_overflow(workdir: Path) -> None:
    r = _serve(workdir, "--dram-size", "4GiB", env={"KVSTORED_NODE__MAX_BLOCK_BYTES": "2GiB"})
    assert r.returncode == 2, r.stderr
    assert "KVSTORED_NODE__MAX_BLOCK_BYTES" in r.stderr and "2146435071" in r.stderr
    assert "Traceback" not in r.stderr and "OverflowError" not in r.stderr
    assert not (workdir / "x.sock").exists()


def test_serve_empty_ssd_dir_is_refused(workdir: Path) -> None:
    cmd = [sys.executable, "-m", "kvstored.cli.main", "serve", "--listen", f"unix:{workdir}/x.sock",
           "--metrics-address", "", "--data-address", "127.0.0.1:0", "--ssd-dir", ""]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=workdir)
    assert r.returncode == 2 and "node.ssd_dir (flag --ssd-dir): is empty" in r.stderr, r.stderr
    assert os.listdir(workdir) == []  # nothing created in the current directory


def test_serve_ssd_cap_larger_than_the_disk_is_refused_before_binding(workdir: Path) -> None:
    st = os.statvfs(workdir)
    too_big = st.f_blocks * st.f_frsize + (1 << 30)
    r = _serve(workdir, "--dram-size", "1MiB", "--ssd-size", str(too_big))
    assert r.returncode == 2 and "node.ssd_size_bytes (flag --ssd-size)" in r.stderr, r.stderr
    assert not (workdir / "x.sock").exists()
    assert not [n for n in os.listdir(workdir) if n.endswith(".arena")]


def test_an_empty_node_id_exits_2_naming_the_flag(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kvstored.cli.main", "node", "--master", "127.0.0.1:1",
         "--node-id", "", "--listen", f"unix:{tmp_path}/n.sock"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert out.returncode == 2, out.stderr
    assert "--node-id" in out.stderr and "1..128 printable ASCII" in out.stderr
    assert "master_link_failed" not in out.stderr


def test_a_held_ssd_dir_exits_2_like_every_config_error(workdir: Path) -> None:
    import fcntl

    (workdir / "ssd").mkdir()
    fd = os.open(workdir / "ssd" / "kvstored.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a live daemon holds it
        os.pwrite(fd, b"4242\n", 0)
        r = _serve(workdir, "--dram-size", "1MiB", "--ssd-size", "8MiB")
    finally:
        os.close(fd)
    assert r.returncode == 2, r.stderr
    assert "already in use by another kvstored process (pid 4242)" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("daemon", ["serve", "master"])
def test_a_port_in_use_is_one_clean_message(workdir: Path, daemon: str) -> None:
    """No raw gRPC log line (``add_port.cc ... Failed to add port``) before the message."""
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        addr = f"127.0.0.1:{held.getsockname()[1]}"
        if daemon == "serve":
            r = _serve(workdir, "--dram-size", "1MiB", "--ssd-size", "0", "--listen", addr)
            setting = "node.listen"
        else:
            r = subprocess.run(
                [sys.executable, "-m", "kvstored.cli.main", "master", "--listen", addr,
                 "--metrics-listen", "", "--data-dir", str(workdir / "master")],
                capture_output=True, text=True, timeout=60, cwd=workdir, check=False)
            setting = "master.listen"
    assert r.returncode == 2, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if "[info" not in ln]
    assert errors == [(f"kvstored: cannot listen on {addr}: Address already in use; "
                       f"change {setting}")], r.stderr
