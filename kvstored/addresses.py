"""Addresses kvstored processes listen on and dial, parsed in one place (a leaf: no I/O).

Forms::

    unix:PATH, unix://ABS_PATH   a node's gRPC unix socket (PATH relative to the cwd)
    HOST:PORT, [V6]:PORT         TCP: gRPC of a node or master, the data plane, metrics

A client with no address dials :func:`default_address`: ``$KVSTORED_ADDRESS``, else the local
node's unix socket (:func:`default_socket_path`).
"""

from __future__ import annotations

import os
import pathlib

from kvstored.errors import InvalidArgument

UNIX_PREFIX = "unix:"


def is_unix_address(address: str) -> bool:
    """Whether ``address`` names a unix socket (``unix:...``); HOST:PORT and ``""`` are not."""
    return address.startswith(UNIX_PREFIX)


def unix_socket_path(address: str) -> str:
    """The absolute socket path of ``unix:PATH`` or ``unix://ABS_PATH``.

    Raises:
        InvalidArgument: ``address`` is not a ``unix:`` address, or its path is empty.
    """
    if not is_unix_address(address):
        raise InvalidArgument(f"expected unix:PATH for a unix socket address, got {address!r}")
    path = address[len(UNIX_PREFIX) :]
    if path.startswith("//"):
        path = path[2:]
    if not path:
        raise InvalidArgument(f"address {address!r} has an empty socket path")
    return os.path.abspath(path)


def parse_host_port(address: str) -> tuple[str, int]:
    """Split ``"host:port"`` / ``"[v6]:port"`` into ``(host, port)``, brackets removed.

    Port 0 is accepted (bind: any free port).

    Raises:
        InvalidArgument: malformed address (no ``:``, empty host, port not in 0..65535).
    """
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise InvalidArgument(f"expected HOST:PORT for a TCP address, got {address!r}")
    if int(port) > 65535:
        raise InvalidArgument(f"expected HOST:PORT for a TCP address with a port in 0..65535, got "
                              f"{address!r} (port {int(port)} out of range)")
    return host.strip("[]"), int(port)


def format_host_port(host: str, port: int) -> str:
    """``host:port``, bracketing IPv6 hosts (``[::1]:7070``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_address(address: str) -> tuple[str, bool]:
    """A node address -> ``(grpc target, is_unix)``.

    Accepts ``unix:PATH``, ``unix://ABS_PATH`` (the target is ``unix:`` + the absolute path)
    and ``HOST:PORT`` (returned as given).

    Raises:
        InvalidArgument: anything else (not a string, empty, an empty socket path, a
            malformed HOST:PORT, a comma list or an ``etcd://`` address of masters); the
            message shows what was received.
    """
    if not isinstance(address, str) or not address:
        raise InvalidArgument(f"address must be 'unix:PATH' or 'HOST:PORT'; got {address!r}")
    if is_unix_address(address):
        return f"{UNIX_PREFIX}{unix_socket_path(address)}", True
    if "," in address or address.startswith("etcd://"):
        raise InvalidArgument(
            "a node address is one 'unix:PATH' or 'HOST:PORT' (a list of masters or an etcd:// "
            f"address names the masters, for cluster commands and a node's --master); got {address!r}")
    try:
        parse_host_port(address)
    except InvalidArgument as exc:
        raise InvalidArgument(f"a node address is 'unix:PATH' or 'HOST:PORT'; got {address!r} "
                              f"({exc})") from None
    return address, False


def default_runtime_dir() -> pathlib.Path:
    """Where the daemon puts its unix socket by default (per user, on local disk)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and os.path.isdir(base):
        return pathlib.Path(base) / "kvstored"
    return pathlib.Path(f"/tmp/kvstored-{os.getuid()}")


def default_socket_path() -> pathlib.Path:
    """The default unix socket of the local node daemon."""
    return default_runtime_dir() / "node.sock"


def default_address() -> str:
    """The address a client uses when none is given: ``$KVSTORED_ADDRESS`` or the unix socket."""
    return os.environ.get("KVSTORED_ADDRESS") or f"{UNIX_PREFIX}{default_socket_path()}"
