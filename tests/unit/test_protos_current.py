"""The committed generated protobuf code matches protos/ (regenerate: scripts/gen_protos.py)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_generated_code_is_current(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (the test extra) is not installed")
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--out", str(tmp_path)], check=True
    )
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.py*"))
    assert generated, "protoc generated nothing"
    stale = [
        str(rel) for rel in generated
        if not (ROOT / rel).exists() or (ROOT / rel).read_bytes() != (tmp_path / rel).read_bytes()
    ]
    assert not stale, f"generated code is stale, run scripts/gen_protos.py: {stale}"
