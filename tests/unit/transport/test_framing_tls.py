"""The data plane's socket helpers over TLS (kvstored/transport/framing.py): ``send_all``
without ``sendmsg``, ``Reader`` without ``MSG_WAITALL``, and deadlines that end a TLS read
(a kernel ``SO_RCVTIMEO`` would make OpenSSL retry a blocking read forever, so over TLS the
socket's own timeout is armed instead). A socketpair with a TLS handshake, no network."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvstored.security.certs import init_cluster_certs
from kvstored.security.tls import TlsFiles
from kvstored.transport.framing import Reader, send_all


@pytest.fixture(scope="module")
def tls_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ssl.SSLSocket, ssl.SSLSocket]]:
    d: Path = tmp_path_factory.mktemp("certs")
    init_cluster_certs(d, nodes=["a"], engines=[], admins=[])
    files = TlsFiles.load(d / "node-a.pem", d / "node-a.key", d / "ca.pem")
    a, b = socket.socketpair()
    a.settimeout(10)
    b.settimeout(10)
    server: list[ssl.SSLSocket] = []
    t = threading.Thread(target=lambda: server.append(files.server_context().wrap_socket(a, server_side=True)))
    t.start()
    client = files.client_context().wrap_socket(b, server_hostname="localhost")
    t.join(10)
    yield server[0], client
    server[0].close()
    client.close()


def test_send_all_and_reader_move_every_byte_over_tls(tls_pair: tuple[ssl.SSLSocket, ssl.SSLSocket]) -> None:
    server, client = tls_pair
    payload = bytes(range(256)) * 4096  # 1 MiB: many TLS records
    parts = [b"head", memoryview(payload), b"", b"tail"]
    got = bytearray(len(payload))
    reader = Reader(server, deadline=time.monotonic() + 10)
    sender = threading.Thread(target=send_all, args=(client, parts, time.monotonic() + 10))
    sender.start()
    assert reader.read_exact(4) == b"head"
    reader.read_into(memoryview(got))
    assert reader.read_exact(4) == b"tail"
    sender.join(10)
    assert bytes(got) == payload


@pytest.mark.timeout(30)  # a regression spins in OpenSSL's read: fail, do not hang the suite
def test_a_tls_read_past_its_deadline_raises_timeout_error(tls_pair: tuple[ssl.SSLSocket, ssl.SSLSocket]) -> None:
    server, _ = tls_pair
    reader = Reader(server, deadline=time.monotonic() + 0.05)  # the peer sends nothing
    with pytest.raises(TimeoutError):
        reader.read_exact(16)  # (pytest-timeout guards a read that would never end)
