"""ObservedBlockIndex: a BlockIndex that tells an observer when replicas become visible.

A replica is *visible* when lookups may return it: its row is COMMITTED and its holder is
readable (and so not retired). The observer hears every change of that set, grouped per
(namespace id, holder, tier)::

    add_replica / add_replicas_bulk    COMMITTED rows of a readable holder      -> visible
    add_replicas_batch                 (the same, a ReportEvents batch)
    apply_events_native                (add_replicas_batch then remove_replicas_batch)
    remove_replicas_batch              visible rows unlinked                    -> gone
    commit_generation                  WRITING rows committed, holder readable  -> visible
    remove_replica                     a visible row unlinked                   -> gone
    set_readable(h, True / False)      every COMMITTED row of h                 -> visible / gone
    retire_holder(h), h readable       every COMMITTED row of h                 -> gone

abort_generation and collect_garbage never change the set (WRITING rows and retired
holders' rows are never visible). Single-block mutations compare the block's visible
(holder, tier) set before and after the call, so whatever the index decided (idempotent
re-adds, a re-commit that only replaces a generation) only real changes are reported.
Every public mutating method of BlockIndex is either wrapped here or listed in
:data:`UNOBSERVED_METHODS` (tests/unit/master/test_master_events.py fails on a new one).

Not thread-safe (as BlockIndex): the observer is called on the master's event loop,
synchronously, inside the mutating call; it must not call back into the index.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from kvstored.master.columns import NO_ROW
from kvstored.master.index import BlockIndex
from kvstored.master.types import STATE_MASK, EventColumns, EventKind, ReplicaState
from kvstored.types import Tier

_ADDED = int(EventKind.ADDED)
UNOBSERVED_METHODS = frozenset({"set_load", "collect_garbage", "abort_generation",
                                "record_replication_factor", "add_holder"})
"""Public BlockIndex methods that mutate it but never change which replicas are visible."""


class IndexObserver(Protocol):
    """Hears changes of the set of visible replicas (see the module docstring)."""

    def replicas_changed(self, namespace_id: bytes, keys: Sequence[bytes], *, holder: int,
                         tier: Tier, visible: bool) -> None:
        """``keys`` (non-empty, in stored namespace ``namespace_id``) became visible
        (``visible``) or stopped being visible on ``holder``'s ``tier``."""


class _NoObserver:
    def replicas_changed(self, namespace_id: bytes, keys: Sequence[bytes], *, holder: int,
                         tier: Tier, visible: bool) -> None:
        return None


_NO_OBSERVER = _NoObserver()


class ObservedBlockIndex(BlockIndex):
    """A :class:`BlockIndex` that reports visible-replica changes to ``observer``.

    Args:
        observer: called synchronously inside each mutating call.
        initial_blocks: as BlockIndex.
    """

    def __init__(self, observer: IndexObserver, initial_blocks: int = 1024) -> None:
        super().__init__(initial_blocks)
        self.observer = observer

    def detach(self) -> None:
        """Stop reporting (the term that owns this index ended); idempotent."""
        self.observer = _NO_OBSERVER

    # ---- helpers ---------------------------------------------------------------------
    def _visible(self, namespace_id: bytes, key: bytes) -> set[tuple[int, Tier]]:
        return {(r.holder, r.tier) for r in self.replicas(namespace_id, key, readable_only=True)}

    def _report_diff(self, namespace_id: bytes, key: bytes,
                     before: set[tuple[int, Tier]]) -> None:
        after = self._visible(namespace_id, key)
        for holder, tier in sorted(after - before):
            self.observer.replicas_changed(namespace_id, [key], holder=holder, tier=tier,
                                           visible=True)
        for holder, tier in sorted(before - after):
            self.observer.replicas_changed(namespace_id, [key], holder=holder, tier=tier,
                                           visible=False)

    def _report_holder(self, holder: int, visible: bool) -> None:
        """Report every COMMITTED row of ``holder`` (walks its row list: O(its rows))."""
        c = self.columns
        groups: dict[tuple[bytes, int], list[bytes]] = {}
        row = int(c.holder_head[holder])
        while row != NO_ROW:
            if int(c.state[row]) & STATE_MASK == ReplicaState.COMMITTED:
                ns_id, key = c.key_of(int(c.block[row]))
                groups.setdefault((ns_id, int(c.tier[row])), []).append(key)
            row = int(c.hnext[row])
        for (ns_id, tier), keys in groups.items():
            self.observer.replicas_changed(ns_id, keys, holder=holder, tier=Tier(tier),
                                           visible=visible)

    # ---- observed mutations ----------------------------------------------------------
    def set_readable(self, holder: int, readable: bool) -> None:  # noqa: D102 (as BlockIndex)
        was = self.is_readable(holder)
        super().set_readable(holder, readable)
        if was != bool(readable):
            self._report_holder(holder, bool(readable))

    def retire_holder(self, holder: int) -> int:  # noqa: D102
        if self.is_readable(holder):
            self._report_holder(holder, False)  # before: its rows are then garbage
        return super().retire_holder(holder)

    def add_replica(self, namespace_id: bytes, key: bytes, **kwargs: Any) -> bool:  # noqa: D102
        before = self._visible(namespace_id, key)
        added = super().add_replica(namespace_id, key, **kwargs)
        self._report_diff(namespace_id, key, before)
        return added

    def add_replicas_bulk(self, namespace_id: bytes, keys: Sequence[bytes], *, holder: int,
                          tiers: Sequence[int] | np.ndarray, **kwargs: Any) -> int:  # noqa: D102
        if not self.is_readable(holder):  # an inventory sync fills an unreadable holder
            return super().add_replicas_bulk(namespace_id, keys, holder=holder, tiers=tiers,
                                             **kwargs)
        before = {(k, int(t)) for k, t in zip(keys, tiers, strict=False)
                  if (holder, Tier(int(t))) in self._visible(namespace_id, k)}
        n = super().add_replicas_bulk(namespace_id, keys, holder=holder, tiers=tiers, **kwargs)
        new: dict[int, list[bytes]] = {}
        for k, t in zip(keys, tiers, strict=False):
            kt = (k, int(t))
            if kt not in before and (holder, Tier(int(t))) in self._visible(namespace_id, k):
                before.add(kt)  # a (key, tier) repeated in the batch is reported once
                new.setdefault(int(t), []).append(k)
        for t, ks in new.items():
            self.observer.replicas_changed(namespace_id, ks, holder=holder, tier=Tier(t),
                                           visible=True)
        return n

    def add_replicas_batch(self, namespace_id: bytes, keys: Sequence[bytes], *, holder: int,
                           tiers: np.ndarray, **kwargs: Any) -> np.ndarray:  # noqa: D102
        codes = super().add_replicas_batch(namespace_id, keys, holder=holder, tiers=tiers,
                                           **kwargs)
        if self.is_readable(holder):  # a new or newly committed row of a readable holder
            self._report_codes(namespace_id, keys, codes, tiers, holder, visible=True)
        return codes

    def remove_replicas_batch(self, namespace_id: bytes, keys: Sequence[bytes], *,
                              holder: int, tiers: np.ndarray) -> np.ndarray:  # noqa: D102
        readable = self.is_readable(holder)
        codes = super().remove_replicas_batch(namespace_id, keys, holder=holder, tiers=tiers)
        if readable:  # a COMMITTED row of a readable holder was visible
            self._report_codes(namespace_id, keys, np.where(codes == 2, 1, 0), tiers, holder,
                               visible=False)
        return codes

    def apply_events_native(self, namespace_id: bytes, events: EventColumns, run: Sequence[int],
                            *, holder: int, next_generation: int
                            ) -> tuple[int, list[tuple[int, int]], np.ndarray] | None:  # noqa: D102
        readable = self.is_readable(holder)
        got = super().apply_events_native(namespace_id, events, run, holder=holder,
                                          next_generation=next_generation)
        if got is not None and readable:  # as add_replicas_batch, then remove_replicas_batch
            codes = got[2]
            kinds = events.kinds
            run_arr = np.asarray(run, dtype=np.int64)
            added = np.asarray([kinds[i] == _ADDED for i in run], dtype=np.bool_)
            keys = events.blocks.keys
            tiers = events.blocks.tiers[run_arr]
            for sel, code, visible in ((added, codes, True), (~added, codes == 2, False)):
                ix = np.flatnonzero(sel)
                if len(ix):
                    self._report_codes(namespace_id, [keys[run[j]] for j in ix.tolist()],
                                       np.asarray(code)[ix], tiers[ix], holder, visible=visible)
        return got

    def _report_codes(self, namespace_id: bytes, keys: Sequence[bytes], codes: np.ndarray,
                      tiers: np.ndarray, holder: int, *, visible: bool) -> None:
        """Report the keys whose code is non-zero, grouped per tier (in key order)."""
        groups: dict[int, list[bytes]] = {}
        for k, code, t in zip(keys, codes.tolist(), np.asarray(tiers).tolist(), strict=True):
            if code:
                groups.setdefault(int(t), []).append(k)
        for t, ks in sorted(groups.items()):
            self.observer.replicas_changed(namespace_id, ks, holder=holder, tier=Tier(t),
                                           visible=visible)

    def remove_replica(self, namespace_id: bytes, key: bytes, *, holder: int,
                       tier: Tier) -> bool:  # noqa: D102
        before = self._visible(namespace_id, key)
        removed = super().remove_replica(namespace_id, key, holder=holder, tier=tier)
        self._report_diff(namespace_id, key, before)
        return removed

    def commit_generation(self, namespace_id: bytes, key: bytes, generation: int) -> int:  # noqa: D102
        before = self._visible(namespace_id, key)
        n = super().commit_generation(namespace_id, key, generation)
        self._report_diff(namespace_id, key, before)
        return n
