"""Block-store tiers: the DRAM arena, the SSD directory and the tiered store over both.

This package has no gRPC dependency: the node service is a thin adapter over
:class:`kvstored.tiers.tiered.TieredStore`.
"""

from kvstored.types import BlockInfo, PinnedBlock, Reservation, StoreStats, Tier, TierStats

__all__ = ["BlockInfo", "PinnedBlock", "Reservation", "StoreStats", "Tier", "TierStats"]
