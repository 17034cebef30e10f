"""The refill of a CommitSlots granted after its answer (``grant_after_answer``), in the
servicer with no socket: kvstored/node/service.py ``CommitSlots(after=...)`` and
``_grant_after_answer``, over kvstored/node/slots.py.

The control channel passes ``after`` (a list) and runs what the servicer appends to it only
once the answer was sent; here the test decides when (or whether) it runs, so every order is
deterministic: the answer built while the refill has not run, the refill failing, a second
commit before the first refill, a lease lapse between them. No sleeps.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from core_helpers import unit_core
from helpers import key

from kvstored.auth import TRUSTED_LOCAL
from kvstored.clock import FakeClock
from kvstored.errors import Unavailable
from kvstored.node.core import NodeCore
from kvstored.node.service import NodeServicer
from kvstored.node.slots import SLOT
from kvstored.types import PinnedBlock
from kvstored.v1 import node_pb2 as pb

K = 4096
SIZE = 2 * K

After = list[Callable[[], Coroutine[Any, Any, pb.CommitSlotsResponse]]]


class Ctx:
    """The part of a ServicerContext the servicer reads (the control channel's principal)."""

    principal = TRUSTED_LOCAL

    def invocation_metadata(self) -> Any:
        return ()

    def time_remaining(self) -> None:
        return None

    def peer(self) -> str:
        return "test"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def core(clock: FakeClock) -> Iterator[NodeCore]:
    yield from unit_core(clock, max_quarantine_bytes=1 << 20)


def run(fn: Callable[[NodeServicer], Coroutine[Any, Any, None]], core: NodeCore) -> None:
    async def main() -> None:
        with ThreadPoolExecutor(1) as pool:
            await fn(NodeServicer(core, pool, version="t"))
    asyncio.run(main())


def _request(sid: int, writes: list[tuple[int, bytes, int]], want: int, *, returns: tuple[int, ...] = (),
             request_id: int = 0) -> pb.CommitSlotsRequest:
    req = pb.CommitSlotsRequest(
        session_id=sid, epoch=1, request_id=request_id, grant_after_answer=True,
        write_slot_ids=[w[0] for w in writes], write_keys=[w[1] for w in writes],
        write_sizes=[w[2] for w in writes], return_slot_ids=list(returns))
    if want:
        w = req.want.add()
        w.size_bytes, w.num_slots = SIZE, want
    return req


def _slots(resp: pb.CommitSlotsResponse) -> list[tuple[int, int, int]]:
    return list(zip(resp.slot_ids, resp.slot_offsets, resp.slot_sizes, strict=True))


def _read(core: NodeCore, k: bytes) -> bytes | None:
    pin_id, got = core.pin_blocks([k], b"", session_id=core.open_session())
    b = got[0]
    if not isinstance(b, PinnedBlock):
        return None
    data = bytes(core.store.arena[b.offset:b.offset + b.size_bytes])
    core.release_pins([pin_id])
    return data


def _write(core: NodeCore, offset: int, data: bytes) -> None:
    core.store.arena[offset:offset + len(data)] = data


async def _first_grant(svc: NodeServicer, sid: int, n: int) -> list[tuple[int, int, int]]:
    """Slots granted in the answer (a request with no writes and no ``after``: the first put)."""
    resp = await svc.CommitSlots(_request(sid, [], n), Ctx())
    return [(g.slot_id, g.offset, g.size_bytes) for g in resp.slots] or _slots(resp)


def test_the_answer_is_complete_before_the_refill_runs_and_the_same_if_it_fails(
    core: NodeCore,
) -> None:
    events: list[str] = []

    def hook(event: str) -> None:
        events.append(event)
        if event == "grant_after_answer" and fail[0]:
            raise RuntimeError("refill held and failed by the test")

    fail = [False]
    core.slots.test_hook = hook

    async def body(svc: NodeServicer) -> None:
        answers = []
        for failing in (False, True):  # the same commit, the refill succeeding then failing
            sid = core.open_session()
            held = await _first_grant(svc, sid, 4)
            assert len(held) == 4
            writes = []
            for j, (slot_id, offset, _) in enumerate(held[:3]):
                _write(core, offset, bytes([j + 1]) * 5000)
                writes.append((slot_id, key(10 * failing + j), 5000))
            after: After = []
            events.clear()
            fail[0] = failing
            resp = await svc.CommitSlots(_request(sid, writes, 8), Ctx(), after)
            # answered: the writes stored and readable, nothing granted, the refill not run
            assert resp.grant_follows and list(resp.write_stored) == [True] * 3
            assert not resp.slot_ids and not resp.slots
            assert "grant_after_answer" not in events and len(after) == 1
            assert core.leases.held_sizes(sid, SLOT) == {SIZE: 1}  # the one left unused
            for j in range(3):
                assert _read(core, key(10 * failing + j)) == bytes([j + 1]) * 5000
            answers.append(resp.SerializeToString())
            if failing:
                with pytest.raises(RuntimeError, match="held and failed"):
                    await after[0]()
                assert core.leases.held_sizes(sid, SLOT) == {SIZE: 1}  # nothing granted
            else:
                refill = await after[0]()
                assert len(_slots(refill)) == 7  # the pool of 8 less the one it held
                assert "grant_after_answer" in events
            for j in range(3):  # the answer's blocks stay, whatever the refill did
                assert _read(core, key(10 * failing + j)) == bytes([j + 1]) * 5000
            core.close_session(sid)
        assert answers[0] == answers[1]  # byte for byte: the refill is not in the answer

    run(body, core)


def test_a_refill_whose_session_ended_before_it_ran_grants_nothing(core: NodeCore) -> None:
    async def body(svc: NodeServicer) -> None:
        sid = core.open_session()
        held = await _first_grant(svc, sid, 2)
        used = core.store.stats().tiers[0].used_bytes
        after: After = []
        resp = await svc.CommitSlots(_request(sid, [(held[0][0], key(1), 100)], 4), Ctx(), after)
        assert list(resp.write_stored) == [True]
        core.close_session(sid)  # the slot it still held is freed with the session
        with pytest.raises(Unavailable):
            await after[0]()
        assert core.leases.held_bytes(sid, SLOT) == 0
        assert core.store.stats().tiers[0].used_bytes < used  # no grant, the unused slot freed
        assert _read(core, key(1)) is not None  # the write the answer reported stays

    run(body, core)


def test_a_slot_is_never_granted_twice_and_never_over_live_or_quarantined_bytes(
    core: NodeCore, clock: FakeClock,
) -> None:
    """300 random steps: puts of 1-4 held slots (their refill run at once, after the next
    commit, or never before the session ends), returns, lease lapses, session ends. Every
    slot id is granted once; a granted range never overlaps another held slot (active or
    quarantined) nor a stored block; every stored block reads back as written."""
    rng = random.Random(18)
    granted_ids: set[int] = set()
    ranges: dict[int, tuple[int, int]] = {}  # slot id -> (offset, end): held, active or lapsed
    stored: dict[bytes, bytes] = {}
    seq = [0]

    def take(slots: list[tuple[int, int, int]]) -> None:
        for slot_id, offset, size in slots:
            assert slot_id not in granted_ids, f"slot {slot_id} granted twice"
            granted_ids.add(slot_id)
            end = offset + size
            for other, (o, e) in ranges.items():
                assert end <= o or e <= offset, f"slot {slot_id} overlaps held slot {other}"
            for e in list(core.store._state.dram.entries.values()):  # the stored blocks
                assert end <= e.offset or e.offset + e.size_bytes <= offset, (
                    f"slot {slot_id} overlaps the block at {e.offset}")
            ranges[slot_id] = (offset, end)

    async def body(svc: NodeServicer) -> None:
        sid = core.open_session()
        active: list[tuple[int, int, int]] = []  # held, not lapsed (usable)
        pending: list[Callable[[], Coroutine[Any, Any, pb.CommitSlotsResponse]]] = []
        first = await _first_grant(svc, sid, 6)
        take(first)
        active += first
        for _ in range(300):
            op = rng.random()
            if op < 0.6 and active:  # a put into 1-4 held slots, its refill after its answer
                n = rng.randint(1, min(4, len(active)))
                use, active = active[:n], active[n:]
                writes = []
                for slot_id, offset, _ in use:
                    seq[0] += 1
                    k = key(1000 + seq[0])
                    data = bytes([seq[0] % 251 + 1]) * rng.randint(1, SIZE)
                    _write(core, offset, data)
                    writes.append((slot_id, k, len(data)))
                    stored[k] = data
                after: After = []
                resp = await svc.CommitSlots(_request(sid, writes, 6), Ctx(), after)
                assert list(resp.write_stored) == [True] * n and not resp.slot_ids
                for slot_id, _, _ in use:
                    del ranges[slot_id]
                pending += after
            elif op < 0.75 and pending:  # run a refill (maybe after later commits)
                got = _slots(await pending.pop(rng.randrange(len(pending)))())
                take(got)
                active += got
            elif op < 0.85 and active:  # return one
                slot_id = active.pop(rng.randrange(len(active)))[0]
                await svc.CommitSlots(_request(sid, [], 0, returns=(slot_id,)), Ctx())
                del ranges[slot_id]
            elif op < 0.93:  # every held slot lapses into quarantine (its range stays held)
                clock.advance(core.cfg.pin_lease_s + 1)
                core.reap_expired()
                active = []
            else:  # the session ends: its slots freed; a refill still to run grants nothing
                core.close_session(sid)
                for fn in pending:
                    with pytest.raises(Unavailable):
                        await fn()
                pending, active = [], []
                ranges.clear()
                sid = core.open_session()
                got = await _first_grant(svc, sid, 6)
                take(got)
                active += got
        for k, data in stored.items():
            assert _read(core, k) in (data, None)  # evicted maybe (1 MiB), never other bytes
        assert len(granted_ids) > 100

    run(body, core)

