"""Cost model: known answers, validation, profile files, fitting."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
from sched_helpers import make_profile

from kvstored.errors import ConfigInvalid, InvalidArgument
from kvstored.scheduler.calibrate import fit_decode, fit_nonnegative, fit_prefill
from kvstored.scheduler.costmodel import CostModel, CostProfile


def test_prefill_time_known_answers(cost: CostModel) -> None:
    assert cost.prefill_s(10_000) == pytest.approx(0.1 + 1.0 + 0.1)
    # 5000 cached: 0.1 + 1e-4 * 5000 + 1e-9 * (1e8 - 2.5e7)
    assert cost.prefill_s(10_000, 5_000) == pytest.approx(0.675)
    # a fully cached prompt still computes its last token
    assert cost.prefill_s(100, 100) == cost.prefill_s(100, 99)


def test_cached_tokens_from_blocks(cost: CostModel) -> None:
    assert cost.cached_tokens(100, 3) == 48  # 3 blocks of 16 tokens
    assert cost.cached_tokens(40, 3) == 39  # never the whole prompt
    assert cost.cached_tokens(40, 0) == 0


@pytest.mark.parametrize(("n", "p"), [(0, 0), (-5, 0), (10, -1)])
def test_prefill_rejects_bad_lengths(cost: CostModel, n: int, p: int) -> None:
    with pytest.raises(InvalidArgument):
        cost.prefill_s(n, p)


def test_transfer_time_by_source(cost: CostModel) -> None:
    assert cost.block_bytes == 16_000
    assert cost.transfer_s(3, remote=True) == pytest.approx(3.0)
    assert cost.transfer_s(3, remote=True, ssd=True) == pytest.approx(6.0)
    assert cost.transfer_s(10, remote=False) == pytest.approx(1e-4)
    assert cost.transfer_s(2, remote=False, ssd=True) == pytest.approx(2e-3)
    assert cost.transfer_s(0, remote=True) == 0.0


def test_fetch_versus_recompute(cost: CostModel) -> None:
    # 10_000-token prompt, 0 local, fetching 1 block (16 tokens) saves ~1.6 ms but costs 1 s
    assert not cost.is_fetch_faster(10_000, 0, 1, 16)
    fast = CostModel(make_profile(bandwidth_bytes_per_s__remote_dram=1.6e9), block_tokens=16)
    # 100 blocks = 1600 tokens: 1.6 MB at 1.6 GB/s = 1 ms, saves ~0.16 s of prefill
    assert fast.is_fetch_faster(10_000, 0, 100, 1600)


def test_tbt_and_decode_load(cost: CostModel) -> None:
    assert cost.tbt_s(10, 20_000) == pytest.approx(0.01 + 0.01 + 0.02)
    assert cost.decode_load(10, 20_000, 0.04) == pytest.approx(1.0)
    capped = CostModel(make_profile(decode__kv_capacity_tokens=10_000,
                                    decode__max_batch_requests=4), block_tokens=16)
    assert capped.decode_load(2, 20_000, 1.0) == pytest.approx(2.0)  # KV bound
    assert capped.decode_load(8, 100, 1.0) == pytest.approx(2.0)  # batch bound


def test_block_tokens_must_be_positive() -> None:
    with pytest.raises(InvalidArgument):
        CostModel(make_profile(), block_tokens=0)


def test_default_profile_loads_and_round_trips(tmp_path: pathlib.Path) -> None:
    prof = CostProfile.default()
    assert prof.kv_bytes_per_token == 327_680  # Llama-70B-shaped, bf16
    path = tmp_path / "p.json"
    prof.save(path)
    assert CostProfile.load(path) == prof


def test_bad_profile_names_the_field(tmp_path: pathlib.Path) -> None:
    doc = json.loads(CostProfile.default().model_dump_json())
    doc["prefill"]["per_token_s"] = -1
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigInvalid, match="prefill.per_token_s"):
        CostProfile.load(path)
    path.write_text("{not json")
    with pytest.raises(ConfigInvalid, match="not valid JSON"):
        CostProfile.load(path)
    with pytest.raises(ConfigInvalid, match="cannot read"):
        CostProfile.load(tmp_path / "missing.json")


def test_fit_recovers_known_coefficients() -> None:
    samples = [(n, p, 0.05 + 2e-4 * (n - p) + 3e-8 * (n * n - p * p))
               for n in (100, 200, 400, 800) for p in (0, n // 2)]
    coef, resid = fit_prefill(samples)
    assert coef.base_s == pytest.approx(0.05, rel=1e-6)
    assert coef.per_token_s == pytest.approx(2e-4, rel=1e-6)
    assert coef.per_token_sq_s == pytest.approx(3e-8, rel=1e-6)
    assert resid < 1e-9
    dec = [(b, c, 0.02 + 0.003 * b + 1e-6 * c) for b in (1, 2, 4) for c in (100, 1000)]
    (d0, db, dc), _ = fit_decode(dec)
    assert (d0, db, dc) == pytest.approx((0.02, 0.003, 1e-6), rel=1e-6)


def test_fit_drops_negative_terms() -> None:
    x = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    y = np.array([3.0, 2.0, 1.0])  # falling: the slope would be negative
    coef = fit_nonnegative(x, y)
    assert (coef >= 0).all()
    assert coef[1] == 0 and coef[0] == pytest.approx(2.0)
    with pytest.raises(InvalidArgument):
        fit_nonnegative(x[:1], y[:1])
