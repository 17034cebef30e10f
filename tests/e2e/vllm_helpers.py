"""The vLLM venv for the e2e tests that run real engines: found once, or the skip reason.

``PYTHON`` is the vLLM venv's interpreter and ``MODEL`` the SmolLM2 model path it loads (both
None when the venv is missing: ``requires_vllm`` then skips with the reason that names it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from thread_helpers import wait_until

from kvstored.demo.vllm_demo import EngineProcess, VllmUnavailable, find_model, find_vllm_python
from kvstored.errors import KvstoredError

try:
    PYTHON: Path | None = find_vllm_python()
    MODEL: Path | None = find_model(PYTHON)
    SKIP_REASON = ""
except VllmUnavailable as exc:
    PYTHON = MODEL = None
    SKIP_REASON = f"needs the vLLM venv (KVSTORED_VLLM_PYTHON or .venv-vllm): {exc}"

requires_vllm = pytest.mark.skipif(PYTHON is None, reason=SKIP_REASON or "no vLLM venv")


def engine_stats(stats_dir: Path, role: str) -> dict[str, Any]:
    """The newest stats file the connector of ``role`` ("worker", "scheduler") wrote."""
    files = sorted(stats_dir.glob(f"{role}*.json"))
    assert files, f"no {role} stats in {stats_dir}"
    return json.loads(files[-1].read_text())  # type: ignore[no-any-return]


def engine_steps(engine: EngineProcess) -> list[dict[str, Any]]:
    """The engine's step results; on a failure the error lines of its whole log are attached
    (the root cause of a vLLM start failure is often far above the log's tail)."""
    try:
        return engine.result()["steps"]  # type: ignore[no-any-return]
    except KvstoredError as exc:
        lines = engine.log_path.read_text(errors="replace").splitlines()
        causes = [ln for ln in lines if "Error" in ln or "Exception" in ln or "Killed" in ln]
        raise AssertionError(f"{exc}\nerror lines of the whole log:\n"
                             + "\n".join(causes[-40:])) from None


def wait_engine_file(path: Path, engine: EngineProcess, wait_s: float) -> None:
    """Until the engine created ``path``, at most ``wait_s`` (a hang guard); raises at once
    if the engine exited first."""
    def reached() -> bool:
        if engine.proc.poll() is not None:
            lines = engine.log_path.read_text(errors="replace").splitlines()
            causes = [ln for ln in lines if "Error" in ln or "Exception" in ln or "Killed" in ln]
            raise AssertionError(f"engine exited ({engine.proc.returncode}) before {path.name};"
                                 " error lines of the whole log:\n" + "\n".join(causes[-40:])
                                 + "\nits end:\n" + "\n".join(lines[-30:]))
        return path.exists()
    wait_until(reached, wait_s, f"engine reached {path.name}", interval_s=0.2)
