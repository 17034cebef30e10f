"""LookupPrefix for read fallback: ``alternates`` (the other readable replicas of each block on
distinct holders, ranked) and ``avoid`` (holders a reader found unreachable rank last, but
are still answered when nothing else is readable); in the index (master/ranking.py,
index.py) and over real gRPC (a MasterDaemon; kvstored/transport/master_rpc.py parses it).
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import numpy as np
import pytest
from helpers import key
from master_helpers import NS, blocks, spec

from kvstored.client.master import MasterClient
from kvstored.clock import FakeClock
from kvstored.config import MasterConfig
from kvstored.errors import InvalidArgument
from kvstored.master.daemon import MasterDaemon
from kvstored.master.index import BlockIndex
from kvstored.master.ranking import MAX_RANKED_REPLICAS
from kvstored.master.types import ReplicaState
from kvstored.types import Tier

DRAM, SSD = Tier.DRAM, Tier.SSD


def _index(num_holders: int) -> tuple[BlockIndex, list[int]]:
    ix = BlockIndex(16)
    holders = [ix.add_holder() for _ in range(num_holders)]
    for h in holders:
        ix.set_readable(h, True)
    return ix, holders


def _add(ix: BlockIndex, i: int, holder: int, tier: Tier, gen: int = 1, **kw: object) -> None:
    assert ix.add_replica(NS, key(i), holder=holder, tier=tier, size_bytes=100 + i,
                          generation=gen, **kw)  # type: ignore[arg-type]


def _alts(hit: object) -> list[list[tuple[int, int]]]:
    """Per answered block: its alternates as (holder, tier)."""
    alt = hit.alternates  # type: ignore[attr-defined]
    assert alt is not None
    out, start = [], 0
    for n in alt.counts.tolist():
        out.append(list(zip(alt.holders[start:start + n].tolist(),
                            alt.tiers[start:start + n].tolist(), strict=True)))
        start += n
    return out


def test_alternates_are_the_other_readable_holders_in_rank_order_one_row_per_holder() -> None:
    ix, (a, b, c, d) = _index(4)
    # block 0: a DRAM + SSD (one holder, two rows), b SSD, c DRAM; d holds it WRITING only
    for h, t in ((a, DRAM), (a, SSD), (b, SSD), (c, DRAM)):
        _add(ix, 0, h, t)
    _add(ix, 0, d, DRAM, state=ReplicaState.WRITING)
    _add(ix, 1, b, DRAM)  # block 1: one holder, no alternate
    ix.set_load(c, 1.0)
    hit = ix.lookup_prefix(NS, [key(0), key(1)], max_alternates=3)
    assert hit.holders.tolist() == [a, b]  # the best replica, as without alternates
    # a's SSD row is no alternate (the same node); c's remote DRAM beats b's remote SSD
    # whatever the load; d's WRITING row is not readable
    assert _alts(hit) == [[(c, DRAM), (b, SSD)], []]
    assert hit.alternates is not None
    assert hit.alternates.sizes.tolist() == [100, 100]
    # bounded by max_alternates; without it the hit carries none (the old answer)
    assert _alts(ix.lookup_prefix(NS, [key(0)], max_alternates=1)) == [[(c, DRAM)]]
    assert ix.lookup_prefix(NS, [key(0)]).alternates is None
    # an unreadable holder is neither best nor alternate
    ix.set_readable(c, False)
    assert _alts(ix.lookup_prefix(NS, [key(0)], max_alternates=3)) == [[(b, SSD)]]


def test_avoided_holders_rank_last_but_are_answered_when_nothing_else_is_readable() -> None:
    ix, (a, b, c) = _index(3)
    for h in (a, b, c):
        _add(ix, 0, h, DRAM)
    _add(ix, 1, a, DRAM)  # block 1: only on a
    keys = [key(0), key(1)]
    hit = ix.lookup_prefix(NS, keys, avoid_holders=[a], max_alternates=2)
    assert hit.holders.tolist() == [b, a]  # a, the lowest id, would win; avoided it is last
    assert _alts(hit) == [[(c, DRAM), (a, DRAM)], []]
    # avoid outranks locality too: a local replica on an avoided holder goes last
    hit = ix.lookup_prefix(NS, keys, local_holder=a, avoid_holders=[a, b], max_alternates=2)
    assert hit.holders.tolist() == [c, a]
    assert _alts(hit) == [[(a, DRAM), (b, DRAM)], []]
    # avoid alone (no alternates) reorders the best replica only
    hit = ix.lookup_prefix(NS, keys, avoid_holders=[a])
    assert (hit.holders.tolist(), hit.alternates) == ([b, a], None)
    # per key as well, misses skipped
    pos, hit = ix.lookup_each(NS, [key(9), *keys], avoid_holders=[a, b], max_alternates=1)
    assert pos.tolist() == [1, 2] and hit.holders.tolist() == [c, a]
    assert _alts(hit) == [[(a, DRAM)], []]


def test_max_alternates_out_of_range_is_refused_naming_it() -> None:
    ix, (a,) = _index(1)
    _add(ix, 0, a, DRAM)
    with pytest.raises(InvalidArgument, match=r"max_alternates must be in 0\.\.7, got 8"):
        ix.lookup_prefix(NS, [key(0)], max_alternates=MAX_RANKED_REPLICAS)
    with pytest.raises(InvalidArgument, match="got -1"):
        ix.lookup_each(NS, [key(0)], max_alternates=-1)


def test_the_ranked_best_equals_the_plain_best_on_random_indexes() -> None:
    rng = random.Random(17)
    for _ in range(30):
        ix, hs = _index(6)
        for h in hs:
            ix.set_load(h, float(rng.randrange(4)))
        n = 40
        for i in range(n):
            for h in rng.sample(hs, rng.randrange(1, 6)):
                for t in rng.sample([DRAM, SSD], rng.randrange(1, 3)):
                    _add(ix, i, h, t, gen=rng.randrange(1, 9),
                         copy=rng.random() < 0.3)  # type: ignore[arg-type]
        for h in rng.sample(hs, 2):
            ix.set_readable(h, False)
        keys = [key(i) for i in range(n)]
        local = rng.choice([-1, *hs])
        plain_pos, plain = ix.lookup_each(NS, keys, local_holder=local)
        pos, ranked = ix.lookup_each(NS, keys, local_holder=local, max_alternates=3)
        assert pos.tolist() == plain_pos.tolist()
        for col in ("holders", "tiers", "sizes", "generations"):
            assert np.array_equal(getattr(ranked, col), getattr(plain, col)), col
        for best, alts in zip(ranked.holders.tolist(), _alts(ranked), strict=True):
            got = [h for h, _ in alts]
            assert best not in got and len(set(got)) == len(got)
            assert all(ix.columns.readable[h] for h in got)


def test_the_rpc_answers_alternates_and_honours_avoid(tmp_path: Path) -> None:
    clock = FakeClock()
    daemon = MasterDaemon(MasterConfig(listen=["127.0.0.1:0"], data_dir=tmp_path,
                                       node_lease_s=5.0), clock=clock)

    async def main() -> None:
        await daemon.start()
        try:
            assert daemon.state is not None
            m = daemon.state.membership
            for n, port in (("a", 7000), ("b", 7100), ("c", 7200)):
                m.register(spec(n, port=port))
                m.sync_inventory(n, 1, sync_id=1, blocks=blocks([1, 2] if n != "c" else [2]),
                                 last_chunk=True)
            addr = daemon.grpc_addresses[0]

            def calls() -> None:
                with MasterClient(addr, timeout_s=10) as c:
                    got = c.lookup_each(NS, [key(1), key(2), key(3)], max_alternates=3)
                    assert got is not None
                    reps = got[0]
                    assert sorted(reps) == [0, 1]
                    assert [(r.node_id, [x.node_id for x in r.alternates])
                            for r in (reps[0], reps[1])] == [("a", ["b"]), ("a", ["b", "c"])]
                    alt = reps[1].alternates[1]
                    assert (alt.data_address, alt.tier, alt.size_bytes) == (
                        "127.0.0.1:7201", DRAM, 4096)
                    # b is avoided (found unreachable): last; an unknown id is ignored
                    got2, _ = c.lookup_prefix(NS, [key(1), key(2)], avoid=["a", "zz"],
                                              max_alternates=3)
                    assert [(r.node_id, [x.node_id for x in r.alternates]) for r in got2] == [
                        ("b", ["a"]), ("b", ["c", "a"])]
                    # an older reader (no new fields) gets the old answer
                    old, _ = c.lookup_prefix(NS, [key(1), key(2)])
                    assert [(r.node_id, r.alternates) for r in old] == [("a", ()), ("a", ())]
                    # the master caps the alternates at 3
                    capped = c.lookup_each(NS, [key(2)], max_alternates=100)
                    assert capped is not None and len(capped[0][0].alternates) == 2
                    with pytest.raises(InvalidArgument, match="65 avoid_node_ids"):
                        c.lookup_prefix(NS, [key(1)], avoid=[f"n{i}" for i in range(65)])

            await asyncio.to_thread(calls)
        finally:
            await daemon.stop()

    asyncio.run(main())
