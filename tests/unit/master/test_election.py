"""Leader election through a real etcd (tests/etcd_helpers.py): who leads, the term, stepping down.

Every handover is driven by an injected hook or an explicit etcd operation (the key deleted,
the lease revoked), never by waiting out a TTL: the loser's next campaign is held at its
``before_campaign`` hook until the test lets it go, so which elector wins is decided.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aetcd  # type: ignore[import-untyped]  # aetcd ships no type information
import pytest
from etcd_helpers import EtcdServer

from kvstored.clock import FakeClock
from kvstored.errors import InvalidArgument
from kvstored.master.election import ElectionHooks, Elector
from kvstored.transport.master_targets import MasterTargets, election_key, read_leader

pytestmark = pytest.mark.etcd
PREFIX = "/kvtest"
WAIT_S = 20.0


class Gate:
    """A campaign hook that lets the first ``free`` campaigns through, then holds the rest."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.open = asyncio.Event()
        self.num_calls = 0

    async def __call__(self) -> None:
        self.num_calls += 1
        if self.num_calls > self.free:
            await self.open.wait()


def _elector(etcd: EtcdServer, name: str, port_index: int, *, hooks: ElectionHooks | None = None,
             clock: Callable[[], float] | None = None) -> tuple[Elector, list[tuple[str, object]]]:
    seen: list[tuple[str, object]] = []
    kw = {"clock": clock} if clock is not None else {}
    e = Elector([etcd.endpoints[port_index]], PREFIX, name=name, addresses=[f"10.0.0.{port_index}:7080"],
                lease_s=3, on_lead=lambda term: seen.append(("lead", term)),
                on_step_down=lambda reason: seen.append(("down", reason)), retry_s=0.05,
                hooks=hooks, **kw)  # type: ignore[arg-type]  # clock is a Callable[[], float]
    return e, seen


async def _until(cond: Callable[[], bool], what: str) -> None:
    async with asyncio.timeout(WAIT_S):
        while not cond():
            await asyncio.sleep(0.01)
    assert cond(), what


def _run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(main())


async def _two(etcd: EtcdServer) -> tuple[Elector, Elector, Gate, list[tuple[str, object]],
                                        list[tuple[str, object]]]:
    """A leads (its next campaign held), then B starts and follows A."""
    gate = Gate(free=1)
    a, seen_a = _elector(etcd, "a", 0, hooks=ElectionHooks(before_campaign=gate))
    b, seen_b = _elector(etcd, "b", 1)
    await a.start()
    await _until(a.is_leading, "a leads")
    await b.start()
    await _until(lambda: b.leader_address == "10.0.0.0:7080", "b follows a")
    assert not b.is_leading() and b.leader_term == a.term
    return a, b, gate, seen_a, seen_b


def test_one_leads_the_other_follows_and_names_it(etcd: EtcdServer) -> None:
    async def main() -> None:
        a, b, _, seen_a, seen_b = await _two(etcd)
        try:
            assert seen_a == [("lead", a.term)] and seen_b == []
            got = await read_leader(MasterTargets((), tuple(etcd.endpoints), PREFIX), timeout_s=5)
            assert got == ("10.0.0.0:7080", a.term)
        finally:
            await b.stop()
            await a.stop()

    _run(main)


def test_the_leaders_key_deleted_the_other_leads_with_a_higher_term(etcd: EtcdServer) -> None:
    async def main() -> None:
        a, b, gate, seen_a, _ = await _two(etcd)
        try:
            old = a.term
            async with aetcd.Client(port=etcd.client_ports[0]) as c:
                await c.delete(election_key(PREFIX))
            await _until(b.is_leading, "b leads")
            assert not a.is_leading() and b.term > old
            assert seen_a[-1][0] == "down"
            gate.open.set()  # a campaigns again: it follows b
            await _until(lambda: a.leader_address == "10.0.0.1:7080", "a follows b")
            assert a.leader_term == b.term and not a.is_leading()
        finally:
            await b.stop()
            await a.stop()

    _run(main)


def test_the_leaders_lease_revoked_the_other_leads_with_a_higher_term(etcd: EtcdServer) -> None:
    async def main() -> None:
        a, b, _, _, _ = await _two(etcd)
        try:
            old = a.term
            async with aetcd.Client(port=etcd.client_ports[1]) as c:
                got = await c.get(election_key(PREFIX))
                await c.revoke_lease(got.lease)
            await _until(b.is_leading, "b leads")
            assert not a.is_leading() and b.term > old
        finally:
            await b.stop()
            await a.stop()

    _run(main)


def test_a_leader_whose_keepalive_fails_steps_down_at_once(etcd: EtcdServer) -> None:
    failing = asyncio.Event()
    calls = {"n": 0}

    async def keepalive() -> None:
        calls["n"] += 1
        if failing.is_set():
            raise ConnectionError("etcd cut off (injected)")

    async def main() -> None:
        gate = Gate(free=1)
        a, seen_a = _elector(etcd, "a", 0, hooks=ElectionHooks(before_keepalive=keepalive,
                                                               before_campaign=gate))
        b, _ = _elector(etcd, "b", 1)
        await a.start()
        await _until(lambda: a.is_leading() and calls["n"] >= 1, "a leads and keeps alive")
        await b.start()
        await _until(lambda: b.leader_term == a.term, "b follows a")
        try:
            old = a.term
            failing.set()
            await _until(lambda: not a.is_leading(), "a steps down")
            assert seen_a[-1][0] == "down"
            # a revoked its lease on the way down, so b takes over without waiting for a TTL
            await _until(b.is_leading, "b leads")
            assert b.term > old
        finally:
            await b.stop()
            await a.stop()

    _run(main)


def test_a_leader_past_its_lease_deadline_answers_not_leading_without_a_keepalive(
        etcd: EtcdServer) -> None:
    clock = FakeClock()

    async def hold() -> None:
        await asyncio.Event().wait()  # the keepalive never runs: the loop cannot refresh

    async def main() -> None:
        a, _ = _elector(etcd, "a", 0, hooks=ElectionHooks(before_keepalive=hold), clock=clock)
        await a.start()
        try:
            await _until(a.is_leading, "a leads")
            clock.advance(2.9)
            assert a.is_leading()
            clock.advance(0.2)  # past the 3 s TTL counted from before the grant was sent
            assert not a.is_leading()  # no await in between: by construction, not by a task
        finally:
            await a.stop()

    _run(main)


def test_bad_settings_are_refused_by_name() -> None:
    with pytest.raises(InvalidArgument, match="at least one etcd endpoint"):
        Elector([], PREFIX, name="a", addresses=[], lease_s=3, on_lead=print, on_step_down=print)
    with pytest.raises(InvalidArgument, match="election_lease_s must be >= 1 s, got 0.5"):
        Elector(["127.0.0.1:1"], PREFIX, name="a", addresses=[], lease_s=0.5, on_lead=print,
                on_step_down=print)


def test_stop_ends_the_loop_even_when_a_cancel_is_swallowed(etcd: EtcdServer) -> None:
    """Python 3.11's asyncio.wait_for can swallow a cancel that lands as its inner await
    completes (seen as a hung stop() under load). The hook stands in for that: the held
    campaign swallows the first cancel and returns. stop() must still end the loop, and no
    campaign starts after it."""
    held = asyncio.Event()
    swallowed: list[int] = []

    async def swallow_once() -> None:
        held.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            swallowed.append(1)  # the cancel is lost here; the campaign goes on

    async def main() -> None:
        e, _ = _elector(etcd, "s", 0, hooks=ElectionHooks(before_campaign=swallow_once))
        await e.start()
        await asyncio.wait_for(held.wait(), WAIT_S)
        stopping = asyncio.create_task(e.stop())
        done, _ = await asyncio.wait({stopping}, timeout=WAIT_S)
        assert stopping in done, "stop() hung: the campaign loop outlived a swallowed cancel"
        stopping.result()
        assert swallowed == [1] and not e.is_leading()
        async with aetcd.Client(port=etcd.client_ports[0]) as c:
            got = await c.get(election_key(PREFIX))
        assert got is None  # had the campaign won meanwhile, stop() revoked its lease

    _run(main)
