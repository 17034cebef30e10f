"""Single-flight for reads across the pool: one copy per missing block at a time.

Two requests missing the same block at once would both copy it from the peer (the second
commit is a no-op, but the bytes cross the network twice and two reservations are held).
:class:`Flights` lets the first request *claim* the block; a later one waits for that copy
to end (committed, dropped or failed), bounded by its own deadline, and then reads whatever
is there locally (a miss if the first copy failed)::

    read 1: claim(k) -> mine      copy k ... verify ... commit      release(k) --+
    read 2: claim(k) -> theirs    wait(k's flight, until read 2's deadline) <-----+

A claimant never waits while it holds claims (it copies its own blocks first, releases
them, then waits for the others'), so two reads that each claim some of the other's blocks
cannot deadlock. This is the same idea as Go's ``singleflight`` and a CDN's request
collapsing; nothing here is a lease: a claim lives exactly as long as the call that made it.

Thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

FlightKey = tuple[bytes, bytes]
"""``(namespace id, block key)``."""


class Flights:
    """Claims of in-flight copies, keyed by ``(namespace id, block key)``.

    Args:
        on_wait: test hook, called (with the number of blocks) just before a request starts
            waiting for copies other requests are making.
    """

    def __init__(self, on_wait: Callable[[int], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._flights: dict[FlightKey, threading.Event] = {}
        self.on_wait = on_wait

    def __len__(self) -> int:
        with self._lock:
            return len(self._flights)

    def claim(self, keys: Sequence[FlightKey]) -> tuple[list[int], list[threading.Event]]:
        """Claim every key not in flight yet.

        Returns:
            ``(mine, theirs)``: indices into ``keys`` this caller now owns (it must
            :meth:`release` them), and the events of the copies others are making (set when
            each ends). A key repeated in ``keys`` is claimed once.
        """
        mine: list[int] = []
        theirs: dict[int, threading.Event] = {}
        with self._lock:
            for i, k in enumerate(keys):
                ev = self._flights.get(k)
                if ev is None:
                    self._flights[k] = threading.Event()
                    mine.append(i)
                else:
                    theirs[id(ev)] = ev
        return mine, list(theirs.values())

    def release(self, keys: Sequence[FlightKey]) -> None:
        """End the caller's claims on ``keys`` (each must have been claimed by it) and wake
        whoever waits for them."""
        with self._lock:
            events = [self._flights.pop(k) for k in keys if k in self._flights]
        for ev in events:
            ev.set()

    def wait(self, events: Sequence[threading.Event], deadline: float) -> bool:
        """Wait until every one of ``events`` is set or ``deadline`` (``time.monotonic()``)
        passes.

        Returns:
            True when all copies ended in time (they may still have failed: read locally).
        """
        if not events:
            return True
        if self.on_wait is not None:
            self.on_wait(len(events))
        for ev in events:
            left = deadline - time.monotonic()
            if left <= 0 or not ev.wait(left):
                return False
        return True
