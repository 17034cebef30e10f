"""Best-fit block allocator for the DRAM arena, with coalescing.

The arena is a byte range ``[0, capacity_bytes)`` carved into extents whose offsets and lengths
are multiples of ``alignment`` (4096 by default, so O_DIRECT reads from the SSD tier can land
straight in arena memory). Free space is kept twice, as extents ordered by offset (to find and
merge neighbours) and ordered by (length, offset) (to find the best fit)::

    arena:  |used |  free  |used|used|      free      |used|
             0     4K       12K  16K  20K              40K  44K
    by_offset:  {4K: 8K, 20K: 20K}
    by_size:    [(8K, 4K), (20K, 20K)]

Invariants (checked by :meth:`BlockAllocator.check_invariants` in the tests):

- free extents never overlap and never touch (adjacent free extents are always merged);
- ``used_bytes + sum(free lengths) == capacity_bytes``; usage never exceeds the cap;
- freeing a range that is (partly) free already raises instead of corrupting the lists.

The allocator keeps no per-allocation state: the owner remembers ``(offset, size_bytes)`` and
passes them back to :meth:`BlockAllocator.free`. Not thread-safe: the owner (the tiered
store) calls it under its lock.
"""

from __future__ import annotations

from sortedcontainers import SortedDict, SortedList

DEFAULT_ALIGNMENT_BYTES = 4096


class BlockAllocator:
    """Best-fit allocator of aligned extents inside a fixed-size arena.

    Args:
        capacity_bytes: size of the arena; rounded *down* to a multiple of ``alignment_bytes``
            (the hard cap is never exceeded).
        alignment_bytes: alignment of every offset and granularity of every allocation, a
            power of two.

    Raises:
        ValueError: ``alignment_bytes`` is not a power of two, or the capacity holds no
            aligned extent.
    """

    __slots__ = (
        "alignment_bytes", "capacity_bytes", "_by_offset", "_by_size", "_used_bytes", "_mask",
    )

    def __init__(self, capacity_bytes: int, *, alignment_bytes: int = DEFAULT_ALIGNMENT_BYTES):
        if alignment_bytes <= 0 or alignment_bytes & (alignment_bytes - 1):
            raise ValueError(f"alignment_bytes must be a power of two, got {alignment_bytes}")
        capacity = (int(capacity_bytes) // alignment_bytes) * alignment_bytes
        if capacity <= 0:
            raise ValueError(
                f"arena capacity must hold at least one {alignment_bytes}-byte extent, "
                f"got {capacity_bytes} bytes"
            )
        self.alignment_bytes = alignment_bytes
        self._mask = ~(alignment_bytes - 1)
        self.capacity_bytes = capacity
        self._by_offset: SortedDict = SortedDict({0: capacity})
        self._by_size: SortedList = SortedList([(capacity, 0)])
        self._used_bytes = 0

    # ---- sizes -------------------------------------------------------------------------
    def round_up(self, size_bytes: int) -> int:
        """Bytes an allocation of ``size_bytes`` really takes (at least one aligned unit)."""
        return ((size_bytes or 1) + self.alignment_bytes - 1) & self._mask

    @property
    def used_bytes(self) -> int:
        """Bytes currently allocated (rounded sizes)."""
        return self._used_bytes

    @property
    def free_bytes(self) -> int:
        """Bytes currently free (possibly fragmented)."""
        return self.capacity_bytes - self._used_bytes

    @property
    def largest_free_bytes(self) -> int:
        """Length of the largest free extent: the largest allocation that succeeds now."""
        return self._by_size[-1][0] if self._by_size else 0

    @property
    def num_free_extents(self) -> int:
        """Number of free extents (1 when the arena is empty: fully coalesced)."""
        return len(self._by_offset)

    # ---- allocate / free ---------------------------------------------------------------
    def allocate(self, size_bytes: int) -> int | None:
        """Reserve an aligned extent for ``size_bytes`` bytes, best fit (smallest adequate).

        Args:
            size_bytes: requested size, >= 0; rounded up to the alignment (0 takes one unit).

        Returns:
            The extent's offset in the arena, or None when no free extent is large enough
            (the caller evicts and retries).

        Raises:
            ValueError: negative size.
        """
        if size_bytes < 0:
            raise ValueError(f"size_bytes must be >= 0, got {size_bytes}")
        need = self.round_up(size_bytes)
        idx = self._by_size.bisect_left((need, -1))
        if idx >= len(self._by_size):
            return None
        length, offset = self._by_size.pop(idx)
        del self._by_offset[offset]
        if length > need:
            rest_off, rest_len = offset + need, length - need
            self._by_offset[rest_off] = rest_len
            self._by_size.add((rest_len, rest_off))
        self._used_bytes += need
        return offset

    def free(self, offset: int, size_bytes: int) -> None:
        """Return an extent obtained from :meth:`allocate`, merging it with free neighbours.

        Args:
            offset: the offset :meth:`allocate` returned.
            size_bytes: the size passed to :meth:`allocate` (rounded the same way).

        Raises:
            ValueError: the range is misaligned, outside the arena, or overlaps free space
                (a double free); the free lists are left unchanged.
        """
        length = self.round_up(size_bytes)
        end = offset + length
        if offset < 0 or offset % self.alignment_bytes or end > self.capacity_bytes:
            raise ValueError(
                f"free of [{offset}, {end}) is misaligned or outside the arena of "
                f"{self.capacity_bytes} bytes"
            )
        bo = self._by_offset
        idx = bo.bisect_left(offset)
        prev_off: int | None = None
        prev_len = next_len = 0  # read only when the offset beside it is set
        if idx > 0:
            prev_off, prev_len = bo.peekitem(idx - 1)
            if prev_off + prev_len > offset:
                raise ValueError(f"double free: [{offset}, {end}) overlaps a free extent")
        next_off: int | None = None
        if idx < len(bo):
            next_off, next_len = bo.peekitem(idx)
            if next_off < end:
                raise ValueError(f"double free: [{offset}, {end}) overlaps a free extent")
        new_off, new_len = offset, length
        if prev_off is not None and prev_off + prev_len == offset:
            del bo[prev_off]
            self._by_size.remove((prev_len, prev_off))
            new_off, new_len = prev_off, new_len + prev_len
        if next_off is not None and next_off == end:
            del bo[next_off]
            self._by_size.remove((next_len, next_off))
            new_len += next_len
        bo[new_off] = new_len
        self._by_size.add((new_len, new_off))
        self._used_bytes -= length

    # ---- checks ------------------------------------------------------------------------
    def free_extents(self) -> list[tuple[int, int]]:
        """All free extents as ``(offset, length_bytes)`` ordered by offset (for tests/admin)."""
        return list(self._by_offset.items())

    def check_invariants(self) -> None:
        """Assert the free lists are consistent (used by the tests).

        Raises:
            AssertionError: an invariant from the module docstring does not hold.
        """
        items = list(self._by_offset.items())
        assert sorted((ln, off) for off, ln in items) == list(self._by_size)
        total_free = 0
        prev_end = -1
        for off, ln in items:
            assert ln > 0 and off % self.alignment_bytes == 0 and ln % self.alignment_bytes == 0
            assert off > prev_end, "free extents touch or overlap (not coalesced)"
            prev_end = off + ln
            total_free += ln
        assert prev_end <= self.capacity_bytes
        assert total_free + self._used_bytes == self.capacity_bytes
