"""Suspect holders: the node's short memory of peers whose data plane just failed it.

A read across the pool (kvstored/node/remote.py) that cannot reach the holder the master
named (connect refused or reset, no answer within the deadline) marks that node *suspect*
for ``[cluster] suspect_holder_s`` seconds (default 5). While it is suspect the node's
lookups send it as ``avoid`` (the master ranks its replicas after every other readable one)
and the reader tries the block's other holders first; a successful transfer from it clears
the mark at once. This is a small circuit breaker on the reader's side that bridges the gap
until the master itself notices the death (the node's lease, or ``unhealthy_after_failures``
reports): it only reorders, it never hides a replica, so a block whose only holder is
suspect is still tried, and it never makes a copy "safe" (every copy is verified as before).

Bounded: at most :data:`MAX_SUSPECTS` nodes are remembered (the oldest mark goes first).
Thread-safe (the node's store executor threads read across the pool in parallel).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

MAX_SUSPECTS = 64
"""Most suspect nodes remembered at once (also the master's limit on ``avoid_node_ids``)."""


class Suspects:
    """Nodes whose data plane failed a transfer within the last ``hold_s`` seconds.

    Args:
        hold_s: seconds a node stays suspect after its last failure (0 = never suspect:
            nothing is remembered, nothing avoided).
        clock: monotonic seconds (injected by tests).

    Raises:
        ValueError: ``hold_s`` is negative.
    """

    def __init__(self, hold_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        if hold_s < 0:
            raise ValueError(f"hold_s must be >= 0 seconds, got {hold_s}")
        self.hold_s = float(hold_s)
        self._clock = clock
        self._until: OrderedDict[str, float] = OrderedDict()  # node id -> suspect until
        self._lock = threading.Lock()

    def mark(self, node_id: str) -> None:
        """``node_id`` failed a transfer now: suspect for ``hold_s`` from now."""
        if not self.hold_s:
            return
        with self._lock:
            self._until.pop(node_id, None)
            self._until[node_id] = self._clock() + self.hold_s
            while len(self._until) > MAX_SUSPECTS:
                self._until.popitem(last=False)

    def clear(self, node_id: str) -> bool:
        """A transfer from ``node_id`` succeeded: it is no longer suspect.

        Returns:
            True if it was marked (expired or not).
        """
        with self._lock:
            return self._until.pop(node_id, None) is not None

    def is_suspect(self, node_id: str) -> bool:
        """True while ``node_id``'s last failure is less than ``hold_s`` old."""
        with self._lock:
            until = self._until.get(node_id)
            if until is None:
                return False
            if until <= self._clock():
                del self._until[node_id]
                return False
            return True

    def current(self) -> list[str]:
        """The suspect node ids now, oldest mark first (what a lookup sends as ``avoid``)."""
        with self._lock:
            now = self._clock()
            for n in [n for n, until in self._until.items() if until <= now]:
                del self._until[n]
            return list(self._until)

    def order(self, node_ids: Iterable[str]) -> list[str]:
        """``node_ids`` with the suspect ones moved last, the order otherwise kept."""
        ids = list(node_ids)
        suspect = set(self.current())
        return [n for n in ids if n not in suspect] + [n for n in ids if n in suspect]
