"""The shared-memory put's paths (kvstored/client/_put.py, kvstored/node/local_put.py).

A batch of at most INLINE_PUT_MAX_BYTES is one inline Put on the control channel (one round
trip); a larger one is copied into reserve-ahead slots and committed with one CommitSlots,
whose answer grants the next put's slots (the first put of a size asks for them first); with
``reserve_ahead_bytes=0`` it is ReservePut, the copy, CommitPut. Either way a put that returned is
readable by any other client at once. The node reserves on its event loop when free space
holds the batch, and in its store executor when an eviction (a demotion to SSD) is needed.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from it_helpers import DaemonThread, random_keys, value_for

from kvstored import AsyncClient, Client
from kvstored.client import _hooks
from kvstored.client._steps import INLINE_PUT_MAX_BYTES

BATCH = 16


@pytest.fixture
def rpcs() -> Iterator[list[str]]:
    """The methods this process's clients send, in order."""
    seen: list[str] = []

    def hook(event: str, **fields: Any) -> None:
        if event == "rpc":
            seen.append(fields["method"])

    _hooks.install(hook)
    yield seen
    _hooks.install(None)


@pytest.mark.parametrize(
    ("size", "ahead", "expected", "then"),
    [
        (INLINE_PUT_MAX_BYTES // BATCH, None, ["Put"], ["Put"]),  # 16 x 4 KiB: one round trip
        # 16 x 256 KiB through the arena: the first put asks for slots, the next is one call
        (256 << 10, None, ["CommitSlots", "CommitSlots"], ["CommitSlots"]),
        (256 << 10, 0, ["ReservePut", "CommitPut"], ["ReservePut", "CommitPut"]),  # off
    ],
)
def test_a_put_that_returned_is_readable_by_another_client(
    node: DaemonThread, rpcs: list[str], size: int, ahead: int | None, expected: list[str],
    then: list[str],
) -> None:
    with Client(node.unix_address, transport="shm", reserve_ahead_bytes=ahead) as writer, \
            Client(node.unix_address, transport="shm") as reader:
        writer.exists(random_keys(1))
        reader.exists(random_keys(1))  # both connected before the put (their own sessions)
        assert writer._st.control is not None  # noqa: SLF001 (the channel is in use)
        for want in (expected, then):
            keys = random_keys(BATCH)
            values = [value_for(k, size) for k in keys]
            rpcs.clear()
            assert all(r.stored for r in writer.put(keys, values))
            assert rpcs == want
            assert reader.get(keys) == values  # at once: the put returned after its commit
            assert all(not r.stored and r.ok for r in writer.put(keys, values))  # idempotent


def test_reserve_runs_on_the_loop_unless_an_eviction_is_needed(start_node: Any) -> None:
    node = start_node(dram_size_bytes=16 << 20, ssd_size_bytes=64 << 20)
    core = node.daemon.core
    threads: list[str] = []
    core.test_hook = lambda event: threads.append(threading.current_thread().name) \
        if event == "reserve_put_held" else None
    size = 256 << 10  # 16 of them (4 MiB, one ReservePut) a batch into a 16 MiB DRAM tier
    loop = node._thread.name  # noqa: SLF001
    with Client(node.unix_address, transport="shm", reserve_ahead_bytes=0) as c:
        batches = [random_keys(BATCH) for _ in range(6)]
        for n, keys in enumerate(batches):
            threads.clear()
            assert all(r.stored for r in c.put(keys, [value_for(k, size) for k in keys]))
            if n < 4:  # free space holds it: reserved on the loop
                assert threads == [loop], (n, threads)
            else:  # evictions (demotions to SSD): in the store executor
                assert len(threads) == 1 and threads[0].startswith("kvstored-store"), (n, threads)
        for keys in (batches[0], batches[-1]):  # demoted, not lost; the newest in DRAM
            assert c.get(keys) == [value_for(k, size) for k in keys]


def test_the_async_client_takes_the_same_paths(node: DaemonThread, rpcs: list[str]) -> None:
    async def main() -> None:
        async with AsyncClient(node.unix_address, transport="shm") as a:
            await a.exists(random_keys(1))
            for size, expected in ((4 << 10, ["Put"]), (256 << 10, ["CommitSlots", "CommitSlots"]),
                                   (256 << 10, ["CommitSlots"])):
                keys = random_keys(BATCH)
                values = [value_for(k, size) for k in keys]
                rpcs.clear()
                assert all(r.stored for r in await a.put(keys, values))
                assert rpcs == expected, size
                with Client(node.unix_address, transport="shm") as reader:
                    assert reader.get(keys) == values

    asyncio.run(main())
