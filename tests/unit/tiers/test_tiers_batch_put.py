"""TieredStore.reserve_many (kvstored/tiers/reservations.py): a put batch under one lock, carved
out of one extent, invisible until committed, every block freed on its own."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import numpy as np
import pytest
from helpers import key

from kvstored.errors import InvalidArgument, KeyInvalid
from kvstored.tiers.base import NEEDS_IO
from kvstored.tiers.tiered import TieredStore
from kvstored.types import Reservation

ARENA = 1 << 20


@pytest.fixture
def store() -> Iterator[TieredStore]:
    s = TieredStore(dram_size_bytes=ARENA, arena_dir=None)
    yield s
    s.close()


def _fill(res: list[Reservation | None], seed: int) -> list[bytes]:
    out = []
    for j, r in enumerate(res):
        assert isinstance(r, Reservation)
        data = bytes([(seed + j) % 251]) * r.size_bytes
        r.view[:] = data
        out.append(data)
    return out


def test_a_reserved_batch_is_invisible_to_readers_until_committed(store: TieredStore) -> None:
    keys = [key(i) for i in range(3)]
    res = store.reserve_many([(k, 5000, b"m") for k in keys])
    assert isinstance(res, list) and all(isinstance(r, Reservation) for r in res)
    data = _fill(res, 7)
    # written, not committed: no reader sees any of it
    assert store.exists(keys) == [False] * 3
    assert store.lookup_prefix(keys) == []
    assert store.pin_many(keys) == [None] * 3
    assert store.get(keys[0]) is None
    assert store.stats().tiers[0].num_blocks == 0 and store.stats().puts == 0
    assert store.commit_many(res) == [True, True, True]  # type: ignore[arg-type]
    assert store.exists(keys) == [True] * 3
    assert [store.get(k) for k in keys] == [(d, b"m") for d in data]


def test_batch_blocks_are_carved_from_one_extent_and_each_freed_on_its_own(
    store: TieredStore,
) -> None:
    alloc = store._state.dram.allocator  # noqa: SLF001
    sizes = [1, 4096, 4097, 0, 12000, 8192]
    res = store.reserve_many([(key(i), n, b"") for i, n in enumerate(sizes)])
    assert isinstance(res, list)
    offs = [r.offset for r in res]  # type: ignore[union-attr]
    rounded = [alloc.round_up(n) for n in sizes]
    assert offs == [offs[0] + sum(rounded[:j]) for j in range(len(sizes))]  # contiguous, aligned
    assert all(o % 4096 == 0 for o in offs)
    assert alloc.used_bytes == sum(rounded) and alloc.num_free_extents == 1
    _fill(res, 1)
    # commit every other block, abort the rest: each block's space is its own
    kept = [r for j, r in enumerate(res) if j % 2 == 0]
    for j, r in enumerate(res):
        if j % 2:
            store.abort(r)  # type: ignore[arg-type]
    assert store.commit_many(kept) == [True] * len(kept)  # type: ignore[arg-type]
    alloc.check_invariants()
    assert alloc.used_bytes == sum(rounded[j] for j in range(0, len(sizes), 2))
    assert store.remove([key(j) for j in range(0, len(sizes), 2)]) == [True] * len(kept)
    alloc.check_invariants()
    assert alloc.used_bytes == 0 and alloc.free_extents() == [(0, alloc.capacity_bytes)]


def test_an_aborted_batch_frees_its_space(store: TieredStore) -> None:
    alloc = store._state.dram.allocator  # noqa: SLF001
    res = store.reserve_many([(key(i), 10000, b"") for i in range(16)])
    assert isinstance(res, list) and alloc.used_bytes == 16 * alloc.round_up(10000)
    for r in res:
        store.abort(r)  # type: ignore[arg-type]
    assert alloc.used_bytes == 0 and alloc.num_free_extents == 1
    assert store._state.reserved_bytes == 0  # noqa: SLF001
    assert store.exists([key(i) for i in range(16)]) == [False] * 16


def test_stored_and_repeated_keys_reserve_nothing(store: TieredStore) -> None:
    assert store.put(key(1), b"x" * 100)
    used = store._state.dram.allocator.used_bytes  # noqa: SLF001
    res = store.reserve_many([(key(1), 100, b""), (key(2), 100, b""), (key(2), 100, b"")])
    assert isinstance(res, list)
    assert res[0] is None and isinstance(res[1], Reservation) and res[2] is None
    assert store._state.dram.allocator.used_bytes == used + 4096  # noqa: SLF001
    assert store.commit_many([res[1]]) == [True]  # type: ignore[list-item]


def test_bad_items_raise_and_reserve_nothing(store: TieredStore) -> None:
    for items, exc in (
        ([(key(1), 10, b""), (b"", 10, b"")], KeyInvalid),
        ([(key(1), 10, b""), (key(2), -1, b"")], InvalidArgument),
        ([(key(1), 10, b""), (key(2), 10, "meta")], InvalidArgument),
        ([(key(1), ARENA * 1024, b"")], InvalidArgument),
    ):
        with pytest.raises(exc):
            store.reserve_many(items)  # type: ignore[arg-type]
        assert store._state.dram.allocator.used_bytes == 0  # noqa: SLF001


def test_no_room_without_an_eviction_is_needs_io_on_the_loop_and_changes_nothing(
    tmp_path: pathlib.Path,
) -> None:
    """may_block=False (the event loop): a batch that needs an eviction (a demotion to SSD:
    disk I/O) reserves, evicts and demotes nothing; may_block=True then makes the room."""
    s = TieredStore(dram_size_bytes=64 << 10, arena_dir=None, ssd_dir=tmp_path / "ssd",
                    ssd_size_bytes=1 << 20)
    try:
        for i in range(16):  # DRAM full of committed blocks
            assert s.put(key(i), np.full(4096, i, np.uint8))
        before = (s._state.dram.allocator.used_bytes, list(s._state.dram.entries), s.stats().tiers)  # noqa: SLF001
        assert s.reserve_many([(key(100), 4096, b""), (key(101), 4096, b"")],
                              may_block=False) is NEEDS_IO
        assert (s._state.dram.allocator.used_bytes, list(s._state.dram.entries), s.stats().tiers) == before  # noqa: SLF001
        assert not s._state.pending and s._state.reserved_bytes == 0  # noqa: SLF001
        res = s.reserve_many([(key(100), 4096, b""), (key(101), 4096, b"")])
        assert isinstance(res, list) and all(isinstance(r, Reservation) for r in res)
        assert s.exists([key(0), key(1)]) == [True, True]  # demoted to SSD, not lost
        assert s.commit_many(res) == [True, True]  # type: ignore[arg-type]
    finally:
        s.close()
