"""``kvstorectl where``'s replicas column counts replicas, not read copies ("2/2 +1 copy")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from click.testing import CliRunner

from kvstored.cli import cluster
from kvstored.cli.kvstorectl import main


class _Master:
    """What ``where`` asks of the master: one block on a and b (originals) and c (a copy)."""

    def __enter__(self) -> _Master:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def is_master(self) -> bool:
        return True

    def list_replicas_and_factors(self, ns: bytes, keys: Sequence[bytes]) -> tuple[Any, Any, bool]:
        rep = {"epoch": 1, "tier": "dram", "size_bytes": 4096, "generation": 1, "state": "ready",
               "readable": True}
        reps = [rep | {"node_id": "a", "copy": False}, rep | {"node_id": "b", "copy": False},
                rep | {"node_id": "c", "copy": True}]
        return [reps for _ in keys], [2 for _ in keys], True


def test_a_read_copy_is_not_counted_as_a_replica(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster, "master_client", lambda obj: _Master())
    out = CliRunner().invoke(main, ["--address", "127.0.0.1:1", "where", "ab" * 16])
    assert out.exit_code == 0, out.output
    assert "2/2 +1 copy" in out.output, out.output
    assert "3/2" not in out.output
