"""The DRAM tier's address-ordered index of committed blocks, with a batch insert.

``DramTier.by_offset`` is a ``SortedKeyList`` keyed by offset. A batch of slot commits adds
blocks that lie in one extent reserved together, so no committed block sits between them:
:meth:`OffsetIndex.add_run` inserts such a run with one bisect and one slice (the positional
index updated once by the run's length) instead of one ``add`` each (a bisect, two list
inserts and a walk of the positional index per block: ~1.5 us a block once the tier holds a
few thousand blocks). A run that does not fall in one place takes the per-block ``add``.

The result is the list ``add`` of each value would leave, element for element (ties after the
equal keys already present, as ``add``'s ``bisect_right``), with the same internal invariants
(``SortedKeyList._check``; tests/unit/tiers/test_offset_index.py runs both on the same
inputs). It relies on sortedcontainers 2.4's private layout (``_lists``, ``_keys``,
``_maxes``, ``_index``, ``_offset``, ``_load``, ``_expand``), which that test checks too.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

from sortedcontainers import SortedKeyList


class OffsetIndex(SortedKeyList):  # (values: DRAM entries)
    """A ``SortedKeyList`` with :meth:`add_run` (see the module docstring)."""

    def add_run(self, values: Sequence[Any]) -> None:
        """Add every value of ``values`` (any order), leaving what ``add`` of each would.

        One slice insert when, sorted by key, they fall between two neighbours already in
        the list (no present key within ``[first, last]`` of theirs, the one after them
        greater than their last) and are no more than the load factor; else one ``add``
        per value.
        """
        n = len(values)
        maxes: list[Any] = self._maxes  # type: ignore[attr-defined]
        load: int = self._load  # type: ignore[attr-defined]
        if n < 2 or n > load or not maxes:
            for v in values:
                self.add(v)
            return
        key = self.key  # (the key function)
        run = sorted(values, key=key)
        keys = [key(v) for v in run]
        first, last = keys[0], keys[-1]
        lists: list[list[Any]] = self._lists  # type: ignore[attr-defined]
        all_keys: list[list[Any]] = self._keys  # type: ignore[attr-defined]
        pos = bisect_right(maxes, first)
        at_end = pos == len(maxes)
        if at_end:
            pos -= 1
            idx = len(all_keys[pos])
        else:
            sub = all_keys[pos]
            idx = bisect_right(sub, first)  # < len(sub): maxes[pos] > first
            if not sub[idx] > last:  # a present key within the run: not one place
                for v in values:
                    self.add(v)
                return
        lists[pos][idx:idx] = run
        all_keys[pos][idx:idx] = keys
        if at_end:
            maxes[pos] = last
        self._len += n  # type: ignore[attr-defined]
        if len(all_keys[pos]) > (load << 1):
            self._expand(pos)  # type: ignore[attr-defined]  # splits it, drops the positional index
            return
        index: list[int] = self._index  # type: ignore[attr-defined]
        if index:  # as _expand does for one value, by n
            child = self._offset + pos  # type: ignore[attr-defined]
            while child:
                index[child] += n
                child = (child - 1) >> 1
            index[0] += n


__all__ = ["OffsetIndex"]
