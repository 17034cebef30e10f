"""Helpers of the e2e tests: a real ``kvstored serve`` process and key-derived values."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

READY_TIMEOUT_S = 60.0


def value_for(key: bytes) -> bytes:
    """The one correct value of a key: its size and bytes are derived from the key."""
    size = (16 << 10) + (key[0] << 10) + key[1]
    seed = int.from_bytes(key[:8], "little")
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


class ServeProcess:
    """``python -m kvstored.cli.main serve`` on a temporary socket, port-0 TCP addresses."""

    def __init__(self, workdir: Path, *, node_id: str = "e2e", dram_size: str = "16MiB",
                 ssd_size: str = "64MiB", extra: list[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.workdir = workdir
        self.socket_path = str(workdir / f"{node_id}.sock")
        self.args = [
            sys.executable, "-m", "kvstored.cli.main", "serve",
            "--listen", f"unix:{self.socket_path}", "--listen", "127.0.0.1:0",
            "--data-address", "127.0.0.1:0", "--metrics-address", "127.0.0.1:0",
            "--dram-size", dram_size, "--ssd-dir", str(workdir / "ssd"), "--ssd-size", ssd_size,
            "--node-id", node_id, *(extra or []),
        ]
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[str] = []
        self.grpc: list[str] = []
        self.data = ""
        self.metrics = ""
        self.arena = ""
        self.log_path = workdir / f"{node_id}.log"

    @property
    def unix_address(self) -> str:
        return f"unix:{self.socket_path}"

    @property
    def tcp_address(self) -> str:
        return next(a for a in self.grpc if not a.startswith("unix:"))

    def start(self) -> ServeProcess:
        log = open(self.log_path, "a")
        self.proc = subprocess.Popen(
            self.args, stdout=subprocess.PIPE, stderr=log, text=True, env=self.env,
            cwd=self.workdir,
        )
        log.close()
        ready = threading.Event()

        def read() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                line = line.rstrip("\n")
                self.lines.append(line)
                parts = line.split()
                if line.startswith("listening grpc "):
                    self.grpc.append(parts[2])
                elif line.startswith("listening data "):
                    self.data = parts[2]
                elif line.startswith("listening metrics "):
                    self.metrics = parts[2]
                elif line.startswith("arena "):
                    self.arena = parts[1]
                elif line == "ready":
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(
                    f"kvstored serve did not become ready (rc={self.proc.returncode}):\n"
                    + self.log_path.read_text()[-3000:]
                )
        return self

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout_s: float = 60.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout_s)

    def terminate(self, timeout_s: float = 60.0) -> int:
        self.signal(signal.SIGTERM)
        return self.wait(timeout_s)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        if self.arena and os.path.exists(self.arena):
            os.unlink(self.arena)  # a SIGKILLed daemon cannot unlink its arena itself

    def log(self) -> str:
        return self.log_path.read_text()


def key_of(writer: int, i: int) -> bytes:
    """The ``i``-th key of put-storm writer ``writer`` (16 bytes, deterministic)."""
    return hashlib.sha256(f"writer{writer}:{i}".encode()).digest()[:16]


def small_value_for(key: bytes) -> bytes:
    """The one correct value of a put-storm key: 4-8 KiB derived from the key (small, so a
    storm's blocks all fit the nodes of a test and every committed block stays readable)."""
    size = 4096 + key[0] * 16 + key[1] % 16
    seed = int.from_bytes(key[:8], "little")
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()
