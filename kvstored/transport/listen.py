"""Binding a gRPC server's listen addresses with one clean error when an address is unusable.

gRPC's C core reports a failed bind twice: a raw line on stderr (``E... add_port.cc:83]
Failed to add port to server: ... Address already in use``) and a ``RuntimeError`` that names
no cause (``Failed to bind to address ...; set GRPC_VERBOSITY=debug ...``). An address is
therefore bound here first with a plain socket, the way gRPC binds it (``SO_REUSEADDR``, no
``SO_REUSEPORT``: the daemons set ``grpc.so_reuseport`` 0; every resolved address, since
gRPC succeeds when any of them binds), and released at once; only an address that passes
goes to gRPC. A process that takes the port between the two binds still gets gRPC's raw line
(the error is clean all the same).
"""

from __future__ import annotations

import errno
import os
import socket
from typing import Protocol

import grpc

from kvstored.errors import ConfigInvalid


class PortBinder(Protocol):
    """What a gRPC server (``grpc.server`` / ``grpc.aio.server``) offers to bind an address."""

    def add_insecure_port(self, address: str) -> int:
        """Bind ``address``; returns the port (0 for a unix socket)."""
        ...

    def add_secure_port(self, address: str, server_credentials: grpc.ServerCredentials) -> int:
        """Bind ``address`` with TLS; returns the port."""
        ...


def _host_port(address: str) -> tuple[str, int] | None:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def check_listen_address(address: str) -> str | None:
    """Why ``address`` cannot be bound now, or None when it can (or is not checked).

    Args:
        address: a gRPC listen address: ``HOST:PORT``, ``[V6]:PORT`` or ``unix:PATH``.
            Port 0 (any free port) and other schemes are not checked.

    Returns:
        A short reason (the OS's, ``"Address already in use"``, as the data plane's and the
        metrics' bind errors say it; ``"host 'x' does not resolve (...)"``, ...).
    """
    if address.startswith("unix:"):
        path = address.removeprefix("unix:").removeprefix("//")  # unix:PATH, unix:///ABS
        parent = os.path.dirname(path) or "."
        if not os.path.isdir(parent):
            return f"directory {parent} does not exist"
        if not os.access(parent, os.W_OK | os.X_OK):
            return f"directory {parent} is not writable"
        return None
    parsed = _host_port(address)
    if parsed is None or parsed[1] == 0 or "://" in address:
        return None
    host, port = parsed
    if port > 65535:  # gRPC would bind the port modulo 65536 (99999 -> 34463) without a word
        return f"port {port} is out of range 0..65535"
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"host {host!r} does not resolve ({exc.strerror})"
    reasons: list[str] = []
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            try:
                sock.bind(sockaddr)
            except OSError as exc:
                reasons.append(exc.strerror or errno.errorcode.get(exc.errno or 0, str(exc)))
                continue
        return None  # one bindable address is enough for gRPC
    return reasons[0] if reasons else f"host {host!r} resolves to no address"


def add_grpc_port(server: PortBinder, address: str, setting: str, *,
                  credentials: grpc.ServerCredentials | None = None) -> int:
    """Bind ``server`` to ``address``, or raise one clean error naming the setting.

    Args:
        server: the gRPC server (not started yet).
        address: a listen address (see :func:`check_listen_address`).
        setting: the config key that holds ``address`` (``"node.listen"``), named in the error.
        credentials: TLS server credentials (kvstored.security.tls.port_credentials); None =
            plaintext (a unix socket, or no ``[tls]``).

    Returns:
        The bound port (0 for a unix socket).

    Raises:
        ConfigInvalid: the address is in use, not permitted, unresolvable or otherwise
            refused; the message names ``address``, the reason and ``setting``.
    """
    reason = check_listen_address(address)
    if reason is None:
        try:
            if credentials is not None:
                return server.add_secure_port(address, credentials)
            return server.add_insecure_port(address)
        except RuntimeError:
            reason = "gRPC could not bind it (in use or not permitted)"
    raise ConfigInvalid(f"cannot listen on {address}: {reason}; change {setting}")
