"""Reserve-ahead slots in NodeCore (no gRPC): kvstored/node/slots.py under the fencing rule.

Time is a fake clock; a lease lapse is made by advancing it and calling reap_expired. A race
is held by the slots' test hook (``commit_slots_checked``), never by a sleep.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from core_helpers import unit_core
from helpers import key

from kvstored.clock import FakeClock
from kvstored.errors import InvalidArgument, LeaseExpired, NotFound
from kvstored.node.core import NodeCore
from kvstored.node.slots import SLOT
from kvstored.tenancy import TenantQuota, scope_namespace
from kvstored.tiers.tiered import TieredStore
from kvstored.types import PinnedBlock

K = 4096


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def core(clock: FakeClock) -> Iterator[NodeCore]:
    yield from unit_core(clock, max_quarantine_bytes=256 << 10)


def _used(core: NodeCore) -> int:
    return core.store.stats().tiers[0].used_bytes


def _grant(core: NodeCore, sid: int, n: int, size: int = 2 * K, ns: bytes = b"") -> list:
    got = core.slots.commit_slots(ns, [], session_id=sid, want=[(size, n)])
    assert isinstance(got, tuple)
    return got[1]


def _write(core: NodeCore, slot, data: bytes) -> None:
    core.store.arena[slot.offset:slot.offset + len(data)] = data


def _read(core: NodeCore, k: bytes) -> bytes:
    pin_id, got = core.pin_blocks([k], b"", session_id=core.open_session())
    b = got[0]
    assert isinstance(b, PinnedBlock)
    data = bytes(core.store.arena[b.offset:b.offset + b.size_bytes])
    core.release_pins([pin_id])
    return data


def test_a_put_into_granted_slots_is_one_call_that_commits_and_refills(core: NodeCore) -> None:
    sid = core.open_session("t")
    base = _used(core)
    slots = _grant(core, sid, 4)
    assert len(slots) == 4 and {s.size_bytes for s in slots} == {2 * K}
    assert _used(core) == base + 4 * 2 * K  # reserved room: used, never evicted
    for i, s in enumerate(slots[:2]):
        _write(core, s, bytes([i + 1]) * 5000)
    got = core.slots.commit_slots(
        b"", [(slots[0].slot_id, key(1), 5000, b"m"), (slots[1].slot_id, key(2), 5000, b"")],
        session_id=sid, want=[(2 * K, 4)],
    )
    assert isinstance(got, tuple)
    outcomes, refill = got
    assert [o.stored for o in outcomes] == [True, True] and all(o.error is None for o in outcomes)
    assert len(refill) == 2  # the pool is back at 4 slots: the two it lacked
    assert _read(core, key(1)) == b"\x01" * 5000 and _read(core, key(2)) == b"\x02" * 5000
    assert core.leases.held_sizes(sid, SLOT) == {2 * K: 4}


def test_a_key_stored_already_frees_its_slot_first_writer_wins(core: NodeCore) -> None:
    sid = core.open_session()
    core.put_inline([(key(1), b"a" * 100, b"")], b"")
    s = _grant(core, sid, 1)[0]
    base = _used(core)
    _write(core, s, b"b" * 100)
    got = core.slots.commit_slots(b"", [(s.slot_id, key(1), 100, b"")], session_id=sid)
    assert isinstance(got, tuple)
    assert got[0][0].stored is False and got[0][0].error is None
    assert _used(core) == base - 2 * K and _read(core, key(1)) == b"a" * 100


def test_commit_racing_the_lease_lapse_reaper_first_is_lease_expired(
    core: NodeCore, clock: FakeClock
) -> None:
    # the reaper wins: the slot is quarantined (nothing freed while the writer may still
    # copy); the late commit is the writer's ack: LeaseExpired, nothing stored, space freed
    sid = core.open_session()
    s = _grant(core, sid, 1)[0]
    base = _used(core)
    clock.advance(core.cfg.pin_lease_s + 1)
    assert core.reap_expired() == 1
    assert core.quarantined_bytes() == 2 * K and _used(core) == base
    got = core.slots.commit_slots(b"", [(s.slot_id, key(1), 10, b"")], session_id=sid)
    assert isinstance(got, tuple)
    assert isinstance(got[0][0].error, LeaseExpired)
    assert core.quarantined_bytes() == 0 and _used(core) == base - 2 * K
    assert core.exists([key(1)], b"")[0] == [False]


def test_commit_racing_the_lease_lapse_commit_first_wins_and_the_reaper_finds_nothing(
    core: NodeCore, clock: FakeClock
) -> None:
    # the commit took the slot from the lease book before the lease lapsed: the reaper,
    # run while the commit is held between its check and its store commit, has nothing
    sid = core.open_session()
    s = _grant(core, sid, 1)[0]
    _write(core, s, b"z" * 10)
    reaped: list[int] = []

    def hold(event: str) -> None:
        if event == "commit_slots_checked":
            clock.advance(core.cfg.pin_lease_s + 1)
            reaped.append(core.reap_expired())

    core.slots.test_hook = hold
    got = core.slots.commit_slots(b"", [(s.slot_id, key(1), 10, b"")], session_id=sid)
    assert reaped == [0] and isinstance(got, tuple) and got[0][0].stored
    assert core.quarantined_bytes() == 0 and _read(core, key(1)) == b"z" * 10


def test_session_end_with_unused_slots_returns_them_active_and_quarantined(
    core: NodeCore, clock: FakeClock
) -> None:
    sid = core.open_session()
    base = _used(core)
    first = _grant(core, sid, 2)
    clock.advance(core.cfg.pin_lease_s + 1)
    assert core.reap_expired() == 2  # two lapse into quarantine
    more = _grant(core, sid, 4)  # a pool is counted over active slots: 4 more
    assert len(more) == 4
    assert _used(core) == base + 6 * 2 * K and core.quarantined_bytes() == 2 * 2 * K
    core.close_session(sid)
    assert _used(core) == base and core.quarantined_bytes() == 0
    assert core.leases.held_bytes(sid, SLOT) == 0
    got = core.slots.commit_slots(b"", [(first[0].slot_id, key(1), 10, b"")],
                                  session_id=core.open_session())  # a late write: nothing stored
    assert isinstance(got, tuple) and isinstance(got[0][0].error, LeaseExpired)
    assert core.exists([key(1)], b"")[0] == [False]


def test_returned_slots_are_freed_and_another_sessions_slot_is_unknown(core: NodeCore) -> None:
    a, b = core.open_session(), core.open_session()
    base = _used(core)
    sa = _grant(core, a, 2)
    got = core.slots.commit_slots(b"", [(sa[0].slot_id, key(1), 10, b"")], session_id=b,
                                  return_slot_ids=[sa[1].slot_id])
    assert isinstance(got, tuple) and isinstance(got[0][0].error, NotFound)
    assert _used(core) == base + 2 * 2 * K  # b can neither commit nor return a's slots
    got = core.slots.commit_slots(b"", [], session_id=a,
                                  return_slot_ids=[s.slot_id for s in sa])
    assert _used(core) == base and core.leases.held_bytes(a, SLOT) == 0


def test_the_slot_budget_bounds_what_a_session_holds(core: NodeCore) -> None:
    sid = core.open_session()
    budget = core.slots.budget_bytes
    assert budget == 128 << 10  # half the 256 KiB quarantine bound
    slots = _grant(core, sid, 1000)
    assert sum(s.size_bytes for s in slots) == budget
    assert _grant(core, sid, 1000) == []


def test_bad_writes_get_their_own_error_and_free_their_slot(core: NodeCore) -> None:
    sid = core.open_session()
    s1, s2 = _grant(core, sid, 2)
    base = _used(core)
    got = core.slots.commit_slots(
        b"", [(s1.slot_id, key(1), 3 * K, b""), (s2.slot_id, b"short", 10, b"")], session_id=sid)
    assert isinstance(got, tuple)
    assert "holds 8192" in str(got[0][0].error) and got[0][1].error is not None
    assert _used(core) == base - 2 * 2 * K
    with pytest.raises(InvalidArgument, match="needs a session"):
        core.slots.commit_slots(b"", [], session_id=0, want=[(K, 1)])
    with pytest.raises(InvalidArgument, match="slot size must be in"):
        core.slots.commit_slots(b"", [], session_id=sid, want=[(0, 1)])


def test_an_orphan_ack_frees_every_slot_the_lost_answer_granted(core: NodeCore) -> None:
    sid = core.open_session()
    base = _used(core)
    got = core.slots.commit_slots(b"", [], session_id=sid, want=[(K, 3)], request_id=77)
    assert isinstance(got, tuple) and len(got[1]) == 3
    assert core.release_orphans(sid, [77]) == 3
    assert _used(core) == base


def test_slots_count_against_the_tenant_quota_and_return_to_it() -> None:
    ns_a = scope_namespace("a", b"ns")
    s = TieredStore(dram_size_bytes=64 * K, arena_dir=None, max_block_bytes=16 * K,
                    tenant_quotas={"a": TenantQuota(dram_quota_bytes=5 * K)})
    try:
        got = s.reserve_slots(2 * K, 4, namespace_id=ns_a, may_block=False)
        assert isinstance(got, list) and len(got) == 2  # 4 x 8 KiB > 20 KiB: only the 2 that fit
        assert s.tenants.reserved_bytes["a"] == 2 * 2 * K
        assert s.commit_slots([(got[0], key(1), 100, b"")], namespace_id=ns_a) == [True]
        s.abort(got[1])
        assert s.tenants.reserved_bytes["a"] == 0
        assert s.tenants.used("a", 1) == 100  # the committed block; its slot's tail went back
        assert s.stats().tiers[0].used_bytes == K
    finally:
        s.close()
