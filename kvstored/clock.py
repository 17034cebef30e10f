"""Clocks: time is injected, so leases and TTLs are testable without sleeping.

``Clock`` is any zero-argument callable returning monotonic seconds as a float.
:class:`MonotonicClock` reads ``time.monotonic``; :class:`FakeClock` only moves when a test
calls :meth:`FakeClock.advance`.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic seconds (float); only differences are meaningful."""

    def __call__(self) -> float:
        """The current time in seconds; never goes backwards. Thread-safe, never blocks."""


class MonotonicClock:
    """The process's monotonic clock (``time.monotonic``)."""

    def __call__(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that moves only when told to (tests).

    Args:
        start_s: the initial reading, seconds.
    """

    def __init__(self, start_s: float = 1000.0) -> None:
        self.now_s = float(start_s)

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        """Move the clock forward.

        Raises:
            ValueError: ``seconds`` is negative (a monotonic clock never goes back).
        """
        if seconds < 0:
            raise ValueError(f"a monotonic clock cannot go back; got advance({seconds})")
        self.now_s += seconds
