"""Run a private ``kvstored serve`` process for the demo (temp socket, ports, SSD dir).

The daemon prints ``listening grpc ADDR`` lines and then ``ready`` on stdout; its logs go to
``WORKDIR/kvstored.log``. :meth:`ManagedDaemon.restart` sends SIGTERM (the daemon drains and
flushes its SSD index) and starts it again on the same SSD directory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import structlog

from kvstored.errors import Unavailable

log = structlog.get_logger(__name__)

READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0


class ManagedDaemon:
    """One ``kvstored serve`` child process.

    Args:
        workdir: directory for the unix socket, the SSD tier (``ssd/``) and the log.
        dram_size: DRAM tier size, e.g. ``"1GiB"``.
        ssd_size: SSD tier cap, e.g. ``"4GiB"``.
    """

    def __init__(self, workdir: Path, *, dram_size: str, ssd_size: str = "4GiB") -> None:
        self.workdir = Path(workdir)
        self.socket_path = self.workdir / "kvstored.sock"
        self.ssd_dir = self.workdir / "ssd"
        self.log_path = self.workdir / "kvstored.log"
        self.dram_size = dram_size
        self.ssd_size = ssd_size
        self.proc: subprocess.Popen[str] | None = None
        self.grpc_addresses: list[str] = []
        self.num_starts = 0

    @property
    def address(self) -> str:
        """The unix-socket address clients on this host use (shared-memory fast path)."""
        return f"unix:{self.socket_path}"

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Start the daemon and wait until it prints ``ready``.

        Raises:
            Unavailable: it exited or was not ready within ``timeout_s`` (the message holds
            the end of its log).
        """
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = [
            sys.executable, "-m", "kvstored.cli.main", "serve",
            "--listen", self.address, "--listen", "127.0.0.1:0",
            "--data-address", "127.0.0.1:0", "--metrics-address", "",
            "--dram-size", self.dram_size, "--ssd-dir", str(self.ssd_dir),
            "--ssd-size", self.ssd_size, "--node-id", "demo",
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("KVSTORED_")}
        with self.log_path.open("a") as logf:
            self.proc = subprocess.Popen(
                args, stdout=subprocess.PIPE, stderr=logf, text=True, env=env, cwd=self.workdir
            )
        self.num_starts += 1
        ready = threading.Event()
        self.grpc_addresses = []

        def read(proc: subprocess.Popen[str]) -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                line = line.rstrip("\n")
                if line.startswith("listening grpc "):
                    self.grpc_addresses.append(line.split()[2])
                elif line == "ready":
                    ready.set()

        threading.Thread(target=read, args=(self.proc,), daemon=True).start()
        deadline = time.monotonic() + timeout_s
        while not ready.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                rc = self.proc.poll()
                self.kill()
                raise Unavailable(
                    f"the demo's kvstored daemon did not become ready (exit code {rc}); log "
                    f"{self.log_path}:\n{self.log_tail()}"
                )
        log.info("demo_daemon_started", address=self.address, pid=self.proc.pid)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM (drain, flush the SSD index) and wait; SIGKILL after ``timeout_s``.

        Returns:
            The exit code (0 after a clean drain).
        """
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc is not None else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = -9
        log.info("demo_daemon_stopped", exit_code=rc)
        return rc

    def restart(self) -> int:
        """Stop (SIGTERM), start again on the same SSD directory; returns the stop's exit code."""
        rc = self.stop()
        self.start()
        return rc

    def kill(self) -> None:
        """SIGKILL the process if it is still running."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def log_tail(self, num_chars: int = 3000) -> str:
        """The end of the daemon's log."""
        try:
            return self.log_path.read_text(errors="replace")[-num_chars:]
        except OSError:
            return ""

    def __enter__(self) -> ManagedDaemon:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
