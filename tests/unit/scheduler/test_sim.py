"""Trace replay: determinism, sanity of the counts, trace parsing."""

from __future__ import annotations

import dataclasses
import pathlib

import pytest

from kvstored.errors import InvalidArgument
from kvstored.scheduler.config import AdmissionMode, Policy
from kvstored.scheduler.sim import ClusterConfig, replay
from kvstored.scheduler.trace import TraceRecord, load_trace, resolve_trace, synthetic_trace

CONVERSATION = resolve_trace("conversation")  # shipped in kvstored/scheduler/traces
# small and hot: 2 prefill + 1 decode instance, 4x speed, so every path is exercised
HOT = ClusterConfig(num_prefill=2, num_decode=1, cache_blocks=500, speed=4.0,
                    decode_kv_capacity_tokens=150_000)


def _same(a: dict[str, object], b: dict[str, object]) -> None:
    a, b = dict(a), dict(b)
    a.pop("wall_s"), b.pop("wall_s")
    assert a == b


@pytest.mark.parametrize("mode", list(AdmissionMode))
def test_replay_is_deterministic(mode: AdmissionMode) -> None:
    trace = synthetic_trace(600, rate_per_s=6.0, seed=3)
    r1 = replay(trace, Policy.KVCACHE_CENTRIC, mode, HOT)
    r2 = replay(trace, Policy.KVCACHE_CENTRIC, mode, HOT)
    _same(r1.summary(), r2.summary())
    assert r1.timeline == r2.timeline
    assert r1.completed + r1.rejected == r1.num_requests == 600
    assert r1.wasted_prefills == r1.rejected_by_reason.get("decode_overloaded", 0)


def test_random_policy_depends_on_the_seed() -> None:
    trace = synthetic_trace(400, rate_per_s=6.0, seed=1)
    a = replay(trace, Policy.RANDOM, AdmissionMode.EARLY, HOT)
    b = replay(trace, Policy.RANDOM, AdmissionMode.EARLY, dataclasses.replace(HOT))
    c = replay(trace, Policy.RANDOM, AdmissionMode.EARLY, dataclasses.replace(HOT, seed=7))
    _same(a.summary(), b.summary())
    assert a.summary() != c.summary()


def test_counts_and_hit_ratio_on_a_hand_made_trace() -> None:
    # r2 comes back to r1's prefix after r1's prefill finished: 2 of its 3 blocks hit
    trace = [TraceRecord(0, 1536, 10, (1, 2, 3)), TraceRecord(5_000, 1536, 10, (1, 2, 4)),
             TraceRecord(6_000, 512, 10, (5,))]
    r = replay(trace, Policy.CACHE_AWARE, AdmissionMode.NONE,
               ClusterConfig(num_prefill=1, num_decode=1))
    assert (r.completed, r.rejected, r.wasted_prefills) == (3, 0, 0)
    assert r.hit_ratio == pytest.approx(2 / 7)
    assert r.avg_ttft_s > 0 and r.tbt_slo_attainment == 1.0


def test_no_admission_never_rejects_and_baseline_wastes() -> None:
    trace = synthetic_trace(500, rate_per_s=8.0, seed=2)
    none = replay(trace, Policy.KVCACHE_CENTRIC, AdmissionMode.NONE, HOT)
    assert none.rejected == 0 and none.completed == 500
    base = replay(trace, Policy.KVCACHE_CENTRIC, AdmissionMode.REJECT_AT_DECODE, HOT)
    assert base.rejected > 0
    assert set(base.rejected_by_reason) <= {"ttft_slo", "decode_overloaded"}


def test_bad_cluster_settings_are_named() -> None:
    with pytest.raises(InvalidArgument, match="speed"):
        replay([], Policy.RANDOM, AdmissionMode.EARLY, ClusterConfig(speed=0))
    with pytest.raises(InvalidArgument, match="prefill"):
        replay([], Policy.RANDOM, AdmissionMode.EARLY, ClusterConfig(num_prefill=0))


def test_load_trace_errors_name_the_line(tmp_path: pathlib.Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [0]}\n'
                 '{"timestamp": 5, "input_length": 10}\n')
    with pytest.raises(InvalidArgument, match=r"t.jsonl:2: missing field"):
        load_trace(p)
    p.write_text('{"timestamp": 9, "input_length": 10, "output_length": 2, "hash_ids": [0]}\n'
                 '{"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": [0]}\n')
    with pytest.raises(InvalidArgument, match="sorted"):
        load_trace(p)
    assert len(load_trace(p, limit=1)) == 1


def test_published_trace_prefix_replays_deterministically() -> None:
    recs = load_trace(CONVERSATION, limit=1500)
    assert recs[0].hash_ids[0] == 0 and len(recs) == 1500
    cl = ClusterConfig(num_prefill=4, num_decode=1, speed=4.0)
    a = replay(recs, Policy.KVCACHE_CENTRIC, AdmissionMode.PREDICTED, cl)
    b = replay(recs, Policy.KVCACHE_CENTRIC, AdmissionMode.PREDICTED, cl)
    _same(a.summary(), b.summary())


# ---- hand-made traces with hand-computed outcomes ---------------------------------------------
# make_profile(): prefill_s(n, p) = 0.1 + 1e-4*(n-p) + 1e-9*(n^2-p^2); 16-token blocks of 16 kB,
# local DRAM 1.6e9 B/s = 10 us per block. One prefill instance (a FIFO), one decode instance,
# unlimited cache. Blocks enter the prefill node's cache when a prefill finishes.
#   r1  t=0     64 tok, blocks 1 2 3 4   nothing cached     prefill(64,0) = 0.106404096
#   r2  t=0.05  64 tok, blocks 1 2 5 6   r1 still running   queue 0.056404096 + 0.106404096
#   r3  t=1.0   64 tok, blocks 1 2 3 7   1 2 3 cached       3 x 10 us + prefill(64,48) = 0.101601792
#   r4  t=1.0   32 tok, blocks 9 10      behind r3          queue 0.101631792 + prefill(32,0) = 0.103201024
HAND_TRACE = [TraceRecord(0, 64, 4, (1, 2, 3, 4)), TraceRecord(50, 64, 4, (1, 2, 5, 6)),
              TraceRecord(1000, 64, 4, (1, 2, 3, 7)), TraceRecord(1000, 32, 4, (9, 10))]
TTFT_R1 = 0.106404096
TTFT_R2 = (0.106404096 - 0.05) + 0.106404096  # 0.162808192
TTFT_R3 = 3e-5 + 0.101601792  # 0.101631792
TTFT_R4 = 0.101631792 + 0.103201024  # 0.204832816


def _hand_cluster(**over: object) -> ClusterConfig:
    from sched_helpers import make_profile

    return ClusterConfig(num_prefill=1, num_decode=1, cache_blocks=None, block_tokens=16,
                         profile=make_profile(), **over)  # type: ignore[arg-type]


def _p90(values: list[float]) -> float:
    s = sorted(values)  # linear interpolation between closest ranks
    k = (len(s) - 1) * 0.9
    lo = int(k)
    return s[lo] + (s[min(lo + 1, len(s) - 1)] - s[lo]) * (k - lo)


@pytest.mark.parametrize("policy", [Policy.CACHE_AWARE, Policy.KVCACHE_CENTRIC])
def test_hand_trace_without_admission_has_the_computed_ttfts_and_hits(policy: Policy) -> None:
    r = replay(HAND_TRACE, policy, AdmissionMode.NONE, _hand_cluster())
    ttfts = [TTFT_R1, TTFT_R2, TTFT_R3, TTFT_R4]
    assert (r.completed, r.rejected, r.rejected_by_reason, r.wasted_prefills) == (4, 0, {}, 0)
    assert r.avg_ttft_s == pytest.approx(sum(ttfts) / 4, abs=1e-12)
    assert r.p90_ttft_s == pytest.approx(_p90(ttfts), abs=1e-12)
    # 3 of r3's blocks reused, nothing else: 3 of 4 + 4 + 4 + 2 blocks
    assert r.hit_ratio == pytest.approx(3 / 14, abs=1e-12)
    assert r.fetched_blocks == 0


def test_hand_trace_with_a_ttft_slo_rejects_the_queued_requests() -> None:
    # SLO 0.15 s: r2 (0.1628 s) and r4 (queued behind r3: 0.2048 s) are refused at arrival, so
    # only r1's blocks are cached when r3 arrives (still 3 hits) and r4 queues behind nothing
    # but r3, as computed above
    r = replay(HAND_TRACE, Policy.CACHE_AWARE, AdmissionMode.EARLY, _hand_cluster(ttft_slo_s=0.15))
    assert (r.completed, r.rejected, r.rejected_by_reason) == (2, 2, {"ttft_slo": 2})
    assert r.avg_ttft_s == pytest.approx((TTFT_R1 + TTFT_R3) / 2, abs=1e-12)
    assert r.hit_ratio == pytest.approx(3 / 8, abs=1e-12)
    assert r.completed_within_slo == 2 and r.tbt_slo_attainment == 1.0
    # with a 0.2 s SLO only r4 (0.2048 s) is refused; r2 now runs, so r4's queue is unchanged
    r = replay(HAND_TRACE, Policy.CACHE_AWARE, AdmissionMode.EARLY, _hand_cluster(ttft_slo_s=0.2))
    assert (r.completed, r.rejected_by_reason) == (3, {"ttft_slo": 1})
    assert r.avg_ttft_s == pytest.approx((TTFT_R1 + TTFT_R2 + TTFT_R3) / 3, abs=1e-12)
    assert r.hit_ratio == pytest.approx(3 / 12, abs=1e-12)
