"""ChangeFeed: an ordered, bounded log of the store's replica changes (for the cluster link).

The node's MasterLink must tell the master every replica the store gains or loses. Listing
the whole store each round and diffing costs O(blocks) per round under the store lock
(about a second at 1M blocks); the feed makes it O(changes). The hook is the tiers' block
maps themselves: ``DramTier.entries`` and ``SsdTier.entries`` are replaced by
:class:`ObservedEntries`, an ``OrderedDict`` that records each key it gains or loses, so
every path that mutates a map (commit, promotion, eviction, demotion, removal, a bad
checksum, SSD LRU eviction) is covered without a hook per call site::

    DRAM map   commit / promotion        -> ADDED   (ns, key, DRAM, size)
               eviction / demotion / rm  -> REMOVED (ns, key, DRAM, size)
    SSD map    demotion write ends       -> ADDED   (ns, key, SSD, size)
               SSD eviction / rm / bad   -> REMOVED (ns, key, SSD, size)

Events are recorded in the order the maps change (both maps change under the store lock;
the feed also has its own lock, so a drain never waits for the store). The queue is bounded:
when it is full the feed drops its queue and raises ``resync_needed`` (never a silent loss);
the reader then takes a full inventory (:meth:`ChangeFeed.reset` first, then the listing:
replaying the events recorded between the two onto the listing is harmless, since every
event sets a replica's presence and the last one per replica wins).

A new feed starts with ``resync_needed`` set: nothing before it was recorded.

Generations: the feed is also where every replica gets its *generation*, the name the
master indexes it under and the data plane sends with it (a reader's copy is verified by
comparing the two, no master call). An entry entering a map with generation 0 is stamped
with the feed's next one (commit, copy-in, SSD write, recovered SSD entries at start); an
entry that already carries one keeps it (a promotion or demotion moves the same bytes to
the other tier, so it inherits the source replica's generation). The counter starts at the
feed's creation time in ns (``time.time_ns()``, after the daemon took its epoch) and only
grows, so generations are unique within a daemon start, and two starts never share one as
long as the wall clock does not step back by more than the time between them and fewer than
one replica per nanosecond is added (the same clock assumption epochs rely on)::

    remove + re-put of a key     -> a new generation (a reader named the old one drops it)
    eviction + re-promotion      -> the SSD replica's generation (the same bytes)
    restart                      -> new generations for everything (SSD recovery included)

Copies: a DRAM replica that is a remote-fill copy of a peer's block (``DramTier.copies``,
tiers/spare.py) is reported with ``copy=True``, so the master knows which replicas are mere
duplicates. The store's copy marks are an :class:`ObservedCopies` map: a copy is marked
before its entry enters the DRAM map (its one ADDED event says ``copy``), and a mark that
goes while the block stays in DRAM (a local put of the same key made it an original)
records the same replica ADDED again with ``copy=False``::

    copy commit                  -> ADDED (ns, key, DRAM, size, gen, copy=True)
    local put of a copied key    -> ADDED (ns, key, DRAM, size, gen, copy=False)  (re-report)
    copy evicted / removed       -> REMOVED (as any block; the mark goes silently)
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from kvstored.errors import InvalidArgument
from kvstored.tiers.ssd_format import _TAG_BYTES, split_store_key

if TYPE_CHECKING:
    from kvstored.tiers.tenants import TenantUsage

DEFAULT_MAX_EVENTS = 1 << 18
"""Events a feed holds before it overflows (about 20 MB of tuples at most)."""


class Change(NamedTuple):
    """One replica change.

    Attributes:
        added: True when the replica appeared, False when it went away.
        namespace_id: the block's namespace.
        key: the block hash.
        tier: 1 (DRAM) or 2 (SSD).
        size_bytes: the block's size.
        generation: the replica's generation (see the module docstring).
        copy: (ADDED only) the replica is a remote-fill copy of a peer's block; an ADDED
            change of a replica already reported re-reports it with its current mark.
    """

    added: bool
    namespace_id: bytes
    key: bytes
    tier: int
    size_bytes: int
    generation: int = 0
    copy: bool = False


class _Sized(Protocol):
    """A tier entry the feed records: its payload size in bytes and its generation."""

    size_bytes: int
    generation: int


class ChangeFeed:
    """Bounded FIFO of replica changes with an overflow flag (thread-safe).

    Args:
        max_events: events held before overflow (>= 1).
        first_generation: the first generation :meth:`stamp` hands out (default: now in
            ns, see the module docstring), in (0, 2**62].

    Raises:
        InvalidArgument: ``max_events < 1`` or ``first_generation`` out of range.
    """

    def __init__(self, max_events: int = DEFAULT_MAX_EVENTS, *,
                 first_generation: int | None = None) -> None:
        if max_events < 1:
            raise InvalidArgument(f"max_events must be >= 1, got {max_events}")
        first = time.time_ns() if first_generation is None else int(first_generation)
        if not 0 < first <= (1 << 62):
            raise InvalidArgument(f"first_generation must be in (0, 2**62], got {first}")
        self.max_events = int(max_events)
        self._lock = threading.Lock()
        self._queue: deque[tuple[bool, bytes, int, int, int, bool]] = deque()
        self._resync = True
        self._next_generation = first
        self.num_recorded = 0
        self.num_overflows = 0

    def stamp(self, entry: _Sized) -> int:
        """Give ``entry`` the next generation unless it carries one already; returns it."""
        if not entry.generation:
            with self._lock:
                entry.generation = self._next_generation
                self._next_generation += 1
        return entry.generation

    def stamp_many(self, entries: Iterable[_Sized]) -> None:
        """:meth:`stamp` of each entry, in order, under one lock."""
        with self._lock:
            gen = self._next_generation
            for entry in entries:
                if not entry.generation:
                    entry.generation = gen
                    gen += 1
            self._next_generation = gen

    def record_added(self, tier: int, items: Iterable[tuple[bytes, int, int, bool]]) -> None:
        """:meth:`record` of an addition per ``(skey, size_bytes, generation, copy)``, in
        order, under one lock (the same queue, counts and overflow as one call each)."""
        with self._lock:
            q = self._queue
            if not isinstance(items, list):
                items = list(items)
            if not self._resync and len(q) + len(items) <= self.max_events:  # the usual case
                self.num_recorded += len(items)
                q.extend([(True, skey, tier, size_bytes, generation, copy)
                          for skey, size_bytes, generation, copy in items])
                return
            for skey, size_bytes, generation, copy in items:
                self.num_recorded += 1
                if self._resync:
                    continue
                if len(self._queue) >= self.max_events:
                    self._queue.clear()
                    self._resync = True
                    self.num_overflows += 1
                    continue
                self._queue.append((True, skey, tier, size_bytes, generation, copy))

    def record(self, added: bool, skey: bytes, tier: int, size_bytes: int,
               generation: int = 0, copy: bool = False) -> None:
        """Append one change (``skey`` a store key); overflow drops the queue, sets the flag."""
        with self._lock:
            self.num_recorded += 1
            if self._resync:
                return  # a full inventory is owed anyway: queueing would be wasted memory
            if len(self._queue) >= self.max_events:
                self._queue.clear()
                self._resync = True
                self.num_overflows += 1
                return
            self._queue.append((added, skey, tier, size_bytes, generation, copy))

    @property
    def resync_needed(self) -> bool:
        """True when events were lost (overflow, or never reset): take a full inventory."""
        return self._resync

    def __len__(self) -> int:
        return len(self._queue)

    def reset(self) -> None:
        """Drop queued events and clear ``resync_needed``; call just before a full listing."""
        with self._lock:
            self._queue.clear()
            self._resync = False

    def drain(self, max_events: int | None = None) -> tuple[list[Change], bool]:
        """Take queued changes, oldest first.

        Args:
            max_events: most changes returned (None: all).

        Returns:
            ``(changes, resync_needed)``; when ``resync_needed`` is True the changes are
            empty and the reader must :meth:`reset` and take a full inventory.
        """
        with self._lock:
            if self._resync:
                return [], True
            q = self._queue
            n = len(q) if max_events is None else min(max_events, len(q))
            raw = [q.popleft() for _ in range(n)]
        out = []
        for added, skey, tier, size, gen, copy in raw:
            ns, key = split_store_key(skey)
            out.append(Change(added, ns, key, tier, size, gen, copy))
        return out, False


class ObservedEntries(OrderedDict[bytes, Any]):
    """A tier's block map that records every key it gains or loses in a :class:`ChangeFeed`.

    Values must have ``size_bytes`` and ``generation``; a value entering the map with
    generation 0 is stamped by the feed (:meth:`ChangeFeed.stamp`). Re-setting a key to a
    value of the same size and generation (or generation 0: it takes the old one) records
    nothing; otherwise a removal then an addition. ``move_to_end`` and reads are the plain
    ``OrderedDict`` ones (no cost added).

    Args:
        feed: where changes go.
        tier: the tier this map indexes (1 DRAM, 2 SSD).
        initial: entries present before observation starts (recorded as nothing, stamped).
        usage: per-tenant byte counts this map keeps current (tiers/tenants.py); the
            initial entries are counted.

    Attributes:
        copies: the store keys marked remote-fill copies (an :class:`ObservedCopies` of
            the DRAM map, or None): an added key in it is recorded with ``copy=True``.
    """

    def __init__(self, feed: ChangeFeed, tier: int, initial: Iterable[tuple[bytes, Any]] = (),
                 usage: TenantUsage | None = None):
        super().__init__()
        self._tier = int(tier)
        for k, v in initial:
            feed.stamp(v)
            OrderedDict.__setitem__(self, k, v)
            if usage is not None:
                usage.count(k, self._tier, v.size_bytes)
        self._feed = feed
        self._usage = usage
        self.copies: ObservedCopies | None = None
        self.on_change: Callable[[bytes], None] | None = None
        """Called with a key after the map gained or lost it (the store's spare-bytes count,
        tiers/spare.py ``SpareBytes``)."""
        self.on_change_many: Callable[[list[bytes]], None] | None = None
        """``on_change`` of several keys in one call, in order (:meth:`add_new`'s batch);
        None: ``on_change`` per key. Set both or only ``on_change``."""

    def _lost(self, key: bytes, old: _Sized) -> None:
        self._feed.record(False, key, self._tier, old.size_bytes, old.generation)
        if self._usage is not None:
            self._usage.count(key, self._tier, -old.size_bytes)
        if self.on_change is not None:
            self.on_change(key)

    def __setitem__(self, key: bytes, value: _Sized) -> None:
        old = self.get(key)
        if old is not None and not value.generation and old.size_bytes == value.size_bytes:
            value.generation = old.generation  # the same replica, re-set
        gen = self._feed.stamp(value)
        OrderedDict.__setitem__(self, key, value)
        copy = self.copies is not None and key in self.copies
        usage = self._usage
        if old is None:
            self._feed.record(True, key, self._tier, value.size_bytes, gen, copy)
            if usage is not None:
                usage.count(key, self._tier, value.size_bytes)
        elif old.size_bytes != value.size_bytes or old.generation != gen:
            self._lost(key, old)
            self._feed.record(True, key, self._tier, value.size_bytes, gen, copy)
            if usage is not None:
                usage.count(key, self._tier, value.size_bytes)
        if self.on_change is not None:
            self.on_change(key)

    def add_new(self, items: list[tuple[bytes, _Sized]], *, checked_new: bool = False) -> None:
        """Set each ``(key, value)``, in order, as ``self[key] = value`` does (stamped,
        recorded, counted), for keys not in the map (a batch of commits: one feed lock for
        the stamps, one for the records, one usage count per namespace). A key that is in
        the map already, or twice in ``items``, takes the one-by-one path.

        ``checked_new``: the caller has checked (holding the lock that guards this map) that
        the keys are distinct and none is in the map; the check is then not repeated."""
        if not checked_new and (any(k in self for k, _ in items)
                                or len({k for k, _ in items}) != len(items)):
            for k, v in items:
                self[k] = v
            return
        feed, tier, copies = self._feed, self._tier, self.copies
        feed.stamp_many([v for _, v in items])
        setitem = OrderedDict.__setitem__
        for k, v in items:
            setitem(self, k, v)
        if copies:
            feed.record_added(tier, [(k, v.size_bytes, v.generation, k in copies) for k, v in items])
        else:
            feed.record_added(tier, [(k, v.size_bytes, v.generation, False) for k, v in items])
        usage = self._usage
        if usage is not None:
            by_tag: dict[bytes, tuple[bytes, int]] = {}  # namespace tag -> (a key of it, bytes)
            for k, v in items:
                tag = k[:_TAG_BYTES]
                first, n = by_tag.get(tag, (k, 0))
                by_tag[tag] = (first, n + v.size_bytes)
            for first, n in by_tag.values():
                usage.count(first, tier, n)
        if self.on_change_many is not None:
            self.on_change_many([k for k, _ in items])
            return
        on_change = self.on_change
        if on_change is not None:
            for k, _ in items:
                on_change(k)

    def __delitem__(self, key: bytes) -> None:
        old = self[key]
        OrderedDict.__delitem__(self, key)
        self._lost(key, old)

    _MISSING = object()

    def pop(self, key: bytes, default: Any = _MISSING) -> Any:  # noqa: D102 (OrderedDict.pop)
        if key not in self:
            if default is ObservedEntries._MISSING:
                raise KeyError(key)
            return default
        value = OrderedDict.pop(self, key)
        self._lost(key, value)
        return value

    def popitem(self, last: bool = True) -> tuple[bytes, Any]:  # noqa: D102
        key, value = OrderedDict.popitem(self, last)
        self._lost(key, value)
        return key, value

    def clear(self) -> None:  # noqa: D102
        items = list(self.items())
        OrderedDict.clear(self)
        for key, value in items:
            self._lost(key, value)

    def setdefault(self, key: bytes, default: Any = None) -> Any:  # noqa: D102
        if key not in self:
            self[key] = default
        return self[key]

    def __reduce__(self) -> Any:
        raise TypeError("ObservedEntries cannot be pickled")


class ObservedCopies(OrderedDict[bytes, None]):
    """``DramTier.copies`` (store key -> None, oldest copy first) that re-reports a block
    whose mark changes while it stays in DRAM (see the module docstring).

    A key marked while its entry is not in the DRAM map yet records nothing (the entry's
    own ADDED event carries the mark); a mark dropped while the entry is still there (a
    local put of the same key) records ADDED with ``copy=False``; a mark dropped after the
    entry left (eviction, removal: its REMOVED is recorded) records nothing.

    Args:
        feed: where changes go.
        entries: the DRAM tier's observed block map (its ``copies`` is set to this map).
        initial: store keys marked before observation starts.
    """

    def __init__(self, feed: ChangeFeed, entries: ObservedEntries, initial: Iterable[bytes] = ()):
        super().__init__((k, None) for k in initial)
        self._feed = feed
        self._entries = entries
        entries.copies = self

    def _report(self, key: bytes, copy: bool) -> None:
        e = self._entries.get(key)
        if e is not None:
            self._feed.record(True, key, self._entries._tier, e.size_bytes, e.generation, copy)  # noqa: SLF001
        on_change = self._entries.on_change  # a copy mark is spare room (tiers/spare.py)
        if on_change is not None:
            on_change(key)

    def __setitem__(self, key: bytes, value: Any) -> None:
        new = key not in self
        OrderedDict.__setitem__(self, key, value)
        if new:
            self._report(key, True)

    def __delitem__(self, key: bytes) -> None:
        OrderedDict.__delitem__(self, key)
        self._report(key, False)

    _MISSING = object()

    def pop(self, key: bytes, default: Any = _MISSING) -> Any:  # noqa: D102 (OrderedDict.pop)
        if key not in self:
            if default is ObservedCopies._MISSING:
                raise KeyError(key)
            return default
        value = OrderedDict.pop(self, key)
        self._report(key, False)
        return value

    def popitem(self, last: bool = True) -> tuple[bytes, Any]:  # noqa: D102
        key, value = OrderedDict.popitem(self, last)
        self._report(key, False)
        return key, value

    def __reduce__(self) -> Any:
        raise TypeError("ObservedCopies cannot be pickled")


__all__ = ["DEFAULT_MAX_EVENTS", "Change", "ChangeFeed", "ObservedCopies", "ObservedEntries"]
