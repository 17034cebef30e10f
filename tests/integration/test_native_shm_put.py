"""The client's shm put copies each chunk into the arena with one native call (``copy_at``
into reserve-ahead slots, ``copy_many`` on the ReservePut path): the C copy where built, the
numpy fallback otherwise; both store the same bytes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from it_helpers import NodeFactory, random_keys, value_for

from kvstored import native
from kvstored.client import Client


@pytest.mark.parametrize("which", ["native", "fallback"])
@pytest.mark.parametrize("reserve_ahead", [True, False], ids=["slots", "reserve_put"])
def test_shm_put_copies_each_chunk_in_one_call(
    start_node: NodeFactory, monkeypatch: pytest.MonkeyPatch, which: str, reserve_ahead: bool
) -> None:
    many: Callable[..., int] | None = (
        native.native_copy_many if which == "native" else native.py_copy_many
    )
    at: Callable[..., int] | None = native.native_copy_at if which == "native" else native.py_copy_at
    if many is None or at is None:
        pytest.skip("kvstored._native is not built here (tests/unit/test_native.py builds it)")
    calls: list[int] = []
    streamed: list[bool] = []

    def spy_many(pairs: Any, threads: int = 0, stream: bool = False) -> int:
        calls.append(len(pairs))
        streamed.append(stream)
        return many(pairs, threads, stream)

    def spy_at(dst: Any, offsets: Any, srcs: Any, stream: bool = False) -> int:
        calls.append(len(srcs))
        streamed.append(stream)
        return at(dst, offsets, srcs, stream)

    monkeypatch.setattr("kvstored.client._shm.copy_many", spy_many)
    monkeypatch.setattr("kvstored.client._shm.copy_at", spy_at)
    node = start_node()
    keys = random_keys(6)
    sizes = [1, 4095, 4097, 256 << 10, 1 << 20, (1 << 20) + 7]
    values = [value_for(k, n) for k, n in zip(keys, sizes, strict=True)]
    kwargs = {} if reserve_ahead else {"reserve_ahead_bytes": 0}
    with Client(node.unix_address, transport="shm", **kwargs) as c:
        assert all(r.ok for r in c.put(keys, values))
        assert calls and sum(calls) == len(keys)  # whole chunks per call, not one per block
        assert len(calls) < len(keys)
        assert all(streamed)  # non-temporal stores asked for (large pieces; memcpy otherwise)
        assert c.get(keys) == values
