"""Admission modes on small synthetic arrival patterns where the right decision is known.

One prefill instance and one decode instance that holds a single request (max batch 1), so the
decode load with a request added is simply the number of requests it would run.
"""

from __future__ import annotations

import pytest
from sched_helpers import make_profile

from kvstored.clock import FakeClock
from kvstored.scheduler.admission import AdaptiveAdmission
from kvstored.scheduler.config import AdmissionMode, Policy, SchedulerConfig
from kvstored.scheduler.core import Scheduler
from kvstored.scheduler.costmodel import CostModel
from kvstored.scheduler.types import InstanceSpec, RejectReason, Role, ScheduleRequest

PREFILL = 0.1 + 0.16 + 1e-9 * 1600**2  # prefill(1600, 0) of the test profile


def make(mode: AdmissionMode, clock: FakeClock, **cfg: object) -> Scheduler:
    conf = SchedulerConfig(policy=Policy.CACHE_AWARE, admission=mode, block_tokens=16,
                           instance_ttl_s=None, tbt_slo_s=1.0, **cfg)  # type: ignore[arg-type]
    s = Scheduler(conf, CostModel(make_profile(decode__max_batch_requests=1), 16), clock)
    s.register_instance(InstanceSpec("p0", "a", Role.PREFILL))
    s.register_instance(InstanceSpec("d0", "d", Role.DECODE))
    return s


def req(rid: str, out: int = 100) -> ScheduleRequest:
    return ScheduleRequest(rid, [], 1600, expected_output_tokens=out)


@pytest.mark.parametrize("mode", [AdmissionMode.REJECT_AT_DECODE, AdmissionMode.EARLY,
                                  AdmissionMode.PREDICTED, AdmissionMode.PREDICTED_LENGTH,
                                  AdmissionMode.PREDICTED_ADAPTIVE,
                                  AdmissionMode.PREDICTED_QUANTILE])
def test_ttft_slo_is_checked_at_arrival(clock: FakeClock, mode: AdmissionMode) -> None:
    s = make(mode, clock, ttft_slo_s=0.5)
    assert s.schedule(req("r1")).admitted  # TTFT 0.26 s
    d = s.schedule(req("r2"))  # queue 0.26 + 0.26 > 0.5
    assert not d.admitted and d.reason is RejectReason.TTFT_SLO
    assert d.predicted_ttft_s == pytest.approx(2 * PREFILL)


def test_none_admits_everything(clock: FakeClock) -> None:
    s = make(AdmissionMode.NONE, clock, ttft_slo_s=0.5)
    assert all(s.schedule(req(f"r{i}")).admitted for i in range(3))
    clock.advance(PREFILL)
    assert s.start_decode("r0").admitted
    clock.advance(PREFILL)
    assert s.start_decode("r1").admitted  # over the decode limit, but nothing is refused


def test_pipeline_request_is_wasted_by_baseline_and_early_refused_by_predicted(
    clock: FakeClock,
) -> None:
    """r1 and r2 arrive together. The decode instance is empty *now*, but r1 will occupy it
    when r2's prefill ends: baseline and early admit r2 and waste its prefill; both predicted
    modes refuse it at arrival."""
    outcome = {}
    for mode in (AdmissionMode.REJECT_AT_DECODE, AdmissionMode.EARLY, AdmissionMode.PREDICTED,
                 AdmissionMode.PREDICTED_LENGTH):
        c = FakeClock(0.0)
        s = make(mode, c)
        assert s.schedule(req("r1")).admitted
        d2 = s.schedule(req("r2"))
        if not d2.admitted:
            outcome[mode] = d2.reason
            continue
        c.advance(PREFILL)
        assert s.start_decode("r1").admitted
        c.advance(PREFILL)
        h = s.start_decode("r2")
        outcome[mode] = h.reason
    assert outcome == {
        AdmissionMode.REJECT_AT_DECODE: RejectReason.DECODE_OVERLOADED,
        AdmissionMode.EARLY: RejectReason.DECODE_OVERLOADED,
        AdmissionMode.PREDICTED: RejectReason.TBT_SLO,
        AdmissionMode.PREDICTED_LENGTH: RejectReason.TBT_SLO,
    }


def test_early_refuses_what_will_be_free_and_predicted_admits_it(clock: FakeClock) -> None:
    """r1 decodes 10 tokens (0.11 s at the empty-batch step of 0.011 s); r2 arrives as r1
    starts. Early sees a full decode instance and refuses; predicted-length knows r1 will be
    gone when r2's prefill ends (0.26 s) and admits, and the handoff then succeeds."""
    results = {}
    for mode in (AdmissionMode.EARLY, AdmissionMode.PREDICTED_LENGTH):
        c = FakeClock(0.0)
        s = make(mode, c)
        assert s.schedule(req("r1", out=10)).admitted
        c.advance(PREFILL)
        assert s.start_decode("r1").admitted
        d2 = s.schedule(req("r2"))
        results[mode] = d2.reason
        if d2.admitted:
            c.advance(0.2)
            assert s.finish_request("r1")
            c.advance(PREFILL)
            assert s.start_decode("r2").admitted
    assert results == {AdmissionMode.EARLY: RejectReason.TBT_SLO,
                       AdmissionMode.PREDICTED_LENGTH: None}


def test_predicted_assumes_one_uniform_decode_time(clock: FakeClock) -> None:
    """The paper's mode ignores r1's length: with a 20 s uniform decode time r1 is assumed
    still there when r2's prefill ends; with 0.05 s it is assumed gone."""
    for uniform_s, admitted in ((20.0, False), (0.05, True)):
        c = FakeClock(0.0)
        s = make(AdmissionMode.PREDICTED, c, initial_decode_s=uniform_s)
        assert s.schedule(req("r1", out=10)).admitted
        c.advance(PREFILL)
        assert s.start_decode("r1").admitted
        assert s.schedule(req("r2")).admitted is admitted


def test_uniform_decode_time_learns_from_finished_requests(clock: FakeClock) -> None:
    s = make(AdmissionMode.PREDICTED, clock, initial_decode_s=20.0, decode_ewma_alpha=0.5)
    s.schedule(req("r1"))
    clock.advance(PREFILL)
    s.start_decode("r1")
    clock.advance(4.0)
    assert s.finish_request("r1")
    assert s.uniform_decode_s == pytest.approx(20.0 + 0.5 * (4.0 - 20.0))
    assert not s.finish_request("r1")  # idempotent
    assert not s.finish_request("never-seen")


def test_cancel_before_prefill_frees_the_decode_plan(clock: FakeClock) -> None:
    s = make(AdmissionMode.PREDICTED_LENGTH, clock)
    assert s.schedule(req("r1")).admitted
    assert not s.schedule(req("r2")).admitted  # r1 will hold the decode slot
    assert s.finish_request("r1")  # cancelled while in prefill
    assert s.schedule(req("r3")).admitted


def test_adaptive_margin_follows_prefill_pressure(clock: FakeClock) -> None:
    s = make(AdmissionMode.PREDICTED_ADAPTIVE, clock, ttft_slo_s=10.0)
    adaptive = s.strategy
    assert isinstance(adaptive, AdaptiveAdmission)
    assert adaptive.margin() == 0.0  # no errors yet
    for i in range(101):
        adaptive.record_error(-0.5 + i / 100)  # errors spread evenly over [-0.5, 0.5]
    # idle prefill: a wasted prefill costs nothing, admit unless surely over (min error)
    assert adaptive.margin() == pytest.approx(-0.5)
    s.report_prefill_load("p0", 10.0)  # queue = TTFT SLO: saturated, c = 1 -> median
    assert adaptive.margin() == pytest.approx(0.0)
    s.report_prefill_load("p0", 5.0)  # c = 0.5 -> the 1/3 quantile
    assert adaptive.margin() == pytest.approx(-0.17)
    # the other modes judge the prediction as it is: no margin
    assert not isinstance(make(AdmissionMode.PREDICTED, clock).strategy, AdaptiveAdmission)


def test_adaptive_records_prediction_errors_at_handoff(clock: FakeClock) -> None:
    s = make(AdmissionMode.PREDICTED_ADAPTIVE, clock)
    s.schedule(req("r1"))
    clock.advance(PREFILL)
    s.start_decode("r1")
    assert isinstance(s.strategy, AdaptiveAdmission)
    assert len(s.strategy.errors) == 1 and s.strategy.errors[0] == pytest.approx(0.0)


def test_decode_refusal_without_and_with_repick(clock: FakeClock) -> None:
    """The planned decode instance fills up while r1 is in prefill: it refuses r1 (wasted
    prefill) unless ``repick_decode`` lets another instance take it."""
    for repick, expect in ((False, RejectReason.DECODE_OVERLOADED), (True, None)):
        c = FakeClock(0.0)
        s = make(AdmissionMode.REJECT_AT_DECODE, c, repick_decode=repick)
        s.register_instance(InstanceSpec("d1", "e", Role.DECODE))
        planned = s.schedule(req("r1")).decode_instance_id
        assert planned is not None
        c.advance(PREFILL)
        s.report_decode_load(planned, 1, 1000.0)  # someone else's request got there first
        h = s.start_decode("r1")
        assert h.reason is expect
        if repick:
            assert h.decode_instance_id not in (None, planned)
