"""The ports of the store core: what a tier must offer, what the store answers besides value
objects (those live in :mod:`kvstored.types`), and the checks of its arguments.

The store core (``TieredStore`` in tiered.py, over the components built on one
:class:`~kvstored.tiers.state.StoreState`) is thread-safe behind one lock; callers copy bytes
into/out of arena views *outside* that lock while they hold a reservation (put) or a pin
(get). A reservation is invisible to readers until committed.

A tier (:class:`TierBackend`) is one place a node keeps replicas: dram.py's
:class:`~kvstored.tiers.dram.DramTier` (the arena) and ssd.py's
:class:`~kvstored.tiers.ssd.SsdTier` (a directory) implement it. What the store does with
every tier alike (stats, the change feed's view of its block map, closing) goes through this
protocol, so a third tier (a remote pool, CXL memory) is one new module implementing it, plus
the transfers that move blocks into and out of it (transit.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from kvstored.errors import InvalidArgument, KeyInvalid
from kvstored.types import Tier, TierStats

NEEDS_IO: object = type("NeedsIo", (), {"__repr__": lambda self: "NEEDS_IO"})()
"""Result of ``TieredStore.pin_many(..., may_block=False)`` for every key when one of them
would need disk I/O (an SSD-only or promoting block): nothing was pinned or counted; call
again with ``may_block=True`` from a thread that may block."""


def check_key(key: object) -> bytes:
    """``key`` as bytes.

    Raises:
        KeyInvalid: not bytes-like, or empty.
    """
    if type(key) is bytes and key:
        return key
    if not isinstance(key, (bytes, bytearray, memoryview)):
        raise KeyInvalid(f"block key must be bytes, got {type(key).__name__}")
    key = bytes(key)
    if not key:
        raise KeyInvalid("block key is empty; pass the block hash bytes")
    return key


def check_bytes(name: str, value: object) -> bytes:
    """``value`` (the argument ``name``) as bytes.

    Raises:
        InvalidArgument: not bytes-like.
    """
    if type(value) is bytes:
        return value
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise InvalidArgument(f"{name} must be bytes, got {type(value).__name__}")
    return bytes(value)


class TierEntry(Protocol):
    """The metadata a tier keeps per block (``DramEntry``, ``SsdEntry``); never the bytes."""

    size_bytes: int
    """The block's exact size in bytes (not rounded to the tier's allocation unit)."""

    generation: int
    """This replica's generation, unique per daemon start; 0 until the store's change feed
    stamps it (feed.py). A replica moved between tiers keeps its generation."""

    @property
    def namespace_id(self) -> bytes:
        """The namespace the block was stored under (b"" is one too)."""

    @property
    def meta(self) -> bytes:
        """The opaque metadata stored with the block."""


@runtime_checkable
class TierBackend(Protocol):
    """One tier of a node's block store: a capped space and the index of the blocks in it.

    Concurrency: not thread-safe on its own. Every member is read and changed with the
    store lock held (``StoreState.lock``; a tier that needs the lock for its own phases is
    given that same lock), and a tier never does I/O under that lock (a tier with slow
    I/O splits it into begin/end phases taken under the lock and an I/O phase run without).
    """

    @property
    def tier(self) -> Tier:
        """Which tier this is (reported in stats, in listings and to the master)."""

    @property
    def capacity_bytes(self) -> int:
        """The hard cap of the tier in bytes (> 0). Never exceeded: an allocation that does
        not fit evicts or fails; it never overcommits."""

    @property
    def used_bytes(self) -> int:
        """Bytes charged now, in the tier's allocation unit (DRAM: committed blocks,
        reservations and promotions in flight, each rounded up to 4096; SSD: indexed files
        and writes in flight, each rounded up to 4096); ``0 <= used_bytes <=
        capacity_bytes``."""

    @property
    def entries(self) -> Mapping[bytes, TierEntry]:
        """The tier's committed blocks: store key (ssd_format.store_key) -> entry, least
        recently used first. Only blocks a reader may be served are in it (a block being
        written or read back is not). The store replaces it with a change-feed observed map
        (feed.ObservedEntries) at start, so every key it gains or loses is reported."""

    hits: int
    """Reads served from this tier since start (a promotion counts on the tier read)."""

    evictions: int
    """Blocks evicted from this tier since start (demoted or dropped to make room)."""

    def stats(self) -> TierStats:
        """The tier's counters and usage now (store lock held; never waits on I/O).

        Returns:
            ``TierStats`` with ``capacity_bytes``, ``used_bytes``, ``num_blocks`` (the size
            of :attr:`entries`), ``hits`` and ``evictions`` as above.
        """

    def close(self) -> None:
        """Release what the tier holds (mappings, files, its index); idempotent. The store
        closes its tiers slowest first, once no transfer between tiers is in flight.

        Raises:
            Exception: whatever the tier's storage raises flushing its persistent state
                (rocksdict's plain ``Exception`` for the SSD index); the tier's resources
                are released all the same.
        """
