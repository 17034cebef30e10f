"""The watchdog's interval from systemd's variables, and its loop task (injected sleep)."""

from __future__ import annotations

import asyncio
import pathlib
import socket

import pytest

from kvstored.sdnotify import WATCHDOG_PING, Watchdog, watchdog_interval_s


def test_interval_is_half_of_watchdog_usec_for_this_process_only() -> None:
    assert watchdog_interval_s({}) is None
    assert watchdog_interval_s({"WATCHDOG_USEC": "0"}) is None
    assert watchdog_interval_s({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert watchdog_interval_s({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "42"}, pid=42) == 15.0
    # inherited by a child: the variables are for pid 42, not us
    assert watchdog_interval_s({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "42"}, pid=43) is None


@pytest.mark.parametrize("env,name", [({"WATCHDOG_USEC": "30s"}, "WATCHDOG_USEC"),
                                      ({"WATCHDOG_USEC": "1", "WATCHDOG_PID": "me"}, "WATCHDOG_PID")])
def test_malformed_variables_are_named(env: dict[str, str], name: str) -> None:
    with pytest.raises(ValueError, match=rf"{name} .*got '{env[name]}'"):
        watchdog_interval_s(env, pid=1)


def test_bad_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="interval_s must be > 0 seconds; got 0"):
        Watchdog(0)


def test_pings_once_per_interval_from_the_loop_and_stops() -> None:
    sent: list[str] = []
    slept: list[float] = []
    gate: asyncio.Queue[None] = asyncio.Queue()

    async def sleep(s: float) -> None:  # one ping per item the test puts
        slept.append(s)
        await gate.get()

    async def main() -> None:
        wd = Watchdog(2.5, notify=lambda st: sent.append(st) is None, sleep=sleep)
        wd.start()
        wd.start()  # idempotent: still one task
        await asyncio.sleep(0)
        assert sent == [WATCHDOG_PING]  # the first ping at once
        for _ in range(3):
            gate.put_nowait(None)
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        assert sent == [WATCHDOG_PING] * 4 and slept == [2.5] * 4 and wd.num_pings == 4
        await wd.stop()
        gate.put_nowait(None)
        await asyncio.sleep(0)
        assert wd.num_pings == 4  # nothing after stop
        await wd.stop()  # a second stop is a no-op

    asyncio.run(main())


def test_a_ping_to_a_receiver_that_stopped_reading_is_dropped_not_waited_for(
        workdir: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvstored.sdnotify import sd_notify

    path = str(workdir / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:  # bound, never read
        receiver.bind(path)
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        sent = 0
        while sd_notify(WATCHDOG_PING, blocking=False):  # a blocking send would hang here
            sent += 1
            assert sent < 1_000_000, "the receiver's queue never filled"
        assert sent > 0  # the queue took some, then the next was dropped
