"""PrefixRouter (kvstored/integrations/router.py): per-node block sets from KV events and
the longest-cached-prefix pick."""

from __future__ import annotations

import msgspec

from kvstored.integrations.router import PrefixRouter, RoutePick
from kvstored.kv_events import AllBlocksCleared, BlockStored, removed_event, stored_event
from kvstored.types import Tier

NS = b"\x22" * 16
K = [bytes([i]) * 16 for i in range(8)]


def test_longest_prefix_wins_and_ties_go_to_the_smallest_node_id() -> None:
    r = PrefixRouter()
    r.apply(stored_event(K[:3], node_id="b", tier=Tier.DRAM, namespace_id=NS))
    r.apply(stored_event(K[:2] + K[3:5], node_id="a", tier=Tier.SSD, namespace_id=NS))
    assert r.pick(K[:5]) == RoutePick("b", 3)
    r.apply(stored_event([K[2]], node_id="a", tier=Tier.DRAM, namespace_id=NS))
    assert r.pick(K[:5]) == RoutePick("a", 5)
    assert r.pick(K[:2]) == RoutePick("a", 2)  # a tie: "a" < "b"
    assert r.pick([K[7]]) == RoutePick(None, 0)


def test_a_block_stays_while_any_tier_holds_it_and_cleared_forgets_all() -> None:
    r = PrefixRouter()
    r.apply(stored_event([K[0]], node_id="a", tier=Tier.DRAM, namespace_id=NS))
    r.apply(stored_event([K[0]], node_id="a", tier=Tier.SSD, namespace_id=NS))
    r.apply(removed_event([K[0]], node_id="a", tier=Tier.DRAM, namespace_id=NS))
    assert r.pick([K[0]]) == RoutePick("a", 1)
    r.apply(removed_event([K[0]], node_id="a", tier=Tier.SSD, namespace_id=NS))
    assert r.pick([K[0]]) == RoutePick(None, 0)
    r.apply(stored_event([K[1]], node_id="a", tier=Tier.DRAM, namespace_id=NS))
    r.apply(AllBlocksCleared())
    assert r.nodes() == {}


def test_events_of_other_classes_are_matched_by_their_tag_and_other_namespaces_skipped() -> None:
    class Foreign(BlockStored, tag="BlockStored"):  # e.g. vLLM's class extended
        extra: int = 0

    r = PrefixRouter(default_node="engine-0", namespace_id=NS)
    ev = Foreign(block_hashes=[K[0]], parent_block_hash=None, token_ids=[], block_size=0,
                 lora_id=None, medium="CPU", lora_name=None)  # no node_id: the default node
    r.apply(msgspec.convert(msgspec.to_builtins(ev), Foreign))
    r.apply(stored_event([K[1]], node_id="x", tier=Tier.DRAM, namespace_id=b"other"))
    assert r.nodes() == {"engine-0": 1}
