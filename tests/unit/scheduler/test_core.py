"""Instance choice on hand-made cases with known answers (test profile: see conftest)."""

from __future__ import annotations

import pytest
from sched_helpers import DictIndex, make_profile

from kvstored.clock import FakeClock
from kvstored.errors import InvalidArgument, NotFound
from kvstored.scheduler.config import AdmissionMode, Policy, SchedulerConfig
from kvstored.scheduler.core import Scheduler
from kvstored.scheduler.costmodel import CostModel
from kvstored.scheduler.types import InstanceSpec, RejectReason, Role, ScheduleRequest

KEYS = [f"k{i}".encode() for i in range(100)]  # 100 blocks of 16 tokens = 1600 tokens
NO_CACHE = 0.1 + 0.16 + 1e-9 * 1600**2  # prefill(1600, 0)
HALF = 0.1 + 1e-4 * 800 + 1e-9 * (1600**2 - 800**2)  # prefill(1600, 800)


def make(policy: Policy, clock: FakeClock, table: dict[str, tuple[int, int]] | None = None,
         **profile_over: object) -> Scheduler:
    cfg = SchedulerConfig(policy=policy, admission=AdmissionMode.NONE, block_tokens=16,
                          instance_ttl_s=None)
    s = Scheduler(cfg, CostModel(make_profile(**profile_over), 16), clock,
                  DictIndex(table or {}))
    s.register_instance(InstanceSpec("p0", "a", Role.PREFILL))
    s.register_instance(InstanceSpec("p1", "b", Role.PREFILL))
    s.register_instance(InstanceSpec("d0", "d", Role.DECODE))
    return s


def req(rid: str, n: int = 1600) -> ScheduleRequest:
    return ScheduleRequest(rid, KEYS[: (n + 15) // 16], n, expected_output_tokens=10)


def test_cache_aware_prefers_the_node_holding_the_prefix(clock: FakeClock) -> None:
    s = make(Policy.CACHE_AWARE, clock, {"a": (50, 0)})
    d = s.schedule(req("r1"))
    assert d.admitted and d.prefill_instance_id == "p0"
    assert (d.local_blocks, d.fetched_blocks, d.reused_blocks) == (50, 0, 50)
    assert d.predicted_transfer_s == pytest.approx(50 * 1e-5)
    assert d.predicted_ttft_s == pytest.approx(HALF + 50 * 1e-5)
    assert d.prefill_finish_s == pytest.approx(d.predicted_ttft_s)


def test_queue_outweighs_the_cache(clock: FakeClock) -> None:
    s = make(Policy.CACHE_AWARE, clock, {"a": (50, 0)})
    s.report_prefill_load("p0", 1.0)
    d = s.schedule(req("r1"))
    assert d.prefill_instance_id == "p1" and d.reused_blocks == 0
    assert d.predicted_ttft_s == pytest.approx(NO_CACHE)


def test_kvcache_centric_fetches_only_when_faster(clock: FakeClock) -> None:
    # remote DRAM at 1 s per block: fetching 50 blocks (50 s) loses to recomputing (0.26 s)
    slow = make(Policy.KVCACHE_CENTRIC, clock, {"a": (50, 0)})
    slow.report_prefill_load("p0", 1.0)
    d = slow.schedule(req("r1"))
    assert d.prefill_instance_id == "p1" and d.fetched_blocks == 0
    # 1 ms per block: fetching (0.05 s + prefill of the rest) beats recomputing
    fast = make(Policy.KVCACHE_CENTRIC, clock, {"a": (50, 0)},
                bandwidth_bytes_per_s__remote_dram=16e6)
    fast.report_prefill_load("p0", 1.0)
    d = fast.schedule(req("r2"))
    assert d.prefill_instance_id == "p1"
    assert (d.local_blocks, d.fetched_blocks, d.prefix_node_id) == (0, 50, "a")
    assert d.replicate_keys == tuple(KEYS[:50])
    assert d.predicted_transfer_s == pytest.approx(0.05)
    assert d.predicted_ttft_s == pytest.approx(0.05 + HALF)


def test_kvcache_centric_fetches_the_rest_from_a_longer_remote_prefix(clock: FakeClock) -> None:
    # a holds 20 blocks; b holds 60, its last 10 only on SSD; b is busy, so use a and fetch
    # blocks 20..59 from b: 30 from DRAM at 1 ms, 10 from SSD at 2 ms per block
    s = make(Policy.KVCACHE_CENTRIC, clock, {"a": (20, 0), "b": (60, 10)},
             bandwidth_bytes_per_s__remote_dram=16e6, bandwidth_bytes_per_s__remote_ssd=8e6)
    s.report_prefill_load("p1", 5.0)
    d = s.schedule(req("r1"))
    assert d.prefill_instance_id == "p0"
    assert (d.local_blocks, d.fetched_blocks, d.fetched_ssd_blocks) == (20, 40, 10)
    assert d.prefix_node_id == "b" and d.replicate_keys == tuple(KEYS[20:60])
    assert d.predicted_transfer_s == pytest.approx(20 * 1e-5 + 30 * 1e-3 + 10 * 2e-3)
    # with b's SSD at 2 s per block the fetch loses: reuse the 20 local blocks only
    s = make(Policy.KVCACHE_CENTRIC, clock, {"a": (20, 0), "b": (60, 10)},
             bandwidth_bytes_per_s__remote_dram=16e6)
    s.report_prefill_load("p1", 5.0)
    d = s.schedule(req("r1"))
    assert (d.prefill_instance_id, d.local_blocks, d.fetched_blocks) == ("p0", 20, 0)
    assert d.prefix_node_id is None and d.replicate_keys == ()


def test_local_ssd_blocks_cost_ssd_bandwidth(clock: FakeClock) -> None:
    s = make(Policy.CACHE_AWARE, clock, {"a": (50, 10)})
    d = s.schedule(req("r1"))
    assert d.prefill_instance_id == "p0"
    assert d.predicted_transfer_s == pytest.approx(40 * 1e-5 + 10 * 1e-3)


def test_load_balancing_ignores_the_cache(clock: FakeClock) -> None:
    s = make(Policy.LOAD_BALANCING, clock, {"b": (90, 0)})
    s.report_prefill_load("p1", 0.2)
    d = s.schedule(req("r1"))
    assert d.prefill_instance_id == "p0" and d.reused_blocks == 0
    # p0's queue grew by r1's prefill (0.26 s); the next request goes to p1 (0.2 s), and the
    # engine there reuses b's blocks
    d2 = s.schedule(req("r2"))
    assert d2.prefill_instance_id == "p1" and d2.local_blocks == 90


def test_random_policy_is_seeded(clock: FakeClock) -> None:
    picks = []
    for _ in range(2):
        s = make(Policy.RANDOM, clock)
        picks.append([s.schedule(req(f"r{i}")).prefill_instance_id for i in range(40)])
    assert picks[0] == picks[1]
    assert set(picks[0]) == {"p0", "p1"}


def test_admitted_work_queues_up(clock: FakeClock) -> None:
    s = make(Policy.CACHE_AWARE, clock)
    s.schedule(req("r1"))
    s.schedule(req("r2"))
    d = s.schedule(req("r3"))  # both instances hold one prefill
    assert d.predicted_queue_s == pytest.approx(NO_CACHE)
    assert d.prefill_instance_id == "p0"  # a tie goes to the first registered
    clock.advance(NO_CACHE)  # r1 and r2 done; p0 runs r3
    d = s.schedule(req("r4"))
    assert (d.prefill_instance_id, d.predicted_queue_s) == ("p1", 0.0)
    d = s.schedule(req("r5"))
    assert d.predicted_queue_s == pytest.approx(NO_CACHE)


def test_no_instance_and_bad_requests(clock: FakeClock) -> None:
    s = Scheduler(SchedulerConfig(instance_ttl_s=None), CostModel(make_profile(), 16), clock)
    d = s.schedule(req("r1"))
    assert not d.admitted and d.reason is RejectReason.NO_INSTANCE
    s = make(Policy.CACHE_AWARE, clock)
    s.schedule(req("dup"))
    with pytest.raises(InvalidArgument, match="already in flight"):
        s.schedule(req("dup"))
    with pytest.raises(InvalidArgument, match="input_tokens"):
        s.schedule(ScheduleRequest("x", [], 0))
    with pytest.raises(InvalidArgument, match="ttft_slo_s"):
        s.schedule(ScheduleRequest("y", [], 10, ttft_slo_s=0))
    with pytest.raises(NotFound):
        s.report_prefill_load("nope", 1.0)
    with pytest.raises(NotFound):
        s.unregister_instance("nope")
    with pytest.raises(InvalidArgument, match="other role"):
        s.register_instance(InstanceSpec("p0", "a", Role.DECODE))


def test_stale_instances_are_skipped(clock: FakeClock) -> None:
    cfg = SchedulerConfig(policy=Policy.CACHE_AWARE, admission=AdmissionMode.NONE,
                          instance_ttl_s=10.0)
    s = Scheduler(cfg, CostModel(make_profile(), 16), clock)
    s.register_instance(InstanceSpec("p0", "a", Role.PREFILL))
    s.register_instance(InstanceSpec("d0", "d", Role.DECODE))
    clock.advance(5)
    s.register_instance(InstanceSpec("p1", "b", Role.PREFILL))
    s.touch_instance("d0")
    clock.advance(6)  # p0 last seen 11 s ago
    assert s.schedule(req("r1")).prefill_instance_id == "p1"
    clock.advance(10)
    assert s.schedule(req("r2")).reason is RejectReason.NO_INSTANCE
