"""Index GC: a retired holder's rows come off its row list, so a GC call costs what it
unlinks (never a scan of the index), in bounded batches; holder row lists stay exact."""

from __future__ import annotations

from typing import Any

import numpy as np
from helpers import key
from hypothesis import given, settings
from hypothesis import strategies as st
from master_helpers import NS

from kvstored.master.index import BlockIndex
from kvstored.master.types import ReplicaState
from kvstored.types import Tier


class _Spy(np.ndarray):
    """An ndarray that remembers the largest array any index of it produced."""

    largest = 0

    def __getitem__(self, idx: Any) -> Any:
        out = super().__getitem__(idx)
        if isinstance(out, np.ndarray):
            _Spy.largest = max(_Spy.largest, out.size)
        return out


def test_gc_of_a_dropped_holder_takes_only_its_rows_and_never_scans_the_index() -> None:
    ix = BlockIndex(16)
    live, dropped = ix.add_holder(), ix.add_holder()
    for h in (live, dropped):
        ix.set_readable(h, True)
    n_live, n_dropped = 50_000, 300
    ix.add_replicas_bulk(NS, [(i + 10**9).to_bytes(16, "little") for i in range(n_live)], holder=live,
                         tiers=[1] * n_live, sizes=[1] * n_live, generation=1)
    ix.add_replicas_bulk(NS, [key(i) for i in range(n_dropped)], holder=dropped,
                         tiers=[2] * n_dropped, sizes=[1] * n_dropped, generation=1)
    ix.add_replica(NS, key(0), holder=live, tier=Tier.DRAM, size_bytes=1, generation=1)  # shared block
    assert ix.retire_holder(dropped) == n_dropped
    assert len(ix.lookup_prefix(NS, [key(1)])) == 0  # invisible at once
    cols = ix.columns
    for name in ("holder", "state", "block", "next", "tier", "retired", "hnext", "hprev"):
        setattr(cols, name, getattr(cols, name).view(_Spy))
    _Spy.largest = 0
    batches = []
    while got := ix.collect_garbage(max_rows=128):
        batches.append(got)
    assert batches == [128, 128, 44]
    assert _Spy.largest <= 128, f"GC indexed {_Spy.largest} rows at once: a scan"
    assert ix.num_garbage_rows == 0 and ix.num_replicas == n_live + 1
    assert ix.num_blocks == n_live + 1  # key(0) kept for the live holder, the rest gone
    assert [(r.holder, r.tier) for r in ix.lookup_prefix(NS, [key(0), key(1)])] == [(live, Tier.DRAM)]
    assert len(ix.holder_keys(dropped)) == 0 and len(ix.holder_keys(live)) == n_live + 1


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "bulk", "remove", "retire", "gc", "abort"]),
                              st.integers(0, 3), st.integers(0, 9),
                              st.sampled_from([Tier.DRAM, Tier.SSD])), max_size=60))
def test_holder_row_lists_match_the_rows(ops: list[tuple[str, int, int, Tier]]) -> None:
    ix = BlockIndex(16)
    holders = [ix.add_holder() for _ in range(4)]
    model: dict[int, set[tuple[int, Tier]]] = {h: set() for h in holders}
    retired: set[int] = set()
    for op, h, k, tier in ops:
        if op == "add" and h not in retired:
            ix.add_replica(NS, key(k), holder=h, tier=tier, size_bytes=k, generation=7)
            model[h].add((k, tier))
        elif op == "bulk" and h not in retired:
            ks = [k, (k + 1) % 10, k]
            ix.add_replicas_bulk(NS, [key(x) for x in ks], holder=h, tiers=[int(tier)] * 3,
                                 sizes=[1] * 3, generation=7)
            model[h] |= {(x, tier) for x in ks}
        elif op == "remove":
            ix.remove_replica(NS, key(k), holder=h, tier=tier)
            model[h].discard((k, tier))
        elif op == "abort" and h not in retired:
            ix.add_replica(NS, key(k), holder=h, tier=tier, size_bytes=1, generation=99,
                           state=ReplicaState.WRITING)
            ix.abort_generation(NS, key(k), 99)
        elif op == "retire":
            ix.retire_holder(h)
            retired.add(h)
        elif op == "gc":
            ix.collect_garbage(max_rows=2)
        for hh in holders:
            got = sorted((x[1], x[2]) for x in ix.holder_keys(hh))
            want = sorted((key(x), t) for x, t in model[hh])
            if hh in retired:
                assert set(got) <= set(want)  # GC takes them off, in batches
            else:
                assert got == want
    while ix.collect_garbage(max_rows=3):
        continue  # GC in batches of 3 rows until nothing is left
    assert ix.num_garbage_rows == 0
    assert all(not ix.holder_keys(h) for h in retired)
