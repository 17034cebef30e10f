"""The node's Prometheus metrics on the hot path (issue 9): O(1) per request, nothing lost.

``kvstored_lease_active{kind}`` is read at scrape time from counts the lease book keeps on
every change, so these tests drive every transition (grant, ack, lapse, ack of a lapsed lease,
orphan ack, session end, shutdown) and compare the scraped gauge with a recount of the book.
Time is a fake clock; a lapse is made by advancing it and calling ``reap_expired``.
"""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Iterator

import pytest
from core_helpers import unit_core
from helpers import key
from prometheus_client.metrics import MetricWrapperBase

from kvstored.clock import FakeClock
from kvstored.errors import LeaseExpired
from kvstored.node.core import NodeCore


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def core(clock: FakeClock) -> Iterator[NodeCore]:
    yield from unit_core(clock)


def _sample(core: NodeCore, name: str, **labels: str) -> float:
    assert core.metrics is not None
    value = core.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def _gauge(core: NodeCore) -> tuple[float, float]:
    return (
        _sample(core, "kvstored_lease_active", kind="pin"),
        _sample(core, "kvstored_lease_active", kind="reservation"),
    )


def _recount(core: NodeCore) -> tuple[int, int]:
    """Active leases by kind, counted the slow way over the book's table."""
    active = list(core.leases._leases.values())
    return (
        sum(1 for x in active if x.kind == "pin"),
        sum(1 for x in active if x.kind == "reservation"),
    )


def _check(core: NodeCore, pins: int, reservations: int) -> None:
    assert _recount(core) == (pins, reservations)
    assert _gauge(core) == (pins, reservations)
    assert core.num_outstanding()[:2] == (pins, reservations)


def _lapse(core: NodeCore, clock: FakeClock) -> int:
    clock.advance(core.cfg.pin_lease_s + 1)
    return core.reap_expired()


def test_lease_gauge_is_exact_through_every_lease_transition(
    core: NodeCore, clock: FakeClock
) -> None:
    core.put_inline([(key(i), bytes([i]) * 1024, b"") for i in range(8)], b"")
    sid = core.open_session("test")
    _check(core, 0, 0)
    p1, _ = core.pin_blocks([key(0), key(1)], b"", session_id=sid)
    p2, _ = core.pin_blocks([key(2)], b"", session_id=sid)
    p3, _ = core.pin_blocks([key(3)], b"", session_id=sid, request_id=7)
    r1, _ = core.reserve_put([(key(100), 4096, b"")], b"", session_id=sid)
    r2, _ = core.reserve_put([(key(101), 4096, b"")], b"", session_id=sid)
    _check(core, 3, 2)
    assert core.release_pins([p1, p1, 12345]) == 1  # a repeated and an unknown id count once
    _check(core, 2, 2)
    core.commit_put(r1)
    _check(core, 2, 1)
    assert core.release_orphans(sid, [7]) == 1  # the client never got p3's answer
    _check(core, 1, 1)

    assert _lapse(core, clock) == 2  # p2 and r2 lapse: quarantined, no longer active
    _check(core, 0, 0)
    assert _sample(core, "kvstored_lease_expired_total", kind="pin") == 1
    assert _sample(core, "kvstored_lease_expired_total", kind="reservation") == 1
    assert core.release_pins_report([p2]) == (0, [p2])  # the late ack of a quarantined pin
    with pytest.raises(LeaseExpired):
        core.commit_put(r2)
    _check(core, 0, 0)

    p4, _ = core.pin_blocks([key(4)], b"", session_id=sid)
    core.reserve_put([(key(102), 4096, b"")], b"", session_id=sid)
    _check(core, 1, 1)
    core.close_session(sid)  # the session's active leases go at once
    _check(core, 0, 0)
    assert core.release_pins([p4]) == 0

    sid2 = core.open_session("test2")
    core.pin_blocks([key(5)], b"", session_id=sid2)
    core.reserve_put([(key(103), 4096, b"")], b"", session_id=sid2)
    _check(core, 1, 1)
    core.release_all()  # shutdown
    _check(core, 0, 0)


def test_transfer_counted_once_per_request_with_all_its_blocks(core: NodeCore) -> None:
    core.put_inline([(key(i), bytes([i]) * 1000, b"") for i in range(4)], b"")
    assert _sample(core, "kvstored_transfer_blocks_total", transport="grpc", direction="in") == 4
    assert _sample(core, "kvstored_transfer_bytes_total", transport="grpc", direction="in") == 4000
    sid = core.open_session()
    pin_id, _ = core.pin_blocks([key(0), key(1), key(2), key(99)], b"", session_id=sid)
    assert _sample(core, "kvstored_transfer_blocks_total", transport="shm", direction="out") == 3
    assert _sample(core, "kvstored_transfer_bytes_total", transport="shm", direction="out") == 3000
    core.release_pins([pin_id])
    core.pin_blocks([key(3)], b"", session_id=sid)
    assert _sample(core, "kvstored_transfer_blocks_total", transport="shm", direction="out") == 4
    assert _sample(core, "kvstored_transfer_bytes_total", transport="shm", direction="out") == 4000
    rid, _ = core.reserve_put([(key(10), 512, b""), (key(11), 256, b"")], b"", session_id=sid)
    core.commit_put(rid)
    assert _sample(core, "kvstored_transfer_blocks_total", transport="shm", direction="in") == 2
    assert _sample(core, "kvstored_transfer_bytes_total", transport="shm", direction="in") == 768
    core.pin_blocks([b"", key(0)], b"", session_id=sid)  # an empty key is an item error
    core.pin_blocks([b""], b"", session_id=sid)
    assert _sample(core, "kvstored_item_errors_total", code="KEY_INVALID") == 2
    assert core.lookup_prefix([key(0), key(1), key(77), key(2)], b"") != []
    assert _sample(core, "kvstored_lookup_blocks_total") == 4
    assert _sample(core, "kvstored_lookup_hit_blocks_total") == 2


def test_hot_path_looks_up_no_labelled_child_after_first_use(
    core: NodeCore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``.labels(...)`` costs microseconds per call: pin, release, reserve, commit and lookup
    reuse the children they looked up once (and count leases without a scan: see above)."""
    core.put_inline([(key(i), bytes([i]) * 1024, b"") for i in range(4)], b"")
    sid = core.open_session()

    n = iter(range(1000, 2000))

    def round_trip() -> None:
        pin_id, _ = core.pin_blocks([key(0), key(1)], b"", session_id=sid)
        core.release_pins([pin_id])
        rid, _ = core.reserve_put([(key(next(n)), 1024, b"")], b"", session_id=sid)
        core.commit_put(rid, abort=True)
        rid, _ = core.reserve_put([(key(next(n)), 1024, b"")], b"", session_id=sid)
        core.commit_put(rid)
        core.lookup_prefix([key(0), key(1)], b"")

    round_trip()  # first use creates the children
    calls: list[tuple[str, object]] = []
    real = MetricWrapperBase.labels

    def counting(self: MetricWrapperBase, *args: object, **kwargs: object) -> object:
        calls.append((self._name, kwargs or args))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(MetricWrapperBase, "labels", counting)
    for _ in range(3):
        round_trip()
    assert calls == []
    _check(core, 0, 0)
    assert _sample(core, "kvstored_transfer_blocks_total", transport="shm", direction="out") == 8


def test_bench_core_metrics_runs_and_has_its_fields() -> None:
    """bench/bench_core_metrics.py (node-side metrics cost, metrics on vs off) runs; no timing
    asserted."""
    root = pathlib.Path(__file__).resolve().parents[3]
    sys.path.insert(0, str(root / "bench"))
    try:
        import bench_core_metrics
    finally:
        sys.path.remove(str(root / "bench"))
    best = bench_core_metrics.measure(held=3, iters=5, rounds=1)
    assert set(best) == {"get", "put", "lookup"}
    for op in best.values():
        assert set(op) == {"off", "on"} and all(t > 0 for t in op.values())
