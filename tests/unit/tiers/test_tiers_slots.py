"""One-sided reads of version-stamped slots (kvstored/tiers/slots.py): never wrong bytes.

Every race is made deterministic: the reader copies half a block, then the test runs the node
operation (rewrite, free, promotion, demotion) before the second half, or the node is held
with a slot or bucket odd (``SlotTable.hook``) while a reader tries. Each test runs with the
native ``copy_checked`` (C, acquire fences) and with the pure-Python fallback (x86 only).
"""

from __future__ import annotations

import mmap
import pathlib
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from helpers import key
from thread_helpers import in_thread

from kvstored import native
from kvstored.tiers.slots import SLOT_WORDS, UNIT_BYTES, Layout, SlotReader, SlotTable, ident, idents
from kvstored.tiers.tiered import TieredStore
from kvstored.types import Tier

K = 4096
BLOCK = 3 * K
NS = b"\x01ns-slots"

IMPLS: list[Any] = [pytest.param(native.py_copy_checked, id="python")]
if native.NATIVE:
    IMPLS.insert(0, pytest.param(native.native_copy_checked, id="native"))


def val(i: int, size: int = BLOCK - 5) -> bytes:
    return bytes([i % 251]) * size


def reader_of(store: TieredStore) -> tuple[SlotReader, memoryview]:
    arena = store._state.dram.arena
    return SlotReader(arena._mmap, arena.layout), arena.view


def read_one_sided(
    store: TieredStore, k: bytes, copy: Callable[..., bool], mid: Callable[[], None] | None = None,
    ns: bytes = NS,
) -> bytes | None:
    """A client's one-sided read of ``k``: the bytes if kept, None if it must ask the node.
    ``mid`` runs after the first half of the bytes is copied."""
    reader, view = reader_of(store)
    lo, hi = ident(ns, k)
    slot = reader.lookup(lo, hi)
    if slot is None:
        return None
    snap = reader.snapshot(slot, lo, hi)
    if snap is None:
        return None
    version, _gen, size, _meta = snap
    off = slot * UNIT_BYTES
    dst = bytearray(size)
    src = view[off : off + size]
    if mid is None:
        ok = copy(dst, src, reader.words, slot * SLOT_WORDS, version)
    else:
        half = size // 2
        ok = copy(memoryview(dst)[:half], src[:half], reader.words, slot * SLOT_WORDS, version)
        mid()
        ok = copy(memoryview(dst)[half:], src[half:], reader.words, slot * SLOT_WORDS, version) and ok
    return bytes(dst) if ok else None


@pytest.fixture
def store(tmp_path: pathlib.Path) -> Iterator[TieredStore]:
    s = TieredStore(dram_size_bytes=BLOCK, arena_dir=None, ssd_dir=tmp_path / "ssd",
                    ssd_size_bytes=40 * BLOCK)
    yield s
    if s._state.ssd is not None:
        s._state.ssd.io_hook = None
    s.close()


def _offset(store: TieredStore, k: bytes) -> int:
    reader, _ = reader_of(store)
    slot = reader.lookup(*ident(NS, k))
    assert slot is not None
    return slot * UNIT_BYTES


@pytest.mark.parametrize("copy", IMPLS)
def test_a_dram_hit_is_read_whole_without_the_node(store: TieredStore, copy: Callable[..., bool]) -> None:
    store.put(key(1), val(1), namespace_id=NS)
    assert read_one_sided(store, key(1), copy) == val(1)
    assert read_one_sided(store, key(2), copy) is None  # a miss: the node's path


@pytest.mark.parametrize("copy", IMPLS)
def test_a_rewrite_mid_copy_makes_the_reader_fall_back(store: TieredStore, copy: Callable[..., bool]) -> None:
    store.put(key(1), val(1), namespace_id=NS)
    off = _offset(store, key(1))

    def rewrite() -> None:  # remove and re-put the same key with other bytes, same space
        store.remove([key(1)], namespace_id=NS)
        store.put(key(1), val(2), namespace_id=NS)
        assert _offset(store, key(1)) == off

    assert read_one_sided(store, key(1), copy, mid=rewrite) is None
    assert read_one_sided(store, key(1), copy) == val(2)


def test_without_the_version_check_the_rewrite_test_sees_wrong_bytes(store: TieredStore) -> None:
    """The mutation test: a copy that skips the version check keeps torn bytes (half old,
    half new), so the check above is what keeps them out."""
    def unchecked(dst: Any, src: Any, _w: Any, _i: int, _v: int) -> bool:
        np.frombuffer(dst, dtype=np.uint8)[:] = np.frombuffer(src, dtype=np.uint8)
        return True

    store.put(key(1), val(1), namespace_id=NS)

    def rewrite() -> None:
        store.remove([key(1)], namespace_id=NS)
        store.put(key(1), val(2), namespace_id=NS)

    got = read_one_sided(store, key(1), unchecked, mid=rewrite)
    assert got is not None
    wrong = sum(a != b for a, b in zip(got, val(1), strict=True))
    assert wrong == len(got) - len(got) // 2  # the second half: the new block's bytes
    with pytest.raises(AssertionError, match="wrong bytes"):
        assert got == val(1), f"wrong bytes: {wrong} of {len(got)} differ"


@pytest.mark.parametrize("copy", IMPLS)
def test_a_free_mid_copy_makes_the_reader_fall_back(store: TieredStore, copy: Callable[..., bool]) -> None:
    store.put(key(1), val(1), namespace_id=NS)
    assert read_one_sided(store, key(1), copy,
                          mid=lambda: store.remove([key(1)], namespace_id=NS)) is None
    assert read_one_sided(store, key(1), copy) is None  # gone from the index too


@pytest.mark.parametrize("copy", IMPLS)
def test_a_promotion_into_the_slot_mid_copy_makes_the_reader_fall_back(
    store: TieredStore, copy: Callable[..., bool]
) -> None:
    store.put(key(1), val(1), namespace_id=NS)
    off = _offset(store, key(1))
    store.put(key(2), val(2), namespace_id=NS)  # the arena holds one block: key(1) demoted
    assert store.lookup_prefix([key(1)], namespace_id=NS) == [Tier.SSD]

    def promote() -> None:  # key(1) comes back from SSD into the one slot
        assert store.get(key(1), namespace_id=NS) == (val(1), b"")
        assert _offset(store, key(1)) == off

    assert read_one_sided(store, key(2), copy, mid=promote) is None  # key(2) left the slot
    assert read_one_sided(store, key(1), copy) == val(1)


@pytest.mark.parametrize("copy", IMPLS)
def test_a_demotion_mid_copy_makes_the_reader_fall_back(store: TieredStore, copy: Callable[..., bool]) -> None:
    store.put(key(1), val(1), namespace_id=NS)
    ssd = store._state.ssd
    assert ssd is not None
    entered, release = threading.Event(), threading.Event()

    def hold(op: str, _skey: bytes) -> None:
        if op == "write" and not entered.is_set():
            entered.set()
            assert release.wait(30)

    ssd.io_hook = hold
    thread: list[threading.Thread] = []

    def demote() -> None:
        t, _box = in_thread(lambda: store.put(key(2), val(2), namespace_id=NS))
        thread.append(t)
        assert entered.wait(30)  # key(1) is being written to SSD: its DRAM bytes still hold
        assert read_one_sided(store, key(1), copy) == val(1)
        release.set()  # the demotion ends, its space is freed and key(2) written there
        t.join(30)
        assert read_one_sided(store, key(2), copy) == val(2)

    try:
        assert read_one_sided(store, key(1), copy, mid=demote) is None
    finally:
        release.set()
        for t in thread:
            t.join(30)
    assert store.lookup_prefix([key(1)], namespace_id=NS) == [Tier.SSD]


@pytest.mark.parametrize("step", ["publish", "unpublish", "bucket"])
def test_a_reader_finds_nothing_while_the_node_holds_a_slot_or_bucket_odd(
    store: TieredStore, step: str
) -> None:
    table = store._state.dram.arena.slot_table
    store.put(key(1), val(1), namespace_id=NS)
    seen: list[object] = []

    def hook(at: str, _i: int) -> None:
        if at == step and not seen:
            reader, _ = reader_of(store)
            lo, hi = ident(NS, key(1))
            slot = reader.lookup(lo, hi)
            seen.append(slot if slot is None else reader.snapshot(slot, lo, hi))

    table.hook = hook
    if step == "unpublish":
        store.remove([key(1)], namespace_id=NS)
    else:
        store.remove([key(1)], namespace_id=NS)
        seen.clear()
        store.put(key(1), val(3), namespace_id=NS)
    table.hook = None
    assert seen == [None]


def test_another_namespace_never_finds_the_slot(store: TieredStore) -> None:
    store.put(key(1), val(1), namespace_id=NS)
    reader, _ = reader_of(store)
    assert reader.lookup(*ident(NS, key(1))) is not None
    assert reader.lookup(*ident(b"\xff\x01b" + NS, key(1))) is None  # tenant b, same id
    assert reader.lookup(*ident(b"", key(1))) is None


def test_eviction_keeps_a_block_read_one_sided(tmp_path: pathlib.Path) -> None:
    s = TieredStore(dram_size_bytes=2 * BLOCK, arena_dir=None)
    try:
        s.put(key(1), val(1), namespace_id=NS)
        s.put(key(2), val(2), namespace_id=NS)
        reader, _ = reader_of(s)
        slot = reader.lookup(*ident(NS, key(1)))
        assert slot is not None
        reader.touch(slot)  # key(1), the LRU block, read with no round trip
        s.put(key(3), val(3), namespace_id=NS)
        assert s.exists([key(1), key(2), key(3)], namespace_id=NS) == [True, False, True]
    finally:
        s.close()


def test_the_index_agrees_with_a_model_through_random_puts_and_removes() -> None:
    lay = Layout(64 * K)
    buf = bytearray(lay.total_bytes)
    table, reader = SlotTable(buf, lay), SlotReader(buf, lay)
    rng = random.Random(18)
    model: dict[bytes, int] = {}
    for _ in range(3000):
        k = key(rng.randrange(40))
        if k in model:
            table.unpublish(model.pop(k) * UNIT_BYTES)
            table.unindex(NS, k)
        else:
            free = sorted(set(range(lay.nslots)) - set(model.values()))
            slot = rng.choice(free)
            table.publish(slot * UNIT_BYTES, 100, NS, k, 1, b"m")
            model[k] = slot
        for j in range(40):
            kj = key(j)
            assert reader.lookup(*ident(NS, kj)) == model.get(kj)


def test_bad_arguments_of_the_native_check_are_named() -> None:
    if not native.NATIVE:
        pytest.skip("kvstored._native not built")
    words = np.zeros(4, dtype=np.uint64)
    with pytest.raises(ValueError, match="dst is 3 bytes but src is 4"):
        native.copy_checked(bytearray(3), b"abcd", words, 0, 0)
    with pytest.raises(ValueError, match="index 9 outside the 4 u64 words"):
        native.copy_checked(bytearray(4), b"abcd", words, 9, 0)
    with pytest.raises(ValueError, match="dst must be a writable"):
        native.copy_checked(b"abcd", b"abcd", words, 0, 0)


def test_the_native_and_python_batch_probes_agree_with_ident_lookups() -> None:
    lay = Layout(64 * K)
    buf = bytearray(lay.total_bytes)
    table = SlotTable(buf, lay)
    keys = [key(i) for i in range(12)]
    for i in (0, 1, 2, 5, 7):
        table.publish((i + 1) * UNIT_BYTES, 10, NS, keys[i], 1, b"")
    table.unpublish(6 * UNIT_BYTES)  # keys[5]: indexed, but its slot is odd (changing)
    ids = idents(NS, keys)
    assert [tuple(int(x) for x in r) for r in ids] == [ident(NS, k) for k in keys]
    expected = [1, 2, 3, -1, -1, -1, -1, 8, -1, -1, -1, -1]
    readers = [SlotReader(buf, lay)]
    if native.probe_many is not None:
        readers.append(SlotReader(buf, lay, probe=native.probe_many))
    for reader in readers:
        out, lead = reader.probe_many(ids)
        assert (out.tolist(), lead) == (expected, 3)


def test_the_batch_check_keeps_stable_slots_stamps_them_and_drops_changed_ones(store: TieredStore) -> None:
    """copy_checked_many (native and fallback): per item the same answer as copy_checked."""
    reader, view = reader_of(store)
    store.put(key(1), val(1), namespace_id=NS)
    slot = reader.lookup(*ident(NS, key(1)))
    assert slot is not None
    snap = reader.snapshot(slot, *ident(NS, key(1)))
    assert snap is not None
    off, size = slot * UNIT_BYTES, snap[2]
    impls = [native.py_copy_checked_many]
    if native.NATIVE:
        impls.append(native.copy_checked_many)
    for impl in impls:
        good, stale = bytearray(size), bytearray(size)
        items = [(good, view[off : off + size], slot * SLOT_WORDS, snap[0]),
                 (stale, view[off : off + size], slot * SLOT_WORDS, snap[0] + 2)]  # another version
        assert impl(items, reader.words, 12345) == [True, False]
        assert bytes(good) == val(1)
        assert int(reader.slots[slot, 5]) == 12345  # access_ns stamped (stamp_ns + item index)
        reader.slots[slot, 5] = 0


def test_a_prefix_read_tail_first_leaves_its_head_most_recent(tmp_path: pathlib.Path) -> None:
    """The client copies a batch tail first with one stamp base (stamp_ns + item index); the
    node's eviction absorbs the stamps in order, so the prefix's head ends most recent."""
    s = TieredStore(dram_size_bytes=4 * BLOCK, arena_dir=None)
    try:
        for i in range(4):
            s.put(key(i), val(i), namespace_id=NS)
        reader, view = reader_of(s)
        items = []
        for i in (2, 1, 0):  # the prefix key(0..2), tail first (as _copy_one_sided plans it)
            lo, hi = ident(NS, key(i))
            slot = reader.lookup(lo, hi)
            assert slot is not None
            snap = reader.snapshot(slot, lo, hi)
            assert snap is not None
            off = slot * UNIT_BYTES
            items.append((bytearray(snap[2]), view[off : off + snap[2]], slot * SLOT_WORDS, snap[0]))
        assert native.copy_checked_many(items, reader.words, 1000) == [True] * 3
        dram = s._state.dram
        assert dram.absorb_reads() == 3
        order = [bytes(k[-16:]) for k in dram.entries]
        assert order == [key(3), key(2), key(1), key(0)]  # LRU first: the unread block, then the tail
    finally:
        s.close()


# --- the whole-batch calls: probe_keys (lookup_prefix, exists) and read_keys (get, get_into) ---

KEY_BOUNDS = (1, 64)


def readers_of(store: TieredStore) -> list[tuple[str, SlotReader]]:
    """The store's slots read by the pure-Python fallbacks and, when built, the native calls."""
    arena = store._state.dram.arena
    out = [("python", SlotReader(arena._mmap, arena.layout))]
    if native.probe_keys is not None and native.read_keys is not None and native.read_all is not None:
        out.append(("native", SlotReader(arena._mmap, arena.layout, probe_keys=native.probe_keys,
                                         read_keys=native.read_keys, read_all=native.read_all)))
    return out


@pytest.fixture
def big_store() -> Iterator[TieredStore]:
    s = TieredStore(dram_size_bytes=16 * BLOCK, arena_dir=None)
    yield s
    s.close()


def test_the_native_and_python_prefix_probes_agree(big_store: TieredStore) -> None:
    keys = [key(i) for i in range(8)]
    for i in (0, 1, 2, 4, 5):
        big_store.put(keys[i], val(i), namespace_id=NS)
    table = big_store._state.dram.arena.slot_table
    ref = SlotReader(big_store._state.dram.arena._mmap, big_store._state.dram.arena.layout)
    slot5 = ref.lookup(*ident(NS, keys[5]))
    assert slot5 is not None
    table.unpublish(slot5 * UNIT_BYTES)  # keys[5]: indexed, but its slot is odd (changing)
    answers = {}
    for name, reader in readers_of(big_store):
        found = bytearray(len(keys))
        answers[name] = (
            reader.lookup_keys(NS, keys, *KEY_BOUNDS),  # stops at the first miss
            reader.lookup_keys(NS, keys, *KEY_BOUNDS, found=found), list(found),
            reader.lookup_keys(b"\xff\x01b" + NS, keys, *KEY_BOUNDS),  # another tenant: nothing
            reader.lookup_keys(NS, keys[:2] + [b""] + keys[2:], *KEY_BOUNDS),  # an empty key: -1 - 2
            reader.lookup_keys(NS, [keys[0], bytearray(keys[1])], *KEY_BOUNDS),  # not bytes: -1 - 1
            reader.lookup_keys(NS, [keys[0], b"k" * 65], *KEY_BOUNDS),  # too long: -1 - 1
            reader.lookup_keys(NS, [keys[3], b""], *KEY_BOUNDS),  # every key checked, a miss first too
        )
    expected = (3, 3, [1, 1, 1, 0, 1, 0, 0, 0], 0, -3, -2, -2, -2)
    assert answers == {name: expected for name in answers}


def test_the_native_and_python_batch_reads_agree(big_store: TieredStore) -> None:
    keys = [key(i) for i in range(6)]
    metas = [b"m0", b"", b"x" * 64, b"y" * 65, b"m4"]  # keys[3]'s meta is not inline: the node's
    for i in range(5):
        big_store.put(keys[i], val(i, 1000 + i), meta=metas[i], namespace_id=NS)
    answers = {}
    for name, reader in readers_of(big_store):
        sizes, got_metas, values, fallbacks = reader.read_keys(NS, keys, None, 0)
        bufs = [bytearray(2000) for _ in keys]
        bufs[4] = bytearray(10)  # too small: the node's path names it
        into = reader.read_keys(NS, keys, bufs, 0)
        answers[name] = (sizes, got_metas, values, fallbacks, into[0], into[1], into[2], into[3],
                         [bytes(b[: s or 0]) for b, s in zip(bufs, into[0], strict=True)])
    sizes = [1000, 1001, 1002, None, 1004, None]
    kept = [val(0, 1000), val(1, 1001), val(2, 1002), None, val(4, 1004), None]
    expected = (sizes, [b"m0", b"", b"x" * 64, b"", b"m4", b""], kept, 0,
                sizes[:4] + [None, None], [b"m0", b"", b"x" * 64, b"", b"", b""], None, 0,
                [v or b"" for v in kept[:4]] + [b"", b""])
    assert answers == {name: expected for name in answers}


def test_batch_reads_into_buffers_at_every_offset_from_a_page_write_exactly_the_block() -> None:
    """read_keys (get_into) from page-aligned arena blocks into destinations 0..4095 bytes past
    a page: the native copy takes its vector loop where the destination sits 1..63 bytes past
    the source modulo 4 KiB (native/copy.c copy_bytes: `rep movsb` there runs 4-8x slower on
    the AMD VM of docs/performance.md); the bytes and the bytes around each buffer are the
    same as the fallback's."""
    size = (64 << 10) + 5
    s = TieredStore(dram_size_bytes=8 * (size + 4096), arena_dir=None)
    try:
        keys = [key(i) for i in range(3)]
        vals = [np.random.default_rng(i).integers(0, 256, size, dtype=np.uint8).tobytes() for i in range(3)]
        for k, v in zip(keys, vals, strict=True):
            s.put(k, v, namespace_id=NS)
        readers = readers_of(s)
        for offsets in ([0, 1, 16], [17, 48, 63], [64, 2048, 4095]):
            answers = {}
            for name, reader in readers:
                raw = mmap.mmap(-1, 3 * (size + 8192))  # page-aligned
                base = np.frombuffer(raw, dtype=np.uint8)
                base[:] = 0xA5
                starts = [j * (size + 8192) + off for j, off in enumerate(offsets)]
                bufs = [base[a : a + size] for a in starts]
                got = reader.read_keys(NS, keys, bufs, 0)
                answers[name] = (got[0], got[3], [bytes(b) for b in bufs], bytes(base).count(0xA5))
                del bufs, base
            want = ([size] * 3, 0, vals, 3 * (size + 8192) - 3 * size + sum(v.count(0xA5) for v in vals))
            assert answers == {name: want for name, _ in readers}, offsets
    finally:
        s.close()


@pytest.mark.parametrize("impl", ["python", "native"])
def test_a_batch_read_stamps_tail_first_and_a_rewrite_between_plan_and_copy_falls_back(
    big_store: TieredStore, impl: str
) -> None:
    """read_keys plans the batch (index, headers), then copies: the node rewriting a block in
    between (remove + re-put of the key with other bytes into the same space) makes that key
    fall back, counted apart from misses; the others are kept, stamped tail first."""
    readers = dict(readers_of(big_store))
    if impl not in readers:
        pytest.skip("kvstored._native not built")
    reader = readers[impl]
    keys = [key(i) for i in range(3)]
    for i in range(3):
        big_store.put(keys[i], val(i), namespace_id=NS)
    slots = [reader.lookup(*ident(NS, k)) for k in keys]

    def rewrite() -> None:
        big_store.remove([keys[1]], namespace_id=NS)
        big_store.put(keys[1], val(9), namespace_id=NS)
        assert reader.lookup(*ident(NS, keys[1])) == slots[1]  # the same space, a new version

    sizes, _metas, values, fallbacks = reader.read_keys(NS, keys, None, 5000, mid=rewrite)
    assert (sizes, values, fallbacks) == ([BLOCK - 5, None, BLOCK - 5], [val(0), None, val(2)], 1)
    stamps = [int(reader.slots[s, 5]) for s in slots]  # type: ignore[index]
    assert stamps[2] == 5000 and stamps[0] == 5002  # the tail first, the head latest
    assert reader.read_keys(NS, keys, None, 0)[2] == [val(0), val(9), val(2)]  # the new bytes


def test_the_native_and_python_all_or_nothing_reads_agree(big_store: TieredStore) -> None:
    """read_all (the sync client's hit path): every key kept, or an int and the caller's
    general path: -1 for an argument of another kind (checked before anything is read, so
    no destination is touched), else the failed version checks (0: a miss, a meta not
    inline, a buffer too small). The same answers from C and from the fallback."""
    keys = [key(i) for i in range(5)]
    metas = [b"m0", b"", b"x" * 64, b"y" * 65]  # keys[3]'s meta is not inline
    for i in range(4):
        big_store.put(keys[i], val(i, 1000 + i), meta=metas[i], namespace_id=NS)
    hit = keys[:3]
    sizes = [1000, 1001, 1002]
    answers = {}
    for name, reader in readers_of(big_store):
        def read(ks: list[Any], dsts: Any = None, meta: bool = False, r: SlotReader = reader) -> Any:
            return r.read_all(NS, ks, dsts, 0, *KEY_BOUNDS, want_meta=meta)

        bufs = [bytearray(2000) for _ in hit]
        arrs = [np.zeros(1500, dtype=np.uint8) for _ in hit]
        untouched = [np.full(1500, 7, dtype=np.uint8), np.full(1500, 7, dtype=np.uint8)]
        answers[name] = (
            read(hit), read(hit, bufs), [bytes(b[:s]) for b, s in zip(bufs, sizes, strict=True)],
            read(hit, arrs, meta=True), [a[:s].tobytes() for a, s in zip(arrs, sizes, strict=True)],
            read(keys[:2] + [keys[4]]),  # a miss: 0
            read(keys[2:4]),  # a meta not inline: 0
            read(hit, [bytearray(2000), bytearray(10), bytearray(2000)]),  # too small: 0
            read([keys[0], bytearray(keys[1])]), read([keys[0], b""]), read([keys[0], b"k" * 65]),  # bad keys
            read(hit[:2], [b"read-only", bytearray(2000)]),  # a read-only buffer
            read(hit[:2], [untouched[0], np.zeros(1500, dtype=np.float32)]),  # not "B": the general path casts it
            read(hit[:2], [untouched[1], np.zeros((2, 1000), dtype=np.uint8)]),  # not flat
            read(hit[:2], [bytearray(2000)]), read(hit[:2], (bytearray(2000), bytearray(2000))),  # lists, lengths
            read(tuple(hit)), [int(u.sum()) for u in untouched],  # type: ignore[arg-type]
        )
    want = (
        ([val(0, 1000), val(1, 1001), val(2, 1002)], sum(sizes)), (sizes, sum(sizes)),
        [val(0, 1000), val(1, 1001), val(2, 1002)],
        (list(zip(sizes, metas[:3], strict=True)), sum(sizes)), [val(0, 1000), val(1, 1001), val(2, 1002)],
        0, 0, 0, -1, -1, -1, -1, -1, -1, -1, -1, -1, [7 * 1500, 7 * 1500],
    )
    assert answers == {name: want for name in answers}


@pytest.mark.parametrize("impl", ["python", "native"])
def test_an_all_or_nothing_read_keeps_nothing_when_a_block_is_rewritten_between_plan_and_copy(
    big_store: TieredStore, impl: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """read_all's version check is read_keys': a block removed and re-put with other bytes in
    its space between the plan and the copies fails it, and the call answers the failed
    check (1), never the batch; the next call reads the new bytes. The mutation (python:
    the fallback's check turned off, the space reused by another key in between) keeps that
    other key's bytes under the planned key: the check is what stops it."""
    readers = dict(readers_of(big_store))
    if impl not in readers:
        pytest.skip("kvstored._native not built (the python case runs)")
    reader = readers[impl]
    keys = [key(i) for i in range(3)]
    for i in range(3):
        big_store.put(keys[i], val(i), namespace_id=NS)
    slot1 = reader.lookup(*ident(NS, keys[1]))

    def rewrite() -> None:
        big_store.remove([keys[1]], namespace_id=NS)
        big_store.put(keys[1], val(9), namespace_id=NS)
        assert reader.lookup(*ident(NS, keys[1])) == slot1  # the same space, a new version

    bufs = [bytearray(BLOCK) for _ in keys]
    assert reader.read_all(NS, keys, bufs, 0, *KEY_BOUNDS, mid=rewrite) == 1
    assert reader.read_all(NS, keys, None, 0, *KEY_BOUNDS) == ([val(0), val(9), val(2)], 3 * (BLOCK - 5))
    if impl == "python":  # the mutation: the fallback's check off, the space reused by another key
        from kvstored.tiers import slots as slots_mod

        def reuse() -> None:
            big_store.remove([keys[1]], namespace_id=NS)
            big_store.put(key(99), val(99), namespace_id=NS)
            assert reader.lookup(*ident(NS, key(99))) == slot1

        monkeypatch.setattr(slots_mod, "_unchanged", lambda *_: True)
        got = reader.read_all(NS, keys, None, 0, *KEY_BOUNDS, mid=reuse)
        assert isinstance(got, tuple) and got[0][1] == val(99)  # another key's bytes, kept


@pytest.mark.parametrize("step", ["publish", "unpublish"])
def test_a_batch_read_finds_nothing_while_the_node_holds_the_slot_odd(big_store: TieredStore, step: str) -> None:
    table = big_store._state.dram.arena.slot_table
    big_store.put(key(1), val(1), namespace_id=NS)
    seen: list[object] = []

    def hook(at: str, _i: int) -> None:
        if at == step and not seen:
            seen.append({name: (r.read_keys(NS, [key(1)], None, 0)[0], r.lookup_keys(NS, [key(1)], *KEY_BOUNDS))
                         for name, r in readers_of(big_store)})

    table.hook = hook
    big_store.remove([key(1)], namespace_id=NS)
    if step == "publish":
        seen.clear()
        big_store.put(key(1), val(3), namespace_id=NS)
    table.hook = None
    assert seen == [{name: ([None], 0) for name, _ in readers_of(big_store)}]


def test_the_native_batch_read_names_bad_arguments(big_store: TieredStore) -> None:
    readers = dict(readers_of(big_store))
    for name, reader in readers.items():
        with pytest.raises(TypeError, match="key #0 must be bytes"):
            reader.read_keys(NS, [bytearray(b"k" * 16)], None, 0)  # type: ignore[list-item]
        with pytest.raises(ValueError, match="dst #0 must be a writable"):
            big_store.put(key(1), val(1), namespace_id=NS)
            reader.read_keys(NS, [key(1)], [b"read-only"], 0)
        assert name in ("python", "native")


def test_without_the_batch_check_another_keys_bytes_are_kept(
    big_store: TieredStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mutation test of the batch read: with its version check turned off, a block freed
    between the plan and the copy and reused by another key is kept under the planned key
    (another block's bytes); with the check, that key falls back to the node."""
    from kvstored.tiers import slots as slots_mod

    reader = SlotReader(big_store._state.dram.arena._mmap, big_store._state.dram.arena.layout)
    keys = [key(1), key(2)]
    for i, k in enumerate(keys):
        big_store.put(k, val(i + 1), namespace_id=NS)
    slot = reader.lookup(*ident(NS, key(2)))

    def reuse() -> None:  # key(2) removed, its space taken by key(99)'s block at once
        big_store.remove([key(2)], namespace_id=NS)
        big_store.put(key(99), val(99), namespace_id=NS)
        assert reader.lookup(*ident(NS, key(99))) == slot

    got = reader.read_keys(NS, keys, None, 0, mid=reuse)[2]
    assert got == [val(1), None]  # checked: key(2) is the node's to answer (a miss now)
    big_store.remove([key(99)], namespace_id=NS)
    big_store.put(key(2), val(2), namespace_id=NS)
    slot = reader.lookup(*ident(NS, key(2)))
    monkeypatch.setattr(slots_mod, "_unchanged", lambda *_: True)
    got = reader.read_keys(NS, keys, None, 0, mid=reuse)[2]
    assert got is not None and got[1] is not None
    wrong = sum(a != b for a, b in zip(got[1], val(2), strict=True))
    assert got[1] == val(99) and wrong == len(val(2))  # every byte another key's
    with pytest.raises(AssertionError, match="wrong bytes"):
        assert got[1] == val(2), f"wrong bytes: {wrong} of {len(got[1])} differ"


def test_a_stale_hint_is_checked_like_a_bucket_and_both_impls_keep_the_same_hints(big_store: TieredStore) -> None:
    """A reader's hint table (SlotReader.hints) names a slot to check first. Each stale hint
    here (the key's slot now another key's, freed, or the key moved to another slot) must
    be refused by the header check and answered from the index: never another key's block.
    The native and pure-Python readers run the same steps and end with the same hints."""
    readers = readers_of(big_store)
    assert all(r.hints is not None for _, r in readers)
    a, b, c = key(1), key(2), key(3)
    big_store.put(a, val(1), namespace_id=NS)
    for _, r in readers:  # the hint a -> its slot
        assert r.lookup_keys(NS, [a], *KEY_BOUNDS) == 1
    slot_a = readers[0][1].lookup(*ident(NS, a))
    big_store.remove([a], namespace_id=NS)
    big_store.put(b, val(2), namespace_id=NS)  # a's space taken by b at once
    assert readers[0][1].lookup(*ident(NS, b)) == slot_a
    answers: dict[str, list[object]] = {}
    for name, r in readers:
        got = answers.setdefault(name, [])
        got.append((r.lookup_keys(NS, [a], *KEY_BOUNDS), r.read_keys(NS, [a, b], None, 0)[2]))  # reused
        big_store.remove([b], namespace_id=NS)
        got.append((r.lookup_keys(NS, [b], *KEY_BOUNDS), r.read_keys(NS, [b], None, 0)[2]))  # freed
        big_store.put(c, val(3), namespace_id=NS)  # c takes the space; b comes back elsewhere
        big_store.put(b, val(4), namespace_id=NS)
        got.append((r.lookup_keys(NS, [b, c], *KEY_BOUNDS), r.read_keys(NS, [b, c], None, 0)[2]))  # moved
        big_store.remove([b, c], namespace_id=NS)
        big_store.put(b, val(2), namespace_id=NS)
    expected = [(0, [None, val(2)]), (0, [None]), (2, [val(4), val(3)])]
    assert answers == {name: expected for name, _ in readers}
    hints = [r.hints for _, r in readers]
    assert all(np.array_equal(hints[0], h) for h in hints[1:])  # type: ignore[arg-type]


def test_garbage_hints_change_no_answer(big_store: TieredStore) -> None:
    """Hints are only where to look first: a table of random garbage (slots out of range, other
    keys' slots, torn entries) gives the answers of a reader without hints, natively and in
    Python, while the node stores, removes and re-puts blocks."""
    rng = random.Random(18)
    keys = [key(i) for i in range(24)]
    plain = SlotReader(big_store._state.dram.arena._mmap, big_store._state.dram.arena.layout, hints=False)
    for step in range(60):
        k = rng.choice(keys)
        if rng.random() < 0.4:
            big_store.remove([k], namespace_id=NS)
        else:
            big_store.put(k, val(rng.randrange(250), 1000 + rng.randrange(2000)), namespace_id=NS)
        want = (plain.lookup_keys(NS, keys, *KEY_BOUNDS, found=bytearray(len(keys))),
                plain.read_keys(NS, keys, None, 0)[:3])
        for name, r in readers_of(big_store):
            assert r.hints is not None
            h = r.hints
            h[:, 0] = [rng.choice([0, rng.getrandbits(64), ident(NS, rng.choice(keys))[0]]) for _ in range(len(h))]
            h[:, 1] = [rng.choice([0, rng.getrandbits(64), rng.randrange(64)]) for _ in range(len(h))]
            found = bytearray(len(keys))
            got = (r.lookup_keys(NS, keys, *KEY_BOUNDS, found=found), r.read_keys(NS, keys, None, 0)[:3])
            assert got == want, (name, step)


def test_the_native_calls_name_a_bad_hint_table(big_store: TieredStore) -> None:
    if native.probe_keys is None or native.read_keys is None:
        pytest.skip("kvstored._native not built")
    r = SlotReader(big_store._state.dram.arena._mmap, big_store._state.dram.arena.layout)
    prefix = bytes((len(NS),)) + NS
    for bad, what in ((np.zeros((3, 2), dtype=np.uint64), "power of two"), (b"\0" * 32, "writable")):
        with pytest.raises(ValueError, match=f"probe_keys: hints .*{what}"):
            native.probe_keys(r.buckets, r.slots, prefix, [key(1)], *KEY_BOUNDS, None, bad)
        with pytest.raises(ValueError, match=f"read_keys: hints .*{what}"):
            native.read_keys(r.buckets, r.slots, r.arena, prefix, [key(1)], None, 0, None, bad)


def _twin_tables() -> tuple[Layout, list[bytearray], SlotTable, SlotTable]:
    """Two slot regions of a 16-slot arena (64 buckets): one written by the native
    publish_many / unindex_many, one by the pure-Python SlotTable (same initial bytes)."""
    if native.publish_many is None or native.unindex_many is None:
        pytest.skip("kvstored._native not built")
    lay = Layout(16 * K)
    bufs = [bytearray(lay.total_bytes), bytearray(lay.total_bytes)]
    fast = SlotTable(bufs[0], lay, native_publish=native.publish_many, native_unindex=native.unindex_many)
    slow = SlotTable(bufs[1], lay)
    assert bufs[0] == bufs[1]
    return lay, bufs, fast, slow


def test_the_native_and_python_commits_write_the_same_slot_and_index_bytes() -> None:
    """Batches of publishes (re-publishes of a key and of a slot, inline and too-long meta,
    generations past 2**64, a namespace of 255 bytes), unpublishes and unindexes, random but
    the same for both tables: after every step the two regions are byte-identical, and the
    index reaches its 3/4 bound (stale keys of rewritten slots stay indexed until removed)."""
    lay, bufs, fast, slow = _twin_tables()
    rng = random.Random(1818)
    namespaces = [NS, b"", b"\xff" * 255]
    live: dict[tuple[bytes, bytes], int] = {}
    most = 0
    for step in range(400):
        op = rng.random()
        if op < 0.6:
            items = []
            for _ in range(rng.randrange(1, 20)):
                ns, k = rng.choice(namespaces), key(rng.randrange(90))
                slot = rng.randrange(lay.nslots)
                meta = bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 63, 64, 65, 200])))
                gen = rng.choice([1, rng.randrange(1 << 62), (1 << 64) + 5])
                items.append((slot * UNIT_BYTES, rng.randrange(1, 1 << 40), ns, k, gen, meta))
                live[(ns, k)] = slot
            fast.publish_many(items)
            slow.publish_many(items)
        elif op < 0.8 and live:
            ns, k = rng.choice(sorted(live))
            for t in (fast, slow):
                t.unpublish(live[(ns, k)] * UNIT_BYTES)
                t.unindex(ns, k)
            del live[(ns, k)]
        else:  # an unindex of a key that may be absent (a no-op then)
            ns, k = rng.choice(namespaces), key(rng.randrange(90))
            fast.unindex(ns, k)
            slow.unindex(ns, k)
            live.pop((ns, k), None)
        assert fast.used_buckets == slow.used_buckets, step
        assert bufs[0] == bufs[1], f"step {step}: the regions differ"
        most = max(most, fast.used_buckets)
    assert most == lay.nbuckets * 3 // 4  # the bound was reached (and held)
    reader = SlotReader(bufs[0], lay)
    for (ns, k), slot in live.items():  # what the index answers is checked against the header
        got = reader.lookup(*ident(ns, k))
        if got is not None and reader.snapshot(got, *ident(ns, k)) is not None:
            assert got == slot


def test_the_native_publish_names_bad_items_and_writes_nothing() -> None:
    lay, bufs, fast, _slow = _twin_tables()
    before = bytes(bufs[0])
    with pytest.raises(TypeError, match="item #1 must be a tuple"):
        native.publish_many(fast.slots, fast.buckets, [(0, 1, NS, key(1), 1, b""), [0]], 0)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="item #0: slot 16 outside the 16 slots"):
        native.publish_many(fast.slots, fast.buckets, [(16, 1, NS, key(1), 1, b"")], 0)
    with pytest.raises(TypeError, match="item #0: namespace_id, key and meta must be bytes"):
        native.publish_many(fast.slots, fast.buckets, [(0, 1, NS, "k", 1, b"")], 0)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="slots and buckets must be writable"):
        native.publish_many(bytes(fast.slots), fast.buckets, [], 0)
    with pytest.raises(TypeError, match=r"item #0 must be a \(namespace_id, key\) tuple"):
        native.unindex_many(fast.buckets, [(NS,)])  # type: ignore[list-item]
    from kvstored.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="namespace_id is 256 bytes"):
        fast.publish_many([(0, 1, b"x" * 256, key(1), 1, b"")])
    assert bytes(bufs[0]) == before


def test_a_batch_commit_publishes_every_block_and_the_head_ends_most_recent(tmp_path: pathlib.Path) -> None:
    """TieredStore.commit_slots publishes its batch in one call: every block is then readable
    one-sided with its bytes and meta, a key twice in the batch is stored once (committed last
    first: its later write wins, the earlier one answers "existed"), and the DRAM order is the
    pinned path's (the head most recent)."""
    s = TieredStore(dram_size_bytes=64 * K, arena_dir=None)
    try:
        slots = s.reserve_slots(2 * K, 4, namespace_id=NS)
        assert isinstance(slots, list) and len(slots) == 4
        writes = []
        for i, (r, k) in enumerate(zip(slots, [key(1), key(2), key(1), key(3)], strict=True)):
            r.view[: 100 + i] = bytes([i + 1]) * (100 + i)
            writes.append((r, k, 100 + i, b"m%d" % i))
        assert s.commit_slots(writes, namespace_id=NS) == [False, True, True, True]
        reader = SlotReader(s._state.dram.arena._mmap, s._state.dram.arena.layout)
        sizes, metas, values, fallbacks = reader.read_keys(NS, [key(1), key(2), key(3)], None, 0)
        assert sizes == [102, 101, 103] and metas == [b"m2", b"m1", b"m3"] and fallbacks == 0
        assert values == [b"\x03" * 102, b"\x02" * 101, b"\x04" * 103]
        order = [sk[-16:] for sk in s._state.dram.entries]
        assert order[-3:] == [key(3), key(1), key(2)]  # committed last first: the head ends latest
        (r,) = s.reserve_slots(2 * K, 1, namespace_id=NS)  # type: ignore[misc]  # a list here
        from kvstored.errors import NotFound

        with pytest.raises(NotFound, match="written twice"):
            s.commit_slots([(r, key(7), 10, b""), (r, key(8), 10, b"")], namespace_id=NS)
        assert s.exists([key(7), key(8)], namespace_id=NS) == [False, False]  # nothing committed
        assert s.commit_slots([(r, key(7), 10, b"")], namespace_id=NS) == [True]
    finally:
        s.close()
