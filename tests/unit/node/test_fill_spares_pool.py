"""A read never costs the pool a block: a remote fill's reservation spares unique blocks.

``TieredStore.reserve(copy=True)`` (what RemoteReads' sink uses through
``NodeCore.reserve_items(copy=True)``) may use free space, other copies, blocks already on
SSD and demotions the SSD takes without evicting; never a block the pool holds nowhere else
(kvstored/tiers/spare.py). In-process and deterministic: every store is full by
construction, sizes are exact multiples of the arena's 4096-byte page.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import key
from remote_helpers import FakeMaster as _Master
from remote_helpers import make_core

from kvstored.errors import NoCapacity
from kvstored.node.core import NodeCore
from kvstored.node.metrics import NodeMetrics
from kvstored.node.remote import RemoteReads
from kvstored.node.spill import Spiller
from kvstored.tiers.ssd_format import round_up_page, store_key, trailer_bytes
from kvstored.tiers.tiered import TieredStore
from kvstored.transport.master_rpc import ClusterReplica
from kvstored.transport.tcp_server import DataPlaneServer
from kvstored.types import Reservation, Tier

BLOCK = 64 << 10


def value(i: int) -> bytes:
    return bytes([i % 251]) * BLOCK


def ssd_charge(i: int) -> int:
    return round_up_page(BLOCK + trailer_bytes(store_key(b"", key(i)), b""))


def put(store: TieredStore, ids: list[int]) -> None:
    for i in ids:
        assert store.put(key(i), value(i))


def copy_in(store: TieredStore, i: int) -> None:
    """Commit block ``i`` as a remote-fill copy (what RemoteReads does after verifying)."""
    res = store.reserve(key(i), BLOCK, copy=True)
    assert isinstance(res, Reservation)
    res.view[:] = value(i)
    assert store.commit(res)


def copies(store: TieredStore) -> set[bytes]:
    return {b.key for b in store.list_blocks()[0] if b.copy}


@pytest.fixture
def dram_only() -> Iterator[TieredStore]:
    store = TieredStore(dram_size_bytes=4 * BLOCK, arena_dir=None, max_block_bytes=BLOCK)
    yield store
    store.close()


def test_a_copy_into_a_full_dram_only_store_of_unique_blocks_is_refused_and_evicts_nothing(
    dram_only: TieredStore,
) -> None:
    put(dram_only, [1, 2, 3, 4])
    with pytest.raises(NoCapacity, match="without dropping"):
        dram_only.reserve(key(9), BLOCK, copy=True)
    assert dram_only.exists([key(i) for i in (1, 2, 3, 4)]) == [True] * 4
    assert dram_only.stats().tiers[0].evictions == 0
    assert dram_only.get(key(1)) == (value(1), b"")  # and the space is not leaked:
    put(dram_only, [5])  # a local put still evicts LRU as always
    assert dram_only.exists([key(5)]) == [True]


def test_a_copy_evicts_another_copy_even_the_most_recent_never_an_older_unique_block(
    dram_only: TieredStore,
) -> None:
    put(dram_only, [1, 2, 3])  # the LRU end: unique blocks
    copy_in(dram_only, 7)  # the most recent: a copy of a peer's block
    assert dram_only.get(key(7)) is not None  # the engine read it: most recent of all
    res = dram_only.reserve(key(8), BLOCK, copy=True)
    assert isinstance(res, Reservation)
    res.view[:] = value(8)
    assert dram_only.commit(res)
    assert dram_only.exists([key(i) for i in (1, 2, 3, 7, 8)]) == [True, True, True, False, True]
    assert copies(dram_only) == {key(8)}


def test_a_local_put_evicts_copies_first_and_a_local_put_of_a_copy_unmarks_it(
    dram_only: TieredStore,
) -> None:
    put(dram_only, [1, 2])
    copy_in(dram_only, 7)
    copy_in(dram_only, 8)
    assert copies(dram_only) == {key(7), key(8)}
    assert not dram_only.put(key(8), value(8))  # the engine put it too: no mere duplicate
    assert copies(dram_only) == {key(7)}
    put(dram_only, [3])  # full: the copy goes, not the LRU unique block 1
    assert dram_only.exists([key(i) for i in (1, 2, 3, 7, 8)]) == [True, True, True, False, True]


def test_a_copy_refused_by_a_full_dram_only_store_looks_at_its_copies_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = TieredStore(dram_size_bytes=512 * 4096, arena_dir=None, max_block_bytes=BLOCK)
    try:
        for i in range(511):
            assert store.put(key(i), b"x" * 4096)
        res = store.reserve(key(600), 4096, copy=True)  # the last free page
        assert isinstance(res, Reservation)
        store.commit(res)
        assert store.pin_many([key(600)])[0] is not None  # pinned: no victim at all
        looked: list[bytes] = []
        inner = store._transit.evictable
        monkeypatch.setattr(store._transit, "evictable", lambda k: looked.append(k) or inner(k))
        with pytest.raises(NoCapacity):
            store.reserve(key(601), 4096, copy=True)
        assert looked == [store_key(b"", key(600))]  # not the 511 unique blocks: O(copies)
    finally:
        store.close()


def test_pinned_copies_are_not_evicted_for_a_copy(dram_only: TieredStore) -> None:
    put(dram_only, [1, 2, 3])
    copy_in(dram_only, 7)
    pinned = dram_only.pin_many([key(7)])[0]
    try:
        with pytest.raises(NoCapacity):
            dram_only.reserve(key(8), BLOCK, copy=True)
    finally:
        dram_only.unpin(pinned)  # type: ignore[arg-type]
    assert dram_only.exists([key(i) for i in (1, 2, 3, 7)]) == [True] * 4


def _tiered(tmp_path: Path, ssd_blocks: int) -> TieredStore:
    return TieredStore(dram_size_bytes=2 * BLOCK, arena_dir=None, max_block_bytes=BLOCK,
                       ssd_dir=tmp_path / "ssd", ssd_size_bytes=ssd_blocks * ssd_charge(1))


def test_with_ssd_room_a_copy_demotes_the_lru_block_and_drops_nothing(tmp_path: Path) -> None:
    store = _tiered(tmp_path, ssd_blocks=4)
    try:
        put(store, [1, 2])
        copy_in(store, 9)  # DRAM full of unique blocks: block 1 goes to SSD
        assert store.lookup_prefix([key(1)]) == [Tier.SSD]
        assert store.exists([key(i) for i in (1, 2, 9)]) == [True] * 3
        ssd = store.stats().tiers[1]
        assert (ssd.num_blocks, ssd.evictions) == (1, 0)
        assert copies(store) == {key(9)}
        put(store, [3])  # a local put evicts the copy: dropped, not demoted to SSD
        assert store.exists([key(9)]) == [False]
        assert store.stats().tiers[1].num_blocks == 1
    finally:
        store.close()


def test_a_copy_never_makes_a_full_ssd_evict_and_a_block_on_ssd_frees_dram(
    tmp_path: Path,
) -> None:
    store = _tiered(tmp_path, ssd_blocks=2)
    try:
        put(store, [1, 2, 3, 4])  # SSD: 1, 2 (full); DRAM: 3, 4 (only there)
        with pytest.raises(NoCapacity, match="without dropping"):
            store.reserve(key(9), BLOCK, copy=True)
        assert store.exists([key(i) for i in (1, 2, 3, 4)]) == [True] * 4
        assert store.stats().tiers[1].evictions == 0
        store.remove([key(2)])  # room for exactly one demotion now
        copy_in(store, 9)
        assert store.exists([key(i) for i in (1, 3, 4, 9)]) == [True] * 4
        assert store.lookup_prefix([key(3)]) == [Tier.SSD]
        assert store.get(key(1)) == (value(1), b"")  # promoted: 1 is in DRAM and on SSD
        copy_in(store, 10)  # evicts block 1 from DRAM (on SSD already) or the copy 9
        assert store.exists([key(i) for i in (1, 3, 4, 10)]) == [True] * 4
        assert store.stats().tiers[1].evictions == 0
    finally:
        store.close()


def test_the_spiller_takes_copies_first(dram_only: TieredStore) -> None:
    put(dram_only, [1, 2])
    copy_in(dram_only, 7)
    spiller = Spiller(dram_only, master=None, transport=lambda a: None,  # type: ignore[arg-type,return-value]
                      node_id="n", batch_blocks=2)
    try:
        assert [b.key for b in spiller.victims(2 * BLOCK)] == [key(7), key(1)]
    finally:
        spiller.close()


# ---- through RemoteReads: a fill of a full node ------------------------------------------------


def _core(node_id: str, dram_bytes: int) -> NodeCore:
    return make_core(node_id, block_bytes=BLOCK, dram_bytes=dram_bytes)


def test_a_fill_through_a_full_dram_only_node_skips_copies_and_keeps_every_unique_block() -> None:
    src, dst = _core("src", 8 * BLOCK), _core("dst", 4 * BLOCK)
    server = DataPlaneServer(src, "127.0.0.1:0")
    address = server.start()
    master = _Master()
    dst.metrics = NodeMetrics()
    reads = RemoteReads(dst, node_id="dst", lookup=master.lookup, report=master.report)
    try:
        for i in (11, 12, 13):
            src.put_inline([(key(i), value(i), b"")], b"")
        # the master names each replica under the generation its holder stamped (feed.py)
        gens = {b.key: b.generations[0] for b in src.store.list_blocks()[0]}
        for i in (11, 12, 13):
            master.replicas[key(i)] = ClusterReplica("src", 7, Tier.DRAM, BLOCK, gens[key(i)], address)
        dst.put_inline([(key(i), value(i), b"") for i in (1, 2, 3)], b"")
        got = reads.fill([key(11), key(12), key(13)], b"")
        assert got.num_fetched == 1  # the one free slot
        assert reads.num_skipped == 2
        assert dst.metrics.registry.get_sample_value(
            "kvstored_remote_blocks_total", {"outcome": "skipped"}) == 2
        assert dst.metrics.registry.get_sample_value(  # a skipped copy is no put error
            "kvstored_item_errors_total", {"code": "NO_CAPACITY"}) is None
        assert dst.store.exists([key(i) for i in (1, 2, 3)]) == [True] * 3
        assert dst.store.get(key(11)) == (value(11), b"")
        got = reads.fill([key(12), key(13)], b"")  # room only by evicting the copy of 11
        assert got.num_fetched == 1
        assert dst.store.exists([key(i) for i in (1, 2, 3)]) == [True] * 3
        assert dst.store.stats().tiers[0].evictions == 1  # the copy, nothing else
    finally:
        reads.close()
        server.stop(0.0)
        src.store.close()
        dst.store.close()
