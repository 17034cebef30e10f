"""``kvstored demo --engine vllm`` without a vLLM venv: a clear error, exit code 2."""

from __future__ import annotations

from click.testing import CliRunner

from kvstored.demo.cli import demo


def test_engine_vllm_without_venv_names_the_setting(tmp_path, monkeypatch) -> None:
    missing = tmp_path / "no-such-venv" / "bin" / "python"
    monkeypatch.setenv("KVSTORED_VLLM_PYTHON", str(missing))
    result = CliRunner().invoke(demo, ["--engine", "vllm", "--lengths", "256"])
    assert result.exit_code == 2, result.output
    text = result.output.replace("\n", "")  # rich wraps long lines
    assert "KVSTORED_VLLM_PYTHON" in text and str(missing) in text
    assert "setup-vllm-venv.sh" in text
