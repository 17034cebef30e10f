"""Block-store tiers: the DRAM arena, the SSD directory and the tiered store over both.

This package has no gRPC dependency: the node service is a thin adapter over
:class:`kvstored.tiers.tiered.TieredStore`, a facade over components (reservations.py,
reads.py, export.py, transit.py) built on one shared state (state.py). Each tier (dram.py,
ssd.py) implements :class:`kvstored.tiers.base.TierBackend`.
"""

from kvstored.types import BlockInfo, PinnedBlock, Reservation, StoreStats, Tier, TierStats

__all__ = ["BlockInfo", "PinnedBlock", "Reservation", "StoreStats", "Tier", "TierStats"]
