"""What the NodeCore unit tests share: a small DRAM-only core (keys: tests/helpers.py; the
clock: kvstored.clock.FakeClock)."""

from __future__ import annotations

from collections.abc import Iterator

from kvstored.clock import FakeClock
from kvstored.config import NodeConfig
from kvstored.node.core import NodeCore
from kvstored.node.metrics import NodeMetrics
from kvstored.tiers.tiered import TieredStore


def unit_core(clock: FakeClock, *, max_quarantine_bytes: int = 1 << 20) -> Iterator[NodeCore]:
    """A NodeCore on 1 MiB of DRAM (no SSD; blocks up to 64 KiB; 5 s pin lease; metrics on)
    reading ``clock``; yields it once and closes its store (use with ``yield from``)."""
    cfg = NodeConfig(
        node_id="unit", dram_size_bytes=1 << 20, ssd_size_bytes=0, max_block_bytes=64 << 10,
        pin_lease_s=5.0, max_quarantine_bytes_per_session=max_quarantine_bytes,
    )
    store = TieredStore(dram_size_bytes=cfg.dram_size_bytes, arena_dir=None,
                        max_block_bytes=cfg.max_block_bytes)
    try:
        yield NodeCore(store, cfg, epoch=1, metrics=NodeMetrics(), clock=clock)
    finally:
        store.close()
