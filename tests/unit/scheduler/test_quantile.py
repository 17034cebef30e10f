"""``predicted-quantile`` admission and its output-length model, on patterns with known answers.

Same set-up as test_admission.py: one prefill and one decode instance that holds one request
(max batch 1), so a new request fits exactly when the request already there has left; the
question is with what probability it has, and whether the mode admits on that probability.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from sched_helpers import make_profile

from kvstored.clock import FakeClock
from kvstored.scheduler.admission import QuantileAdmission
from kvstored.scheduler.config import AdmissionMode, Policy, SchedulerConfig
from kvstored.scheduler.core import Scheduler
from kvstored.scheduler.costmodel import CostModel
from kvstored.scheduler.lengths import NUM_QUANTILES, OutputLengthModel, survival
from kvstored.scheduler.types import InstanceSpec, RejectReason, Role, ScheduleRequest

PREFILL = 0.1 + 0.16 + 1e-9 * 1600**2  # prefill(1600, 0) of the test profile
STEP = 0.01 + 0.001 + 1e-6 * 1600  # decode step with one 1600-token request


def make(clock: FakeClock, mode: AdmissionMode = AdmissionMode.PREDICTED_QUANTILE,
         **cfg: object) -> Scheduler:
    conf = SchedulerConfig(policy=Policy.CACHE_AWARE, admission=mode, block_tokens=16,
                           instance_ttl_s=None, tbt_slo_s=1.0, **cfg)  # type: ignore[arg-type]
    s = Scheduler(conf, CostModel(make_profile(decode__max_batch_requests=1), 16), clock)
    s.register_instance(InstanceSpec("p0", "a", Role.PREFILL))
    s.register_instance(InstanceSpec("d0", "d", Role.DECODE))
    return s


def _lengths(s: Scheduler) -> OutputLengthModel:
    """The quantile strategy's output-length model."""
    assert isinstance(s.strategy, QuantileAdmission)
    return s.strategy.lengths


def req(rid: str, out: int = 0) -> ScheduleRequest:
    return ScheduleRequest(rid, [], 1600, expected_output_tokens=out)


def bimodal_history(s: Scheduler, short: int = 100, long: int = 100) -> None:
    """Completed requests: ``short`` of 5 tokens and ``long`` of 1000 tokens (one bucket)."""
    for _ in range(short):
        _lengths(s).observe(1600, 5)
    for _ in range(long):
        _lengths(s).observe(1600, 1000)


def start_r1(s: Scheduler, c: FakeClock, out: int = 0) -> None:
    assert s.schedule(req("r1", out)).admitted
    c.advance(PREFILL)
    assert s.start_decode("r1").admitted


# ---- the length model -------------------------------------------------------------------
def test_exact_prediction_gives_a_point_mass() -> None:
    m = OutputLengthModel(256, length_sigma=0.0)
    assert np.array_equal(m.length_quantiles(1600, 37), np.full(NUM_QUANTILES, 37.0))


def test_without_prediction_the_quantiles_follow_the_history() -> None:
    m = OutputLengthModel(256, prior_count=1e-9, bucket_shrinkage=0.0)
    for _ in range(50):
        m.observe(1600, 5)
        m.observe(1600, 1000)
    q = m.length_quantiles(1600)
    # half the quantiles near 5 tokens, half near 1000 (kernel smoothing: within ~40%)
    assert np.all((q[: NUM_QUANTILES // 2] > 3) & (q[: NUM_QUANTILES // 2] < 8))
    assert np.all((q[NUM_QUANTILES // 2:] > 600) & (q[NUM_QUANTILES // 2:] < 1600))


def test_a_prediction_selects_the_mode_it_is_near() -> None:
    m = OutputLengthModel(256, length_sigma=0.5, prior_count=1e-9, bucket_shrinkage=0.0)
    for _ in range(50):
        m.observe(1600, 5)
        m.observe(1600, 1000)
    assert np.all(m.length_quantiles(1600, 800) > 500)  # "long" picks the long mode only
    assert np.all(m.length_quantiles(1600, 6) < 10)


def test_history_is_per_input_bucket() -> None:
    m = OutputLengthModel(256, prior_count=1e-9, bucket_shrinkage=0.0)
    for _ in range(50):
        m.observe(1000, 10)  # short prompts: short answers
        m.observe(50_000, 2000)  # long prompts: long answers
    assert np.all(m.length_quantiles(1000) < 20)
    assert np.all(m.length_quantiles(50_000) > 1000)


def test_predictor_error_is_learned_from_completed_requests() -> None:
    m = OutputLengthModel(256)
    assert m.sigma == 1.0  # before 16 samples
    for i in range(20):
        m.observe(1600, 100, round(100 * math.exp(0.5 if i % 2 else -0.5)))
    assert m.sigma == pytest.approx(0.5, abs=0.01)
    assert OutputLengthModel(256, length_sigma=0.3).sigma == 0.3


def test_survival_is_conditioned_on_tokens_generated() -> None:
    q = np.array([[5.0] * 16 + [1000.0] * 16, [10.0] * 32])
    p = survival(q, np.array([0.0, 20.0]), np.array([20.0, 41.0]))
    # row 0: half the mass is beyond 20 tokens; row 1 outlived every quantile: Pareto tail
    assert p.tolist() == [0.5, 21 / 42]
    p = survival(q[:1], np.array([50.0]), np.array([70.0]))
    assert p.tolist() == [1.0]  # past the short mode: surely a long one


# ---- admission decisions ----------------------------------------------------------------
def test_exact_lengths_decide_as_predicted_length(clock: FakeClock) -> None:
    """sigma 0 is the per-request limit: r1 with 1000 tokens still holds the slot when r2's
    prefill ends (refused at arrival); with 10 tokens it is gone (admitted, handoff fits)."""
    for out, admitted in ((1000, False), (10, True)):
        c = FakeClock(0.0)
        s = make(c, length_sigma=0.0)
        start_r1(s, c, out)
        d = s.schedule(req("r2", 100))
        assert d.admitted is admitted
        if admitted:
            c.advance(out * STEP)
            assert s.finish_request("r1", out)
            c.advance(PREFILL)
            assert s.start_decode("r2").admitted
        else:
            assert d.reason is RejectReason.TBT_SLO


def test_admits_by_probability_of_fitting(clock: FakeClock) -> None:
    """Lengths unknown, history half 5 / half 1000 tokens. r2 arrives as r1 starts: r1 is gone
    by r2's join (after ~21 tokens) with probability ~1/2. Requiring 0.4 admits, requiring 0.6
    refuses."""
    for q, admitted in ((0.4, True), (0.6, False)):
        c = FakeClock(0.0)
        s = make(c, admit_probability=q)
        bimodal_history(s)
        start_r1(s, c)
        d = s.schedule(req("r2"))
        assert d.admitted is admitted, q
        assert d.predicted_decode_load == pytest.approx(1.0, abs=0.2)


def test_a_request_found_running_is_a_long_one(clock: FakeClock) -> None:
    """The inspection paradox: once r1 has generated 50 tokens it is past the short mode, so it
    will surely still be running when r2's prefill ends: refused even at probability 0.05,
    which admits when r1 has just started."""
    for wait_tokens, admitted in ((0, True), (50, False)):
        c = FakeClock(0.0)
        s = make(c, admit_probability=0.05)
        bimodal_history(s)
        start_r1(s, c)
        c.advance(wait_tokens * STEP)
        d = s.schedule(req("r2"))
        assert d.admitted is admitted, wait_tokens
        if not admitted:
            assert d.reason is RejectReason.TBT_SLO


def test_default_probability_follows_prefill_pressure(clock: FakeClock) -> None:
    """admit_probability None = c / (1 + c), c = mean prefill load. A second prefill instance
    p1 idle (c = 0: admit whatever may fit) or with a full 60 s queue (c = (0 + 60) / (2 * 30) =
    1 -> 0.5); r2 goes to the idle p0 either way. History 40% short / 60% long: r2 fits with
    probability ~0.4, enough for an idle prefill side, not for a saturated one."""
    results = {}
    for queued_s in (0.0, 60.0):
        c = FakeClock(0.0)
        s = make(c)
        s.register_instance(InstanceSpec("p1", "b", Role.PREFILL))
        bimodal_history(s, short=80, long=120)
        start_r1(s, c)
        s.report_prefill_load("p1", queued_s)
        d = s.schedule(req("r2"))
        assert d.prefill_instance_id == "p0"
        results[queued_s] = d.admitted
    assert results == {0.0: True, 60.0: False}


def test_rows_follow_requests_from_prefill_to_decode(clock: FakeClock) -> None:
    """The length distribution of a request moves with it to its decode-table row (here a
    different row: r1, cancelled in prefill, freed a lower one), and a finished request feeds
    the history (with its predicted length, for the predictor's error)."""
    s = make(clock, length_sigma=0.0)
    s.register_instance(InstanceSpec("d1", "e", Role.DECODE))
    assert s.schedule(req("r1", 7)).admitted
    assert s.schedule(req("r2", 40)).admitted
    assert s.finish_request("r1")  # cancelled while in prefill
    clock.advance(2 * PREFILL)
    assert s.start_decode("r2").admitted
    _, rec = s._running["r2"]
    assert rec.slot == 0 and s._pending == {}
    assert _lengths(s).quantiles[rec.slot].tolist() == [40.0] * NUM_QUANTILES
    assert _lengths(s).predicted[rec.slot] == 40
    clock.advance(40 * STEP)
    assert s.finish_request("r2", 20)
    assert _lengths(s).num_observed == 1
    assert _lengths(s)._err_n == 1 and _lengths(s)._err_sq == pytest.approx(math.log(2) ** 2)
