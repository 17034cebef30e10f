"""Run a call in a thread and prove it does not block (tests that hold an I/O at a hook).

Importable from every test directory: the suite's root conftest puts tests/ on sys.path.
"""

from __future__ import annotations

import threading
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
