"""The client's pool of reserve-ahead slots (node side: kvstored/node/slots.py).

A shared-memory put copies its blocks into arena slots the node granted this client's
session in advance, then sends one CommitSlots that commits them under their keys and whose
answer grants the slots of the next put: one round trip per put, at any size::

    take slots for the chunk (by size class) --> none for some: one CommitSlots(want) first
    copy the blocks into the slots           --> CommitSlots(writes, return_slot_ids, want)
    answer: per write stored / existed / error, and the next slots (added to the pool)

Over the control channel, when two puts' worth fit the bounds below, the refill comes after
the answer (``grant_after_answer``): the node answers the writes, then grants, and sends the
slots as the next frame on that connection, which the client reads with its next request
there (kvstored/client/_control.py). The pool then holds two puts' worth: a put copies into
the slots the put before last asked for, and its answer never waits for a grant::

    put N:   take slots (granted after put N-2's answer) --> copy
             --> CommitSlots N (want, grant_after_answer)
             <-- [refill of N-1, read first] <-- answer N   (put N returns)
                                             <-- refill of N (read with the next request)

What the pool wants to hold (``want``) is the shape of the most recent put per size class
(twice it with the refill after the answer), bounded by ``Client(reserve_ahead_bytes=...)``,
an eighth of the arena and the node's per-session slot budget.

Slots belong to one session of one node epoch: a new session or epoch drops the pool (the
node freed those slots when the session ended). A slot whose lease is about to lapse by this
process's clock is never written; it is returned with the next CommitSlots (the ack that
frees it, quarantined or not). A failed CommitSlots returns the slots it wrote into (the
node ignores those it committed). A refill whose frame is lost (its connection failed first)
is acked as an orphan of its request: the node frees what it granted, as for any grant whose
answer never arrived (kvstored/client/_orphans.py); one that arrives after its session ended
is dropped (the node freed it with the session).

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
    before ``use_by`` (this process's monotonic seconds: the lease's end less a margin)."""

    slot_id: int
    offset: int
    size_bytes: int
    use_by: float


class _Class:
    """The free slots of one size class, oldest grant first: parallel lists (a put takes
    and adds them by slices, with no object per slot). ``use_by`` never decreases along
    the lists (:meth:`SlotPool.add` keeps it so), so the first slot is the first to lapse."""

    __slots__ = ("ids", "offsets", "use_by")

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.offsets: list[int] = []
        self.use_by: list[float] = []

    def drop_lapsed(self, now: float, returns: list[int]) -> None:
        use_by = self.use_by
        if use_by and use_by[0] <= now:
            n = next((j for j, u in enumerate(use_by) if u > now), len(use_by))
            returns += self.ids[:n]
            del self.ids[:n], self.offsets[:n], use_by[:n]


class SlotPool:
    """Slots held by one client (see the module docstring).

    Args:
        max_bytes: the client's bound (``reserve_ahead_bytes``); 0 = reserve-ahead off.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max(0, int(max_bytes))
        self._lock = threading.Lock()
        self._owner: tuple[int, int] = (0, 0)  # (session id, node epoch) the slots belong to
        self._free: dict[int, _Class] = {}
        self._returns: list[int] = []
        self._target: dict[int, int] = {}  # size class -> slots wanted (insertion = recency)
        self._wants: list[tuple[int, int]] = []  # _target's non-zero items (the request's want)
        self._demand: object = None  # the shape of the last put (its counts, budget, depth)
        self.node_budget_bytes = 0  # the node's per-session bound (0 = not known yet)
        self.columns_epoch = -1
        """The node epoch whose answers said it takes packed write columns (CommitSlots
        ``accepts_columns``): a plain batch to it is sent as columns, else as SlotWrites."""

    def budget_bytes(self, arena_size_bytes: int) -> int:
        """Most slot bytes this pool asks for."""
        b = min(self.max_bytes, arena_size_bytes // ARENA_FRACTION)
        return min(b, self.node_budget_bytes) if self.node_budget_bytes else b

    def _own(self, owner: tuple[int, int]) -> None:
        if owner != self._owner:  # another session or epoch: the node freed the old slots
            self._owner = owner
            self._free.clear()
            self._returns.clear()

    def note_demand(self, counts: dict[int, int], budget_bytes: int, depth: int = 1) -> None:
        """Remember what a put needs (``counts``: size class -> blocks): the pool's next
        targets, ``depth`` puts' worth each (2 when each refill arrives one put later),
        scaled down to ``budget_bytes``."""
        key = (tuple(counts.items()), budget_bytes, depth)
        with self._lock:
            if key == self._demand:  # the same shape as the last put (the steady state)
                return
            self._demand = key
            target = self._target
            for s, n in counts.items():
                target.pop(s, None)
                target[s] = n * depth  # most recent last
            while len(target) > MAX_SIZE_CLASSES:
                del target[next(iter(target))]
            total = sum(s * n for s, n in target.items())
            if total > budget_bytes:  # scale every class down to fit, most recent first
                room = budget_bytes
                for s in reversed(list(target)):
                    n = min(target[s], room // s)
                    target[s] = n
                    room -= n * s
            self._wants = [(s, n) for s, n in target.items() if n]

    def wants(self) -> list[tuple[int, int]]:
        """``(size class, slots)`` the pool wants to hold (CommitSlots ``want``)."""
        return self._wants

    def take_all(self, owner: tuple[int, int], counts: dict[int, int],
                 ) -> dict[int, tuple[list[int], list[int]]] | None:
        """All or nothing: per size class in ``counts``, that many live slots
        ``(ids, offsets)``, oldest first; None (nothing taken) when the pool lacks some.
        Slots near their lease's end move to the returns either way (sent with the next
        CommitSlots, so the node counts them out before it grants)."""
        now = time.monotonic()
        with self._lock:
            if owner != self._owner:
                self._own(owner)
            free = self._free
            for s, n in counts.items():
                c = free.get(s)
                if c is None:
                    return None
                c.drop_lapsed(now, self._returns)
                if len(c.ids) < n:
                    return None
            out = {}
            for s, n in counts.items():
                c = free[s]
                out[s] = (c.ids[:n], c.offsets[:n])
                del c.ids[:n], c.offsets[:n], c.use_by[:n]
            return out

    def lacks(self, owner: tuple[int, int], sizes: Sequence[int]) -> bool:
        """Whether the pool of ``owner`` holds fewer live slots than ``sizes`` need; slots
        near their lease's end move to the returns."""
        now = time.monotonic()
        need: dict[int, int] = {}
        for s in sizes:
            need[s] = need.get(s, 0) + 1
        with self._lock:
            self._own(owner)
            for c in self._free.values():
                c.drop_lapsed(now, self._returns)
            return any(s not in self._free or len(self._free[s].ids) < n for s, n in need.items())

    def take(self, owner: tuple[int, int], sizes: Sequence[int]) -> list[HeldSlot | None]:
        """One slot per size (None where the pool has none), oldest first; slots near their
        lease's end are moved to the returns instead."""
        now = time.monotonic()
        out: list[HeldSlot | None] = []
        with self._lock:
            self._own(owner)
            for s in sizes:
                c = self._free.get(s)
                got = None
                if c is not None:
                    c.drop_lapsed(now, self._returns)
                    if c.ids:
                        got = HeldSlot(c.ids.pop(0), c.offsets.pop(0), s, c.use_by.pop(0))
                out.append(got)
        return out

    def add(self, owner: tuple[int, int], slots: Sequence[tuple[int, int, int]] | Iterable[tuple[int, int, int]],
            lease_s: float, granted_at: float, *, current_only: bool = False) -> None:
        """Slots ``(slot_id, offset, size_bytes)`` granted at ``granted_at`` (monotonic s,
        taken before the request was sent) under a lease of ``lease_s``.

        Args:
            current_only: add them only if ``owner`` is the pool's current owner (a refill
                that arrived after its answer: a session that ended meanwhile had them freed).
        """
        use_by = granted_at + lease_s - min(LEASE_MARGIN_S, lease_s / 4)
        with self._lock:
            if owner != self._owner:
                if current_only:
                    return
                self._own(owner)
            free = self._free
            touched: set[int] = set()
            for sid, off, size in slots:
                c = free.get(size)
                if c is None:
                    c = free[size] = _Class()
                if size not in touched:
                    touched.add(size)
                    if c.use_by and c.use_by[-1] > use_by:  # never later than a slot before it
                        c.use_by = [min(u, use_by) for u in c.use_by]
                c.ids.append(sid)
                c.offsets.append(off)
            for size in touched:  # one use_by per slot, all alike
                c = free[size]
                c.use_by += [use_by] * (len(c.ids) - len(c.use_by))

    def add_columns(self, owner: tuple[int, int], ids: Sequence[int], offsets: Sequence[int],
                    sizes: Sequence[int], lease_s: float, granted_at: float, *,
                    current_only: bool = False) -> None:
        """:meth:`add` of slots given as columns (``ids[i]``, ``offsets[i]``, ``sizes[i]``
        per slot, as a node grants them packed); one size class is added by slices."""
        n = len(ids)
        if n == 0:
            return
        first = sizes[0]
        if len(offsets) != n or len(sizes) != n or any(z != first for z in sizes):
            self.add(owner, zip(ids, offsets, sizes, strict=True), lease_s, granted_at,
                     current_only=current_only)
            return
        use_by = granted_at + lease_s - min(LEASE_MARGIN_S, lease_s / 4)
        with self._lock:
            if owner != self._owner:
                if current_only:
                    return
                self._own(owner)
            c = self._free.get(first)
            if c is None:
                c = self._free[first] = _Class()
            if c.use_by and c.use_by[-1] > use_by:  # never later than a slot before it
                c.use_by = [min(u, use_by) for u in c.use_by]
            c.ids += ids
            c.offsets += offsets
            c.use_by += [use_by] * n

    def give_back(self, owner: tuple[int, int], slot_ids: Iterable[int]) -> None:
        """Slots to return with the next CommitSlots (unused, or of a failed call)."""
        with self._lock:
            if owner == self._owner:
                self._returns.extend(slot_ids)

    def take_returns(self, owner: tuple[int, int]) -> list[int]:
        """The slot ids to return now (the caller sends them)."""
        with self._lock:
            if owner != self._owner:
                self._own(owner)
            out, self._returns = self._returns, []
        return out

    def slot_ids(self) -> set[int]:
        """Ids of the slots held and not in use (for tests)."""
        with self._lock:
            return {i for c in self._free.values() for i in c.ids}

    def held_bytes(self) -> int:
        """Bytes of the slots held and not in use (for tests and stats)."""
        with self._lock:
            return sum(s * len(c.ids) for s, c in self._free.items())

    def drain(self) -> tuple[tuple[int, int], list[int]]:
        """Forget every slot held (close): ``(owner, their ids and the pending returns)``."""
        with self._lock:
            ids = [i for c in self._free.values() for i in c.ids] + self._returns
            self._free.clear()
            self._returns = []
            return self._owner, ids


__all__ = ["DEFAULT_RESERVE_AHEAD_BYTES", "HeldSlot", "SlotPool", "size_class"]
