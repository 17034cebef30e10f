"""Run a call in a thread and prove it does not block (tests that hold an I/O at a hook);
poll a condition with a hang guard; wait for events a component's test hook reports.

Importable from every test directory: the suite's root conftest puts tests/ on sys.path.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

HOOK_WAIT_S = 60.0
"""Hang guard of :meth:`HookEvents.wait_for` (never reached when the event comes)."""


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


def wait_until(predicate: Callable[[], T], timeout_s: float = 10.0, what: str = "condition", *,
               interval_s: float = 0.01) -> T:
    """Poll ``predicate`` every ``interval_s`` seconds until it returns something truthy, and
    return that; fail the test after ``timeout_s`` (a hang guard, not a timing assertion).

    Raises:
        AssertionError: ``predicate`` stayed falsy for ``timeout_s`` seconds; names ``what``.
    """
    deadline = time.monotonic() + timeout_s
    while not (got := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)
    return got


class HookEvents:
    """Records what a component's test hook reports, so a test waits for an event itself
    (a counter moved once it is reported) instead of polling for the effect.

    Pass :meth:`hook` as the component's ``hook(event, **fields)`` (e.g.
    ``DataPlaneServer(hook=...)``, whose ``request_done`` comes after the request was
    counted). Thread-safe.
    """

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._changed = threading.Condition()

    def hook(self, event: str, **fields: Any) -> None:
        """Record one event (called by the component, from any thread)."""
        with self._changed:
            self.events.append((event, fields))
            self._changed.notify_all()

    def count(self, event: str, **fields: Any) -> int:
        """How many ``event``s with (at least) these field values were reported."""
        with self._changed:
            return self._count(event, fields)

    def _count(self, event: str, fields: dict[str, Any]) -> int:
        return sum(1 for e, f in self.events
                   if e == event and all(f.get(k) == v for k, v in fields.items()))

    def wait_for(self, num: int, event: str, **fields: Any) -> None:
        """Block until ``num`` such events were reported; fail the test after
        :data:`HOOK_WAIT_S` (a hang guard, not a timing assertion)."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._count(event, fields) >= num,
                                          HOOK_WAIT_S):
                raise AssertionError(
                    f"timed out after {HOOK_WAIT_S} s waiting for {num} x {event} {fields}; "
                    f"got {self._count(event, fields)}")
