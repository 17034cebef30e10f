"""The client's shm put copies each chunk into the arena with one kvstored.native.copy_many
call: the C copy where built, the numpy fallback otherwise; both store the same bytes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from it_helpers import NodeFactory, random_keys, value_for

from kvstored import native
from kvstored.client import Client


@pytest.mark.parametrize("which", ["native", "fallback"])
def test_shm_put_copies_through_copy_many(
    start_node: NodeFactory, monkeypatch: pytest.MonkeyPatch, which: str
) -> None:
    impl: Callable[..., int] | None = (
        native.native_copy_many if which == "native" else native.py_copy_many
    )
    if impl is None:
        pytest.skip("kvstored._native is not built here (tests/unit/test_native.py builds it)")
    calls: list[int] = []
    streamed: list[bool] = []

    def spy(pairs: Any, threads: int = 0, stream: bool = False) -> int:
        calls.append(len(pairs))
        streamed.append(stream)
        return impl(pairs, threads, stream)

    monkeypatch.setattr("kvstored.client._shm.copy_many", spy)
    node = start_node()
    keys = random_keys(6)
    sizes = [1, 4095, 4097, 256 << 10, 1 << 20, (1 << 20) + 7]
    values = [value_for(k, n) for k, n in zip(keys, sizes, strict=True)]
    with Client(node.unix_address, transport="shm") as c:
        assert all(r.ok for r in c.put(keys, values))
        assert calls and sum(calls) == len(keys)  # whole chunks per call, not one per block
        assert all(streamed)  # non-temporal stores asked for (large pieces; memcpy otherwise)
        assert c.get(keys) == values
