"""A batched commit of slots (``TieredStore.commit_slots``, one lock and one publish for the
batch) leaves the store as committing each block alone does: the same DRAM LRU order, the
same tenant and store accounting, the same change-feed events in the same order, the same
one-sided index. The batch is also taken with the change feed near its bound (its overflow
path) and with a key marked a remote-fill copy. And ``LeaseBook.take_many``'s fast path
answers what ``take`` answers id by id, in every lease state.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from helpers import key

from kvstored.node.sessions import LeaseBook, LeaseState
from kvstored.tenancy import scope_namespace
from kvstored.tiers.slots import SlotReader
from kvstored.tiers.ssd_format import store_key
from kvstored.tiers.tiered import TieredStore

K = 4096
NS = scope_namespace("tenant-a", b"ns")  # a tenant's stored namespace id (counted per tenant)


def _store(feed_events: int = 1 << 16) -> TieredStore:
    s = TieredStore(dram_size_bytes=512 * K, arena_dir=None)
    s.change_feed.max_events = feed_events
    s.change_feed.reset()  # events are queued from here on
    return s


def _state(s: TieredStore) -> dict[str, Any]:
    """What the two ways of committing must agree on (offsets and generations aside: the
    slots and the per-block reservations sit at different offsets; generations are compared
    by their order)."""
    st = s._state
    dram = st.dram
    order = list(dram.entries)
    gens = [dram.entries[k].generation for k in order]
    changes, resync = s.change_feed.drain()
    reader = SlotReader(dram.arena._mmap, dram.arena.layout)
    keys = [k[-16:] for k in order]
    sizes, metas, _values, fallbacks = reader.read_keys(NS, keys, None, 0)
    return {
        "order": order,
        "sizes": [dram.entries[k].size_bytes for k in order],
        "infos": [dram.entries[k].info for k in order],
        "generations_rise_in_map_order_of_the_batch": gens == sorted(gens),
        "by_offset": sorted(e.skey for e in dram.by_offset),
        "used_bytes": dram.allocator.used_bytes,
        "reserved_bytes": st.reserved_bytes,
        "puts": st.puts,
        "tenant_used": dict(st.tenants.used_bytes),
        "tenant_reserved": {t: n for t, n in st.tenants.reserved_bytes.items() if n},
        "copies": list(dram.copies),
        "spare": (s._spare.total, dict(s._spare._counted)),  # a copy-marked block is spare room
        # per key, in the order keys first appear, its last event: what a reader of the feed
        # ends up knowing (a key twice in a batch and marked a copy: committed alone, its
        # mark is reported then its drop; batched, the mark's end once)
        "events": _net_events(changes),
        "event_generations": all(
            g == dram.entries[store_key(ns, k)].generation
            for (ns, k), (_, _, _, _, g) in _last_events(changes).items()
        ),
        "resync": resync,
        "one_sided": (sizes, metas, fallbacks),
    }


def _last_events(changes: list[Any]) -> dict[tuple[bytes, bytes], tuple[bool, int, int, bool, int]]:
    out: dict[tuple[bytes, bytes], tuple[bool, int, int, bool, int]] = {}
    for c in changes:
        out[(c.namespace_id, c.key)] = (c.added, c.tier, c.size_bytes, c.copy, c.generation)
    return out


def _net_events(changes: list[Any]) -> list[tuple[bytes, bytes, bool, int, int, bool]]:
    return [(ns, k, *ev[:4]) for (ns, k), ev in _last_events(changes).items()]


def _batch(rng: random.Random) -> tuple[list[tuple[bytes, int, bytes]], list[bytes]]:
    """Writes ``(key, size, meta)`` of one batch (a key twice, one stored before, metas of
    two kinds, sizes below and at the slot size) and the keys stored before it."""
    before = [key(1000 + i) for i in range(3)]
    keys = [key(i) for i in range(12)] + [key(3), before[1]]
    rng.shuffle(keys)
    writes = [(k, rng.choice([1, 100, 2 * K - 1, 2 * K, 3 * K]), rng.choice([b"", b"", b"m"]))
              for k in keys]
    return writes, before


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("feed_events", [1 << 16, 8])  # 8: the feed overflows mid-batch
def test_a_batched_commit_leaves_the_store_as_per_block_commits_do(seed: int, feed_events: int) -> None:
    rng = random.Random(seed)
    writes, before = _batch(rng)
    copy_key = writes[rng.randrange(len(writes))][0]  # marked a remote-fill copy before the put
    batched, single = _store(feed_events), _store(feed_events)
    try:
        for s in (batched, single):
            for i, k in enumerate(before):
                assert s.put(k, bytes([i]) * (K + i), namespace_id=NS)
            s._state.dram.copies[store_key(NS, copy_key)] = None
            s.change_feed.drain()
        slots = batched.reserve_slots(3 * K, len(writes), namespace_id=NS, may_block=True)
        assert isinstance(slots, list) and len(slots) == len(writes)
        for r, (k, size, _) in zip(slots, writes, strict=True):
            r.view[:size] = k[:1] * size
        got = batched.commit_slots([(r, k, size, meta) for r, (k, size, meta) in zip(slots, writes, strict=True)],
                                   namespace_id=NS)
        want = [False] * len(writes)
        for i in range(len(writes) - 1, -1, -1):  # per block, in the batch's order: last first
            k, size, meta = writes[i]
            r = single.reserve(k, size, namespace_id=NS, meta=meta)
            if r is None:
                continue  # stored already
            r.view[:size] = k[:1] * size
            want[i] = single.commit(r)
        assert got == want
        a, b = _state(batched), _state(single)
        assert a == b
        assert a["generations_rise_in_map_order_of_the_batch"] and a["event_generations"]
        assert a["resync"] is (feed_events == 8)
        assert a["reserved_bytes"] == 0 and not a["tenant_reserved"]
        assert a["order"][:3] == [store_key(NS, k) for k in before]  # older blocks stay older
        assert a["one_sided"][2] == 0  # every committed block is published one-sided
        # the marked block counts as spare room, unless a second write of it (a local put)
        # or a block stored before dropped the mark
        once = [k for k, _, _ in writes].count(copy_key) == 1 and copy_key not in before
        assert (a["spare"][0] > 0) is once
        for k, size, _ in writes:  # and holds its bytes (a key stored before: those)
            got_kv = batched.get(k, namespace_id=NS)
            assert got_kv is not None
            assert got_kv == single.get(k, namespace_id=NS)
            if k not in before:
                assert got_kv[0] in (k[:1] * size, b"") or set(got_kv[0]) == set(k[:1])
    finally:
        batched.close()
        single.close()


def test_the_comparison_sees_a_wrong_lru_order() -> None:
    """The comparison can fail: the same blocks committed first-first (the head least recent)
    are told apart from the per-block commits' order."""
    writes, _ = _batch(random.Random(0))
    writes = list(dict((k, (k, s, m)) for k, s, m in writes).values())  # distinct keys
    a, b = _store(), _store()
    try:
        for i in range(len(writes) - 1, -1, -1):
            k, size, meta = writes[i]
            assert a.put(k, b"x" * size, namespace_id=NS, meta=meta)
        for k, size, meta in writes:  # the wrong order
            assert b.put(k, b"x" * size, namespace_id=NS, meta=meta)
        sa, sb = _state(a), _state(b)
        assert sa["order"] != sb["order"] and sa["events"] != sb["events"]
        assert sa["tenant_used"] == sb["tenant_used"]
    finally:
        a.close()
        b.close()


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _book(clock: _Clock) -> tuple[LeaseBook, list[int], int, int]:
    """A book whose slot leases are in every state: held (two sessions, a group), of another
    kind, quarantined, expired (session ended), already taken; plus unknown ids."""
    book = LeaseBook(1 << 30, clock)
    s1, s2, s3 = book.open_session("a"), book.open_session("b"), book.open_session("c")
    ids: list[int] = []
    group = book.add_group("slot", s1, [[i] for i in range(4)], [K] * 4, 60.0, request_id=7)
    assert group is not None
    ids += group
    ids.append(book.add("slot", s2, [9], K, 60.0))  # another session's
    ids.append(book.add("pin", s1, [8], K, 60.0))  # another kind
    short = book.add("slot", s1, [7], K, 1.0)
    clock.now += 2.0
    book.quarantine_lapsed()  # `short` is quarantined
    ids.append(short)
    ended = book.add("slot", s3, [6], K, 60.0)
    book.close_session(s3)  # expired
    ids.append(ended)
    taken = book.add("slot", s1, [5], K, 60.0)
    book.take("slot", taken, s1)
    ids += [taken, 12345, group[0]]  # gone, unknown, and a group's id twice
    return book, ids, s1, s2


@pytest.mark.parametrize("session", ["holder", "other", "any"])
def test_take_many_answers_what_take_answers_id_by_id(session: str) -> None:
    clock = _Clock()
    book, ids, s1, s2 = _book(clock)
    sid = {"holder": s1, "other": s2, "any": None}[session]
    got = book.take_many("slot", ids, sid)
    book2, ids2, t1, t2 = _book(_Clock())
    sid2 = {"holder": t1, "other": t2, "any": None}[session]
    want = [book2.take("slot", i, sid2) for i in ids2]

    def shape(rs: list[tuple[LeaseState, Any]]) -> list[tuple[LeaseState, Any]]:
        return [(st, None if lease is None else (lease.kind, lease.items, lease.num_bytes)) for st, lease in rs]

    assert shape(got) == shape(want)
    assert {LeaseState.HELD, LeaseState.UNKNOWN} <= {st for st, _ in got}
    for kind in ("slot", "pin"):
        assert book.num_active(kind) == book2.num_active(kind)
    assert book.quarantined_bytes() == book2.quarantined_bytes()
    assert book.held_of(s1, "slot") == book2.held_of(t1, "slot")
    left = [(x.items, x.num_bytes) for x in book.release_orphans(s1, [7])]  # the group's rest
    assert left == [(x.items, x.num_bytes) for x in book2.release_orphans(t1, [7])]
    assert (left == []) is (session != "other")  # a take of one of the group drops its request
