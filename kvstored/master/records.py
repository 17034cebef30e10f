"""Value types of the master's block index: replica state, replicas, lookup answers,
generations."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from kvstored.errors import InvalidArgument
from kvstored.types import Tier

MAX_SIZE_BYTES = (1 << 32) - 1
"""Largest replica size the packed ``u4`` size column holds (4 GiB - 1)."""


class ReplicaState(IntEnum):
    """State of a replica (mirrors ``kvstored.v1.ReplicaState``)."""

    WRITING = 1
    COMMITTED = 2


COPY_BIT = 0x80
"""Set in a row's ``state`` byte (with COMMITTED) when the replica is a remote-fill copy of
another node's block (``BlockRef.copy``): packed there, so a replica stays 34 bytes."""
STATE_MASK = 0x7F
"""The :class:`ReplicaState` bits of a row's ``state`` byte."""


@dataclass(frozen=True, slots=True)
class Replica:
    """One replica of one block, as the index knows it.

    Attributes:
        holder: the holder (node incarnation) id of the membership.
        tier: DRAM or SSD on that node.
        size_bytes: the block's size.
        generation: the write that created it (placement) or the event that reported it.
        state: WRITING (placed, not committed) or COMMITTED.
        copy: the holder reported it as a remote-fill copy of another node's block (a
            duplicate it evicts first): never counted as the block's original.
    """

    holder: int
    tier: Tier
    size_bytes: int
    generation: int
    state: ReplicaState
    copy: bool = False


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """Answer of :meth:`BlockIndex.lookup_prefix`: the best replica of each leading block,
    as columns (no Python object per block on the hot path).

    Attributes:
        holders: ``(num_blocks,)`` int64, the holder of each block's best replica.
        tiers: ``(num_blocks,)`` uint8, its tier (1 DRAM, 2 SSD).
        sizes: ``(num_blocks,)`` uint32, its size in bytes.
        generations: ``(num_blocks,)`` uint64, its generation.
    """

    holders: np.ndarray
    tiers: np.ndarray
    sizes: np.ndarray
    generations: np.ndarray

    def __len__(self) -> int:
        return len(self.holders)

    def __iter__(self) -> Iterator[Replica]:
        """Per-block :class:`Replica` objects (convenience for tests and admin views)."""
        for h, t, s, g in zip(self.holders.tolist(), self.tiers.tolist(), self.sizes.tolist(),
                              self.generations.tolist(), strict=True):
            yield Replica(h, Tier(t), s, g, ReplicaState.COMMITTED)


EMPTY_HIT = PrefixHit(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint8),
                       np.zeros(0, dtype=np.uint32), np.zeros(0, dtype=np.uint64))
"""The answer for a prefix whose first block is missing."""


class Generations:
    """Source of write generations: strictly increasing, also across master restarts.

    Args:
        start: the first generation; the master passes its start epoch (ns since the Unix
            epoch, strictly greater than any earlier start's), so a generation handed out
            before a restart is never handed out again.
    """

    def __init__(self, start: int) -> None:
        if not 0 < start < (1 << 63):
            raise InvalidArgument(f"generation start must be in (0, 2**63), got {start}")
        self._next = int(start)

    def next(self) -> int:
        """A new generation, greater than every one before."""
        g = self._next
        self._next += 1
        return g
