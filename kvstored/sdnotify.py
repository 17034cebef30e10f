"""Daemon lifecycle helpers shared by the node and master daemons (a leaf module: they never
import each other): systemd readiness notification (sd_notify(3)) without libsystemd, one
datagram to ``$NOTIFY_SOCKET``, and the SIGTERM/SIGINT stop event."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import Iterator

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


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def stop_event_on_signals() -> Iterator[asyncio.Event]:
    """An Event set by SIGTERM or SIGINT while the block runs (loop only; handlers removed on
    exit). Enter it before the daemon starts, so a signal sent as soon as it is up is seen."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    try:
        yield stop
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
