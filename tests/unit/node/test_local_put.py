"""The node's batched put paths (kvstored/node/local_put.py), no gRPC: a batch reservation is
invisible until committed, and an aborted, lapsed or orphaned one frees all its space."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from core_helpers import unit_core
from helpers import key

from kvstored.clock import FakeClock
from kvstored.errors import BlockTooLarge, KeyInvalid, LeaseExpired
from kvstored.node.core import NodeCore
from kvstored.node.local_put import EXISTED, STORED, PutOutcome
from kvstored.tiers.base import NEEDS_IO
from kvstored.types import Reservation

BATCH = 16


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def core(clock: FakeClock) -> Iterator[NodeCore]:
    yield from unit_core(clock)


def _used(core: NodeCore) -> int:
    return core.store.stats().tiers[0].used_bytes


def _batch(base: int, size: int = 8192) -> list[tuple[bytes, int, bytes]]:
    return [(key(base + j), size, b"") for j in range(BATCH)]


def _write(core: NodeCore, items: list[object]) -> None:
    for j, r in enumerate(items):
        if isinstance(r, Reservation):
            core.store.arena[r.offset : r.offset + r.size_bytes] = bytes([j + 1]) * r.size_bytes


def test_a_batch_reservation_is_invisible_to_readers_until_its_commit(core: NodeCore) -> None:
    sid = core.open_session()
    keys = [k for k, _, _ in _batch(0)]
    rid, items = core.reserve_put_items(_batch(0), b"", session_id=sid, request_id=1)
    assert rid and isinstance(items, list) and all(isinstance(x, Reservation) for x in items)
    _write(core, items)
    # another reader (no session of the writer's) sees none of it before the commit
    assert core.exists(keys, b"")[0] == [False] * BATCH
    assert core.lookup_prefix(keys, b"") == []
    pin_id, got = core.pin_blocks(keys, b"", session_id=core.open_session("reader"))
    assert pin_id == 0 and got == [None] * BATCH
    assert core.commit_put(rid) == [STORED] * BATCH
    assert core.exists(keys, b"")[0] == [True] * BATCH
    assert core.get_inline(keys[:2], b"", budget_bytes=1 << 20)[1].value == bytes([2]) * 8192


def test_an_aborted_batch_reservation_frees_its_space(core: NodeCore) -> None:
    sid = core.open_session()
    base = _used(core)
    rid, items = core.reserve_put_items(_batch(0), b"", session_id=sid)
    assert rid and _used(core) == base + BATCH * 8192
    assert core.commit_put(rid, abort=True) == [EXISTED] * BATCH
    assert _used(core) == base and core.num_outstanding() == (0, 0, 0)
    assert core.exists([key(j) for j in range(BATCH)], b"")[0] == [False] * BATCH


def test_an_orphaned_batch_reservation_frees_its_space(core: NodeCore) -> None:
    sid = core.open_session()
    base = _used(core)
    rid, _ = core.reserve_put_items(_batch(0), b"", session_id=sid, request_id=77)
    assert rid and _used(core) == base + BATCH * 8192
    assert core.release_orphans(sid, [77]) == 1  # the client never got the answer
    assert _used(core) == base and core.num_outstanding() == (0, 0, 0)


def test_a_lapsed_batch_reservation_is_refused_at_commit_and_then_freed(
    core: NodeCore, clock: FakeClock,
) -> None:
    sid = core.open_session()
    base = _used(core)
    rid, items = core.reserve_put_items(_batch(0), b"", session_id=sid)
    _write(core, items)  # type: ignore[arg-type]
    clock.advance(core.cfg.pin_lease_s + 1)
    assert core.reap_expired() == 1
    assert _used(core) == base + BATCH * 8192  # quarantined: nothing freed on a timer
    with pytest.raises(LeaseExpired):
        core.commit_put(rid)
    assert _used(core) == base and core.exists([key(0)], b"")[0] == [False]


def test_bad_stored_and_repeated_items_get_their_own_outcome(core: NodeCore) -> None:
    sid = core.open_session()
    assert core.put_inline([(key(5), b"x" * 10, b"")], b"") == [STORED]
    items = [(key(1), 10, b""), (b"", 10, b""), (key(5), 10, b""), (key(1), 10, b""),
             (key(2), 1 << 20, b"")]
    rid, got = core.reserve_put_items(items, b"", session_id=sid)
    assert isinstance(got, list) and isinstance(got[0], Reservation)
    assert isinstance(got[1], PutOutcome) and isinstance(got[1].error, KeyInvalid)
    assert got[2] is EXISTED and got[3] is EXISTED  # stored already / repeated in the batch
    assert isinstance(got[4], PutOutcome) and isinstance(got[4].error, BlockTooLarge)
    out = core.commit_put(rid)
    assert out[0] is STORED and out[2] is EXISTED and isinstance(out[1].error, KeyInvalid)


def test_on_the_loop_a_batch_that_needs_an_eviction_is_needs_io_and_records_nothing(
    core: NodeCore,
) -> None:
    sid = core.open_session()
    n = core.cfg.dram_size_bytes // (64 << 10)
    for i in range(n):  # DRAM full of committed blocks
        assert core.put_inline([(key(100 + i), b"f" * (64 << 10), b"")], b"") == [STORED]
    used = _used(core)
    items = _batch(0) + [(b"", 10, b"")]
    assert core.reserve_put_items(items, b"", session_id=sid, may_block=False) == (0, NEEDS_IO)
    assert _used(core) == used and core.num_outstanding() == (0, 0, 0)
    assert core.leases._sessions[sid].active == set()  # noqa: SLF001
    rid, got = core.reserve_put_items(items, b"", session_id=sid)  # may block: evicts
    assert rid and sum(isinstance(x, Reservation) for x in got) == BATCH  # type: ignore[union-attr]
