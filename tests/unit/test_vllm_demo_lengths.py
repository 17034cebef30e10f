"""``kvstored demo --engine vllm`` in its default form, with a stand-in engine (no vLLM needed).

The default lengths (1024, 4096, 8192) asked vLLM for a ``max_model_len`` over SmolLM2's
8192-token context at 8192 tokens: the third length failed after minutes and the two finished
rows were lost. Each length is capped to the model's context the way the transformers demo
does, and every row is printed as soon as it finishes (a later failure keeps them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kvstored.demo import corpus, vllm_demo
from kvstored.demo import daemon as demo_daemon
from kvstored.demo.cli import demo
from kvstored.errors import KvstoredError

CONTEXT_TOKENS = 8192
QUESTION_AND_TAIL_TOKENS = 30  # what the real chat template and question add (~20-40)


def test_fit_to_context_caps_the_shared_part_to_what_the_context_leaves() -> None:
    fit = corpus.fit_to_context
    room = CONTEXT_TOKENS - 32 - corpus.QUESTION_ROOM_TOKENS
    assert fit(1024, CONTEXT_TOKENS, 32) == 1024
    assert fit(8192, CONTEXT_TOKENS, 32) == room
    assert fit(8192, CONTEXT_TOKENS, 32, block_size=256) == room // 256 * 256
    assert fit(1000, CONTEXT_TOKENS, 32, block_size=256) == 768
    assert fit(100, 200, 32, block_size=256) == 256  # at least one block


class _Events:
    """What happened, in order: engine starts (with their spec) and rows printed."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []
        self.fail_at_engine: int | None = None


class _FakeEngine:
    """Stands in for :class:`EngineProcess`; refuses what vLLM refuses for this model."""

    events: _Events

    def __init__(self, python: Path, spec: dict[str, Any], workdir: Path,
                 env: dict[str, str] | None = None) -> None:
        self.spec = spec
        self.index = sum(1 for kind, _ in self.events.log if kind == "engine")
        self.events.log.append(("engine", spec))

    def result(self, timeout_s: float = 0.0) -> dict[str, Any]:
        spec = self.spec
        if self.index == self.events.fail_at_engine:
            raise KvstoredError("vLLM engine process failed (exit 1)")
        if spec["max_model_len"] > CONTEXT_TOKENS:  # vLLM's own check, word for word
            raise KvstoredError(
                f"vLLM engine process failed (exit 1): User-specified max_model_len "
                f"({spec['max_model_len']}) is greater than the derived max_model_len "
                f"({CONTEXT_TOKENS})"
            )
        (prompt,) = spec["prompts"]
        steps = []
        hit = self.index % 2 == 1
        for step in spec["steps"]:
            assert len(prompt) + step["max_tokens"] <= spec["max_model_len"], spec
            steps.append({"wall_s": 1.0 if hit else 4.0,
                          "num_cached_tokens": (len(prompt) - 1) // 128 * 128 if hit else 0,
                          "token_ids": [7] * step["max_tokens"], "text": "json"})
        return {"steps": steps}

    def kill(self) -> None:
        pass


class _FakeDaemon:
    def __init__(self, workdir: Path, **kwargs: Any) -> None:
        self.address = "unix:/nonexistent/kvstored.sock"

    def start(self) -> None:
        pass

    def stop(self) -> int:
        return 0


@pytest.fixture
def events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> _Events:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": CONTEXT_TOKENS}))
    ev = _Events()

    def build_prompts(model: Path, shared_tokens: int, questions: Any, index: int = 0
                      ) -> tuple[str, list[list[int]]]:
        return f"doc {index}", [[1] * (shared_tokens + QUESTION_AND_TAIL_TOKENS)]

    engine = type("Engine", (_FakeEngine,), {"events": ev})
    monkeypatch.setattr(vllm_demo, "find_vllm_python", lambda: tmp_path / "python")
    monkeypatch.setattr(vllm_demo, "find_model", lambda python: model)
    monkeypatch.setattr(vllm_demo, "build_prompts", build_prompts)
    monkeypatch.setattr(vllm_demo, "EngineProcess", engine)
    monkeypatch.setattr(demo_daemon, "ManagedDaemon", _FakeDaemon)
    return ev


def test_default_lengths_fit_the_model_context(events: _Events, tmp_path: Path) -> None:
    saved = tmp_path / "report.json"
    r = CliRunner().invoke(demo, ["--engine", "vllm", "--output", "json",
                                  "--save-json", str(saved)])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["rows"]
    assert [row["prompt_tokens"] for row in rows] == [
        1024 + QUESTION_AND_TAIL_TOKENS, 4096 + QUESTION_AND_TAIL_TOKENS,
        CONTEXT_TOKENS - 32 - 64 + QUESTION_AND_TAIL_TOKENS,  # 32 to answer, 64 for the question
    ]
    assert "8192 tokens do not fit the model's context" in r.stderr.replace("\n", " ")
    assert json.loads(saved.read_text())["rows"] == rows
    specs = [spec for kind, spec in events.log if kind == "engine"]
    assert len(specs) == 6 and all(s["max_model_len"] <= CONTEXT_TOKENS for s in specs)


def test_rows_are_printed_as_they_finish_and_kept_when_a_later_length_fails(
    events: _Events, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    events.fail_at_engine = 4  # the third length's miss engine
    printed: list[str] = []
    real_row_line = getattr(vllm_demo, "row_line", None)

    def row_line(row: Any) -> str:
        events.log.append(("row", row.prompt_tokens))
        assert real_row_line is not None
        printed.append(real_row_line(row))
        return printed[-1]

    monkeypatch.setattr(vllm_demo, "row_line", row_line, raising=False)
    saved = tmp_path / "report.json"
    r = CliRunner().invoke(demo, ["--engine", "vllm", "--output", "json",
                                  "--save-json", str(saved)])
    assert r.exit_code == 1, r.output
    # each row is out before the next length's first engine starts
    assert [kind for kind, _ in events.log] == [
        "engine", "engine", "row", "engine", "engine", "row", "engine"]
    for line in printed:
        assert line in r.stderr
    report = json.loads(r.stdout)
    assert [row["prompt_tokens"] for row in report["rows"]] == [
        1024 + QUESTION_AND_TAIL_TOKENS, 4096 + QUESTION_AND_TAIL_TOKENS]
    assert "vLLM engine process failed" in report["error"]
    assert json.loads(saved.read_text()) == report
    assert "kvstored demo --engine vllm: KvstoredError" in r.stderr


def test_table_output_keeps_the_finished_rows_when_a_later_length_fails(events: _Events) -> None:
    events.fail_at_engine = 2  # the second length's miss engine
    r = CliRunner().invoke(demo, ["--engine", "vllm"])
    assert r.exit_code == 1, r.output
    assert f"{1024 + QUESTION_AND_TAIL_TOKENS} tokens" in r.stdout
    assert "KvstoredError: vLLM engine process failed" in r.stderr
