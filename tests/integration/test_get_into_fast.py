"""get_into's batch fast path (kvstored/client/_fastget.py) against the general path.

The fast path takes a PinBlocks answer in which every block was found and copies the batch
with one copy_many call; every other answer goes through the general path. These tests
read the same blocks both ways (the general path forced by making the planner decline) and
compare results and bytes, check that mixed answers fall back, and hold a fast copy half-way
(client hook) while another client forces eviction: the pinned block must stay put.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from it_helpers import DaemonThread, random_keys, value_for

from kvstored import Client, Tier
from kvstored.client import _fastget, _hooks
from kvstored.errors import InvalidArgument

pytestmark = pytest.mark.usefixtures("pinned_reads")  # the pinned path's tests (PinBlocks)

SIZES = [0, 1, 4095, 4096, 65537, 1 << 20]


@pytest.fixture
def fnode(start_node: Any) -> DaemonThread:
    return start_node(dram_size_bytes=64 << 20, ssd_size_bytes=256 << 20)  # type: ignore[no-any-return]


@pytest.fixture
def plans(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Records what the planner answered (None = declined: the general path ran)."""
    seen: list[Any] = []
    real = _fastget.plan_copies

    def spy(*args: Any) -> Any:
        plan = real(*args)
        seen.append(plan)
        return plan

    monkeypatch.setattr(_fastget, "plan_copies", spy)
    return seen


@pytest.fixture
def general_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A context that makes the planner decline every answer (the general path only)."""
    import contextlib

    @contextlib.contextmanager
    def forced() -> Iterator[None]:
        with monkeypatch.context() as m:
            m.setattr(_fastget, "plan_copies", lambda *a: None)
            yield

    yield forced


def _buffers(sizes: list[int]) -> list[Any]:
    """Buffers of several kinds, each larger than its block, filled with a marker byte."""
    out: list[Any] = []
    for i, size in enumerate(sizes):
        room = size + 7
        if i % 3 == 0:
            out.append(np.full(room, 0xEE, np.uint8))
        elif i % 3 == 1:
            out.append(bytearray(b"\xee" * room))
        else:  # a non-byte format: float32 elements (4 bytes each)
            out.append(np.frombuffer(b"\xee" * ((room + 3) // 4 * 4), np.float32).copy())
    return out


def _bytes(buf: Any) -> bytes:
    return bytes(memoryview(buf).cast("B"))


def _read_both_ways(c: Client, keys: list[bytes], sizes: list[int], general_path: Any,
                    return_meta: bool) -> tuple[Any, Any, list[bytes], list[bytes]]:
    fast_bufs, slow_bufs = _buffers(sizes), _buffers(sizes)
    fast = c.get_into(keys, fast_bufs, return_meta=return_meta)
    with general_path():
        slow = c.get_into(keys, slow_bufs, return_meta=return_meta)
    return fast, slow, [_bytes(b) for b in fast_bufs], [_bytes(b) for b in slow_bufs]


@pytest.mark.parametrize("return_meta", [False, True])
def test_the_fast_path_returns_what_the_general_path_returns(
    fnode: DaemonThread, plans: list[Any], general_path: Any, return_meta: bool
) -> None:
    keys = random_keys(len(SIZES))
    values = [value_for(k, s) for k, s in zip(keys, SIZES, strict=True)]
    metas = [f"meta {i}".encode() if i % 2 else b"" for i in range(len(keys))]
    with Client(fnode.unix_address) as c:
        assert all(r.stored for r in c.put(keys, values, metas=metas))
        fast, slow, fast_bytes, slow_bytes = _read_both_ways(c, keys, SIZES, general_path, return_meta)
        assert plans and plans[0] is not None  # the fast path served the first read
        assert fast == slow
        expected = [(s, m) for s, m in zip(SIZES, metas, strict=True)] if return_meta else SIZES
        assert fast == expected
        assert fast_bytes == slow_bytes
        for got, value in zip(fast_bytes, values, strict=True):
            assert got[: len(value)] == value  # the block, then the buffer's untouched tail
            assert got[len(value) :] == b"\xee" * (len(got) - len(value))


def test_an_answer_with_a_miss_takes_the_general_path(
    fnode: DaemonThread, plans: list[Any], general_path: Any
) -> None:
    keys = random_keys(3)
    values = [value_for(k, 5000) for k in keys]
    with Client(fnode.unix_address) as c:
        c.put([keys[0], keys[2]], [values[0], values[2]])
        fast, slow, fast_bytes, slow_bytes = _read_both_ways(c, keys, [5000] * 3, general_path, False)
        assert plans == [None]  # declined: a block was not found
        assert fast == slow == [5000, None, 5000]
        assert fast_bytes == slow_bytes
        assert fast_bytes[1] == b"\xee" * len(fast_bytes[1])  # a miss leaves its buffer alone
        assert fast_bytes[0][:5000] == values[0] and fast_bytes[2][:5000] == values[2]


def test_a_buffer_too_small_is_reported_as_by_the_general_path(
    fnode: DaemonThread, plans: list[Any]
) -> None:
    keys = random_keys(2)
    with Client(fnode.unix_address) as c:
        c.put(keys, [value_for(k, 4096) for k in keys])
        with pytest.raises(InvalidArgument, match=r"key #1 is 4096 bytes but buffer #1 holds 4095"):
            c.get_into(keys, [bytearray(4096), bytearray(4095)])
        assert plans == [None]
        assert c.stats()["pinned_blocks"] == 0  # released all the same


def test_a_pin_holds_against_eviction_during_a_fast_copy(
    fnode: DaemonThread, plans: list[Any]
) -> None:
    size = 4 << 20
    key, storm = random_keys(1), random_keys(20)  # 80 MiB through a 64 MiB DRAM tier
    reached = threading.Event()
    seen: dict[str, Any] = {}
    with Client(fnode.unix_address, timeout_s=120) as a, Client(fnode.unix_address, timeout_s=120) as b:
        assert a.put(key, [value_for(key[0], size)])[0].stored

        def storm_mid_copy(event: str, **fields: Any) -> None:
            if event != "shm_copy_out_mid" or reached.is_set():
                return
            reached.set()  # half of the block is copied; the pin is held by the node
            for k in storm:
                assert b.put([k], [value_for(k, size)])[0].stored
            seen["where"] = b.where(key)
            seen["removed"] = b.remove(key)
            seen["evicted"] = sum(t == Tier.SSD for t in b.where(storm))

        _hooks.install(storm_mid_copy)
        try:
            buf = np.zeros(size, np.uint8)
            assert a.get_into(key, [buf]) == [size]
        finally:
            _hooks.install(None)
        assert reached.is_set() and plans and plans[0] is not None  # the fast path copied
        assert seen["evicted"] > 0  # the storm did evict (to SSD) while the copy ran
        assert seen["where"] == [Tier.DRAM] and seen["removed"] == [False]  # pinned: kept
        assert buf.tobytes() == value_for(key[0], size)
