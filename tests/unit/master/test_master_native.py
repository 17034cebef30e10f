"""The master index's C loops (native/master.c) against their numpy fallbacks, same inputs.

Each of ``KeyTable.get_many``, ``ranking.best_rows`` and ``IndexColumns.find_rows`` has a C
version (used when ``kvstored._native_master`` is built) and the numpy one it replaced (used
when it is not, or with ``KVSTORED_NATIVE=0``). Here both run on the same random inputs:
key tables with deleted entries (tombstones), keys sharing their low word (collisions of
home buckets, overflowed buckets), hot chains (blocks with a replica on every holder),
removed rows, WRITING rows, copies, unreadable and retired holders, equal loads (the
holder tie-break) and loads above the clip; every answer must be identical. The workload
test then drives two indexes through the same adds, removes and lookups, one per
implementation, and compares every answer and the chains.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from helpers import ServicerContextStub
from master_helpers import NS

from kvstored import native
from kvstored.master import ranking
from kvstored.master.columns import HOT_CHAIN_ROWS, PyHotChains
from kvstored.master.holders import LOAD_CLIP
from kvstored.master.index import BlockIndex
from kvstored.master.keytable import KeyTable, keys_to_words
from kvstored.master.types import STATE_MASK, ReplicaState
from kvstored.types import Tier

pytestmark = pytest.mark.skipif(native.master_index is None,
                                reason="kvstored._native_master not built (python setup.py build_ext --inplace)")
NATIVE = native.master_index


def _key(rng: random.Random, lows: list[int]) -> bytes:
    return rng.choice(lows).to_bytes(8, "little") + rng.getrandbits(64).to_bytes(8, "little")


@pytest.mark.parametrize("seed", range(6))
def test_keytable_probe_matches_numpy(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    lows = [rng.getrandbits(64) for _ in range(rng.choice([3, 40, 5000]))]  # few: collisions
    t = KeyTable(16)
    model: dict[bytes, int] = {}
    for step in range(30):
        new = list({_key(rng, lows) for _ in range(rng.randint(1, 300))} - set(model))
        slots = np.arange(len(model) + step * 1000, len(model) + step * 1000 + len(new))
        t.insert_many(keys_to_words(new), slots)
        model.update(zip(new, slots.tolist(), strict=True))
        for k in rng.sample(sorted(model), len(model) // 4):  # tombstones
            w = keys_to_words([k])[0]
            assert t.delete_words(int(w[0]), int(w[1]))
            del model[k]
        probe = rng.sample(sorted(model), min(len(model), 200)) + [_key(rng, lows) for _ in range(100)]
        rng.shuffle(probe)
        words = keys_to_words(probe)
        got = t.get_many(words)
        assert got.dtype == np.int64
        assert got.tolist() == t.py_get_many(words).tolist() == [model.get(k, -1) for k in probe]
    assert t._over.any()  # the collisions overflowed some buckets (the C probe followed them)
    monkeypatch.setattr(native, "master_index", None)
    assert t.get_many(words).tolist() == got.tolist()  # the dispatch takes the fallback
    assert KeyTable(16).get_many(words).tolist() == [-1] * len(probe)


def _colliding_lows(n: int, home: int, bits: int) -> list[int]:
    """``n`` low words whose home bucket is ``home`` in a table of ``2**bits`` buckets and
    ``home << k`` after it grows k times (lo * MULT's top bits, MULT inverted mod 2**64)."""
    inv = pow(0x9E3779B97F4A7C15, -1, 1 << 64)
    return [(((home << (64 - bits)) + r) * inv) % (1 << 64) for r in range(1, n + 1)]


@pytest.mark.parametrize("seed", range(3))
def test_keys_colliding_in_one_bucket_survive_growth_and_deletes(seed: int) -> None:
    """Many keys with one home bucket (and keys sharing a low word): they spill across the
    following buckets; deletes leave holes the next inserts reuse; growth rehashes them (they
    collide again at every size). The C probe, the numpy probe and a dict agree throughout."""
    rng = random.Random(seed)
    t = KeyTable(16)
    bits0 = t._bits
    home = rng.randrange(1 << bits0)
    lows = _colliding_lows(60, home, bits0)
    assert len({t._home_int(lo) for lo in lows}) == 1
    keys = [lo.to_bytes(8, "little") + rng.getrandbits(64).to_bytes(8, "little") for lo in lows]
    keys += [lows[0].to_bytes(8, "little") + h.to_bytes(8, "little") for h in range(20)]  # same low word
    keys = list(dict.fromkeys(keys))
    model: dict[bytes, int] = {}

    def check() -> None:
        probe = keys + [_key(rng, lows) for _ in range(50)]
        words = keys_to_words(probe)
        want = [model.get(k, -1) for k in probe]
        assert t.get_many(words).tolist() == t.py_get_many(words).tolist() == want
        assert [t.get(k) for k in probe] == want
        assert len(t) == len(model)

    for i, k in enumerate(keys[:40]):  # one at a time: the scalar insert path
        t.insert(k, i)
        model[k] = i
    check()
    assert t._bits > bits0 and t._over.sum() >= 40 // 3 - 1  # grown; a run of overflowed buckets
    for k in rng.sample(keys[:40], 25):
        w = keys_to_words([k])[0]
        assert t.delete_words(int(w[0]), int(w[1]))
        del model[k]
    check()
    rest = keys[40:]
    t.insert_many(keys_to_words(rest), np.arange(100, 100 + len(rest)))  # the batch path
    model.update(zip(rest, range(100, 100 + len(rest)), strict=True))
    check()
    bits1 = t._bits
    filler = [rng.getrandbits(128).to_bytes(16, "little") for _ in range(3000)]  # growth: a rehash
    t.insert_many(keys_to_words(filler), np.arange(1000, 4000))
    model.update(zip(filler, range(1000, 4000), strict=True))
    assert t._bits > bits1
    check()
    buckets, bits = t.probe_buffers()
    assert buckets.ctypes.data % 64 == 0 and buckets.nbytes == 64 << bits == t.nbytes  # one line a bucket


def test_the_c_probe_refuses_buckets_of_the_wrong_size_or_alignment() -> None:
    t = KeyTable(16)
    buckets, bits = t.probe_buffers()
    words = keys_to_words([bytes(16)])
    out = np.empty(1, dtype=np.int64)
    with pytest.raises(ValueError, match="64-byte aligned"):
        NATIVE.keytable_get_many(buckets[:-64], bits, words, out)
    raw = np.zeros(buckets.nbytes + 128, dtype=np.uint8)
    off = -raw.ctypes.data % 64 + 8
    with pytest.raises(ValueError, match="offset 8"):
        NATIVE.keytable_get_many(raw[off : off + buckets.nbytes], bits, words, out)
    with pytest.raises(ValueError, match="bits must be in 1..40"):
        NATIVE.keytable_get_many(buckets, 0, words, out)


def _random_index(rng: random.Random, num_holders: int, num_keys: int) -> tuple[BlockIndex, list[bytes], list[int]]:
    """An index with hot blocks (a replica on every holder), removed rows, WRITING rows,
    copies, retired and unreadable holders, tied and clipped loads."""
    ix = BlockIndex(16)
    hs = [ix.add_holder() for _ in range(num_holders)]
    keys = [rng.getrandbits(128).to_bytes(16, "little") for _ in range(num_keys)]
    hot = keys[: max(1, num_keys // 10)]
    for h in hs:
        ix.set_readable(h, rng.random() < 0.8)
        ix.set_load(h, rng.choice([0.0, 1.0, 1.0, 2.5, 3 * LOAD_CLIP, float(rng.randint(0, 9))]))
        mine = hot + rng.sample(keys, rng.randint(0, num_keys // 3))
        for k in dict.fromkeys(mine):
            tier = rng.choice([Tier.DRAM, Tier.SSD])
            state = ReplicaState.WRITING if rng.random() < 0.1 else ReplicaState.COMMITTED
            ix.add_replica(NS, k, holder=h, tier=tier, size_bytes=rng.randint(0, 9), generation=rng.randint(1, 99),
                           state=state, copy=rng.random() < 0.2)
    for h in rng.sample(hs, 2):
        ix.retire_holder(h)
    for _ in range(num_keys):  # removed rows, some in hot chains
        k = rng.choice(keys)
        ix.remove_replica(NS, k, holder=rng.choice(hs), tier=rng.choice([Tier.DRAM, Tier.SSD]))
    return ix, keys, hs


@pytest.mark.parametrize("seed", range(5))
def test_ranking_walk_matches_numpy(seed: int) -> None:
    rng = random.Random(100 + seed)
    ix, keys, hs = _random_index(rng, rng.choice([5, 3 * HOT_CHAIN_ROWS]), 60)
    c = ix.columns
    slots = c.tables[0].get_many(keys_to_words(keys))
    slots = slots[slots >= 0]
    assert len(slots)
    for local in [-1, *rng.sample(hs, 4)]:
        rows, holders = ranking.best_rows(c, slots, local)
        want_rows, want_holders = ranking.py_best_rows(c, slots, local)
        assert rows.tolist() == want_rows.tolist()
        assert holders.tolist() == want_holders.tolist()
        assert rows.dtype == holders.dtype == np.int64
    assert (rows >= 0).any()


@pytest.mark.parametrize("seed", range(5))
def test_find_rows_matches_numpy(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # two indexes built alike (one with the C maps, one with PyHotChains): a long chain met
    # by find_rows becomes hot in both
    built = [_random_index(random.Random(200 + seed), 2 * HOT_CHAIN_ROWS, 50)]
    monkeypatch.setattr(native, "master_index", None)
    built.append(_random_index(random.Random(200 + seed), 2 * HOT_CHAIN_ROWS, 50))
    monkeypatch.setattr(native, "master_index", NATIVE)
    (a, keys, hs), (b, _, _) = built
    rng = random.Random(seed)
    for _ in range(6):
        holder = rng.choice(hs)
        probe = rng.sample(keys, 30)
        slots = a.columns.tables[0].get_many(keys_to_words(probe))
        slots = slots[slots >= 0]
        tiers = np.asarray([rng.choice([1, 2]) for _ in slots], dtype=np.int64)
        got = a.columns.find_rows(slots, holder, tiers)
        want = b.columns.py_find_rows(slots, holder, tiers)
        assert got.tolist() == want.tolist()
        assert a.columns.hot.slots() == b.columns.hot.slots()
        assert a.columns.hot.snapshot() == b.columns.hot.snapshot()
    assert a.columns.hot  # some chains were long (made hot by the C walk)
    assert type(a.columns.hot).__name__ == "HotChains" and isinstance(b.columns.hot, PyHotChains)


def _chains(ix: BlockIndex, keys: list[bytes]) -> list[list[tuple[int, int, int, int, int, bool]]]:
    return [[(r.holder, int(r.tier), r.size_bytes, r.generation, int(r.state), r.copy)
             for r in ix.replicas(NS, k)] for k in keys]


@pytest.mark.parametrize("seed", range(3))
def test_a_workload_gives_the_same_answers_with_both(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(300 + seed)
    keys = [rng.getrandbits(128).to_bytes(16, "little") for _ in range(80)]
    ixs = [BlockIndex(16)]  # [native, python]: the python one with PyHotChains
    monkeypatch.setattr(native, "master_index", None)
    ixs.append(BlockIndex(16))
    monkeypatch.setattr(native, "master_index", NATIVE)
    impls = [NATIVE, None]
    hs = [[ix.add_holder() for _ in range(2 * HOT_CHAIN_ROWS)] for ix in ixs]
    assert hs[0] == hs[1]
    for ix in ixs:
        for h in hs[0]:
            ix.set_readable(h, True)
    seen_hot = False
    for step in range(300):
        holder = rng.choice(hs[0])
        batch = rng.sample(keys[:6] if rng.random() < 0.6 else keys, rng.randint(1, 6))  # hot ones often
        tiers = np.asarray([rng.choice([1, 2]) for _ in batch], dtype=np.int64)
        op = rng.choice(["add", "add", "remove", "lookup", "load"])
        load = float(rng.randint(0, 3))
        local = rng.choice([-1, holder])
        copies = np.asarray([rng.random() < 0.2 for _ in batch])
        answers = []
        for ix, impl in zip(ixs, impls, strict=True):
            monkeypatch.setattr(native, "master_index", impl)
            n = len(batch)
            if op == "add":
                out = ix.add_replicas_batch(NS, batch, holder=holder, tiers=tiers, sizes=np.ones(n, np.int64),
                                            generations=np.full(n, step + 1, np.uint64),
                                            replace_generation=np.zeros(n, np.bool_),
                                            copies=copies,
                                            factors=np.zeros(n, np.int64))
                answers.append(out.tolist())
            elif op == "remove":
                answers.append(ix.remove_replicas_batch(NS, batch, holder=holder, tiers=tiers).tolist())
            elif op == "load":
                ix.set_load(holder, load)
                answers.append(None)
            else:
                hit = ix.lookup_prefix(NS, batch, local_holder=local)
                pos, each = ix.lookup_each(NS, batch, local_holder=local)
                answers.append((hit.holders.tolist(), hit.tiers.tolist(), hit.generations.tolist(),
                                pos.tolist(), each.holders.tolist()))
        assert answers[0] == answers[1], (step, op)
        assert ixs[0].columns.hot.snapshot() == ixs[1].columns.hot.snapshot(), (step, op)
        seen_hot = seen_hot or bool(ixs[0].columns.hot)
    monkeypatch.setattr(native, "master_index", None)
    assert _chains(ixs[0], keys) == _chains(ixs[1], keys)
    assert ixs[0].num_replicas == ixs[1].num_replicas
    assert ixs[0].columns.hot.snapshot() == ixs[1].columns.hot.snapshot()
    assert seen_hot and isinstance(ixs[1].columns.hot, PyHotChains)  # both kinds of maps ran


def _columns(cols: object) -> object:
    b = cols.blocks  # type: ignore[attr-defined]
    return (cols.seqs, cols.kinds, b.namespace_ids, b.keys,  # type: ignore[attr-defined]
            *[(getattr(b, f).dtype.str, getattr(b, f).tolist())
              for f in ("tiers", "sizes", "generations", "copies", "replicas")])


def _outcome(fn: object, arg: object) -> object:
    try:
        return _columns(fn(arg))  # type: ignore[operator]
    except Exception as exc:  # the same error, type and text, from both readers
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("seed", range(4))
def test_events_read_from_wire_bytes_match_protobuf(seed: int) -> None:
    from kvstored.master.service import event_columns, request_event_columns
    from kvstored.master.types import MAX_REPLICAS
    from kvstored.v1 import master_pb2 as pb

    rng = random.Random(400 + seed)
    bad = [  # one bad value per request (or none), each of what the checks refuse
        {}, {"key": b""}, {"key": b"k" * 10_000}, {"tier": 3}, {"tier": -1}, {"kind": 0}, {"kind": 7},
        {"generation": 1 << 63}, {"replicas": MAX_REPLICAS + 1}, {"size_bytes": (1 << 64) - 1},
        {"no_block": True},
    ]
    seen_fallback = seen_native = 0
    flags: set[tuple[str, bool]] = set()
    for case in bad * 3:
        n = rng.randint(0, 40)
        in_order = rng.random() < 0.5  # consecutive seqs (the usual batch), else random ones
        events = []
        for i in range(n):
            ref = dict(namespace_id=rng.choice([b"\x07" * 16, b"ns2", b""]),
                       key=rng.randbytes(rng.choice([16, 5, 40])), tier=rng.choice([1, 2]),
                       size_bytes=rng.randint(0, 1 << 40), generation=rng.choice([0, rng.getrandbits(62)]),
                       copy=rng.random() < 0.3, replicas=rng.randint(0, MAX_REPLICAS))
            kind = rng.choice([1, 2])
            if case and i == n // 2:
                ref.update({k: v for k, v in case.items() if k not in ("kind", "no_block")})
                kind = case.get("kind", kind)
            block = None if case.get("no_block") and i == n // 2 else pb.BlockRef(**ref)
            seq = rng.getrandbits(40) if not (in_order and events) else events[-1].seq + 1
            if events and rng.random() < 0.05:  # a block repeated (the same namespace and key)
                block = pb.BlockRef(namespace_id=events[0].block.namespace_id, key=events[0].block.key)
            events.append(pb.BlockEvent(seq=seq, kind=kind, block=block))
        data = pb.ReportEventsRequest(node_id="n", epoch=3, events=events).SerializeToString()
        if rng.random() < 0.3:  # unknown fields (kept and written back by protobuf), skipped by C
            data += bytes([(9 << 3) | 0, 0x96, 0x01, (10 << 3) | 2, 2, 0xAB, 0xCD, (11 << 3) | 1]) + bytes(8)
        if rng.random() < 0.2 and n:  # a field repeated inside an event: protobuf's last wins; C reads it not
            data += bytes([(3 << 3) | 2, 4, (1 << 3) | 0, 5, (1 << 3) | 0, 6])
        req = pb.ReportEventsRequest.FromString(data)
        want = _outcome(lambda r: event_columns(r.events), req)
        assert _outcome(request_event_columns, req) == want, case
        # the same events carried by a heartbeat (field 7, beside its own fields)
        hb = pb.HeartbeatRequest(node_id="n", epoch=3, tiers=[pb.TierCapacity(tier=1, used_bytes=5)],
                                 load=2.5, last_seq=9, acked_command_ids=[4, 5])
        hb.events.extend(req.events)
        assert _outcome(request_event_columns, hb) == want, case
        got = NATIVE.parse_events(req.SerializeToString(), 1, 1, 1, 2, 1, 2)
        seen_fallback += got is None
        seen_native += got is not None
        if got is not None:  # what report_events would find of the seqs and blocks
            seqs = [e.seq for e in req.events]
            pairs = [(e.block.namespace_id, e.block.key) for e in req.events]
            assert got[10] == all(b == a + 1 for a, b in zip(seqs, seqs[1:], strict=False))
            assert got[11] == (len(set(pairs)) == len(pairs))
            flags.update({("consecutive", got[10]), ("distinct", got[11])})
        # C reads a heartbeat's events (field 7) as it reads ReportEvents' (field 3)
        alone = pb.ReportEventsRequest(events=hb.events).SerializeToString()
        in_hb = NATIVE.parse_events(hb.SerializeToString(), 1, 1, 1, 2, 1, 2, 7)
        assert in_hb == NATIVE.parse_events(alone, 1, 1, 1, 2, 1, 2)
        # and the heartbeat's other fields, as bytes that parse as it without its events
        stripped = NATIVE.parse_events(hb.SerializeToString(), 1, 1, 1, 2, 1, 2, 7, True)
        if in_hb is None:
            assert stripped is None
        else:
            assert stripped is not None and stripped[:12] == in_hb[:12] and in_hb[12] is None
            rest = pb.HeartbeatRequest.FromString(stripped[12])
            hb.ClearField("events")
            assert rest == hb
    assert seen_fallback and seen_native  # both readers ran
    assert len(flags) == 4  # each flag seen true and false


def test_the_wire_reader_knows_every_field_of_an_event() -> None:
    """native/master.c parse_events reads these fields by number and skips others: a field
    added to BlockEvent or BlockRef must be added there too (or this test changed)."""
    from kvstored.v1 import master_pb2 as pb

    def fields(msg: object) -> dict[str, tuple[int, int]]:
        return {f.name: (f.number, f.type) for f in msg.DESCRIPTOR.fields}  # type: ignore[attr-defined]

    fd = pb.BlockRef.DESCRIPTOR.fields[0]
    bytes_t, enum_t, u64, boolean, u32, msg_t = (fd.TYPE_BYTES, fd.TYPE_ENUM, fd.TYPE_UINT64, fd.TYPE_BOOL,
                                                 fd.TYPE_UINT32, fd.TYPE_MESSAGE)
    assert fields(pb.BlockRef) == {"namespace_id": (1, bytes_t), "key": (2, bytes_t), "tier": (3, enum_t),
                                   "size_bytes": (4, u64), "generation": (5, u64), "copy": (6, boolean),
                                   "replicas": (7, u32)}
    assert fields(pb.BlockEvent) == {"seq": (1, u64), "kind": (2, enum_t), "block": (3, msg_t)}
    assert fields(pb.ReportEventsRequest)["events"][0] == 3
    assert fields(pb.HeartbeatRequest)["events"][0] == 7


class _Recorder:
    """An IndexObserver keeping every visible-replica report, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[bytes, list[bytes], int, int, bool]] = []

    def replicas_changed(self, namespace_id: bytes, keys: object, *, holder: int, tier: Tier,
                         visible: bool) -> None:
        self.calls.append((namespace_id, list(keys), holder, int(tier), visible))  # type: ignore[call-overload]


def _index_state(st: object) -> dict[str, object]:
    """Everything of an index: its columns up to their high-water marks, free lists, hot maps,
    key tables (every slot of the keys used), recent factors, counters."""
    c = st.index.columns  # type: ignore[attr-defined]
    nr, nb = c.num_rows_used, c.num_slots
    out: dict[str, object] = {name: getattr(c, name)[:nr].tolist()
                              for name in ("holder", "next", "block", "size", "gen", "tier", "state",
                                           "hnext", "hprev")}
    out.update({name: getattr(c, name)[:nb].tolist() for name in ("head", "block_ns", "factor")})
    out["bkey"] = c.bkey[:nb].tolist()
    nh = st.index._holders.num_holders  # type: ignore[attr-defined]
    out.update({name: getattr(c, name)[:nh].tolist() for name in ("holder_rows", "holder_head")})
    out["free"] = (list(c.free_rows), list(c.free_blocks), nr, nb)
    out["hot"] = c.hot.snapshot()
    out["recent"] = dict(c.recent_factors)
    out["long"] = dict(c.long_keys)
    out["live"] = [len(t) for t in c.tables]
    out["ns"] = list(c.ns_ids)
    out["dead"] = st.index.num_garbage_rows  # type: ignore[attr-defined]
    return out


@pytest.mark.parametrize("seed", range(4))
def test_report_events_applied_in_c_match_the_batch_methods(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two masters, one applying ReportEvents runs in C (apply_events), one with the batch
    methods (numpy), fed the same events: hot chains (24 nodes on 40 keys), blocks emptied
    and indexed again (key-table tombstones, recent factors), removes of rows not held,
    WRITING rows committed by an ADDED event, copies and their promotions, generations sent
    or not, repeated keys and old seqs in a batch (runs), and batches C leaves to Python (a
    second namespace, a long key, a bad tier, size, factor or kind: the same error). Every
    answer, every column, free list, hot map and observer report must be identical."""
    from helpers import key
    from master_helpers import spec

    from kvstored.clock import FakeClock
    from kvstored.errors import InvalidArgument
    from kvstored.master.state import MasterState
    from kvstored.master.types import MAX_SIZE_BYTES, BlockEvent, BlockRef, EventKind

    ns2 = b"\x22" * 16
    nodes = [f"n{i:02d}" for i in range(24)]
    recs = [_Recorder(), _Recorder()]
    states = []
    for r, impl in zip(recs, [NATIVE, None], strict=True):  # the second with PyHotChains
        monkeypatch.setattr(native, "master_index", impl)
        states.append(MasterState(epoch=100, clock=FakeClock(), rng=random.Random(1), initial_blocks=16,
                                  observer=r))
    impls = [NATIVE, None]
    calls = {"c": 0, "none": 0}
    real = NATIVE.apply_events

    def counting(*args: object) -> object:
        got = real(*args)
        calls["c" if got is not None else "none"] += 1
        return got

    class _Counting:
        def __getattr__(self, name: str) -> object:
            return counting if name == "apply_events" else getattr(NATIVE, name)

    impls[0] = _Counting()  # type: ignore[assignment]

    def both(fn: object) -> list[object]:
        out = []
        for st, impl in zip(states, impls, strict=True):
            monkeypatch.setattr(native, "master_index", impl)
            try:
                out.append(fn(st))  # type: ignore[operator]
            except InvalidArgument as exc:
                out.append(("InvalidArgument", str(exc)))
        return out

    for st in states:
        monkeypatch.setattr(native, "master_index", None)
        for n in nodes:
            st.membership.register(spec(n))
            st.membership.sync_inventory(n, 1, sync_id=1, blocks=[], last_chunk=True)
    rng = random.Random(500 + seed)
    seqs = dict.fromkeys(nodes, 0)
    num_promotions = num_recent = 0
    bads = [{"tier": 3}, {"size_bytes": MAX_SIZE_BYTES + 1}, {"replicas": 99}, {"kind": 7}]
    for _round in range(8):
        for n in nodes:
            events = []
            seq = seqs[n]
            case = rng.random()
            for i in range(rng.randrange(1, 40)):
                # hot keys (every node), or cold ones (this node's own: emptied and indexed again)
                k = rng.randrange(40) if rng.random() < 0.6 else 40 + 4 * nodes.index(n) + rng.randrange(4)
                ns = ns2 if case < 0.1 and i % 3 == 0 else NS  # a second namespace: Python
                ref = dict(namespace_id=ns, key=key(k), tier=Tier.DRAM if rng.random() < 0.8 else Tier.SSD,
                           size_bytes=4096 + rng.randrange(3), generation=rng.choice([0, 0, 1000 + seq]),
                           copy=rng.random() < 0.3, replicas=rng.choice([0, 0, 0, 2, 3]))
                kind = EventKind.ADDED if rng.random() < 0.6 else EventKind.REMOVED
                if 0.1 <= case < 0.15 and i == 1:
                    ref["key"] = b"short"  # a key not of 16 bytes: Python
                if 0.15 <= case < 0.2 and i == 1:
                    bad = rng.choice(bads)
                    kind = bad.get("kind", kind)  # type: ignore[assignment]
                    ref.update({f: v for f, v in bad.items() if f != "kind"})
                seq += 1
                events.append(BlockEvent(seq, kind, BlockRef(**ref)))  # type: ignore[arg-type]
            if 0.2 <= case < 0.3 and len(events) > 2:  # a repeated key: runs of distinct blocks
                e = events[-1]
                events[-1] = BlockEvent(e.seq, e.kind, events[0].block)
            if 0.3 <= case < 0.35 and seqs[n]:  # events already applied, then new ones
                events = [BlockEvent(seqs[n], EventKind.ADDED, BlockRef(NS, key(0), Tier.DRAM, 1)), *events]
            if rng.random() < 0.2:  # a WRITING row (a put in progress) the holder's event commits
                k, tier = key(rng.randrange(40)), rng.choice([Tier.DRAM, Tier.SSD])

                def writing(st: MasterState, k: bytes = k, tier: Tier = tier, n: str = n) -> object:
                    holder = st.membership.node(n).holder  # type: ignore[union-attr]
                    return st.index.add_replica(NS, k, holder=holder, tier=tier, size_bytes=7, generation=5,
                                                state=ReplicaState.WRITING)
                a, b = both(writing)
                assert a == b
            got = both(lambda st, n=n, events=events: st.membership.report_events(n, 1, events))
            assert got[0] == got[1], (n, case)
            if not isinstance(got[0], tuple) or got[0][0] != "InvalidArgument":
                seqs[n] = got[0][1]  # type: ignore[index]
            assert _index_state(states[0]) == _index_state(states[1]), (n, case)
            num_recent += len(states[0].index.columns.recent_factors)
        cmds = [{n: [(c.kind, c.namespace_id, c.key) for c in st.commands.pending(n)] for n in nodes}
                for st in states]
        assert cmds[0] == cmds[1]
        num_promotions += sum(len(v) for v in cmds[0].values())
        assert recs[0].calls == recs[1].calls
        assert states[0].generations.peek() == states[1].generations.peek()
    c = states[0].index.columns
    counts, _, _ = c.hot.snapshot()
    assert counts and max(counts.values()) > HOT_CHAIN_ROWS  # hot chains were reached
    assert isinstance(states[1].index.columns.hot, PyHotChains) and not isinstance(c.hot, PyHotChains)
    assert num_recent  # blocks were emptied (their factors kept), some indexed again
    assert num_promotions  # copies-only blocks asked for promotions
    assert calls["c"] > 50 and calls["none"] > 0  # C applied most runs, and left some to Python
    # GC of a holder with rows in hot chains, then lookups, still alike
    assert both(lambda st: st.membership.unregister(nodes[3], 1)) == [True, True]
    gc = both(lambda st: st.membership.collect_garbage())
    assert gc[0] == gc[1] and gc[0]
    assert _index_state(states[0]) == _index_state(states[1])
@pytest.mark.parametrize("seed", range(6))
def test_ranked_rows_match_numpy(seed: int) -> None:
    """ranking.ranked_rows (alternates, avoided holders) in C and in numpy: the same rows, in
    the same order, for every width; holders mostly unreadable in one case, so that chains
    longer than MAX_RANKED_REPLICAS whose first rows are all unreadable take best_rows' walk."""
    rng = random.Random(500 + seed)
    ix, keys, hs = _random_index(rng, 3 * HOT_CHAIN_ROWS if seed % 2 else rng.choice([5, 3 * HOT_CHAIN_ROWS]), 60)
    if seed % 2:
        for h in hs:
            if not ix.columns.retired[h]:
                ix.set_readable(h, rng.random() < 0.1)
    c = ix.columns
    slots = c.tables[0].get_many(keys_to_words(keys))
    slots = slots[slots >= 0]
    deep = 0
    for local in [-1, *rng.sample(hs, 3)]:
        for width in range(1, ranking.MAX_RANKED_REPLICAS + 1):
            avoid = np.asarray(rng.sample(hs, rng.choice([0, 1, 3])), np.int64)
            rows, holders = ranking.ranked_rows(c, slots, local, avoid=avoid, width=width)
            want_rows, want_holders = ranking.py_ranked_rows(c, slots, local, avoid=avoid, width=width)
            assert rows.tolist() == want_rows.tolist(), (local, width)
            assert holders.tolist() == want_holders.tolist(), (local, width)
            assert rows.shape == (len(slots), width) and rows.dtype == holders.dtype == np.int64
            deep += sum(row >= 0 and not _readable_within(c, int(s), ranking.MAX_RANKED_REPLICAS)
                        for s, row in zip(slots.tolist(), rows[:, 0].tolist(), strict=True))
    assert deep or not seed % 2  # the walk past the first rows was taken
    with pytest.raises(ValueError, match="width must be in"):
        ranking.ranked_rows(c, slots, -1, avoid=np.zeros(0, np.int64), width=0)


def _readable_within(c: object, slot: int, depth: int) -> bool:
    """Whether one of the first ``depth`` rows of a block's chain is a readable COMMITTED one."""
    row = int(c.head[slot])  # type: ignore[attr-defined]
    for _ in range(depth):
        if row < 0:
            return False
        h = int(c.holder[row])  # type: ignore[attr-defined]
        if c.readable[h] and (int(c.state[row]) & STATE_MASK) == int(ReplicaState.COMMITTED):  # type: ignore[attr-defined]
            return True
        row = int(c.next[row])  # type: ignore[attr-defined]
    return False


def _servicer(rng: random.Random, num_nodes: int, num_keys: int) -> tuple[object, list[bytes], list[str]]:
    """A MasterServicer whose nodes hold random replicas: hot blocks on every node, WRITING
    rows, copies, both tiers, unreadable nodes, tied loads."""
    from master_helpers import spec

    from kvstored.clock import FakeClock
    from kvstored.master.service import MasterServicer
    from kvstored.master.state import MasterState
    from kvstored.master.types import BlockColumns

    state = MasterState(epoch=3, clock=FakeClock(), node_lease_s=10.0, rng=random.Random(1), initial_blocks=16)
    sv = MasterServicer(state, check_roles=False)
    keys = [rng.getrandbits(128).to_bytes(16, "little") for _ in range(num_keys)]
    names = [f"n{i}" for i in range(num_nodes)]
    for i, name in enumerate(names):
        state.membership.register(spec(name, port=7000 + 2 * i))
        mine = list(dict.fromkeys(keys[:3] + rng.sample(keys, rng.randint(0, num_keys // 2))))
        k = len(mine)
        cols = BlockColumns([NS] * k, mine, np.asarray([rng.choice([1, 2]) for _ in mine], np.int64),
                            np.asarray([rng.randint(0, 99) for _ in mine], np.int64),
                            np.asarray([rng.choice([0, rng.randint(1, 9)]) for _ in mine], np.uint64),
                            np.asarray([rng.random() < 0.2 for _ in mine]), np.zeros(k, np.int64))
        state.membership.sync_inventory(name, 1, sync_id=1, blocks=cols, last_chunk=True, seq=0)
    for name in names:
        rec = state.membership.node(name)
        assert rec is not None
        for kk in rng.sample(keys, 3):  # a write in progress: WRITING rows
            state.index.add_replica(NS, kk, holder=rec.holder, tier=Tier.DRAM, size_bytes=1, generation=5,
                                    state=ReplicaState.WRITING)
        state.index.set_load(rec.holder, float(rng.choice([0, 1, 1, 2, 50])))
        if rng.random() < 0.25:
            state.index.set_readable(rec.holder, False)
    return sv, keys, names


@pytest.mark.parametrize("seed", range(4))
def test_lookup_from_request_bytes_matches_the_columns_path(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """MasterService.LookupPrefix's answer from native/master_lookup.c ``lookup_wire``
    (request bytes in, the response's columns out) equals the answer of the numpy path
    (BlockIndex.lookup_prefix / lookup_each, the fields set from the hit), message for
    message: prefixes and every_key probes, missing keys, alternates 0..3, avoided nodes, a
    local node, keys of other lengths (the C path declines them)."""
    from kvstored.master.index import BlockIndex
    from kvstored.v1 import master_pb2 as pb

    rng = random.Random(600 + seed)
    sv, keys, names = _servicer(rng, rng.choice([4, 2 * HOT_CHAIN_ROWS]), 50)
    calls = {"native": 0}
    real = BlockIndex.lookup_wire

    def counted(self: BlockIndex, *a: object, **kw: object) -> object:
        got = real(self, *a, **kw)  # type: ignore[arg-type]
        calls["native"] += got is not None
        return got

    monkeypatch.setattr(BlockIndex, "lookup_wire", counted)
    absent = [rng.getrandbits(128).to_bytes(16, "little") for _ in range(5)]
    for _ in range(60):
        ks = rng.sample(keys + absent, rng.randint(0, 30))
        if rng.random() < 0.5:
            ks = keys[:3] + ks  # the hot blocks lead (a system prompt)
        if rng.random() < 0.1:
            ks.append(b"a longer key than sixteen bytes")
        req = pb.MasterLookupPrefixRequest(
            namespace_id=NS, keys=ks, every_key=rng.random() < 0.4,
            local_node_id=rng.choice(["", "unknown", *names]),
            avoid_node_ids=rng.sample(names + ["gone"], rng.choice([0, 0, 1, 2])),
            max_alternates=rng.choice([0, 0, 1, 3, 5]))
        monkeypatch.setattr(native, "master_index", NATIVE)
        got = sv._lookup_prefix(req)  # type: ignore[attr-defined]
        monkeypatch.setattr(native, "master_index", None)
        want = sv._lookup_prefix(req)  # type: ignore[attr-defined]
        assert got == want, req
        assert got.SerializeToString(deterministic=True) == want.SerializeToString(deterministic=True)
    assert calls["native"] > 40  # most requests took the C path




@pytest.mark.parametrize("seed", range(3))
def test_batches_longer_than_a_prefetch_group_answer_as_numpy(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The C lookups take their keys in groups (native/master_buffers.h MB_PREFETCH_GROUP, 32:
    buckets, head entries and rows prefetched a group ahead); batches of 1..700 keys, so many
    groups and partial last groups, with absent keys anywhere (the prefix stops there, at
    every position of a group), repeated keys, hot chains (every node holds the first keys)
    and unreadable nodes: ``lookup_wire`` (request bytes), ``lookup_prefix`` and
    ``lookup_each`` (``keytable_get_many`` then ``best_rows`` / ``ranked_rows``) answer as the
    numpy code, message for message and column for column."""
    from kvstored.v1 import master_pb2 as pb

    rng = random.Random(900 + seed)
    sv, keys, names = _servicer(rng, 2 * HOT_CHAIN_ROWS, 300)
    ix = sv.state.index  # type: ignore[attr-defined]
    absent = [rng.getrandbits(128).to_bytes(16, "little") for _ in range(20)]
    holders = [-1, *(sv.state.membership.node(n).holder for n in names[:4])]  # type: ignore[attr-defined]
    stops, longest = set(), 0
    for t in range(40):
        size = rng.choice([1, 31, 32, 33, 64, 65, 200, 512, 700])
        ks = keys[:3] + rng.choices(keys, k=size)  # duplicates; the hot blocks lead
        if t % 3:  # an absent key at some position, often inside a later group
            ks.insert(rng.randint(0, len(ks)), rng.choice(absent))
        req = pb.MasterLookupPrefixRequest(
            namespace_id=NS, keys=ks, every_key=rng.random() < 0.4, local_node_id=rng.choice(["", *names]),
            avoid_node_ids=rng.sample(names, rng.choice([0, 0, 1])), max_alternates=rng.choice([0, 0, 1, 3]))
        local = rng.choice(holders)
        monkeypatch.setattr(native, "master_index", NATIVE)
        got = sv._lookup_prefix(req)  # type: ignore[attr-defined]
        hit = ix.lookup_prefix(NS, ks, local_holder=local, max_alternates=req.max_alternates)
        pos, each = ix.lookup_each(NS, ks, local_holder=local)
        monkeypatch.setattr(native, "master_index", None)
        want = sv._lookup_prefix(req)  # type: ignore[attr-defined]
        want_hit = ix.lookup_prefix(NS, ks, local_holder=local, max_alternates=req.max_alternates)
        want_pos, want_each = ix.lookup_each(NS, ks, local_holder=local)
        assert got.SerializeToString(deterministic=True) == want.SerializeToString(deterministic=True), t
        for f in ("holders", "tiers", "sizes", "generations"):
            assert getattr(hit, f).tolist() == getattr(want_hit, f).tolist(), (t, f)
            assert getattr(each, f).tolist() == getattr(want_each, f).tolist(), (t, f)
        assert pos.tolist() == want_pos.tolist()
        stops.add(len(hit) % 32)
        longest = max(longest, len(got.node_index))
    assert longest > 2 * 32 and len(stops) > 5, (longest, stops)  # many groups; ends at many positions


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("impl", ["native", "python"])
def test_the_servers_wire_handlers_answer_as_the_message_handlers(
    seed: int, impl: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server's Heartbeat and LookupPrefix (``master_method_handlers``: the request
    reaches the handler with its wire bytes, LookupPrefix's answer leaves as the bytes the
    handler built) give the same answers, byte for byte once parsed, as the handlers called
    with messages, with the C extension and without it; and a heartbeat carrying events
    leaves the same index either way."""
    import asyncio

    import kvstored.master.service as service
    from kvstored.master.service import master_method_handlers
    from kvstored.v1 import master_pb2 as pb

    monkeypatch.setattr(native, "master_index", NATIVE if impl == "native" else None)
    fallbacks = {"taken": 0, "expected": 0}
    real_event_columns = service.event_columns

    def counted_event_columns(events: object) -> object:
        fallbacks["taken"] += 1
        return real_event_columns(events)

    # canonical events: C reads every one (protobuf reads only those C declines)
    monkeypatch.setattr(service, "event_columns", counted_event_columns)
    rng = random.Random(700 + seed)
    sv_wire, keys, names = _servicer(random.Random(seed), rng.choice([4, 2 * HOT_CHAIN_ROWS]), 50)
    sv_msg, _, _ = _servicer(random.Random(seed), len(names), 50)
    for sv in (sv_wire, sv_msg):
        sv.state.term = 7  # type: ignore[attr-defined]  # the answer's term is appended to the bytes
    handlers = master_method_handlers(sv_wire)  # type: ignore[arg-type]
    lookup, heartbeat = handlers["LookupPrefix"], handlers["Heartbeat"]
    absent = [rng.getrandbits(128).to_bytes(16, "little") for _ in range(5)]
    seqs = dict.fromkeys(names, 0)

    async def main() -> None:
        for step in range(80):
            if rng.random() < 0.5:
                ks = rng.sample(keys + absent, rng.randint(0, 30))
                if rng.random() < 0.1:
                    ks.append(b"a longer key than sixteen bytes")
                req = pb.MasterLookupPrefixRequest(
                    namespace_id=NS, keys=ks, every_key=rng.random() < 0.4,
                    local_node_id=rng.choice(["", *names]),
                    avoid_node_ids=rng.sample(names, rng.choice([0, 0, 1])),
                    max_alternates=rng.choice([0, 1, 3]))
                data = req.SerializeToString()
                got = lookup.response_serializer(
                    await lookup.unary_unary(lookup.request_deserializer(data), ServicerContextStub()))
                want = await sv_msg.LookupPrefix(req, ServicerContextStub())  # type: ignore[attr-defined]
                assert pb.MasterLookupPrefixResponse.FromString(got) == want, step
                assert want.term == 7
            else:
                n = rng.choice(names)
                events = []
                for _ in range(rng.randint(0, 10)):
                    seqs[n] += 1
                    events.append(pb.BlockEvent(seq=seqs[n], kind=rng.choice([1, 2]), block=pb.BlockRef(
                        namespace_id=NS, key=rng.choice(keys + absent), tier=rng.choice([1, 2]),
                        size_bytes=7, generation=rng.choice([0, 9]))))
                if events and rng.random() < 0.1:  # a bad value: both refuse it, naming it alike
                    bad = rng.choice(events)
                    if rng.random() < 0.5:
                        bad.kind = 5  # type: ignore[assignment]
                    else:
                        bad.block.tier = 3  # type: ignore[assignment]
                req = pb.HeartbeatRequest(node_id=n, epoch=1, load=rng.random(), last_seq=seqs[n],
                                          tiers=[pb.TierCapacity(tier=1, capacity_bytes=1 << 30,
                                                                 used_bytes=rng.randint(0, 99))],
                                          events=events)
                data = req.SerializeToString()
                if events and rng.random() < 0.1:  # a field repeated inside an event: C reads it not
                    data += bytes([(7 << 3) | 2, 4, (1 << 3) | 0, 5, (1 << 3) | 0, 6])
                    req = pb.HeartbeatRequest.FromString(data)
                    fallbacks["expected"] += 1
                try:
                    got = heartbeat.response_serializer(
                        await heartbeat.unary_unary(heartbeat.request_deserializer(data), ServicerContextStub()))
                except RuntimeError as exc:  # refused (the abort of ServicerContextStub)
                    got = str(exc)
                try:
                    want = (await sv_msg.Heartbeat(req, ServicerContextStub())).SerializeToString()  # type: ignore[attr-defined]
                except RuntimeError as exc:
                    want = str(exc)
                assert got == want, step
        assert _index_state(sv_wire) == _index_state(sv_msg)
        if impl == "native":
            assert fallbacks["taken"] == fallbacks["expected"]

    asyncio.run(main())


def test_the_lookup_tally_exports_what_prometheus_histograms_and_counters_would() -> None:
    """LookupPrefix's metrics are plain numbers exported by a collector (master/metrics.py
    LookupTally): the same samples as prometheus_client's Counter and Histogram given the
    same observations (latencies on and between the bucket bounds)."""
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    from kvstored.master.metrics import _LOOKUP_BUCKETS_S, MasterMetrics

    rng = random.Random(7)
    m = MasterMetrics()
    ref = CollectorRegistry()
    calls = Counter("kvstored_master_lookups_total", "LookupPrefix calls answered.", registry=ref)
    blocks = Counter("kvstored_master_lookup_blocks_total", "Blocks asked for by LookupPrefix calls.",
                     registry=ref)
    hits = Counter("kvstored_master_lookup_hit_blocks_total",
                   "Blocks of the leading prefixes found present cluster-wide.", registry=ref)
    hist = Histogram("kvstored_master_lookup_duration_seconds", "LookupPrefix handler latency, seconds.",
                     buckets=_LOOKUP_BUCKETS_S, registry=ref)
    for _ in range(300):
        d = rng.choice([*_LOOKUP_BUCKETS_S, rng.random() * 1e-3, rng.random() * 2, 5.0])
        n, h = rng.randint(0, 512), rng.randint(0, 9)
        m.lookup.observe(n, h, d)
        calls.inc()
        blocks.inc(n)
        hits.inc(h)
        hist.observe(d)

    def lines(reg: CollectorRegistry) -> list[str]:
        return sorted(x for x in generate_latest(reg).decode().splitlines()
                      if "lookup" in x and not x.startswith("#") and "_created" not in x)

    want = lines(ref)
    assert len(want) == 3 + len(_LOOKUP_BUCKETS_S) + 3  # counters, buckets and +Inf, count, sum
    got = lines(m.registry)
    assert [g.rsplit(" ", 1)[0] for g in got] == [w.rsplit(" ", 1)[0] for w in want]
    assert [float(g.rsplit(" ", 1)[1]) for g in got] == pytest.approx([float(w.rsplit(" ", 1)[1]) for w in want])


@pytest.mark.parametrize("seed", range(3))
def test_lookup_node_entries_follow_every_membership_change(seed: int) -> None:
    """The node entries a LookupPrefix answer names are cached per membership version
    (``Membership.holders_version``): after a node reconnects with new addresses (same
    epoch, same holder), restarts (new epoch, new holder, synced), leaves, or a new node
    joins, every answer equals the one of a servicer without a cache on the same state,
    and names each node's current spec."""
    from master_helpers import spec

    from kvstored.master.service import MasterServicer
    from kvstored.master.types import BlockColumns
    from kvstored.v1 import master_pb2 as pb

    rng = random.Random(900 + seed)
    sv, keys, names = _servicer(rng, 6, 40)
    m = sv.state.membership  # type: ignore[attr-defined]

    def check() -> None:
        for _ in range(6):
            req = pb.MasterLookupPrefixRequest(
                namespace_id=NS, keys=keys[:3] + rng.sample(keys, 8), max_alternates=3,
                every_key=rng.random() < 0.5, local_node_id=rng.choice(["", *names]))
            got = sv._lookup_prefix(req)  # type: ignore[attr-defined]
            fresh = MasterServicer(sv.state, check_roles=False)  # type: ignore[attr-defined]
            assert got == fresh._lookup_prefix(req)
            for n in got.nodes:
                rec = m.node(n.node_id)
                assert rec is not None
                assert (n.epoch, n.data_address) == (rec.spec.epoch, rec.spec.data_address)

    def sync(name: str, epoch: int) -> None:
        mine = keys[:3] + rng.sample(keys[3:], 10)
        k = len(mine)
        m.sync_inventory(name, epoch, sync_id=epoch, last_chunk=True, seq=0, blocks=BlockColumns(
            [NS] * k, mine, np.ones(k, np.int64), np.full(k, 5, np.int64), np.zeros(k, np.uint64),
            np.zeros(k, np.bool_), np.zeros(k, np.int64)))

    check()
    m.register(spec(names[0], port=9100))  # the live daemon reconnecting, new addresses
    check()
    m.register(spec(names[1], epoch=2, port=9200))  # a restart: a new holder once synced
    sync(names[1], 2)
    check()
    m.unregister(names[2], 1)
    names.remove(names[2])
    check()
    m.register(spec("late", port=9300))
    sync("late", 1)
    names.append("late")
    check()
    m.register(spec(names[0], port=9400))  # and again: the cache must not keep 9100's entry
    check()
