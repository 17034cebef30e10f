"""Run a call in a thread and prove it does not block (tests that hold an I/O at a hook);
poll a condition with a hang guard.

Importable from every test directory: the suite's root conftest puts tests/ on sys.path.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Start ``fn`` in a daemon thread; the list gets its result or the exception it raised."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as exc:
            box.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def completes(fn: Callable[[], Any], *, timeout_s: float = 10.0,
              blocked_msg: str = "call blocked behind another block's disk I/O") -> Any:
    """Run ``fn`` and return its result (re-raising its error); fail if it is still running
    after ``timeout_s`` seconds (it blocked, e.g. on an I/O a hook holds)."""
    t, box = in_thread(fn)
    t.join(timeout_s)
    assert not t.is_alive(), blocked_msg
    (res,) = box
    if isinstance(res, BaseException):
        raise res
    return res


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0, what: str = "condition") -> None:
    """Poll ``predicate`` until true; fail the test after ``timeout_s`` (a hang guard, not a
    timing assertion)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)
