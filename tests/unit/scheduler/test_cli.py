"""``kvstored replay`` / ``kvstored calibrate`` commands (click runner, tiny inputs)."""

from __future__ import annotations

import json
import os
import pathlib

import pytest
from click.testing import CliRunner

from kvstored.scheduler.cli import calibrate, replay
from kvstored.scheduler.costmodel import CostProfile
from kvstored.scheduler.trace import synthetic_trace


@pytest.fixture
def trace_file(tmp_path: pathlib.Path) -> pathlib.Path:
    p = tmp_path / "t.jsonl"
    with p.open("w") as fh:
        for r in synthetic_trace(300, rate_per_s=6.0, seed=5):
            fh.write(json.dumps({"timestamp": r.timestamp_ms, "input_length": r.input_tokens,
                                 "output_length": r.output_tokens,
                                 "hash_ids": list(r.hash_ids)}) + "\n")
    return p


def test_replay_json_has_every_field(trace_file: pathlib.Path, tmp_path: pathlib.Path) -> None:
    out = tmp_path / "r.json"
    res = CliRunner().invoke(replay, [
        str(trace_file), "--prefill", "2", "--decode", "1", "--cache-blocks", "200",
        "--policy", "cache-aware,kvcache-centric", "--admission", "early,predicted",
        "--output", "json", "--json-out", str(out), "--no-progress",
    ])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert len(doc["results"]) == 4
    for pol in ("cache-aware", "kvcache-centric"):
        for mode in ("early", "predicted"):
            row = doc["by_policy"][pol][mode]
            assert set(row) >= {"avg_ttft_s", "p90_ttft_s", "tbt_slo_attainment", "completed",
                                "rejected", "wasted_prefills", "hit_ratio"}
    assert "timeline" in json.loads(out.read_text())["results"][0]


def test_replay_table_plots_and_hit_curve(trace_file: pathlib.Path,
                                          tmp_path: pathlib.Path) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib (the [sim] extra) is not installed")
    plot, tl = tmp_path / "cmp.png", tmp_path / "tl.png"
    res = CliRunner().invoke(replay, [
        str(trace_file), "--prefill", "2", "--decode", "1", "--policy", "random",
        "--admission", "early", "--plot", str(plot), "--timeline-plot", str(tl),
        "--hit-curve", "--no-progress",
    ])
    assert res.exit_code == 0, res.output
    assert "random" in res.output and "prefix-hit ratio" in res.output
    assert plot.read_bytes()[:4] == b"\x89PNG" and tl.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(("args", "msg"), [
    (["--policy", "fastest"], "unknown policy"),
    (["--admission", "later"], "unknown admission mode"),
    (["--cache-blocks", "0"], "must be >= 1"),
])
def test_replay_bad_arguments(trace_file: pathlib.Path, args: list[str], msg: str) -> None:
    res = CliRunner().invoke(replay, [str(trace_file), "--no-progress", *args])
    assert res.exit_code == 2 and msg in res.output


@pytest.mark.slow  # importing transformers alone takes 20-60 s on a busy 2-core machine
def test_calibrate_writes_a_loadable_profile(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("transformers", reason="transformers (the [demo] extra) is not installed")
    out = tmp_path / "prof.json"
    res = CliRunner().invoke(calibrate, [
        "--output", str(out), "--layers", "1", "--hidden-size", "32", "--heads", "2",
        "--kv-heads", "1", "--intermediate-size", "64", "--max-tokens", "64", "--repeats", "1",
        "--no-io",
    ])
    assert res.exit_code == 0, res.output
    prof = CostProfile.load(out)
    assert prof.source == "kvstored calibrate"
    assert prof.kv_bytes_per_token == 2 * 1 * 1 * 16 * 4
    assert len(prof.fit["prefill_samples"]) >= 6 and prof.prefill.per_token_s >= 0


def test_replay_sweeps_noise_seeds_and_speed(trace_file: pathlib.Path,
                                             tmp_path: pathlib.Path) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib (the [sim] extra) is not installed")
    png = tmp_path / "noise.png"
    res = CliRunner().invoke(replay, [
        str(trace_file), "--prefill", "2", "--decode", "1", "--cache-blocks", "200",
        "--policy", "kvcache-centric", "--admission", "predicted,predicted-quantile",
        "--length-noise", "0,0.5", "--seed", "0,1,2", "--speed", "1,2", "--output", "json",
        "--noise-plot", str(png), "--no-progress",
    ])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert len(doc["results"]) == 2 * 2 * 2 * 3
    assert sum(r["reused"] for r in doc["results"]) == 2 * 5  # predicted: 1 run per speed
    rows = doc["robustness"]
    assert len(rows) == 2 * 2 * 2
    assert all(r["seeds"] == [0, 1, 2] for r in rows)
    assert {(r["speed"], r["length_noise"]) for r in rows} == {(1.0, 0.0), (1.0, 0.5),
                                                               (2.0, 0.0), (2.0, 0.5)}
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_replay_finds_shipped_traces_by_name() -> None:
    res = CliRunner().invoke(replay, ["--trace", "synthetic", "--limit", "40", "--policy",
                                      "cache-aware", "--admission", "early", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "synthetic_trace.jsonl: 40 requests" in res.output
    res = CliRunner().invoke(replay, ["--trace", "nosuch", "--no-progress"])
    assert res.exit_code == 1 and "neither a shipped trace (conversation, synthetic)" in res.output


@pytest.mark.parametrize("opt", ["--plot", "--timeline-plot", "--noise-plot", "--json-out"])
def test_replay_checks_output_paths_before_running(trace_file: pathlib.Path, opt: str,
                                                   tmp_path: pathlib.Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def no_run(*a: object, **k: object) -> None:
        raise AssertionError("the replay ran before the output path was checked")

    monkeypatch.setattr("kvstored.scheduler.robustness.sweep", no_run)
    bads = [(tmp_path / "missing" / "x.png", "does not exist"), (tmp_path, "is a directory"),
            (pathlib.Path("/proc/kvstored-x.png"), "cannot be written" if os.geteuid() == 0
             else "is not writable")]  # root passes os.access, so the file is opened for real
    if opt != "--json-out":
        pytest.importorskip("matplotlib", reason="matplotlib (the [sim] extra) is not installed")
        bads.append((tmp_path / "x.txt", "matplotlib cannot write 'txt'"))
    for bad, msg in bads:
        res = CliRunner().invoke(replay, [str(trace_file), opt, str(bad), "--no-progress"])
        assert res.exit_code == 2, res.output
        assert opt in res.output and msg in res.output, res.output
    assert not (tmp_path / "x.txt").exists()  # the check leaves no file behind


def test_replay_checks_matplotlib_before_running(trace_file: pathlib.Path,
                                                 tmp_path: pathlib.Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)  # import fails
    monkeypatch.setattr("kvstored.scheduler.robustness.sweep", lambda *a, **k: 1 / 0)
    res = CliRunner().invoke(replay, [str(trace_file), "--plot", str(tmp_path / "x.png"),
                                      "--no-progress"])
    assert res.exit_code == 2 and "plots need matplotlib" in res.output


@pytest.mark.parametrize(("args", "msg"), [
    (["--length-noise", "-1"], "--length-noise must be >= 0"),
    (["--length-noise", "0,x"], "must be a number"),
    (["--speed", "0"], "--speed must be > 0"),
    (["--seed", "a"], "must be an integer"),
])
def test_replay_bad_lists(trace_file: pathlib.Path, args: list[str], msg: str) -> None:
    res = CliRunner().invoke(replay, [str(trace_file), "--no-progress", *args])
    assert res.exit_code == 2 and msg in res.output, res.output
