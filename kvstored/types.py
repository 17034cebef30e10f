"""Wire-level value types shared by every layer: tiers, replicas as the node pins and reserves
them, and the admin view of a block.

A leaf module: no I/O, no gRPC, imports only the standard library (and, for typing only,
kvstored.errors, another leaf). The tiers build these objects; the transport, the node, the
master and the client read them.

    put:  reserve(key, size) -> Reservation(view)  ->  caller fills view  ->  commit | abort
    get:  pin_many(keys) -> [PinnedBlock(view) | None | error]  ->  caller copies  ->  unpin
    export: read_for_export(keys) -> [ExportedBlock(view) | None]  ->  send  ->  release_export
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvstored.errors import KvstoredError


class Tier(IntEnum):
    """Where a replica lives on a node (mirrors ``kvstored.v1.Tier``)."""

    DRAM = 1
    SSD = 2


@dataclass(frozen=True, slots=True)
class Reservation:
    """Arena space reserved for one block being written.

    Attributes:
        key: the block hash.
        offset: byte offset of the block in the arena.
        size_bytes: the block's exact size.
        view: writable memoryview of ``size_bytes`` bytes at ``offset``.
        reservation_id: identifies the reservation for commit/abort.
    """

    key: bytes
    offset: int
    size_bytes: int
    view: memoryview = field(repr=False, compare=False)
    reservation_id: int


@dataclass(frozen=True, slots=True)
class PutOutcome:
    """Result of storing one block: ``stored`` False with no error = it already existed.

    ``error`` is the item's own error (a ``KvstoredError``: the block was not stored).
    """

    stored: bool
    error: KvstoredError | None = None


@dataclass(slots=True, unsafe_hash=True)
class PinnedBlock:
    """A block pinned in the DRAM arena for reading; release with ``TieredStore.unpin``.

    Read-only by convention: not a frozen dataclass because a frozen one costs ~1 us to
    build and a 16-block get builds 16 on the node's event loop; hashing and
    equality are those of the frozen form (``view`` and ``entry`` excluded).

    Attributes:
        key: the block hash.
        offset: byte offset in the arena.
        size_bytes: block size.
        meta: opaque metadata stored with the block (torch helpers: dtype and shape).
        tier: tier the block was found in before any promotion.
        view: read-only memoryview of the block's bytes (valid until unpinned).
        generation: the generation of the replica whose bytes were pinned (the DRAM entry's,
            which a promotion inherits from the SSD entry it read; see
            :mod:`kvstored.tiers.feed`); 0 = unknown. The data plane sends it with the block
            so a reading peer verifies its copy without asking the master: the master
            indexes the replica under the generation the node reported for it, and a
            reader drops every copy whose generation differs from the one it was named.
        entry: the store's record of the pinned block (a ``DramEntry``), so that
            ``TieredStore.unpin_many`` finds it without a search; None = look it up by
            offset. Opaque to everyone but the store.
    """

    key: bytes
    offset: int
    size_bytes: int
    meta: bytes
    tier: Tier
    view: memoryview = field(repr=False, compare=False)
    generation: int = 0
    entry: object = field(default=None, repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class ExportedBlock:
    """A block read for export (``TieredStore.read_for_export``); hand it back with
    ``release_export`` once sent.

    Attributes:
        key: the block hash.
        namespace_id: its namespace.
        size_bytes: its size.
        meta: its opaque metadata.
        tier: DRAM (``view`` is the pinned arena bytes) or SSD (``view`` is a private,
            checksum-verified copy read from the block's file; nothing pinned).
        view: read-only bytes of the block, valid until released.
        pinned: the DRAM pin (None for an SSD read).
        generation: the generation of the replica read (the DRAM entry's or, for an
            SSD-only block, the SSD entry's: a read for export keeps it; 0 = unknown).
        buffer: the mapping an SSD read's ``view`` lies in (None for a DRAM block); opaque
            to everyone but the store (an ``ExportBuffer`` of kvstored/tiers/export.py).
    """

    key: bytes
    namespace_id: bytes
    size_bytes: int
    meta: bytes
    tier: Tier
    view: memoryview = field(repr=False, compare=False)
    pinned: PinnedBlock | None = field(default=None, repr=False, compare=False)
    generation: int = 0
    buffer: object = field(default=None, repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class BlockInfo:
    """Admin view of one block (never pins or touches recency).

    ``generations``: the replica's generation per entry of ``tiers`` (empty when the store
    does not know them).
    """

    key: bytes
    size_bytes: int
    namespace_id: bytes
    tiers: tuple[Tier, ...]
    pinned: bool
    generations: tuple[int, ...] = ()
    copy: bool = False
    """A remote-fill copy of a block a peer holds (a duplicate in the pool; spare.py)."""


@dataclass(frozen=True, slots=True)
class TierStats:
    """Counters of one tier."""

    tier: Tier
    capacity_bytes: int
    used_bytes: int
    num_blocks: int
    hits: int
    evictions: int


@dataclass(frozen=True, slots=True)
class StoreStats:
    """Counters of the whole store since start."""

    tiers: tuple[TierStats, ...]
    gets: int
    hits: int
    misses: int
    puts: int
    put_failures: int
    checksum_failures: int
    pinned_blocks: int
