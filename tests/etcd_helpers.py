"""A real etcd (Debian's ``etcd-server``, /usr/bin/etcd) on free loopback ports, for the HA tests.

:class:`EtcdServer` starts one single-member etcd with a temporary data dir, listening for
clients on ``num_client_ports`` loopback ports (one URL each in ``--listen-client-urls``, so a
test can cut one master's port and leave another's), waits until it answers, and
:meth:`EtcdServer.stop` kills it and removes the data dir. :func:`require_etcd` is what the
``etcd`` fixture (tests/conftest.py) calls first: without the binary a test fails under
``CI=true`` (CI installs it: scripts/setup-system.sh) and skips elsewhere.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

ETCD_BINARY = "etcd"
READY_TIMEOUT_S = 30.0


def require_etcd() -> str:
    """The etcd binary's path; fails the test under CI=true when missing, else skips it."""
    path = shutil.which(ETCD_BINARY)
    if path is None:
        msg = "etcd is not installed (apt-get install etcd-server; scripts/setup-system.sh)"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback TCP ports free right now (bound, then released together)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class EtcdServer:
    """One etcd member on loopback.

    Attributes:
        client_ports: the client ports (``endpoints`` as ``127.0.0.1:PORT``).
        data_dir: its temporary data directory (removed by :meth:`stop`).
    """

    def __init__(self, binary: str, *, num_client_ports: int = 1) -> None:
        self.binary = binary
        ports = free_ports(num_client_ports + 1)
        self.client_ports = ports[:-1]
        self.peer_port = ports[-1]
        self.data_dir = Path(tempfile.mkdtemp(prefix="kvetcd", dir="/tmp"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoints(self) -> list[str]:
        """``127.0.0.1:PORT`` of every client port."""
        return [f"127.0.0.1:{p}" for p in self.client_ports]

    def url(self, i: int = 0) -> str:
        """``http://127.0.0.1:PORT`` of client port ``i``."""
        return f"http://{self.endpoints[i]}"

    def start(self) -> EtcdServer:
        """Start etcd; returns once every client port accepts connections.

        Raises:
            AssertionError: not ready within READY_TIMEOUT_S (its log's tail attached).
        """
        peer = f"http://127.0.0.1:{self.peer_port}"
        log = open(self.data_dir / "etcd.log", "wb")  # noqa: SIM115 (kept open for the process)
        self.proc = subprocess.Popen([
            self.binary, "--name", "kvtest", "--data-dir", str(self.data_dir / "data"),
            "--listen-client-urls", ",".join(self.url(i) for i in range(len(self.client_ports))),
            "--advertise-client-urls", self.url(0),
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"kvtest={peer}", "--initial-cluster-state", "new",
            "--log-level", "warn",
        ], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + READY_TIMEOUT_S
        pending = list(self.client_ports)
        while pending:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop(remove=False)
                raise AssertionError("etcd did not start:\n"
                                     + (self.data_dir / "etcd.log").read_text()[-3000:])
            try:
                socket.create_connection(("127.0.0.1", pending[0]), timeout=0.5).close()
                pending.pop(0)
            except OSError:
                time.sleep(0.05)
        return self

    def stop(self, *, remove: bool = True) -> None:
        """Kill etcd and (``remove``) its data dir (idempotent)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        if remove:
            shutil.rmtree(self.data_dir, ignore_errors=True)
