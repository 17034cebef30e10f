"""Block-store tiers: the DRAM arena, the SSD directory and the tiered store over both.

This package has no gRPC dependency: the node service is a thin adapter over
:class:`kvstored.tiers.tiered.TieredStore`, a facade over components (reservations.py,
reads.py, export.py, transit.py) built on one shared state (state.py). Each tier (dram.py,
ssd.py) implements :class:`kvstored.tiers.base.TierBackend`. The eviction order is
docs/architecture.md#tiers-and-eviction.

- ``allocator.py``: best-fit block allocator of the DRAM arena, with coalescing.
- ``base.py``: the ports of the store core (TierBackend) and the checks of its arguments.
- ``dram.py``: the DRAM tier, one shared-memory arena with an LRU index.
- ``eviction.py``: DRAM victim choice that frees a contiguous extent (LRU, neighbours by address).
- ``export.py``: reading blocks out for a peer or a spill, coldest first, never promoting.
- ``feed.py``: ChangeFeed, the ordered, bounded log of replica changes (for the cluster link).
- ``reads.py``: the read side: pins, releases, recency, probes and the admin listing.
- ``reservations.py``: the write side: reservations, commits, aborts, puts, removals, copy marks.
- ``spare.py``: which blocks an allocation may evict (a read never costs the pool a block).
- ``ssd.py``: the SSD tier, a capped directory with one file per block and a persistent index.
- ``ssd_batch.py``: the SSD tier's I/O pool (a batch's reads and writes, several at once).
- ``ssd_format.py``: on-disk formats (store keys, file names, index records, block trailers).
- ``ssd_io.py``: block file I/O (positional reads and writes, O_DIRECT writes).
- ``ssd_recovery.py``: opening an SSD directory: its lock, its index, rebuilding the entries.
- ``state.py``: StoreState, the one set of mutable state the components share (and its lock).
- ``tenants.py``: TenantUsage, bytes per tenant and tier, and the quota checks (docs/tenants.md).
- ``tiered.py``: TieredStore, the facade the node uses.
- ``transit.py``: promotion and demotion without holding the store lock during disk I/O.
"""

from kvstored.types import BlockInfo, PinnedBlock, Reservation, StoreStats, Tier, TierStats

__all__ = ["BlockInfo", "PinnedBlock", "Reservation", "StoreStats", "Tier", "TierStats"]
