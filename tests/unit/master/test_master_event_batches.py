"""ReportEvents applied in vectorized runs (issue 19): the same outcome as one event at a time.

The reference is the per-event loop the master ran before (add_replica / remove_replica per
event, in order; kept in this test), so every difference in the index, the promotions, the
generations or the visible-replica
reports of a whole batch at once is a bug of the batched path. Hot chains (blocks with more
than HOT_CHAIN_ROWS rows) are forced by giving 24 nodes a small key set.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest
from helpers import key
from master_helpers import NS, spec

from kvstored.clock import FakeClock
from kvstored.errors import InvalidArgument
from kvstored.master.columns import HOT_CHAIN_ROWS
from kvstored.master.index import BlockIndex
from kvstored.master.state import MasterState
from kvstored.master.types import BlockEvent, BlockRef, EventKind, NodeAction
from kvstored.types import Tier

NS2 = b"\x22" * 16
NODES = [f"n{i:02d}" for i in range(24)]


class Recorder:
    """An IndexObserver that counts every visible-replica change."""

    def __init__(self) -> None:
        self.changes: Counter[tuple[bytes, bytes, int, Tier, bool]] = Counter()

    def replicas_changed(self, namespace_id: bytes, keys: Sequence[bytes], *, holder: int,
                         tier: Tier, visible: bool) -> None:
        for k in keys:
            self.changes[(namespace_id, k, holder, tier, visible)] += 1


def _state(rec: Recorder) -> MasterState:
    st = MasterState(epoch=100, clock=FakeClock(), rng=random.Random(1), initial_blocks=16,
                     observer=rec)
    for n in NODES:
        st.membership.register(spec(n))
        st.membership.sync_inventory(n, 1, sync_id=1, blocks=[], last_chunk=True)
    return st


def _stream(rng: random.Random, held: dict[str, set[tuple[bytes, int, Tier]]], node: str,
            seq: int, count: int) -> list[BlockEvent]:
    """Mostly consistent events (ADDED of a block not held, REMOVED of one held), with
    repeats, re-adds, removes of blocks not held, copies, generations and factors."""
    out = []
    mine = held[node]
    for _ in range(count):
        ns = NS if rng.random() < 0.85 else NS2
        k, tier = rng.randrange(40), Tier.DRAM if rng.random() < 0.8 else Tier.SSD
        item = (ns, k, tier)
        if item in mine and rng.random() < 0.7:
            kind = EventKind.REMOVED
            mine.discard(item)
        else:
            kind = EventKind.ADDED if rng.random() < 0.9 else EventKind.REMOVED
            if kind is EventKind.ADDED:
                mine.add(item)
            else:
                mine.discard(item)
        seq += 1
        out.append(BlockEvent(seq, kind, BlockRef(
            ns, key(k), tier, 4096 + rng.randrange(3),
            generation=rng.choice([0, 0, 1000 + seq]), copy=rng.random() < 0.3,
            replicas=rng.choice([0, 0, 0, 2, 3]))))
    return out


def _one_by_one(st: MasterState, node_id: str, events: list[BlockEvent]) -> tuple[object, int]:
    """The reference: the per-event loop the master ran before issue 19 (index.add_replica /
    remove_replica per event, in order)."""
    m = st.membership
    rec = m._live(node_id, 1)  # noqa: SLF001 (the reference needs the record)
    assert rec is not None and rec.synced and not rec.gap
    for ev in events:
        if ev.seq <= rec.applied_seq:
            continue
        assert ev.seq == rec.applied_seq + 1
        b = ev.block
        if ev.kind is EventKind.ADDED:
            m.index.add_replica(b.namespace_id, b.key, holder=rec.holder, tier=b.tier,
                                size_bytes=b.size_bytes,
                                generation=b.generation or m.generations.next(),
                                replace_generation=bool(b.generation), copy=b.copy,
                                factor=b.replicas)
            if not b.copy:
                m.promotions.settle(node_id, b.namespace_id, b.key)
        else:
            m.promotions.settle(node_id, b.namespace_id, b.key)
            if m.index.remove_replica(b.namespace_id, b.key, holder=rec.holder, tier=b.tier):
                m._promote_if_only_copies(b.namespace_id, b.key)  # noqa: SLF001
        rec.applied_seq = ev.seq
    return NodeAction.NONE, rec.applied_seq


def _snapshot(st: MasterState) -> dict[str, object]:
    ix = st.index
    reps = {(ns, k): ix.replicas(ns, key(k)) for ns in (NS, NS2) for k in range(40)}  # chain order
    factors = {(ns, k): ix.replication_factor(ns, key(k)) for ns in (NS, NS2) for k in range(40)}
    keys = [key(k) for k in range(40)]
    looks = []
    for n in NODES[:6]:
        h = st.membership.node(n).holder  # type: ignore[union-attr]
        pos, hit = ix.lookup_each(NS, keys, local_holder=h)
        looks.append((pos.tolist(), hit.holders.tolist(), hit.tiers.tolist()))
    cmds = {n: [(c.kind, c.namespace_id, c.key) for c in st.commands.pending(n)] for n in NODES}
    return {"replicas": reps, "factors": factors, "lookups": looks, "commands": cmds,
            "num_replicas": ix.num_replicas, "next_gen": st.generations.next()}


def test_a_batch_of_events_is_applied_as_one_event_at_a_time() -> None:
    rng = random.Random(19)
    rec_a, rec_b = Recorder(), Recorder()
    batched, single = _state(rec_a), _state(rec_b)
    held: dict[str, set[tuple[bytes, int, Tier]]] = {n: set() for n in NODES}
    seqs = dict.fromkeys(NODES, 0)
    for _round in range(8):
        for n in NODES:
            events = _stream(rng, held, n, seqs[n], rng.randrange(1, 30))
            seqs[n] += len(events)
            got = batched.membership.report_events(n, 1, events)
            assert got == _one_by_one(single, n, events)
        assert _snapshot(batched) == _snapshot(single)
        assert rec_a.changes == rec_b.changes
    assert batched.index.columns.hot, "the scenario must reach hot chains"
    assert max(batched.index.columns.hot.snapshot()[0].values()) > HOT_CHAIN_ROWS
    # a holder retired with rows in hot chains: GC unlinks them through the chains' maps
    victim = batched.membership.node(NODES[10]).holder  # type: ignore[union-attr]
    for st in (batched, single):
        st.membership.unregister(NODES[10], 1)
        while st.membership.collect_garbage(7):
            pass
    assert _snapshot(batched) == _snapshot(single)
    assert batched.index.num_holder_replicas(victim) == 0
    assert rec_a.changes == rec_b.changes


def test_a_gap_in_a_batch_applies_what_comes_before_it() -> None:
    rec = Recorder()
    st = _state(rec)
    ev = [BlockEvent(s, EventKind.ADDED, BlockRef(NS, key(s), Tier.DRAM, 1)) for s in (1, 2, 4)]
    action, applied = st.membership.report_events(NODES[0], 1, ev)
    assert (action.name, applied) == ("RESYNC", 2)
    assert [bool(st.index.replicas(NS, key(s))) for s in (1, 2, 4)] == [True, True, False]


def test_a_bad_kind_in_a_batch_applies_nothing() -> None:
    st = _state(Recorder())
    ev = [BlockEvent(1, EventKind.ADDED, BlockRef(NS, key(1), Tier.DRAM, 1)),
          BlockEvent(2, 9, BlockRef(NS, key(2), Tier.DRAM, 1))]  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="event 2: kind must be ADDED or REMOVED, got 9"):
        st.membership.report_events(NODES[0], 1, ev)
    assert st.index.replicas(NS, key(1)) == []


def _hot_index(n_holders: int) -> tuple[BlockIndex, list[int]]:
    ix = BlockIndex(16)
    hs = [ix.add_holder() for _ in range(n_holders)]
    for h in hs:
        ix.set_readable(h, True)
        ix.add_replica(NS, key(1), holder=h, tier=Tier.DRAM, size_bytes=1, generation=h + 1)
    return ix, hs


def test_a_long_chain_gets_maps_and_drops_them_when_short_again() -> None:
    ix, hs = _hot_index(HOT_CHAIN_ROWS + 4)
    c = ix.columns
    slot = c.slot(c.ns(NS, create=False), key(1))
    assert slot is not None and slot in c.hot  # found long by add_replica's own search
    for h in hs[:13]:  # removal in any order keeps the maps and the chain in step
        assert ix.remove_replica(NS, key(1), holder=h, tier=Tier.DRAM)
        row, prev = c.find_row(slot, hs[-1], int(Tier.DRAM))
        assert row >= 0 and (prev == -1 or c.next[prev] == row)
    assert slot not in c.hot  # below HOT_CHAIN_ROWS / 2 rows: walked again, no maps
    assert sorted(r.holder for r in ix.replicas(NS, key(1))) == hs[13:]
    assert c.find_rows(np.array([slot]), hs[-1], np.array([1])).tolist() == [
        c.find_row(slot, hs[-1], 1)[0]]


def test_batch_methods_refuse_bad_input_naming_it() -> None:
    ix, hs = _hot_index(2)
    args = dict(holder=hs[0], sizes=np.array([1, 1]), generations=np.array([1, 1]),
                replace_generation=np.array([False, False]), copies=np.array([False, False]),
                factors=np.array([0, 0]))
    with pytest.raises(InvalidArgument, match="keys must be distinct"):
        ix.add_replicas_batch(NS, [key(2), key(2)], tiers=np.array([1, 1]), **args)
    with pytest.raises(InvalidArgument, match="tier must be DRAM .1. or SSD .2., got 3"):
        ix.add_replicas_batch(NS, [key(2), key(3)], tiers=np.array([1, 3]), **args)
    with pytest.raises(InvalidArgument, match="one entry per key"):
        ix.add_replicas_batch(NS, [key(2)], tiers=np.array([1, 1]), **args)
    with pytest.raises(InvalidArgument, match="tiers must have one entry per key"):
        ix.remove_replicas_batch(NS, [key(2)], holder=hs[0], tiers=np.array([1, 1]))


def _pb_event(seq: int, *, kind: int = 1, tier: int = 1, key_bytes: bytes | None = None,
              generation: int = 0, replicas: int = 0) -> object:
    from kvstored.v1 import master_pb2 as pb
    return pb.BlockEvent(seq=seq, kind=kind, block=pb.BlockRef(
        namespace_id=NS, key=key(seq) if key_bytes is None else key_bytes, tier=tier,
        size_bytes=7, generation=generation, replicas=replicas))


def test_event_columns_of_a_request_hold_every_field() -> None:
    from kvstored.master.service import event_columns
    cols = event_columns([_pb_event(1), _pb_event(2, kind=2, tier=2, generation=9, replicas=3)])
    assert cols.seqs == [1, 2] and cols.kinds == [1, 2]
    b = cols.blocks
    assert b.keys == [key(1), key(2)] and b.namespace_ids == [NS, NS]
    assert b.tiers.tolist() == [1, 2] and b.sizes.tolist() == [7, 7]
    assert b.generations.tolist() == [0, 9] and b.replicas.tolist() == [0, 3]
    assert b.copies.tolist() == [False, False]


@pytest.mark.parametrize(("bad", "match"), [
    (dict(kind=5), "event 2: kind must be ADDED or REMOVED, got 5"),
    (dict(tier=7), "event 2: tier must be DRAM .1. or SSD .2., got 7"),
    (dict(key_bytes=b""), "event 2: key must have 1..[0-9]+ bytes, got 0"),
    (dict(generation=1 << 63), "event 2: generation must be < 2..63, got 9223372036854775808"),
    (dict(replicas=99), "event 2: replicas .* got 99"),
])
def test_event_columns_name_the_first_bad_event(bad: dict[str, object], match: str) -> None:
    from kvstored.master.service import event_columns
    with pytest.raises(InvalidArgument, match=match):
        event_columns([_pb_event(1), _pb_event(2, **bad), _pb_event(3, **bad)])  # type: ignore[arg-type]
