"""Robustness sweeps: which runs may be reused across noise and seeds, and the summaries."""

from __future__ import annotations

import dataclasses

import pytest

from kvstored.scheduler.config import AdmissionMode, Policy
from kvstored.scheduler.robustness import (
    LENGTH_AWARE_MODES,
    cell,
    markdown_table,
    summarize,
    sweep,
)
from kvstored.scheduler.sim import ClusterConfig, ReplayResult, replay
from kvstored.scheduler.trace import SHIPPED_TRACES, load_trace, resolve_trace, synthetic_trace

HOT = ClusterConfig(num_prefill=2, num_decode=1, cache_blocks=500, speed=4.0,
                    decode_kv_capacity_tokens=150_000)


def _outcome(r: ReplayResult) -> dict[str, object]:
    d = r.summary()
    for k in ("wall_s", "length_noise", "seed"):
        d.pop(k)
    return d


@pytest.mark.parametrize("mode", [m for m in AdmissionMode if m not in LENGTH_AWARE_MODES])
def test_modes_that_ignore_lengths_do_not_depend_on_noise_or_seed(mode: AdmissionMode) -> None:
    """The rule that lets sweep() reuse a run: outside the length-aware modes (and the random
    policy) neither the noise nor the seed changes anything."""
    trace = synthetic_trace(500, rate_per_s=6.0, seed=3)
    a = replay(trace, Policy.KVCACHE_CENTRIC, mode, HOT)
    b = replay(trace, Policy.KVCACHE_CENTRIC, mode,
               dataclasses.replace(HOT, length_noise=1.0, seed=7))
    assert _outcome(a) == _outcome(b)


@pytest.mark.parametrize("mode", sorted(LENGTH_AWARE_MODES))
def test_length_aware_modes_see_the_noise(mode: AdmissionMode) -> None:
    trace = synthetic_trace(500, rate_per_s=6.0, seed=3)
    a = replay(trace, Policy.KVCACHE_CENTRIC, mode, HOT)
    b = replay(trace, Policy.KVCACHE_CENTRIC, mode, dataclasses.replace(HOT, length_noise=1.0))
    assert _outcome(a) != _outcome(b)


def test_sweep_runs_each_noise_dependent_cell_and_reuses_the_rest() -> None:
    trace = synthetic_trace(200, rate_per_s=6.0, seed=1)
    ran: list[tuple[str, float, int]] = []
    cells = sweep(trace, [Policy.KVCACHE_CENTRIC],
                  [AdmissionMode.PREDICTED, AdmissionMode.PREDICTED_QUANTILE], HOT,
                  sigmas=[0.0, 0.5], seeds=[0, 1], speeds=[3.0, 4.0],
                  on_run=lambda r: ran.append((r.admission, r.length_noise, r.seed)))
    assert len(cells) == 2 * 2 * 2 * 2
    # per speed: predicted once, predicted-quantile at every (sigma, seed)
    assert ran == 2 * [("predicted", 0.0, 0), ("predicted-quantile", 0.0, 0),
                       ("predicted-quantile", 0.0, 1), ("predicted-quantile", 0.5, 0),
                       ("predicted-quantile", 0.5, 1)]
    reused = [(r.admission, r.length_noise, r.seed, r.speed) for r, re in cells if re]
    assert reused == [("predicted", s, seed, speed) for speed in (3.0, 4.0)
                      for s, seed in ((0.0, 1), (0.5, 0), (0.5, 1))]
    assert {r.speed for r, _ in cells} == {3.0, 4.0}


def test_summarize_gives_mean_min_max_over_seeds() -> None:
    rs = [ReplayResult("p", "m", 10, rejected=rej, completed_within_slo=10 - rej,
                       length_noise=0.5, seed=seed, speed=2.0)
          for seed, rej in enumerate((1, 4, 7))]
    rs.append(ReplayResult("p", "m", 10, rejected=3, length_noise=0.0, seed=0, speed=2.0))
    rows = summarize([(r, False) for r in rs])
    row = cell(rows, admission="m", length_noise=0.5)
    assert (row["rejected_mean"], row["rejected_min"], row["rejected_max"]) == (4.0, 1, 7)
    assert row["completed_within_slo_mean"] == 6.0 and row["seeds"] == [0, 1, 2]
    assert cell(rows, admission="m", length_noise=0.0)["rejected_max"] == 3
    assert markdown_table(rows).splitlines()[2] == "| 2× | p | m | 3 | 4 (1–7) |"
    with pytest.raises(KeyError):
        cell(rows, admission="m", length_noise=0.3)


def test_shipped_traces_resolve_by_name() -> None:
    counts = {"conversation": 12_031, "synthetic": 3_993}
    for name in SHIPPED_TRACES:
        p = resolve_trace(name)
        assert p.parent.name == "traces" and p.parent.parent.name == "scheduler"
        with p.open() as fh:
            assert sum(1 for _ in fh) == counts[name]
    assert len(load_trace(resolve_trace("synthetic"), limit=5)) == 5
