"""Costs that must not grow with the node count: a hot block held by every node, lease
checks on every RPC (expire_lapsed's O(1) fast path keeps lapsing exact), is_complete on
every lookup (cached, invalidated by every sync, gap, join and lapse)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import key
from master_helpers import LEASE_S, NS, Cluster, blocks, spec

from kvstored import native
from kvstored.master import ranking
from kvstored.master.columns import IndexColumns
from kvstored.master.index import BlockIndex
from kvstored.master.ranking import MAX_RANKED_REPLICAS
from kvstored.master.types import BlockEvent, BlockRef, EventKind
from kvstored.types import Tier


def _hot_index(num_holders: int) -> tuple[BlockIndex, list[int]]:
    ix = BlockIndex(16)
    hs = [ix.add_holder() for _ in range(num_holders)]
    for i, h in enumerate(hs):
        ix.set_readable(h, True)
        ix.set_load(h, float(num_holders - i))  # the newest rows are the least loaded
        ix.add_replica(NS, key(0), holder=h, tier=Tier.DRAM, size_bytes=1, generation=1)
    return ix, hs


def test_a_block_held_by_many_nodes_is_ranked_in_bounded_steps(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "master_index", None)  # the numpy walk: its steps are counted
    ix, hs = _hot_index(200)
    steps = []
    score = ranking.score_rows

    def counting(cols: IndexColumns, rows: np.ndarray, local: int) -> object:
        steps.append(len(rows))
        return score(cols, rows, local)

    monkeypatch.setattr(ranking, "score_rows", counting)
    got = list(ix.lookup_prefix(NS, [key(0)]))
    assert len(steps) == MAX_RANKED_REPLICAS, steps
    assert got[0].holder == hs[-1]  # least loaded among the newest rows
    steps.clear()
    got = list(ix.lookup_prefix(NS, [key(0)], local_holder=hs[-1]))  # local DRAM at the head
    assert len(steps) == 1 and got[0].holder == hs[-1]


@pytest.mark.parametrize("impl", ["native", "python"])
def test_a_hot_block_is_ranked_among_its_newest_rows_only(
        impl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if impl == "python":
        monkeypatch.setattr(native, "master_index", None)
    elif native.master_index is None:
        pytest.skip("kvstored._native_master not built")
    ix, hs = _hot_index(200)
    ix.set_load(hs[0], 0.0)  # the least loaded of all, but the oldest row: not ranked
    assert list(ix.lookup_prefix(NS, [key(0)]))[0].holder == hs[-1]
    for h in hs[-MAX_RANKED_REPLICAS:]:  # no newest row readable: the walk goes on to hs[0]
        ix.set_readable(h, False)
    assert list(ix.lookup_prefix(NS, [key(0)]))[0].holder == hs[-MAX_RANKED_REPLICAS - 1]


def test_a_hot_block_whose_newest_rows_are_unreadable_is_still_found() -> None:
    ix, hs = _hot_index(3 * MAX_RANKED_REPLICAS)
    for h in hs[1:]:  # only the oldest row (the chain's tail) stays readable
        ix.set_readable(h, False)
    got = list(ix.lookup_prefix(NS, [key(0)]))
    assert [r.holder for r in got] == [hs[0]]


def test_a_silent_node_lapses_exactly_after_its_lease_while_others_heartbeat() -> None:
    c = Cluster()
    for n in ("a", "b", "c"):
        c.join(n, inventory=blocks([ord(n)]))
    c.clock.advance(1.0)
    c.members.heartbeat("b", 1)  # "a" and "c" were heard at t0, "b" at t0 + 1
    for _ in range(int(LEASE_S) - 1):
        c.clock.advance(1.0)
        c.members.heartbeat("c", 1)
    assert c.members.expire_lapsed() == []  # a: exactly LEASE_S silent, not more
    c.clock.advance(0.5)
    assert c.members.heartbeat("c", 1) == c.members.heartbeat("c", 1)
    assert c.members.node("a") is None and c.members.node("b") is not None
    c.clock.advance(0.6)  # b: silent LEASE_S + 0.1
    assert c.members.node("b") is None and c.members.node("c") is not None
    assert c.where([ord("c")]) == [("c", Tier.DRAM)] and c.where([ord("a")]) == []


def test_is_complete_follows_every_sync_gap_join_and_lapse() -> None:
    c = Cluster()
    m = c.members
    c.join("a", inventory=blocks([1]))
    assert m.is_complete()
    m.report_events("a", 1, [BlockEvent(5, EventKind.ADDED, BlockRef(NS, key(2), Tier.DRAM, 1))])
    assert not m.is_complete()  # a gap (seq 5 after 0)
    c.sync("a", 1, blocks([1, 2]), seq=5)
    assert m.is_complete()
    m.register(spec("b"))
    assert not m.is_complete()  # b registered, not synced
    c.clock.advance(LEASE_S / 2)
    m.heartbeat("a", 1)
    c.clock.advance(LEASE_S / 2 + 1)
    assert m.is_complete()  # b lapsed; a alone is synced
