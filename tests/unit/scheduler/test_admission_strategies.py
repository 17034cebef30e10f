"""The admission strategies (kvstored/scheduler/admission.py): one per mode, with the
table of the module docstring as their flags."""

from __future__ import annotations

import pytest

from kvstored.errors import InvalidArgument
from kvstored.scheduler.admission import (
    AdaptiveAdmission,
    MeasuredAdmission,
    PredictedAdmission,
    QuantileAdmission,
    make_admission,
)
from kvstored.scheduler.config import AdmissionMode, SchedulerConfig

M = AdmissionMode
# mode -> (strategy class, TTFT checked at arrival, TBT checked at arrival, handoff may refuse)
TABLE = {
    M.NONE: (MeasuredAdmission, False, False, False),
    M.REJECT_AT_DECODE: (MeasuredAdmission, True, False, True),
    M.EARLY: (MeasuredAdmission, True, True, True),
    M.PREDICTED: (PredictedAdmission, True, True, True),
    M.PREDICTED_LENGTH: (PredictedAdmission, True, True, True),
    M.PREDICTED_ADAPTIVE: (AdaptiveAdmission, True, True, True),
    M.PREDICTED_QUANTILE: (QuantileAdmission, True, True, True),
}


def test_every_mode_has_a_strategy_with_the_documented_flags() -> None:
    assert set(TABLE) == set(AdmissionMode)
    for mode, (cls, ttft, tbt, enforce) in TABLE.items():
        got = make_admission(SchedulerConfig(admission=mode), prefill_load=lambda: 0.0,
                             uniform_decode_s=lambda: 20.0)
        assert type(got) is cls and got.mode is mode, mode
        assert (got.checks_ttft, got.enforces_decode) == (ttft, enforce), mode
        assert got.rejects_tbt(1.5, 1.0) is tbt, mode  # over the limit: refused iff checked
        assert got.rejects_tbt(1.0, 1.0) is False, mode  # at the limit: admitted


def test_a_strategy_refuses_a_mode_it_does_not_implement() -> None:
    cfg = SchedulerConfig()
    with pytest.raises(InvalidArgument, match="does not implement"):
        MeasuredAdmission(M.PREDICTED, cfg)
    with pytest.raises(InvalidArgument, match="does not implement"):
        PredictedAdmission(M.EARLY, cfg, lambda: 20.0)


def test_the_adaptive_margin_reads_the_prefill_load_when_it_decides() -> None:
    load = [0.0]
    s = AdaptiveAdmission(SchedulerConfig(admission=M.PREDICTED_ADAPTIVE), lambda: load[0])
    for _ in range(AdaptiveAdmission.MIN_ERRORS - 1):
        s.record_error(1.0)
    assert s.margin() == 0.0  # too few errors yet
    s.record_error(-1.0)
    assert s.margin() == -1.0  # idle prefill: the smallest error
    load[0] = 1.0
    assert s.margin() == 1.0  # saturated prefill: the median of 31 x 1.0 and one -1.0
