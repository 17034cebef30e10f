"""Scenario helpers of the master unit tests: a cluster of fake nodes on a FakeClock."""

from __future__ import annotations

import random

from helpers import key

from kvstored.clock import FakeClock
from kvstored.master.repair import RepairSettings
from kvstored.master.state import MasterState
from kvstored.master.types import BlockRef, NodeSpec, TierUsage
from kvstored.types import Tier

NS = b"\x11" * 16
LEASE_S = 10.0
MiB = 1 << 20


def spec(node_id: str, epoch: int = 1, *, dram_cap: int = 64 * MiB, dram_used: int = 0,
         ssd_cap: int = 256 * MiB, port: int = 7000) -> NodeSpec:
    return NodeSpec(
        node_id=node_id, epoch=epoch, grpc_address=f"127.0.0.1:{port}",
        data_address=f"127.0.0.1:{port + 1}",
        tiers=(TierUsage(Tier.DRAM, dram_cap, dram_used), TierUsage(Tier.SSD, ssd_cap, 0)),
    )


def blocks(keys: range | list[int], tier: Tier = Tier.DRAM, size: int = 4096) -> list[BlockRef]:
    return [BlockRef(NS, key(i), tier, size) for i in keys]


class Cluster:
    """A MasterState (membership + index + placement) on a FakeClock, with one-line scenario
    steps."""

    def __init__(self, *, lease_s: float = LEASE_S, failures: int = 3, seed: int = 7,
                 write_lease_s: float = 30.0, repair: RepairSettings | None = None) -> None:
        self.clock = FakeClock()
        self.state = MasterState(epoch=100, clock=self.clock, node_lease_s=lease_s,
                                 unhealthy_after_failures=failures, write_lease_s=write_lease_s,
                                 rng=random.Random(seed), initial_blocks=16, repair=repair)
        self.index = self.state.index
        self.gens = self.state.generations
        self.members = self.state.membership
        self.placement = self.state.placement
        self._sync_ids = 0

    def join(self, node_id: str, epoch: int = 1, inventory: list[BlockRef] | None = None,
             seq: int = 0, **kw: int) -> None:
        """Register and sync an inventory in one chunk."""
        self.members.register(spec(node_id, epoch, **kw))
        self.sync(node_id, epoch, inventory or [], seq=seq)

    def sync(self, node_id: str, epoch: int, inventory: list[BlockRef], seq: int = 0) -> int:
        self._sync_ids += 1
        _, n = self.members.sync_inventory(node_id, epoch, sync_id=self._sync_ids,
                                           blocks=inventory, last_chunk=True, seq=seq)
        return n

    def holder(self, node_id: str) -> int:
        rec = self.members.node(node_id)
        assert rec is not None, node_id
        return rec.holder

    def where(self, keys: list[int], local: str = "") -> list[tuple[str, Tier]]:
        """(node id, tier) of the best replica of each leading block."""
        rec = self.members.node(local) if local else None
        got = self.index.lookup_prefix(NS, [key(i) for i in keys],
                                       local_holder=rec.holder if rec else -1)
        out = []
        for r in got:
            owner = self.members.record_of_holder(r.holder)
            assert owner is not None
            out.append((owner.spec.node_id, r.tier))
        return out
