"""Wrong argument types raise InvalidArgument (what was expected, what was received) on the
client, before any RPC: the client here points at a socket nobody listens on, so any call
that reached the network would raise Unavailable instead."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import Callable
from typing import Any

import pytest

from kvstored import AsyncClient, Client
from kvstored.errors import InvalidArgument

KEY = bytes(range(16))


@pytest.fixture
def client(tmp_path: pathlib.Path) -> Any:
    with Client(f"unix:{tmp_path}/nobody.sock", timeout_s=30) as c:
        yield c


CASES: list[tuple[str, Callable[[Any], Any], list[str]]] = [
    ("put(None, None)", lambda c: c.put(None, None), ["keys must be a sequence", "got NoneType None"]),
    ("put(keys, None)", lambda c: c.put([KEY], None), ["values must be a sequence", "got NoneType"]),
    ("put(keys, bytes)", lambda c: c.put([KEY], b"xyz"), ["values must be a sequence", "got bytes b'xyz'"]),
    ("put(metas=str)", lambda c: c.put([KEY], [b"v"], metas="m"), ["metas must be None or a sequence", "got str 'm'"]),
    ("put(metas=7)", lambda c: c.put([KEY], [b"v"], metas=7), ["metas must be", "got int 7"]),
    ("get(None)", lambda c: c.get(None), ["keys must be a sequence", "got NoneType"]),
    ("get_into(keys, None-ish)", lambda c: c.get_into([KEY], 5), ["buffers must be a sequence", "got int 5"]),
    ("exists(None)", lambda c: c.exists(None), ["keys must be a sequence", "got NoneType"]),
    ("lookup_prefix(int)", lambda c: c.lookup_prefix(3), ["keys must be a sequence", "got int 3"]),
    ("remove(None)", lambda c: c.remove(None), ["keys must be a sequence", "got NoneType"]),
    ("list_blocks(str)", lambda c: c.list_blocks("00ff"), ["namespace_id must be bytes", "got str '00ff'"]),
    ("list_blocks(int)", lambda c: c.list_blocks(5), ["namespace_id must be bytes", "got int 5"]),
    ("put(replicas=0)", lambda c: c.put([KEY], [b"v"], replicas=0),
     ["put(replicas=...) must be None (the default) or an int in 1..8", "got 0"]),
    ("put(replicas=9)", lambda c: c.put([KEY], [b"v"], replicas=9), ["in 1..8", "got 9"]),
    ("put(replicas=str)", lambda c: c.put([KEY], [b"v"], replicas="2"), ["in 1..8", "got '2'"]),
    ("Client(replicas=bool)", lambda c: Client("unix:/nonexistent.sock", replicas=True),
     ["Client(replicas=...) must be None (the default) or an int in 1..8", "got True"]),
]


@pytest.mark.parametrize("name,call,fragments", CASES, ids=[c[0] for c in CASES])
def test_wrong_types_raise_invalid_argument_before_any_rpc(
    client: Any, name: str, call: Callable[[Any], Any], fragments: list[str]
) -> None:
    with pytest.raises(InvalidArgument) as info:
        call(client)
    for fragment in fragments:
        assert fragment in str(info.value), (name, str(info.value))


def test_async_client_raises_the_same(tmp_path: pathlib.Path) -> None:
    async def main() -> None:
        async with AsyncClient(f"unix:{tmp_path}/nobody.sock", timeout_s=30) as c:
            with pytest.raises(InvalidArgument, match="keys must be a sequence"):
                await c.put(None, None)  # type: ignore[arg-type]
            with pytest.raises(InvalidArgument, match="namespace_id must be bytes"):
                await c.list_blocks("ab")  # type: ignore[arg-type]
            with pytest.raises(InvalidArgument, match=r"put\(replicas=\.\.\.\) must be None"):
                await c.put([KEY], [b"v"], replicas=-1)

    asyncio.run(main())


BAD_TIMEOUTS = [float("inf"), 1e12, float("nan"), 0, -1, True, "5"]


@pytest.mark.parametrize("timeout_s", BAD_TIMEOUTS, ids=repr)
def test_a_timeout_that_is_not_finite_or_too_long_is_refused(tmp_path: pathlib.Path, timeout_s: Any) -> None:
    # regression: inf/1e12 overflowed gRPC's deadline, failed at once with DEADLINE_EXCEEDED,
    # and the client retried that for ever (the call never returned)
    with pytest.raises(InvalidArgument, match="timeout_s must be a number of seconds"):
        Client(f"unix:{tmp_path}/nobody.sock", timeout_s=timeout_s)
    with pytest.raises(InvalidArgument, match="timeout_s must be a number of seconds"):
        AsyncClient(f"unix:{tmp_path}/nobody.sock", timeout_s=timeout_s)
    with Client(f"unix:{tmp_path}/nobody.sock", timeout_s=30) as c:
        with pytest.raises(InvalidArgument, match="timeout_s must be a number of seconds"):
            c.get([KEY], timeout_s=timeout_s)

    async def per_call() -> None:
        async with AsyncClient(f"unix:{tmp_path}/nobody.sock", timeout_s=30) as ac:
            await ac.get([KEY], timeout_s=timeout_s)

    with pytest.raises(InvalidArgument, match="timeout_s must be a number of seconds"):
        asyncio.run(per_call())
