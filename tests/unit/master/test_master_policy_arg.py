"""The placement policy a PutStart / PutStartBatch request names (master/service.py)."""

from __future__ import annotations

import pytest

from kvstored.errors import InvalidArgument
from kvstored.master.service import _policy_of
from kvstored.master.types import PlacementPolicy
from kvstored.v1 import master_pb2 as pb


def test_a_named_policy_maps_unspecified_is_the_default_and_an_unknown_one_is_refused() -> None:
    assert _policy_of(pb.PLACEMENT_POLICY_UNSPECIFIED) is None
    assert _policy_of(pb.PLACEMENT_POLICY_MOST_FREE) is PlacementPolicy.MOST_FREE
    assert _policy_of(pb.PLACEMENT_POLICY_RANDOM) is PlacementPolicy.RANDOM
    with pytest.raises(InvalidArgument, match="unknown placement policy 99"):
        _policy_of(99)
