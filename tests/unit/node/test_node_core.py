"""NodeCore (gRPC-free request handling): validation per item, leases, draining, epochs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers import key

from kvstored.clock import FakeClock
from kvstored.config import NodeConfig
from kvstored.errors import (
    BatchTooLarge,
    BlockTooLarge,
    Draining,
    ErrorCode,
    InvalidArgument,
    KeyInvalid,
    LeaseExpired,
    NotFound,
    Unavailable,
)
from kvstored.node.core import NodeCore
from kvstored.node.limits import MAX_META_BYTES
from kvstored.node.metrics import NodeMetrics
from kvstored.tiers.tiered import TieredStore
from kvstored.types import PinnedBlock, Reservation, Tier

EPOCH = 1234


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def core(clock: FakeClock) -> Iterator[NodeCore]:
    cfg = NodeConfig(
        node_id="unit", dram_size_bytes=1 << 20, ssd_size_bytes=0, max_block_bytes=64 << 10,
        max_batch_keys=32, pin_lease_s=5.0,
    )
    store = TieredStore(dram_size_bytes=cfg.dram_size_bytes, arena_dir=None, max_block_bytes=cfg.max_block_bytes)
    yield NodeCore(store, cfg, epoch=EPOCH, metrics=NodeMetrics(), clock=clock)
    store.close()


@pytest.fixture
def sid(core: NodeCore) -> int:
    """A session of the core's (its pins and reservations need one)."""
    return core.open_session("test")


def test_put_inline_mixed_batch_each_bad_item_gets_its_own_error(core: NodeCore) -> None:
    items = [
        (key(1), b"a" * 100, b""),
        (b"", b"empty key", b""),
        (b"short", b"short key", b""),
        (b"k" * 65, b"long key", b""),
        (key(2), b"x" * ((64 << 10) + 1), b""),
        (key(3), b"meta too big", b"m" * (MAX_META_BYTES + 1)),
        (key(4), b"b" * 10, b"meta"),
    ]
    out = core.put_inline(items, b"")
    assert [o.stored for o in out] == [True, False, False, False, False, False, True]
    assert out[0].error is None and out[6].error is None
    assert isinstance(out[1].error, KeyInvalid) and "key #1 is empty" in str(out[1].error)
    assert isinstance(out[2].error, KeyInvalid) and "5 bytes" in str(out[2].error)
    assert isinstance(out[3].error, KeyInvalid) and "65 bytes" in str(out[3].error)
    assert isinstance(out[4].error, BlockTooLarge) and str(64 << 10) in str(out[4].error)
    assert type(out[5].error) is InvalidArgument and "meta" in str(out[5].error)
    assert core.store.get(key(1)) == (b"a" * 100, b"")
    assert core.store.get(key(4)) == (b"b" * 10, b"meta")
    assert core.store.exists([key(2), key(3)]) == [False, False]
    # a second put of a stored key is an idempotent success
    again = core.put_inline([(key(1), b"different bytes", b"")], b"")
    assert again[0].stored is False and again[0].error is None
    assert core.store.get(key(1)) == (b"a" * 100, b"")


def test_batch_too_large_fails_the_whole_call(core: NodeCore, sid: int) -> None:
    with pytest.raises(BatchTooLarge, match="33 keys"):
        core.put_inline([(key(i), b"v", b"") for i in range(33)], b"")
    with pytest.raises(BatchTooLarge):
        core.pin_blocks([key(i) for i in range(33)], b"", session_id=sid)
    with pytest.raises(BatchTooLarge):
        core.lookup_prefix([key(i) for i in range(33)], b"")


def test_calls_without_item_status_raise_naming_the_bad_index(core: NodeCore) -> None:
    with pytest.raises(KeyInvalid, match="key #2"):
        core.exists([key(1), key(2), b""])
    with pytest.raises(KeyInvalid, match="key #0"):
        core.remove([b"tiny"])
    with pytest.raises(InvalidArgument, match="namespace_id"):
        core.lookup_prefix([key(1)], b"n" * 65)


def test_reservation_commit_and_lease_expiry_quarantines(core: NodeCore, clock: FakeClock, sid: int) -> None:
    rid, outcomes = core.reserve_put([(key(1), 4096, b""), (b"", 10, b"")], b"", epoch=EPOCH, session_id=sid)
    assert rid != 0
    assert outcomes[0].error is None and not outcomes[0].exists
    assert isinstance(outcomes[1].error, KeyInvalid)
    core.store.arena[outcomes[0].offset : outcomes[0].offset + 4096] = b"z" * 4096
    assert core.store.exists([key(1)]) == [False]  # invisible until committed
    results = core.commit_put(rid)
    assert results[0].stored and isinstance(results[1].error, KeyInvalid)
    assert core.store.get(key(1)) == (b"z" * 4096, b"")
    with pytest.raises(NotFound):
        core.commit_put(rid)

    used_before = core.store.stats().tiers[0].used_bytes
    rid2, _ = core.reserve_put([(key(2), 8192, b"")], b"", lease_ms=2000, session_id=sid)
    assert core.store.stats().tiers[0].used_bytes == used_before + 8192
    clock.advance(1.9)
    assert core.reap_expired() == 0
    clock.advance(0.2)
    assert core.reap_expired() == 1
    # lapsed: quarantined (the writer may still copy), not given back
    assert core.store.stats().tiers[0].used_bytes == used_before + 8192
    assert core.quarantined_bytes() == 8192
    with pytest.raises(LeaseExpired):
        core.commit_put(rid2)  # the writer's ack: refused, and the space is given back now
    assert core.store.stats().tiers[0].used_bytes == used_before
    assert core.quarantined_bytes() == 0
    assert core.store.exists([key(2)]) == [False]


def test_reserve_of_existing_key_needs_no_commit(core: NodeCore, sid: int) -> None:
    core.put_inline([(key(7), b"seven", b"")], b"")
    rid, outcomes = core.reserve_put([(key(7), 5, b"")], b"", session_id=sid)
    assert rid == 0 and outcomes[0].exists and outcomes[0].error is None


def test_pins_are_released_explicitly_and_lapsed_ones_quarantined(core: NodeCore, clock: FakeClock, sid: int) -> None:
    core.put_inline([(key(1), b"one", b"m1"), (key(2), b"two", b"")], b"")
    pin_id, got = core.pin_blocks([key(1), key(3), key(2)], b"", epoch=EPOCH, session_id=sid)
    assert isinstance(got[0], PinnedBlock) and bytes(got[0].view) == b"one" and got[0].meta == b"m1"
    assert got[1] is None
    assert core.store.stats().pinned_blocks == 2
    assert core.store.remove([key(1)]) == [False]  # pinned blocks are kept
    assert core.release_pins([pin_id, 424242]) == 1
    assert core.release_pins([pin_id]) == 0
    assert core.store.stats().pinned_blocks == 0

    late, _ = core.pin_blocks([key(1)], b"", session_id=sid)  # a reader that is late
    assert core.store.stats().pinned_blocks == 1
    clock.advance(core.cfg.pin_lease_s + 0.01)
    assert core.reap_expired() == 1
    assert core.store.stats().pinned_blocks == 1  # quarantined: still pinned, bytes unchanged
    assert core.store.remove([key(1)]) == [False]
    assert core.release_pins_report([late]) == (0, [late])  # the ack reports the lapse
    assert core.store.stats().pinned_blocks == 0 and core.quarantined_bytes() == 0


def test_nothing_pinned_gives_pin_id_zero(core: NodeCore, sid: int) -> None:
    pin_id, got = core.pin_blocks([key(9), b""], b"", session_id=sid)
    assert pin_id == 0 and got[0] is None and isinstance(got[1], KeyInvalid)


def test_every_core_operation_is_scoped_to_its_namespace(core: NodeCore, sid: int) -> None:
    ns_a, ns_b = b"A" * 16, b"B" * 16
    core.put_inline([(key(1), b"in a", b"")], ns_a)
    pin_id, got = core.pin_blocks([key(1)], ns_b, session_id=sid)
    assert pin_id == 0 and got == [None]  # a miss: B learns nothing about A's block
    assert core.exists([key(1)], ns_b) == ([False], [])
    assert core.exists([key(1)], ns_b, with_tiers=True) == ([False], [None])
    assert core.exists([key(1)], b"") == ([False], [])
    assert core.remove([key(1)], ns_b) == [False]
    assert core.remove([key(1)]) == [False]
    assert core.put_inline([(key(1), b"in b", b"")], ns_b)[0].stored is True
    assert [o.value for o in core.get_inline([key(1)], ns_b, budget_bytes=1 << 20)] == [b"in b"]
    pin_id, got = core.pin_blocks([key(1)], ns_a, session_id=sid)
    assert isinstance(got[0], PinnedBlock) and bytes(got[0].view) == b"in a"
    core.release_pins([pin_id])
    assert core.lookup_prefix([key(1)], ns_a) == [Tier.DRAM]
    assert core.remove([key(1)], ns_a) == [True]
    assert core.lookup_prefix([key(1)], ns_a) == [] and core.lookup_prefix([key(1)], ns_b) == [Tier.DRAM]


@pytest.mark.parametrize("path", ["inline", "reserve"])
def test_duplicate_key_within_one_put_batch_first_writer_wins(core: NodeCore, path: str, sid: int) -> None:
    # regression: the batch is committed tail-first, so the later duplicate used to win
    items = [(key(1), b"first", b"m1"), (key(2), b"other", b""), (key(1), b"later", b"m2")]
    if path == "inline":
        out = core.put_inline(items, b"")
        assert [(o.stored, o.error) for o in out] == [(True, None), (True, None), (False, None)]
    else:
        rid, res = core.reserve_put([(k, len(v), m) for k, v, m in items], b"", session_id=sid)
        # the duplicate is answered "exists": the client writes nothing for it
        assert [r.exists for r in res] == [False, False, True] and res[2].error is None
        held = core.leases._leases[rid].items
        assert len(core.store._state.pending) == 2
        for r, (_, v, _) in zip(held, items, strict=True):
            if isinstance(r, Reservation):
                r.view[:] = v
        out = core.commit_put(rid)
        assert [o.stored for o in out] == [True, True, False]
    assert core.store.get(key(1)) == (b"first", b"m1")
def test_stale_epoch_is_unavailable(core: NodeCore, sid: int) -> None:
    with pytest.raises(Unavailable, match="restarted"):
        core.reserve_put([(key(1), 10, b"")], b"", epoch=EPOCH + 1, session_id=sid)
    with pytest.raises(Unavailable):
        core.pin_blocks([key(1)], b"", epoch=EPOCH + 1, session_id=sid)


def test_draining_refuses_new_work_but_in_flight_work_finishes(core: NodeCore, sid: int) -> None:
    core.put_inline([(key(i), bytes([i]) * 10, b"") for i in range(1, 4)], b"")
    rid, outcomes = core.reserve_put([(key(9), 3, b"")], b"", session_id=sid)
    pin_id, _ = core.pin_blocks([key(1)], b"", session_id=sid)
    streaming = core.pinned_chunks([key(1), key(2), key(3)], b"", chunk_keys=1)
    assert next(streaming)[0] == 0  # a data-plane GET past its first chunk
    core.start_draining()
    with pytest.raises(Draining, match="puts"):
        core.put_inline([(key(5), b"five", b"")], b"")
    with pytest.raises(Draining, match="puts"):
        core.reserve_put([(key(5), 5, b"")], b"", session_id=sid)
    with pytest.raises(Draining, match="reads"):
        core.pin_blocks([key(1)], b"", session_id=sid)
    with pytest.raises(Draining, match="reads"):
        core.get_inline([key(1)], b"", budget_bytes=1 << 20)
    with pytest.raises(Draining, match="reads"):
        next(core.pinned_chunks([key(1)], b""))
    assert core.lookup_prefix([key(1), key(2)], b"") == [Tier.DRAM, Tier.DRAM]  # metadata: served
    # what was in flight finishes: the stream, the write's commit, the read's release
    assert [start for start, _ in streaming] == [1, 2]
    core.store.arena[outcomes[0].offset : outcomes[0].offset + 3] = b"two"
    assert core.commit_put(rid)[0].stored
    assert core.release_pins([pin_id]) == 1
    assert core.num_outstanding() == (0, 0, 0) and core.store.stats().pinned_blocks == 0
    assert core.store.get(key(9)) == (b"two", b"")


def test_get_inline_respects_its_budget_but_always_returns_one_block(core: NodeCore) -> None:
    core.put_inline([(key(i), bytes([i]) * 1000, b"") for i in range(4)], b"")
    out = core.get_inline([key(0), key(1), key(2), key(99)], b"", budget_bytes=1500)
    assert out[0].found and out[0].value == b"\x00" * 1000
    assert not out[1].found and out[1].error is not None and out[1].error.code == ErrorCode.BATCH_TOO_LARGE
    assert out[2].error is not None
    assert not out[3].found and out[3].error is None  # a plain miss
    tiny = core.get_inline([key(3)], b"", budget_bytes=1)
    assert tiny[0].found and tiny[0].value == b"\x03" * 1000
    assert core.store.stats().pinned_blocks == 0


def test_release_all_drops_every_lease(core: NodeCore, sid: int) -> None:
    core.put_inline([(key(1), b"one", b"")], b"")
    core.pin_blocks([key(1)], b"", session_id=sid)
    core.reserve_put([(key(2), 4096, b"")], b"", session_id=sid)
    assert core.num_outstanding()[:2] == (1, 1)
    core.release_all()
    assert core.num_outstanding() == (0, 0, 0)
    assert core.store.stats().pinned_blocks == 0
