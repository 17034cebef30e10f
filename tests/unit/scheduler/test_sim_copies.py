"""The replay's executed copies (issue 19 §4): bytes moved per admitted request, and the
prefill waiting for a copy at a given rate instead of the cost model's transfer time."""

from __future__ import annotations

import dataclasses

import pytest

from kvstored.errors import InvalidArgument
from kvstored.scheduler.config import AdmissionMode, Policy
from kvstored.scheduler.costmodel import CostModel, CostProfile
from kvstored.scheduler.sim import ClusterConfig, replay
from kvstored.scheduler.trace import load_trace, resolve_trace

RECORDS = load_trace(resolve_trace("conversation"), limit=600)
CLUSTER = ClusterConfig(num_prefill=4, num_decode=4, cache_blocks=2000, speed=1.0)


def test_copies_are_counted_in_bytes_of_the_fetched_blocks() -> None:
    r = replay(RECORDS, Policy.KVCACHE_CENTRIC, AdmissionMode.NONE, CLUSTER)
    block_bytes = CostModel(CostProfile.default(), CLUSTER.block_tokens).block_bytes
    assert r.admitted == len(RECORDS) and 0 < r.copies <= r.admitted
    assert r.copied_bytes == r.fetched_blocks * block_bytes > 0
    model = CostModel(CostProfile.default(), CLUSTER.block_tokens)
    assert r.copy_s == pytest.approx(model.transfer_s(r.fetched_blocks, remote=True))


def test_a_slow_copy_lengthens_ttft_by_its_real_time() -> None:
    fast = replay(RECORDS, Policy.KVCACHE_CENTRIC, AdmissionMode.NONE, CLUSTER)
    slow = replay(RECORDS, Policy.KVCACHE_CENTRIC, AdmissionMode.NONE,
                  dataclasses.replace(CLUSTER, copy_bytes_per_s=1e9))
    model = CostModel(CostProfile.default(), CLUSTER.block_tokens)
    # each copy now takes bytes / 1 GB/s plus the engine's load from its own DRAM (which
    # copies are planned may differ: the caches fill at other times)
    assert slow.copies > 0
    assert slow.copy_s == pytest.approx(slow.copied_bytes / 1e9 + model.transfer_s(
        slow.fetched_blocks, remote=False))
    assert slow.avg_ttft_s > fast.avg_ttft_s
    with pytest.raises(InvalidArgument, match="copy_bytes_per_s must be >= 0"):
        replay(RECORDS, Policy.KVCACHE_CENTRIC, AdmissionMode.NONE,
               dataclasses.replace(CLUSTER, copy_bytes_per_s=-1.0))


def test_replay_copy_gbps_flag_runs_the_copies_at_that_rate(tmp_path: object) -> None:
    import json

    from click.testing import CliRunner

    from kvstored.scheduler.cli import replay as replay_cmd

    args = ["--trace", "conversation", "--limit", "300", "--prefill", "4", "--decode", "4",
            "--policy", "kvcache-centric", "--admission", "none", "--speed", "1",
            "--output", "json", "--no-progress"]
    runs = {}
    for gbps in ("0", "1"):
        res = CliRunner().invoke(replay_cmd, [*args, "--copy-gbps", gbps])
        assert res.exit_code == 0, res.output
        runs[gbps] = json.loads(res.output)["results"][0]
    fast, slow = runs["0"], runs["1"]
    assert fast["copies"] > 0 and slow["copies"] > 0
    assert slow["copy_s"] / slow["copies"] > 10 * fast["copy_s"] / fast["copies"]
    res = CliRunner().invoke(replay_cmd, [*args, "--copy-gbps", "-1"])
    assert res.exit_code == 2 and "--copy-gbps" in res.output
