"""The read buffers of SSD-only exports are reused (issue 9), never while a block is held.

``read_for_export`` reads a call's SSD-only blocks into one page-aligned mapping from a pool
per store; ``release_export`` hands it back once every block read into it is released. Each
test checks the bytes a caller sees are the block's own, whichever buffer they landed in.
"""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Iterator

import pytest
from helpers import key

from kvstored.errors import NotFound
from kvstored.tiers import export
from kvstored.tiers.tiered import TieredStore
from kvstored.types import Tier

K = 4096
BLOCK = 3 * K - 100  # not a page multiple: each block still starts on a page boundary


def val(i: int) -> bytes:
    return bytes([i % 251]) * (BLOCK - 7) + b"%07d" % i


@pytest.fixture
def store(tmp_path: pathlib.Path) -> Iterator[TieredStore]:
    """Blocks 0-7 SSD-only; 8-11 in DRAM."""
    s = TieredStore(dram_size_bytes=4 * 3 * K, arena_dir=None, ssd_dir=tmp_path / "ssd",
                    ssd_size_bytes=64 * BLOCK, ssd_direct_io=False)
    for i in range(12):
        assert s.put(key(i), val(i))
    assert s.lookup_prefix([key(i) for i in range(8)]) == [Tier.SSD] * 8
    yield s
    s.close()


def test_a_released_call_s_buffer_serves_the_next_call_page_aligned_with_the_right_bytes(
    store: TieredStore,
) -> None:
    first = store.read_for_export([key(0), key(8), key(1)])
    assert [bytes(b.view) for b in first if b is not None] == [val(0), val(8), val(1)]
    ssd_blocks = [first[0], first[2]]
    assert all(b is not None and b.buffer is not None for b in ssd_blocks)
    buffer = first[0].buffer  # type: ignore[union-attr]
    assert first[2].buffer is buffer and first[1].buffer is None  # one per call; DRAM: none
    assert len(buffer.mm) == 2 * 3 * K  # type: ignore[union-attr]  # a page-aligned slot each
    store.release_export(first)
    second = store.read_for_export([key(2), key(3)])
    try:
        assert all(b is not None and b.buffer is buffer for b in second)  # reused
        assert [bytes(b.view) for b in second if b is not None] == [val(2), val(3)]
    finally:
        store.release_export(second)


def test_a_buffer_is_not_reused_while_one_of_its_blocks_is_held(store: TieredStore) -> None:
    first = store.read_for_export([key(0), key(1)])
    store.release_export([first[0]])  # key(1) still held: its bytes must not change
    second = store.read_for_export([key(4), key(5)])
    try:
        assert second[0] is not None and second[0].buffer is not first[1].buffer  # type: ignore[union-attr]
        assert bytes(first[1].view) == val(1)  # type: ignore[union-attr]
        assert [bytes(b.view) for b in second if b is not None] == [val(4), val(5)]
    finally:
        store.release_export(second)
        store.release_export([first[1]])
    with pytest.raises(NotFound):
        store.release_export([first[1]])  # the last block of a buffer released twice


def test_the_pool_keeps_a_bounded_number_of_bytes(
    store: TieredStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(export, "EXPORT_POOL_MAX_BYTES", 4 * 3 * K)
    held = [store.read_for_export([key(i), key(i + 1)]) for i in (0, 2, 4, 6)]  # 4 buffers
    for got in held:
        store.release_export(got)
    pooled = store._exports.pool
    assert pooled is not None and sum(len(b.mm) for b in pooled) <= 4 * 3 * K
    assert len(pooled) == 2  # each buffer: 2 blocks of 3 pages; the newest two kept


def test_bench_export_ssd_runs_and_has_its_fields(tmp_path: pathlib.Path) -> None:
    """bench/bench_export_ssd.py (export vs engine cold get of SSD-only blocks) runs; no
    timing asserted."""
    root = pathlib.Path(__file__).resolve().parents[3]
    sys.path.insert(0, str(root / "bench"))
    try:
        import bench_export_ssd
    finally:
        sys.path.remove(str(root / "bench"))
    got = bench_export_ssd.run_size(64 << 10, 256 << 10, 1, str(tmp_path))
    assert set(got) == {"blocks", "engine_gbps", "export_gbps", "ratio"}
    assert got["blocks"] == 4 and all(v > 0 for v in got.values())
