"""``kvstorectl replicate --replicas`` is checked before any master is asked (1..8)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from kvstored.cli.kvstorectl import main

KEY = "101112131415161718191a1b1c1d1e1f"


@pytest.mark.parametrize("replicas", ["0", "9", "-1"])
def test_replicas_out_of_range_exits_2_naming_the_flag_and_value(replicas: str) -> None:
    # 127.0.0.1:1 refuses connections: an answer that reached a master would differ
    result = CliRunner().invoke(main, ["--address", "127.0.0.1:1", "replicate", KEY, "--replicas", replicas])
    assert result.exit_code == 2, result.output
    assert "--replicas" in result.output and replicas in result.output and "1<=x<=8" in result.output
