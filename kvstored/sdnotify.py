"""systemd readiness notification (sd_notify(3)) without libsystemd: one datagram to
``$NOTIFY_SOCKET``. A leaf module shared by the node and master daemons."""

from __future__ import annotations

import os
import socket

import structlog

log = structlog.get_logger(__name__)


def sd_notify(state: str) -> bool:
    """Send a systemd notification (``READY=1``, ``STOPPING=1``...) if NOTIFY_SOCKET is set.

    Returns:
        True if a notification was sent.
    """
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]  # abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(addr)
            s.sendall(state.encode())
    except OSError as exc:
        log.warning("sd_notify_failed", state=state, error=str(exc))
        return False
    return True
