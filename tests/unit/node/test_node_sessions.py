"""Sessions and quarantine in NodeCore (no gRPC): the fencing rule of kvstored/node/sessions.py.

Time is a fake clock; a lease lapse is made by advancing it and calling reap_expired.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from core_helpers import unit_core
from helpers import key

from kvstored.clock import FakeClock
from kvstored.errors import InvalidArgument, LeaseExpired, NoCapacity, NotFound, Unavailable
from kvstored.node.core import NodeCore
from kvstored.types import PinnedBlock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def core(clock: FakeClock) -> Iterator[NodeCore]:
    yield from unit_core(clock, max_quarantine_bytes=16 << 10)


def _used(core: NodeCore) -> int:
    return core.store.stats().tiers[0].used_bytes


def _lapse(core: NodeCore, clock: FakeClock) -> int:
    clock.advance(core.cfg.pin_lease_s + 1)
    return core.reap_expired()


@pytest.mark.parametrize("grant", ["pin_blocks", "reserve_put", "reserve_put_items"])
def test_an_in_process_grant_without_a_session_is_refused_and_grants_nothing(
    core: NodeCore, grant: str
) -> None:
    # the rule lives in the grants component, so no caller (servicer, control channel,
    # in-process code) can take space that no session end would ever free
    core.put_inline([(key(1), b"a" * 100, b"")], b"")
    base = _used(core)
    call = getattr(core, grant)
    args = ([key(1)], b"") if grant == "pin_blocks" else ([(key(2), 4096, b"")], b"")
    with pytest.raises(InvalidArgument, match="needs a session.*got 0"):
        call(*args, session_id=0)
    with pytest.raises(TypeError, match="session_id"):
        call(*args)  # the session is a required argument
    assert core.num_outstanding() == (0, 0, 0) and core.store.stats().pinned_blocks == 0
    assert _used(core) == base


def test_session_end_frees_active_and_quarantined_leases_at_once(core: NodeCore, clock: FakeClock) -> None:
    core.put_inline([(key(1), b"a" * 4096, b"")], b"")
    base = _used(core)
    sid = core.open_session("test")
    rid, _ = core.reserve_put([(key(2), 8192, b"")], b"", session_id=sid)
    assert _lapse(core, clock) == 1  # the reservation lapses: quarantined, nothing freed
    pin_id, got = core.pin_blocks([key(1)], b"", session_id=sid)  # active, in time
    assert isinstance(got[0], PinnedBlock)
    assert core.quarantined_bytes() == 8192 and _used(core) == base + 8192
    assert core.store.stats().pinned_blocks == 1
    core.close_session(sid)  # the client is gone: its copies cannot run any more
    assert core.quarantined_bytes() == 0 and _used(core) == base
    assert core.store.stats().pinned_blocks == 0
    assert core.num_outstanding() == (0, 0, 0)
    with pytest.raises(LeaseExpired, match="already released"):
        core.commit_put(rid)
    assert core.release_pins_report([pin_id]) == (0, [pin_id])
    core.close_session(sid)  # idempotent


def test_closed_or_unknown_session_is_refused(core: NodeCore) -> None:
    sid = core.open_session()
    core.close_session(sid)
    with pytest.raises(Unavailable, match="not open"):
        core.reserve_put([(key(1), 10, b"")], b"", session_id=sid)
    with pytest.raises(Unavailable, match="not open"):
        core.pin_blocks([key(1)], b"", session_id=12345)
    assert _used(core) == 0


def test_quarantine_is_bounded_per_session(core: NodeCore, clock: FakeClock) -> None:
    stuck, other = core.open_session("stuck"), core.open_session("other")
    for i in range(3):  # 3 x 8 KiB lapsed: over the 16 KiB bound
        core.reserve_put([(key(10 + i), 8192, b"")], b"", session_id=stuck)
    assert _lapse(core, clock) == 3
    assert core.leases.quarantined_bytes(stuck) == 3 * 8192
    with pytest.raises(NoCapacity, match="max_quarantine_bytes_per_session=16384") as info:
        core.reserve_put([(key(20), 10, b"")], b"", session_id=stuck)
    assert "24576 quarantined bytes" in str(info.value)
    with pytest.raises(NoCapacity, match="quarantined"):
        core.pin_blocks([key(10)], b"", session_id=stuck)
    rid, _ = core.reserve_put([(key(21), 10, b"")], b"", session_id=other)  # others unaffected
    assert rid
    core.close_session(stuck)
    assert core.quarantined_bytes() == 0
    rid2, _ = core.reserve_put([(key(22), 10, b"")], b"", session_id=other)
    assert rid2


def test_ack_of_a_quarantined_reservation_frees_it_and_abort_is_accepted(core: NodeCore, clock: FakeClock) -> None:
    sid = core.open_session()
    r1, _ = core.reserve_put([(key(1), 4096, b"")], b"", session_id=sid)
    r2, _ = core.reserve_put([(key(2), 4096, b"")], b"", session_id=sid)
    assert _lapse(core, clock) == 2 and core.quarantined_bytes() == 8192
    out = core.commit_put(r1, abort=True)  # an abort after the lapse: accepted, space freed
    assert [o.stored for o in out] == [False]
    assert core.quarantined_bytes() == 4096
    with pytest.raises(LeaseExpired, match="outlived its lease"):
        core.commit_put(r2)  # a commit after the lapse: refused, space freed
    assert core.quarantined_bytes() == 0 and _used(core) == 0
    with pytest.raises(LeaseExpired, match="already released"):
        core.commit_put(r2)  # asked again: the same answer
    with pytest.raises(NotFound):
        core.commit_put(424242)
    assert core.store.exists([key(1), key(2)]) == [False, False]


def test_session_ending_during_a_reserve_releases_it(core: NodeCore) -> None:
    sid = core.open_session()

    # the session ends between the store reservation and recording the lease
    original = core.leases.add

    def add_after_close(*args: object, **kwargs: object) -> int | None:
        core.close_session(sid)
        return original(*args, **kwargs)  # type: ignore[arg-type]

    core.leases.add = add_after_close  # type: ignore[method-assign]
    with pytest.raises(Unavailable, match="ended during the call"):
        core.reserve_put([(key(1), 4096, b"")], b"", session_id=sid)
    assert _used(core) == 0 and core.num_outstanding() == (0, 0, 0)


def test_shutdown_releases_quarantine(core: NodeCore, clock: FakeClock) -> None:
    core.put_inline([(key(1), b"a" * 100, b"")], b"")
    core.pin_blocks([key(1)], b"", session_id=core.open_session())  # quarantined until acked
    assert _lapse(core, clock) == 1
    assert core.quarantined_bytes() == 100 and core.store.stats().pinned_blocks == 1
    core.release_all()
    assert core.quarantined_bytes() == 0 and core.store.stats().pinned_blocks == 0


# ---- orphaned grants: the client never received the answer (request_id acks) -----------------


def test_orphan_ack_frees_an_active_and_a_quarantined_grant(core: NodeCore, clock: FakeClock) -> None:
    core.put_inline([(key(1), b"a" * 4096, b"")], b"")
    base = _used(core)
    sid = core.open_session()
    rid, _ = core.reserve_put([(key(2), 8192, b"")], b"", session_id=sid, request_id=7)
    assert rid and _lapse(core, clock) == 1  # the reservation is quarantined
    pin_id, got = core.pin_blocks([key(1)], b"", session_id=sid, request_id=8)  # active
    assert pin_id and isinstance(got[0], PinnedBlock)
    assert core.quarantined_bytes() == 8192 and core.store.stats().pinned_blocks == 1
    assert core.release_orphans(sid, [8]) == 1  # the pin: active, freed at once
    assert core.store.stats().pinned_blocks == 0 and core.num_outstanding() == (0, 0, 0)
    assert core.quarantined_bytes() == 8192
    assert core.release_orphans(sid, [7]) == 1  # the quarantined reservation
    assert core.quarantined_bytes() == 0 and _used(core) == base
    assert core.release_orphans(sid, [7, 8]) == 0  # idempotent
    with pytest.raises(NotFound):  # its lease id is gone too: nothing is freed twice
        core.commit_put(rid)
    assert core.release_pins_report([pin_id]) == (0, [])
    assert core.leases._sessions[sid].by_request == {}


def test_orphan_ack_of_another_request_or_session_frees_nothing(core: NodeCore) -> None:
    core.put_inline([(key(1), b"a" * 100, b"")], b"")
    sid, other = core.open_session(), core.open_session()
    pin_id, _ = core.pin_blocks([key(1)], b"", session_id=sid, request_id=5)
    assert core.release_orphans(other, [5]) == 0  # request ids are per session
    assert core.release_orphans(sid, [6, 0]) == 0
    assert core.store.stats().pinned_blocks == 1
    assert core.release_pins_report([pin_id]) == (1, [])  # the normal ack still works
    assert core.leases._sessions[sid].by_request == {}  # and forgot the request id
    assert core.release_orphans(sid, [5]) == 0
    core.close_session(sid)
    assert core.release_orphans(sid, [5]) == 0  # a closed session: nothing left to free
    # an orphan ack without a session (0) never frees a session's grant
    third_pin, _ = core.pin_blocks([key(1)], b"", session_id=core.open_session(), request_id=5)
    assert core.release_orphans(0, [5]) == 0 and core.store.stats().pinned_blocks == 1
    assert core.release_pins_report([third_pin]) == (1, [])


def test_grant_arriving_after_its_orphan_ack_is_refused_and_released(core: NodeCore) -> None:
    core.put_inline([(key(1), b"a" * 100, b"")], b"")
    base = _used(core)
    sid = core.open_session()
    assert core.release_orphans(sid, [9, 10]) == 0  # the acks overtook their requests
    with pytest.raises(LeaseExpired, match="never received its answer"):
        core.pin_blocks([key(1)], b"", session_id=sid, request_id=9)
    with pytest.raises(LeaseExpired, match="never received its answer"):
        core.reserve_put([(key(2), 4096, b"")], b"", session_id=sid, request_id=10)
    assert core.store.stats().pinned_blocks == 0 and _used(core) == base
    assert core.num_outstanding() == (0, 0, 0)
    pin_id, _ = core.pin_blocks([key(1)], b"", session_id=sid, request_id=11)  # others granted
    assert pin_id and core.store.stats().pinned_blocks == 1
    core.release_pins([pin_id])


def test_orphan_tombstones_are_bounded_per_session(core: NodeCore) -> None:
    from kvstored.node import sessions

    sid = core.open_session()
    core.release_orphans(sid, list(range(1, sessions._ORPHAN_TOMBSTONES + 11)))
    assert len(core.leases._sessions[sid].orphaned) == sessions._ORPHAN_TOMBSTONES
    assert 1 not in core.leases._sessions[sid].orphaned  # the oldest were dropped
