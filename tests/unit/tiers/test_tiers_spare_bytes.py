"""``TieredStore.spare_bytes`` (tiers/spare.py ``SpareBytes``): the DRAM bytes of remote-fill
copies and of DRAM blocks also on the node's SSD, kept current as the block maps change,
always equal to a count from scratch (random puts, reads that promote, spills to SSD,
copies, removals and the evictions a full store makes, seeded)."""

from __future__ import annotations

import pathlib
import random

import pytest
from helpers import key

from kvstored.errors import KvstoredError
from kvstored.tiers.tiered import TieredStore

K = 4096
BLOCK = 2 * K + 100  # 3 allocation units in DRAM


def _from_scratch(s: TieredStore) -> int:
    st = s._state  # noqa: SLF001 (white box: the maps the count must agree with)
    dram, ssd = st.dram, st.ssd
    ssd_keys = ssd.entries if ssd is not None else {}
    return sum(dram.round_up(e.size_bytes) for k, e in dram.entries.items()
               if k in dram.copies or k in ssd_keys)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_spare_bytes_always_equals_a_count_from_scratch(tmp_path: pathlib.Path, seed: int) -> None:
    rng = random.Random(seed)
    s = TieredStore(dram_size_bytes=8 * 3 * K, arena_dir=None, ssd_dir=tmp_path / "ssd",
                    ssd_size_bytes=12 * 3 * K)
    try:
        spare_seen = 0
        for step in range(400):
            i = rng.randrange(30)
            op = rng.random()
            try:
                if op < 0.35:
                    s.put(key(i), bytes([i]) * BLOCK)
                elif op < 0.6:
                    got = s.pin_many([key(i)])  # promotes an SSD block: both tiers
                    s.unpin_many([p for p in got if p is not None and not isinstance(p, Exception)])  # type: ignore[misc]
                elif op < 0.7:
                    s.spill_to_ssd()
                elif op < 0.85:
                    r = s.reserve(key(i), BLOCK, copy=True)  # a remote-fill copy
                    if r is not None:
                        r.view[:] = bytes([i]) * BLOCK
                        s.commit(r)
                else:
                    s.remove([key(i)])
            except KvstoredError:
                pass  # (no room for a copy or a promotion: nothing changed)
            assert s.spare_bytes() == _from_scratch(s), f"step {step}"
            spare_seen = max(spare_seen, s.spare_bytes())
        assert spare_seen > 0  # the walk reached both kinds of spare block
    finally:
        s.close()
