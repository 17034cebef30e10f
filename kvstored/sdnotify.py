"""Daemon lifecycle helpers shared by the node and master daemons (a leaf module: they never
import each other): systemd readiness notification (sd_notify(3)) without libsystemd, one
datagram to ``$NOTIFY_SOCKET``, the watchdog, and the SIGTERM/SIGINT stop event.

Watchdog (sd_watchdog_enabled(3)): with ``WatchdogSec=`` in the unit, systemd sets
``WATCHDOG_USEC`` (and ``WATCHDOG_PID``) and restarts the service when no ``WATCHDOG=1``
arrives within that time. :class:`Watchdog` pings from a task on the daemon's event loop
every half of it, never from a thread: a loop that is wedged (a blocking call, a busy
handler) stops pinging, which is exactly what systemd is asked to detect.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import Awaitable, Callable, Iterator, Mapping

import structlog

log = structlog.get_logger(__name__)


def sd_notify(state: str, *, blocking: bool = True) -> bool:
    """Send a systemd notification (``READY=1``, ``STOPPING=1``...) if NOTIFY_SOCKET is set.

    Args:
        state: the notification, ``KEY=VALUE`` lines.
        blocking: False never waits for room in the receiver's queue (a full queue drops
            the notification and returns False): what the watchdog's pings use, so a
            receiver that stopped reading cannot wedge the event loop that pings.

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
            s.setblocking(blocking)
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


WATCHDOG_PING = "WATCHDOG=1"


def _notify_nonblocking(state: str) -> bool:
    return sd_notify(state, blocking=False)


def watchdog_interval_s(environ: Mapping[str, str] | None = None, *, pid: int | None = None) -> float | None:
    """Seconds between two watchdog pings: half of ``$WATCHDOG_USEC``, or None when off.

    Off when ``WATCHDOG_USEC`` is unset or 0, or when ``WATCHDOG_PID`` names another process
    (the variables were inherited by a child, as sd_watchdog_enabled(3) says).

    Args:
        environ: environment to read (default ``os.environ``).
        pid: this process's pid (default ``os.getpid()``).

    Raises:
        ValueError: ``WATCHDOG_USEC`` or ``WATCHDOG_PID`` is set but not a non-negative
            integer (names the variable and the value received).
    """
    env = os.environ if environ is None else environ
    usec_text = env.get("WATCHDOG_USEC", "").strip()
    if not usec_text:
        return None
    if not usec_text.isdigit():
        raise ValueError(f"WATCHDOG_USEC must be a number of microseconds; got {usec_text!r}")
    pid_text = env.get("WATCHDOG_PID", "").strip()
    if pid_text:
        if not pid_text.isdigit():
            raise ValueError(f"WATCHDOG_PID must be a process id; got {pid_text!r}")
        if int(pid_text) != (os.getpid() if pid is None else pid):
            return None
    usec = int(usec_text)
    return usec / 2e6 if usec > 0 else None


class Watchdog:
    """An owned loop task that sends ``WATCHDOG=1`` every ``interval_s`` seconds.

    ``start()`` / ``stop()`` on the event loop (loop-only). The first ping goes out at once,
    then one per interval; the pings come from the loop itself, so a blocked loop stops them.

    Args:
        interval_s: seconds between pings (see :func:`watchdog_interval_s`).
        notify: sends one state (default :func:`sd_notify`, non-blocking); injected by tests.
        sleep: waits between pings (default ``asyncio.sleep``); injected by tests.

    Raises:
        ValueError: ``interval_s`` is not positive.
    """

    def __init__(
        self,
        interval_s: float,
        *,
        notify: Callable[[str], bool] = _notify_nonblocking,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"watchdog interval_s must be > 0 seconds; got {interval_s!r}")
        self.interval_s = interval_s
        self.num_pings = 0
        self._notify = notify
        self._sleep = sleep
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Watchdog | None:
        """A watchdog for ``$WATCHDOG_USEC``, or None when systemd asked for none.

        Raises:
            ValueError: malformed ``WATCHDOG_USEC`` / ``WATCHDOG_PID``.
        """
        interval_s = watchdog_interval_s(environ)
        return None if interval_s is None else cls(interval_s)

    async def _run(self) -> None:
        while True:
            self._notify(WATCHDOG_PING)
            self.num_pings += 1
            await self._sleep(self.interval_s)

    def start(self) -> None:
        """Start pinging (loop-only; a second call is a no-op)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sd-watchdog")
            log.info("watchdog_started", interval_s=self.interval_s)

    async def stop(self) -> None:
        """Stop pinging and wait for the task to end."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
