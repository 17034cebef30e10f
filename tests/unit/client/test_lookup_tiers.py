"""The client's mapping of a LookupPrefix answer's wire tiers to :class:`Tier` (issue 9 fast path)."""

from __future__ import annotations

import pytest

from kvstored.client._args import tiers_of
from kvstored.types import Tier
from kvstored.v1 import node_pb2 as pb


@pytest.mark.parametrize(
    "wire",
    [[], [Tier.DRAM] * 512, [Tier.DRAM, Tier.SSD, Tier.DRAM], [Tier.SSD] * 3, [Tier.DRAM] * 7 + [Tier.SSD]],
)
def test_tiers_of_maps_every_wire_value(wire: list[Tier]) -> None:
    resp = pb.LookupPrefixResponse(num_hit_blocks=len(wire), tiers=wire)
    got = tiers_of(resp.tiers[: resp.num_hit_blocks])
    assert got == wire
    assert all(type(t) is Tier for t in got)  # Tier members, not bare ints
