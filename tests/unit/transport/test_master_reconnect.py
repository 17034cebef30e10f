"""Channels to a master retry a refused connection at least every second (bounded reconnect
backoff), so a master restarted at the same address is found within about a second.

gRPC's default backoff grows 1 s x 1.6 per failed attempt up to 120 s: a node whose master was
down for ten seconds kept failing its lookups fast (Unavailable) for seconds after the master
was back, and a read through it missed its whole batch. The test counts connection attempts
at a listener that accepts and drops every connection (what a dead master looks like to gRPC's
handshake): in 6 s the default backoff makes at most 5 (0, 1, 2.6, 5.2 s, jitter 20 %),
the bounded one about 10.
"""

from __future__ import annotations

import socket
import threading
import time

from kvstored.errors import KvstoredError
from kvstored.transport.master_rpc import MasterClient
from kvstored.transport.master_targets import RECONNECT_BACKOFF_OPTIONS


def test_a_master_client_retries_a_refused_master_at_least_every_second() -> None:
    assert dict(RECONNECT_BACKOFF_OPTIONS)["grpc.max_reconnect_backoff_ms"] <= 1000
    attempts = 0
    with socket.socket() as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", 0))
        srv.listen(64)

        def refuse() -> None:
            nonlocal attempts
            while True:
                try:
                    conn, _ = srv.accept()
                except OSError:
                    return
                attempts += 1
                conn.close()

        threading.Thread(target=refuse, daemon=True).start()
        with MasterClient(f"127.0.0.1:{srv.getsockname()[1]}", timeout_s=0.2) as m:
            t0 = time.monotonic()
            failures = 0
            while time.monotonic() - t0 < 6.0:
                try:
                    m.list_nodes()
                except KvstoredError:
                    failures += 1
                time.sleep(0.05)
            seen = attempts
        srv.shutdown(socket.SHUT_RDWR)
    assert failures > 0
    assert seen >= 7, f"{seen} connection attempts in 6 s: the reconnect backoff is not bounded at 1 s"
