"""TieredStore with the DRAM tier only: puts, pins, exact eviction order, errors, threads."""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Iterator

import pytest
from helpers import key

from kvstored.config import NodeConfig
from kvstored.errors import (
    BlockTooLarge,
    InvalidArgument,
    KeyInvalid,
    NoCapacity,
    NotFound,
    Unavailable,
)
from kvstored.tiers.slots import Layout
from kvstored.tiers.ssd_format import store_key
from kvstored.tiers.tiered import TieredStore
from kvstored.types import PinnedBlock, Tier

K = 4096


def val(i: int, size: int = K) -> bytes:
    return bytes([i % 251]) * size


@pytest.fixture
def store4() -> Iterator[TieredStore]:
    """A DRAM-only store holding exactly four 4 KiB blocks."""
    s = TieredStore(dram_size_bytes=4 * K, arena_dir=None)
    yield s
    s.close()


def lru_keys(s: TieredStore) -> list[bytes]:
    blocks, _ = s.list_blocks()
    return [b.key for b in blocks]


def present(s: TieredStore, ids: range | list[int]) -> list[int]:
    return [i for i, ok in zip(ids, s.exists([key(i) for i in ids]), strict=True) if ok]


# ---- put / get -------------------------------------------------------------------------


def test_put_get_roundtrip_with_meta(store4: TieredStore) -> None:
    assert store4.put(key(1), b"hello" * 100, meta=b"f16:2x3") is True
    assert store4.get(key(1)) == (b"hello" * 100, b"f16:2x3")
    assert store4.get(key(2)) is None


def test_put_is_idempotent_and_keeps_first_value(store4: TieredStore) -> None:
    assert store4.put(key(1), val(1)) is True
    assert store4.put(key(1), val(2)) is False
    assert store4.get(key(1)) == (val(1), b"")
    assert store4.reserve(key(1), K) is None
    st = store4.stats()
    assert st.puts == 1 and st.tiers[0].used_bytes == K


def test_put_accepts_typed_buffers(store4: TieredStore) -> None:
    import numpy as np

    arr = np.arange(512, dtype=np.float32)
    assert store4.put(key(1), memoryview(arr))
    data, _ = store4.get(key(1))  # type: ignore[misc]
    assert np.array_equal(np.frombuffer(data, dtype=np.float32), arr)
    with pytest.raises(InvalidArgument, match="contiguous"):
        store4.put(key(2), memoryview(arr)[::2])


def test_zero_size_block(store4: TieredStore) -> None:
    assert store4.put(key(1), b"")
    assert store4.get(key(1)) == (b"", b"")


def test_first_commit_wins_and_later_commit_frees_space(store4: TieredStore) -> None:
    r1 = store4.reserve(key(1), K)
    r2 = store4.reserve(key(1), K)
    assert r1 is not None and r2 is not None and r1.offset != r2.offset
    r1.view[:] = val(1)
    r2.view[:] = val(2)
    assert store4.exists([key(1)]) == [False]  # invisible until committed
    assert store4.pin_many([key(1)]) == [None]
    assert store4.lookup_prefix([key(1)]) == []
    assert store4.commit(r2) is True
    assert store4.commit(r1) is False
    assert store4.get(key(1)) == (val(2), b"")
    assert store4.stats().tiers[0].used_bytes == K
    with pytest.raises(NotFound):
        store4.commit(r1)


def test_abort_frees_space_and_is_idempotent(store4: TieredStore) -> None:
    r = store4.reserve(key(1), 3 * K)
    assert r is not None
    assert store4.stats().tiers[0].used_bytes == 3 * K
    store4.abort(r)
    store4.abort(r)
    assert store4.stats().tiers[0].used_bytes == 0
    with pytest.raises(NotFound):
        store4.commit(r)
    assert store4.exists([key(1)]) == [False]


def test_reserved_space_is_never_evicted(store4: TieredStore) -> None:
    r = store4.reserve(key(9), 2 * K)
    assert r is not None
    for i in range(5):
        store4.put(key(i), val(i))
    assert present(store4, range(5)) == [3, 4]  # only 2 units left beside the reservation
    r.view[:] = val(9, 2 * K)
    assert store4.commit(r)
    assert store4.get(key(9)) == (val(9, 2 * K), b"")


# ---- eviction order --------------------------------------------------------------------


def test_eviction_is_exact_lru(store4: TieredStore) -> None:
    for i in range(4):
        store4.put(key(i), val(i))
    assert lru_keys(store4) == [key(0), key(1), key(2), key(3)]
    store4.get(key(0))  # touch 0
    store4.put(key(4), val(4))  # evicts 1
    assert present(store4, range(5)) == [0, 2, 3, 4]
    store4.put(key(5), val(5))  # evicts 2
    assert present(store4, range(6)) == [0, 3, 4, 5]
    assert store4.stats().tiers[0].evictions == 2


def test_prefix_read_touches_tail_first_so_head_is_evicted_last(store4: TieredStore) -> None:
    for i in range(4):
        store4.put(key(i), val(i))
    pins = store4.pin_many([key(1), key(2), key(3)])
    for p in pins:
        assert isinstance(p, PinnedBlock)
        store4.unpin(p)
    # 0 untouched (oldest); then the chain tail 3, 2, and the head 1 most recent
    assert lru_keys(store4) == [key(0), key(3), key(2), key(1)]
    evicted: list[int] = []
    for j in range(10, 14):
        before = set(present(store4, range(4)))
        store4.put(key(j), val(j))
        evicted += sorted(before - set(present(store4, range(4))))
    assert evicted == [0, 3, 2, 1]


def test_commit_many_leaves_head_most_recent(store4: TieredStore) -> None:
    rs = [store4.reserve(key(i), K) for i in range(3)]
    for i, r in enumerate(rs):
        assert r is not None
        r.view[:] = val(i)
    assert store4.commit_many(rs) == [True, True, True]  # type: ignore[arg-type]
    assert lru_keys(store4) == [key(2), key(1), key(0)]
    with pytest.raises(NotFound):
        store4.commit_many(rs)  # type: ignore[arg-type]


def test_pinned_block_is_never_evicted(store4: TieredStore) -> None:
    for i in range(4):
        store4.put(key(i), val(i))
    (p0,) = store4.pin_many([key(0)])
    assert isinstance(p0, PinnedBlock)
    store4.get(key(1))
    store4.get(key(2))
    store4.get(key(3))
    # block 0 is the LRU, but pinned: the next LRU (1) goes instead
    store4.put(key(4), val(4))
    assert present(store4, range(5)) == [0, 2, 3, 4]
    assert bytes(p0.view) == val(0)
    assert store4.remove([key(0)]) == [False]  # pinned blocks are kept
    store4.unpin(p0)
    with pytest.raises(NotFound):
        store4.unpin(p0)
    assert store4.remove([key(0), key(0), key(77)]) == [True, False, False]


def test_no_capacity_when_everything_is_pinned_and_nothing_evicted_in_vain() -> None:
    with TieredStore(dram_size_bytes=4 * K, arena_dir=None) as s:
        for i in range(4):
            s.put(key(i), val(i))
        pins = s.pin_many([key(0), key(1)])
        with pytest.raises(NoCapacity):
            s.reserve(key(9), 3 * K)  # 2 pinned units + 3 needed > 4
        assert present(s, range(4)) == [0, 1, 2, 3]
        assert s.stats().pinned_blocks == 2
        for p in pins:
            s.unpin(p)  # type: ignore[arg-type]
        assert s.stats().pinned_blocks == 0
        with pytest.raises(NoCapacity):
            s.reserve(key(9), 5 * K)  # larger than the whole arena
        assert s.reserve(key(9), 3 * K) is not None


# ---- errors, namespaces, probes ------------------------------------------------------


def test_bad_input_errors(store4: TieredStore) -> None:
    with pytest.raises(KeyInvalid, match="empty"):
        store4.reserve(b"", 10)
    with pytest.raises(KeyInvalid, match="bytes"):
        store4.put("abc", b"x")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="size_bytes"):
        store4.reserve(key(1), -1)
    with pytest.raises(KeyInvalid):
        store4.pin_many([key(1), b""])
    s = TieredStore(dram_size_bytes=4 * K, arena_dir=None, max_block_bytes=100)
    with pytest.raises(BlockTooLarge, match="max_block_bytes=100"):
        s.put(key(1), b"x" * 101)
    s.close()
    with pytest.raises(InvalidArgument, match="dram_size_bytes"):
        TieredStore(dram_size_bytes=100, arena_dir=None)


def test_every_operation_is_scoped_to_its_namespace(store4: TieredStore) -> None:
    # regression: a put under B of a key stored under A was an ok no-op, exists/remove ignored
    # the namespace and a reader with no namespace read every namespace's blocks
    store4.put(key(1), val(1), namespace_id=b"nsA")
    assert store4.put(key(1), val(2), namespace_id=b"nsB") is True  # a second block
    assert store4.get(key(1), namespace_id=b"nsA") == (val(1), b"")
    assert store4.get(key(1), namespace_id=b"nsB") == (val(2), b"")
    assert store4.pin_many([key(1)], namespace_id=b"nsC") == [None]  # no error, no leak
    assert store4.get(key(1)) is None  # b"" is a namespace of its own
    assert store4.exists([key(1)], namespace_id=b"nsC") == [False]
    assert store4.exists([key(1)], namespace_id=b"nsA") == [True]
    assert store4.lookup_prefix([key(1)], namespace_id=b"nsC") == []
    assert store4.remove([key(1)], namespace_id=b"nsC") == [False]
    assert store4.remove([key(1)]) == [False]
    assert store4.remove([key(1)], namespace_id=b"nsB") == [True]
    assert store4.get(key(1), namespace_id=b"nsA") == (val(1), b"")  # A's block untouched
    assert [(b.key, b.namespace_id) for b in store4.list_blocks(namespace_id=b"nsA")[0]] == [
        (key(1), b"nsA")
    ]
    assert store4.stats().pinned_blocks == 0


def test_lookup_prefix_stops_at_first_miss_and_touches_nothing(store4: TieredStore) -> None:
    for i in range(3):
        store4.put(key(i), val(i))
    before = store4.stats()
    order = lru_keys(store4)
    assert store4.lookup_prefix([key(2), key(0), key(5), key(1)]) == [Tier.DRAM, Tier.DRAM]
    assert store4.exists([key(0), key(5)]) == [True, False]
    assert lru_keys(store4) == order
    after = store4.stats()
    assert (after.gets, after.hits, after.misses) == (before.gets, before.hits, before.misses)


def test_stats_count_gets_hits_misses(store4: TieredStore) -> None:
    store4.put(key(1), val(1))
    store4.get(key(1))
    store4.get(key(2))
    got = store4.pin_many([key(1), key(3), key(1)])
    for p in got:
        if isinstance(p, PinnedBlock):
            store4.unpin(p)
    st = store4.stats()
    assert (st.gets, st.hits, st.misses, st.puts) == (5, 3, 2, 1)
    assert st.tiers[0].hits == 3 and st.tiers[0].num_blocks == 1
    assert len(st.tiers) == 1


def test_list_blocks_filters_and_truncates(store4: TieredStore) -> None:
    store4.put(key(1), val(1), namespace_id=b"a")
    store4.put(key(2), val(2), namespace_id=b"b")
    store4.put(key(3), val(3), namespace_id=b"a")
    blocks, truncated = store4.list_blocks(namespace_id=b"a")
    assert [b.key for b in blocks] == [key(1), key(3)] and not truncated
    assert blocks[0].tiers == (Tier.DRAM,) and blocks[0].size_bytes == K
    blocks, truncated = store4.list_blocks(limit=2)
    assert len(blocks) == 2 and truncated


# ---- arena file ------------------------------------------------------------------------


def test_arena_file_is_shared_and_unlinked_on_close(tmp_path: os.PathLike[str]) -> None:
    s = TieredStore(dram_size_bytes=8 * K + 5, arena_dir=tmp_path, node_id="n/1")
    assert s.arena_size_bytes == 8 * K
    path = s.arena_path
    assert path is not None and os.path.basename(path) == f"kvstored-n_1-{os.getpid()}.arena"
    # the blocks, then the slot headers and the shared index (kvstored/tiers/slots.py)
    assert os.path.getsize(path) == Layout(8 * K).total_bytes
    s.put(key(1), b"shared bytes")
    (p,) = s.pin_many([key(1)])
    assert isinstance(p, PinnedBlock)
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ) as m:
        assert m[p.offset : p.offset + p.size_bytes] == b"shared bytes"
    s.unpin(p)
    del p
    s.close()
    s.close()
    assert not os.path.exists(path)
    with pytest.raises(Unavailable):
        s.put(key(2), b"x")


def test_from_config(tmp_path: os.PathLike[str]) -> None:
    cfg = NodeConfig(
        node_id="cfgnode", dram_size_bytes="64KiB", arena_dir=tmp_path, ssd_size_bytes=0,
        max_block_bytes="16KiB",
    )
    with TieredStore.from_config(cfg) as s:
        assert s.arena_size_bytes == 64 * 1024 and "cfgnode" in (s.arena_path or "")
        assert len(s.stats().tiers) == 1
        with pytest.raises(BlockTooLarge):
            s.reserve(key(1), 16 * 1024 + 1)


# ---- threads ---------------------------------------------------------------------------


def test_eight_threads_putting_same_keys_store_one_complete_value_each() -> None:
    num_keys, size = 64, 3 * K + 17
    with TieredStore(dram_size_bytes=2 * num_keys * 8 * K, arena_dir=None) as s:
        wins = [[0] * num_keys for _ in range(8)]
        barrier = threading.Barrier(8)

        def worker(t: int) -> None:
            barrier.wait()
            for i in range(num_keys):
                res = s.reserve(key(i), size)
                if res is None:
                    continue
                res.view[:] = bytes([t + 1]) * size
                wins[t][i] = int(s.commit(res))

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        for i in range(num_keys):
            assert sum(w[i] for w in wins) == 1
            data, _ = s.get(key(i))  # type: ignore[misc]
            winner = next(t for t in range(8) if wins[t][i])
            assert data == bytes([winner + 1]) * size
        st = s.stats()
        assert st.puts == num_keys
        assert st.tiers[0].used_bytes == num_keys * 4 * K  # losers' space all freed


# ---- eviction with mixed block sizes ----------------------------------------------------

MiB = 1 << 20


def test_mixed_sizes_one_large_put_evicts_a_contiguous_window_not_34_blocks() -> None:
    # the repro of issue 6: 64 MiB of 1 MiB blocks whose LRU order alternates by address
    # (odd blocks least recent), then one 4 MiB put. Evicting LRU-first freed isolated 1 MiB
    # holes and took 34 victims; now the LRU victim is taken with its neighbours.
    s = TieredStore(dram_size_bytes=64 * MiB, arena_dir=None)
    try:
        keys = [key(i) for i in range(64)]
        for i, k in enumerate(keys):
            s.put(k, val(i, MiB))
        assert [s._state.dram.entries[store_key(b"", k)].offset for k in keys] == [i * MiB for i in range(64)]
        for p in s.pin_many(keys[:64:2]):
            s.unpin(p)  # type: ignore[arg-type]
        assert s.put(key(100), val(100, 4 * MiB)) is True
        assert s.stats().tiers[0].evictions == 4
        gone = [i for i, ok in enumerate(s.exists(keys)) if not ok]
        assert gone == [1, 2, 3, 4]  # the LRU block (1) and the window right of it
        assert s._state.dram.entries[store_key(b"", key(100))].offset == 1 * MiB
        s._state.dram.allocator.check_invariants()
        # the next large put starts from the next LRU block (3 is gone: 5 is next)
        assert s.put(key(101), val(101, 2 * MiB)) is True
        gone = [i for i, ok in enumerate(s.exists(keys)) if not ok]
        assert gone == [1, 2, 3, 4, 5, 6]
        assert s.stats().tiers[0].evictions == 6
    finally:
        s.close()


def test_mixed_sizes_a_window_skips_pinned_neighbours_and_prefers_free_space() -> None:
    s = TieredStore(dram_size_bytes=8 * K, arena_dir=None)
    try:
        for i in range(8):
            s.put(key(i), val(i))
        (pinned,) = s.pin_many([key(1)])  # 1 pinned (and most recent)
        for p in s.pin_many([key(i) for i in (2, 4, 5, 6, 7)]):
            s.unpin(p)  # type: ignore[arg-type]
        # LRU order now: 0, 3, 7, 6, 5, 4, 2, (1 pinned)
        assert s.remove([key(4)]) == [True]  # a free unit at 4
        assert s.put(key(20), val(20, 3 * K)) is True
        # 0 cannot grow past pinned 1 -> skipped; 3 with free 4 and 5: cost 2 blocks
        gone = [i for i, ok in enumerate(s.exists([key(i) for i in range(8)])) if not ok]
        assert gone == [3, 4, 5]
        assert s.stats().tiers[0].evictions == 2
        s.unpin(pinned)  # type: ignore[arg-type]
    finally:
        s.close()


def test_eviction_work_is_bounded_when_small_blocks_sit_at_the_lru_head(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # regression (found by bench_metadata_storm): 512 probe blocks of 4 KiB at the LRU head
    # whose windows cannot reach 4 MiB made every 4 MiB put walk ~512 x 1024 extents with the
    # store lock held (a 2.8 s stall of LookupPrefix). Now a few tries, then plain LRU.
    import kvstored.tiers.transit as tiered
    from kvstored.tiers.eviction import MAX_WINDOW_TRIES

    s = TieredStore(dram_size_bytes=8 * MiB, arena_dir=None)
    try:
        probes = [key(i) for i in range(512)]
        for k in probes:
            s.put(k, b"p" * 64)  # [0, 2 MiB)
        fence = s.reserve(key(9999), 10)  # a reservation at 2 MiB: windows cannot cross it
        assert fence is not None and fence.offset == 2 * MiB
        big = [key(1000 + i) for i in range(5)]
        for i, k in enumerate(big):
            s.put(k, val(i, MiB))  # [2 MiB + 4 KiB, ...): nearly full
        for p in s.pin_many(big):
            s.unpin(p)  # type: ignore[arg-type]  # probes are LRU now
        calls: list[int] = []
        real = tiered.victim_window

        def counting(*a: object, **kw: object) -> object:
            got = real(*a, **kw)  # type: ignore[arg-type]
            calls.append(0 if got is None else len(got))
            return got

        monkeypatch.setattr(tiered, "victim_window", counting)
        assert s.put(key(5000), val(7, 2 * MiB)) is True
        assert calls == [0] * MAX_WINDOW_TRIES  # then plain LRU took the probes
        gone = [i for i, ok in enumerate(s.exists(probes)) if not ok]
        assert gone == list(range(512))  # 2 MiB of probes freed, in LRU order
        assert s.stats().tiers[0].evictions == 512
        s.abort(fence)
    finally:
        s.close()
