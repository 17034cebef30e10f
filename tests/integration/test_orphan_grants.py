"""Orphaned grants: a ReservePut/PinBlocks answer that never reaches the client (issue: a
SIGSTOPped client's in-flight call). The node grants, the client only sees DeadlineExceeded,
so ``Call.undo`` cannot run; the client's orphan ack (``ReleasePins.orphan_request_ids``,
kvstored/client/_orphans.py) must free the grant while the client process lives, without
any lease lapse (the pin lease here is 600 s, so only the ack can free it).

Ordering is held by hooks, never by sleeps: the node's ``test_hook`` holds the granting RPC
after the grant is recorded until the client, whose deadline has passed, is about to send its
ack (client hook ``orphan_ack``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from it_helpers import DaemonThread, random_keys, value_for, wait_until

from kvstored import AsyncClient, Client, DeadlineExceeded
from kvstored.client import _hooks

# the pinned path's (PinBlocks) and the ReservePut path's tests; reserve-ahead slots: test_slot_puts.py
pytestmark = pytest.mark.usefixtures("pinned_reads", "reserve_put_path")

SIZE = 4 << 20



@pytest.fixture(autouse=True)
def _both_control_paths(control_channel: str) -> str:
    """Every test here runs over the control channel and over gRPC."""
    return control_channel


@pytest.fixture
def onode(start_node: Any) -> DaemonThread:
    """A node with the SSD tier on and a lease no test outlives."""
    return start_node(  # type: ignore[no-any-return]
        dram_size_bytes=64 << 20, ssd_size_bytes=128 << 20, max_block_bytes=8 << 20,
        pin_lease_s=600.0,
    )


def _used(node: DaemonThread) -> int:
    return node.daemon.store.stats().tiers[0].used_bytes


def _idle(node: DaemonThread) -> None:
    core = node.daemon.core
    assert core is not None
    # a get's pin over the control channel is released by the client's next request, or
    # by its idle flush (kvstored/client/_control.py): wait for that, bounded
    # and an orphan ack goes in the background (kvstored/client/_orphans.py): wait for it too
    wait_until(lambda: core.num_outstanding() == (0, 0, 0) and core.quarantined_bytes() == 0,
               timeout_s=10, what=f"nothing outstanding (now {core.num_outstanding()}, "
               f"{core.quarantined_bytes()} bytes quarantined)")
    assert core.num_outstanding() == (0, 0, 0)
    assert core.quarantined_bytes() == 0
    assert node.daemon.store.stats().pinned_blocks == 0


class _Held:
    """Node hook holding ``point`` once; client hook releasing it at the client's orphan ack
    (optionally failing the first ``fail_acks`` acks as a lost RPC would)."""

    def __init__(self, point: str, fail_acks: int = 0) -> None:
        self.point = point
        self.fail_acks = fail_acks
        self.reached = threading.Event()
        self.go = threading.Event()
        self.acks: list[dict[str, Any]] = []

    def node_hook(self, event: str) -> None:  # inside the granting RPC, after the grant
        if event == self.point and not self.reached.is_set():
            self.reached.set()
            assert self.go.wait(60), "the client never sent its orphan ack"

    def client_hook(self, event: str, **fields: Any) -> None:
        if event != "orphan_ack":
            return
        self.acks.append(fields)
        assert self.reached.wait(30), "the node never granted"
        self.go.set()  # the node answers now: nobody waits for that answer any more
        if len(self.acks) <= self.fail_acks:
            raise grpc.RpcError("injected: the orphan ack was lost")


@pytest.fixture
def held(onode: DaemonThread) -> Iterator[Callable[..., _Held]]:
    core = onode.daemon.core
    assert core is not None
    made: list[_Held] = []

    def make(op: str, fail_acks: int = 0) -> _Held:
        h = _Held("reserve_put_held" if op == "put" else "pin_blocks_held", fail_acks)
        made.append(h)
        core.test_hook = h.node_hook
        _hooks.install(h.client_hook)
        return h

    yield make
    core.test_hook = None
    _hooks.install(None)
    for h in made:
        h.go.set()


def _unhook(node: DaemonThread) -> None:
    core = node.daemon.core
    assert core is not None
    core.test_hook = None
    _hooks.install(None)


@pytest.mark.parametrize("op", ["put", "get"])
def test_grant_whose_answer_never_arrived_is_freed_by_the_clients_ack(
    onode: DaemonThread, held: Callable[..., _Held], op: str
) -> None:
    keys, warm = random_keys(1), random_keys(1)
    value = value_for(keys[0], SIZE)
    with Client(onode.unix_address, timeout_s=30) as c:
        assert c.put(warm, [value_for(warm[0], SIZE)])[0].stored  # session open, arena mapped
        if op == "get":
            assert c.put(keys, [value])[0].stored
        baseline = _used(onode)
        h = held(op)
        with pytest.raises(DeadlineExceeded):
            c.put(keys, [value], timeout_s=0.5) if op == "put" else c.get(keys, timeout_s=0.5)
        _unhook(onode)
        assert h.reached.is_set() and len(h.acks) == 1
        # freed by the ack alone: no lease lapsed, and this client process lives on
        _idle(onode)
        assert _used(onode) == baseline
        assert c._st.orphans.pending() == {}
        if op == "put":
            assert c.exists(keys) == [False]
            assert c.put(keys, [value])[0].stored
        assert c.get(keys) == [value]
        _idle(onode)


def test_lost_orphan_ack_is_sent_with_the_next_call(
    onode: DaemonThread, held: Callable[..., _Held]
) -> None:
    keys = random_keys(1)
    value = value_for(keys[0], SIZE)
    core = onode.daemon.core
    assert core is not None
    with Client(onode.unix_address, timeout_s=30) as c:
        assert c.put(keys, [value])[0].stored
        h = held("get", fail_acks=1)
        with pytest.raises(DeadlineExceeded):
            c.get(keys, timeout_s=0.5)
        _unhook(onode)
        assert len(h.acks) == 1
        pending = c._st.orphans.pending()
        assert [len(ids) for ids in pending.values()] == [1], pending  # kept, not lost
        assert onode.daemon.store.stats().pinned_blocks == 1  # still granted on the node
        # it lapses meanwhile: quarantined, which the ack frees as well
        core.clock = lambda: 10_000.0 + time.monotonic()
        assert core.reap_expired() == 1 and core.quarantined_bytes() == SIZE
        _hooks.install(h.client_hook)  # record the retried ack (it succeeds)
        assert c.exists(keys) == [True]  # the next call sends the pending ack first
        _hooks.install(None)
        assert len(h.acks) == 2 and h.acks[1]["request_ids"] == h.acks[0]["request_ids"]
        assert c._st.orphans.pending() == {}
        _idle(onode)
        assert c.get(keys) == [value]
        _idle(onode)


@pytest.mark.parametrize("op", ["put", "get"])
def test_async_grant_whose_answer_never_arrived_is_freed_by_the_clients_ack(
    onode: DaemonThread, held: Callable[..., _Held], op: str
) -> None:
    keys, warm = random_keys(1), random_keys(1)
    value = value_for(keys[0], SIZE)

    async def main() -> None:
        async with AsyncClient(onode.unix_address, timeout_s=30) as a:
            assert (await a.put(warm, [value_for(warm[0], SIZE)]))[0].stored
            if op == "get":
                assert (await a.put(keys, [value]))[0].stored
            baseline = _used(onode)
            h = held(op)
            with pytest.raises(DeadlineExceeded):
                await (a.put(keys, [value], timeout_s=0.5) if op == "put"
                       else a.get(keys, timeout_s=0.5))
            _unhook(onode)
            assert h.reached.is_set() and len(h.acks) == 1
            await asyncio.to_thread(_idle, onode)  # the loop runs the ack (in the background)
            assert _used(onode) == baseline
            if op == "put":
                assert (await a.put(keys, [value]))[0].stored
            assert await a.get(keys) == [value]
            await asyncio.to_thread(_idle, onode)  # the loop runs the deferred release

    asyncio.run(main())


def test_lost_orphan_ack_is_sent_at_close(onode: DaemonThread, held: Callable[..., _Held]) -> None:
    keys = random_keys(1)
    value = value_for(keys[0], SIZE)
    c = Client(onode.unix_address, timeout_s=30)
    try:
        assert c.put(keys, [value])[0].stored
        h = held("get", fail_acks=1)
        with pytest.raises(DeadlineExceeded):
            c.get(keys, timeout_s=0.5)
        assert len(h.acks) == 1 and c._st.orphans.pending()
        assert onode.daemon.store.stats().pinned_blocks == 1
    finally:
        c.close()  # sends the pending ack (then ends the session)
    _unhook(onode)
    assert len(h.acks) == 2 and h.acks[1]["request_ids"] == h.acks[0]["request_ids"]
    assert c._st.orphans.pending() == {}
    _idle(onode)
