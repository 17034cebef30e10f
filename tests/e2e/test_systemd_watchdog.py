"""The systemd watchdog, proven on a real daemon: pings come from its event loop, and stop
when that loop is wedged.

``kvstored serve`` runs with NOTIFY_SOCKET pointed at a datagram socket this test reads and
``WATCHDOG_USEC`` set (what systemd does for ``WatchdogSec=``). The test sees READY=1 and a
run of WATCHDOG=1 pings, then blocks the daemon's loop with the ``loop_stall`` test hook
(SIGUSR2 runs a handler on the loop that blocks on a FIFO: kvstored/node/fault_hooks.py),
and sees no ping while it holds; released, the pings resume and SIGTERM still stops it with
exit 0. Under systemd, the missing pings are what makes it kill and restart the unit: that
restart itself needs a real systemd host (PID 1) and is not run here.
"""

from __future__ import annotations

import configparser
import os
import signal
import socket
from pathlib import Path

from e2e_helpers import ServeProcess
from thread_helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]
WATCHDOG_USEC = 200_000  # pings every 0.1 s
QUIET_S = 1.0  # ten ping intervals with none: the loop is really not pinging


def _watchdog_sec(unit: str) -> str:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(ROOT / "systemd" / unit)
    return parser["Service"]["WatchdogSec"]


def _recv(notify: socket.socket, timeout_s: float) -> str | None:
    notify.settimeout(timeout_s)
    try:
        return notify.recv(4096).decode()
    except TimeoutError:
        return None


def _drain(notify: socket.socket) -> list[str]:
    out = []
    notify.setblocking(False)
    try:
        while True:
            out.append(notify.recv(4096).decode())
    except BlockingIOError:
        return out


def test_both_units_ask_for_a_watchdog() -> None:
    for unit in ("kvstored-node.service", "kvstored-master.service"):
        assert _watchdog_sec(unit).removesuffix("s").isdigit(), unit


def test_a_wedged_event_loop_stops_the_watchdog_pings(workdir: Path) -> None:
    fifo = workdir / "stall.fifo"
    os.mkfifo(fifo)
    notify_path = str(workdir / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(notify_path)
        node = ServeProcess(workdir, node_id="wd", env={
            "NOTIFY_SOCKET": notify_path, "WATCHDOG_USEC": str(WATCHDOG_USEC),
            "KVSTORED_TEST_HOOKS": f"loop_stall:{fifo}",
        })
        node.start()
        try:
            got: list[str] = []
            while "READY=1" not in "\n".join(got) or got[-3:] != ["WATCHDOG=1"] * 3:
                msg = _recv(notify, 30)
                assert msg is not None, f"no notification in 30 s; got {got}"
                got.append(msg)
            # pinging from before READY=1; systemd enforces WatchdogSec= only from READY=1 on
            # (the start is bounded by TimeoutStartSec=), so early pings are harmless
            assert got[0] == "WATCHDOG=1"

            node.signal(signal.SIGUSR2)  # the loop now blocks on the FIFO
            wait_until(lambda: os.path.exists(f"{fifo}.held"), 30, "the loop stall hook to hold")
            _drain(notify)  # pings sent before the loop blocked
            assert _recv(notify, QUIET_S) is None, "a ping arrived while the event loop was blocked"
            assert node.proc is not None and node.proc.poll() is None  # alive, just wedged

            with open(fifo, "wb"):  # release the loop
                pass
            assert _recv(notify, 30) == "WATCHDOG=1"  # pings resume once the loop runs
            assert node.terminate() == 0, node.log()[-3000:]
            assert "STOPPING=1" in _drain(notify)
        finally:
            node.kill()
