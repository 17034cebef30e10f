"""Fixtures: in-process node daemons for integration tests.

Each daemon runs its own asyncio loop in a background thread, listens on a unix socket in a
short temporary directory plus TCP port 0 (gRPC), data plane on port 0, metrics on port 0,
and has its own arena file (unique node id). The SSD tier is ON, as in production (its own
directory, 256 MiB cap); a test that needs it off passes ``ssd_size_bytes=0`` (and says why),
or parametrizes both with the ``ssd`` fixture.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from it_helpers import DaemonThread, NodeFactory

from kvstored.config import NodeConfig


@pytest.fixture
def sock_dir(workdir: Path) -> str:
    """The suite's short ``workdir`` as a string (unix socket paths are <= 107 bytes)."""
    return str(workdir)




@pytest.fixture
def start_node(sock_dir: str) -> Iterator[NodeFactory]:
    """``start_node(**node_config_overrides) -> DaemonThread``; all are stopped at teardown."""
    started: list[DaemonThread] = []

    def factory(**overrides: Any) -> DaemonThread:
        enable_scheduler = overrides.pop("enable_scheduler", False)
        name = overrides.pop("node_id", None) or f"it-{uuid.uuid4().hex[:8]}"
        fields: dict[str, Any] = {
            "node_id": name,
            "listen": [f"unix:{sock_dir}/{name}.sock", "127.0.0.1:0"],
            "data_address": "127.0.0.1:0",
            "metrics_address": "127.0.0.1:0",
            "dram_size_bytes": 64 << 20,
            "ssd_size_bytes": 256 << 20,
            "ssd_dir": f"{sock_dir}/{name}.ssd",
            "max_block_bytes": 4 << 20,
            "drain_grace_s": 2.0,
            "log_level": "warning",
        }
        fields.update(overrides)
        node = DaemonThread(NodeConfig(**fields), enable_scheduler=enable_scheduler).start()
        started.append(node)
        return node

    yield factory
    for node in reversed(started):
        node.stop()


@pytest.fixture
def node(start_node: NodeFactory) -> DaemonThread:
    return start_node()


@pytest.fixture(params=["ssd_on", "ssd_off"])
def ssd(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Node config overrides for both SSD settings: ``start_node(**ssd)``."""
    return {} if request.param == "ssd_on" else {"ssd_size_bytes": 0, "ssd_dir": None}


@pytest.fixture(params=["control", "grpc"])
def control_channel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both paths of a local client's hot calls: the lean control channel (the default) and
    gRPC (``KVSTORED_CONTROL_CHANNEL=0``). Also resets the client's lease clock."""
    from kvstored.client import _control, _shm

    monkeypatch.setenv(_control.ENV_SWITCH, "1" if request.param == "control" else "0")
    monkeypatch.setattr(_shm, "_clock", _shm._clock)
    return str(request.param)


@pytest.fixture
def reserve_put_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Clients made in the test put through ReservePut + CommitPut (reserve-ahead off: the
    default ``Client(reserve_ahead_bytes=...)`` is 0). The ReservePut path still runs when a
    client's slot pool is off, lacks slots, or a batch is larger than the pool; the fencing
    tests of reserve-ahead slots are tests/integration/test_slot_puts.py and
    tests/e2e/test_e2e_fencing.py."""
    from kvstored.client import _state

    monkeypatch.setattr(_state, "DEFAULT_RESERVE_AHEAD_BYTES", 0)
