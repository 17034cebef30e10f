"""The client's pool of reserve-ahead slots (node side: kvstored/node/slots.py).

A shared-memory put copies its blocks into arena slots the node granted this client's
session in advance, then sends one CommitSlots that commits them under their keys and whose
answer grants the slots of the next put: one round trip per put, at any size::

    take slots for the chunk (by size class) --> none for some: one CommitSlots(want) first
    copy the blocks into the slots           --> CommitSlots(writes, return_slot_ids, want)
    answer: per write stored / existed / error, and the next slots (added to the pool)

What the pool wants to hold (``want``) is the shape of the largest recent put per size
class, bounded by ``Client(reserve_ahead_bytes=...)``, an eighth of the arena and the node's
per-session slot budget. Slots belong to one session of one node epoch: a new session or
epoch drops the pool (the node freed those slots when the session ended). A slot whose lease
is about to lapse by this process's clock is never written; it is returned with the next
CommitSlots (the ack that frees it, quarantined or not). A failed CommitSlots returns the
slots it wrote into (the node ignores those it committed).

Thread-safe: every method takes the pool's lock; an operation owns the slots it took.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from kvstored.tiers.slots import UNIT_BYTES

DEFAULT_RESERVE_AHEAD_BYTES = 64 << 20
"""Default of ``Client(reserve_ahead_bytes=...)``: most slot bytes a client holds ahead."""
ARENA_FRACTION = 8
"""A client's pool is at most 1/ARENA_FRACTION of the node's arena."""
MAX_SIZE_CLASSES = 8
"""Slot sizes a pool keeps asking for (the most recent; the node takes at most 8)."""
LEASE_MARGIN_S = 2.0
"""A slot whose lease ends within this many seconds (a quarter of the lease when that is
shorter), by this process's clock, is not written: it is returned instead."""


def size_class(size_bytes: int) -> int:
    """The slot size a block of ``size_bytes`` goes into (the arena's 4 KiB unit)."""
    return max(1, -(-size_bytes // UNIT_BYTES)) * UNIT_BYTES


class HeldSlot(NamedTuple):
    """A slot this client holds: write at most ``size_bytes`` at ``offset`` if the copy starts
    before ``use_by`` (this process's monotonic seconds: the lease's end less a margin).
    A named tuple: a put makes one per block granted (a frozen dataclass costs 3x more)."""

    slot_id: int
    offset: int
    size_bytes: int
    use_by: float


class SlotPool:
    """Slots held by one client (see the module docstring).

    Args:
        max_bytes: the client's bound (``reserve_ahead_bytes``); 0 = reserve-ahead off.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max(0, int(max_bytes))
        self._lock = threading.Lock()
        self._owner: tuple[int, int] = (0, 0)  # (session id, node epoch) the slots belong to
        self._free: dict[int, list[HeldSlot]] = {}
        self._returns: list[int] = []
        self._target: dict[int, int] = {}  # size class -> slots wanted (insertion = recency)
        self.node_budget_bytes = 0  # the node's per-session bound (0 = not known yet)

    def budget_bytes(self, arena_size_bytes: int) -> int:
        """Most slot bytes this pool asks for."""
        b = min(self.max_bytes, arena_size_bytes // ARENA_FRACTION)
        return min(b, self.node_budget_bytes) if self.node_budget_bytes else b

    def _own(self, owner: tuple[int, int]) -> None:
        if owner != self._owner:  # another session or epoch: the node freed the old slots
            self._owner = owner
            self._free.clear()
            self._returns.clear()

    def note_demand(self, sizes: Iterable[int], budget_bytes: int) -> None:
        """Remember what a put needs (its blocks' size classes): the pool's next targets."""
        counts: dict[int, int] = {}
        for s in sizes:
            counts[s] = counts.get(s, 0) + 1
        with self._lock:
            for s, n in counts.items():
                self._target.pop(s, None)
                self._target[s] = n  # most recent last
            while len(self._target) > MAX_SIZE_CLASSES:
                del self._target[next(iter(self._target))]
            total = sum(s * n for s, n in self._target.items())
            if total > budget_bytes:  # scale every class down to fit, most recent first
                room = budget_bytes
                for s in reversed(list(self._target)):
                    n = min(self._target[s], room // s)
                    self._target[s] = n
                    room -= n * s

    def wants(self) -> list[tuple[int, int]]:
        """``(size class, slots)`` the pool wants to hold (CommitSlots ``want``)."""
        with self._lock:
            return [(s, n) for s, n in self._target.items() if n]

    def lacks(self, owner: tuple[int, int], sizes: Sequence[int]) -> bool:
        """Whether the pool of ``owner`` holds fewer live slots than ``sizes`` need; slots
        near their lease's end move to the returns (sent with the next CommitSlots, so the
        node counts them out before it grants)."""
        now = time.monotonic()
        need: dict[int, int] = {}
        for s in sizes:
            need[s] = need.get(s, 0) + 1
        with self._lock:
            self._own(owner)
            for s, free in self._free.items():
                if any(x.use_by <= now for x in free):
                    self._returns += [x.slot_id for x in free if x.use_by <= now]
                    self._free[s] = [x for x in free if x.use_by > now]
            return any(len(self._free.get(s, ())) < n for s, n in need.items())

    def take(self, owner: tuple[int, int], sizes: Sequence[int]) -> list[HeldSlot | None]:
        """One slot per size (None where the pool has none); slots near their lease's end
        are moved to the returns instead."""
        now = time.monotonic()
        out: list[HeldSlot | None] = []
        with self._lock:
            self._own(owner)
            for s in sizes:
                free = self._free.get(s)
                got = None
                while free:
                    x = free.pop()
                    if x.use_by > now:
                        got = x
                        break
                    self._returns.append(x.slot_id)
                out.append(got)
        return out

    def add(self, owner: tuple[int, int], slots: Iterable[tuple[int, int, int]],
            lease_s: float, granted_at: float) -> None:
        """Slots ``(slot_id, offset, size_bytes)`` granted at ``granted_at`` (monotonic s,
        taken before the request was sent) under a lease of ``lease_s``."""
        use_by = granted_at + lease_s - min(LEASE_MARGIN_S, lease_s / 4)
        with self._lock:
            if owner != self._owner:
                self._own(owner)
            free = self._free
            for sid, off, size in slots:
                got = free.get(size)
                if got is None:
                    got = free[size] = []
                got.append(HeldSlot(sid, off, size, use_by))

    def give_back(self, owner: tuple[int, int], slot_ids: Iterable[int]) -> None:
        """Slots to return with the next CommitSlots (unused, or of a failed call)."""
        with self._lock:
            if owner == self._owner:
                self._returns.extend(slot_ids)

    def take_returns(self, owner: tuple[int, int]) -> list[int]:
        """The slot ids to return now (the caller sends them)."""
        with self._lock:
            self._own(owner)
            out, self._returns = self._returns, []
        return out

    def held_bytes(self) -> int:
        """Bytes of the slots held and not in use (for tests and stats)."""
        with self._lock:
            return sum(x.size_bytes for v in self._free.values() for x in v)

    def drain(self) -> tuple[tuple[int, int], list[int]]:
        """Forget every slot held (close): ``(owner, their ids and the pending returns)``."""
        with self._lock:
            ids = [x.slot_id for v in self._free.values() for x in v] + self._returns
            self._free.clear()
            self._returns = []
            return self._owner, ids


__all__ = ["DEFAULT_RESERVE_AHEAD_BYTES", "HeldSlot", "SlotPool", "size_class"]
