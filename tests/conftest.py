"""Suite-wide fixtures.

CLI commands run in-process by tests (click's CliRunner) call ``kvstored.log.configure``,
which sets a level filter and ``cache_logger_on_first_use``: every module logger used after
that stays bound to it, and later tests' ``structlog.testing.capture_logs`` see nothing. Real
processes (daemons started by the tests) configure their own logging as in production.

Parallel runs (``pytest -n 2 --dist loadgroup``, what .ci/run does): every test is grouped
by its file (so a module's fixtures are set up once, on one worker), and every test marked
``vllm`` goes to one group of its own, so the vLLM engines (CPU-heavy, ~1.5 GiB each) never
run on two workers at once while the rest of the suite runs beside them.

``workdir``: a fresh directory under /tmp with a short path (a unix socket path must fit in
108 bytes, which pytest's ``tmp_path`` may not), removed when the test ends.

``etcd``: a real etcd on two free loopback client ports (tests/etcd_helpers.py), killed and
its data dir removed when the test ends; without /usr/bin/etcd the test fails under CI=true
and skips otherwise. Mark such tests ``@pytest.mark.etcd``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from etcd_helpers import EtcdServer, require_etcd


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = "vllm" if item.get_closest_marker("vllm") else item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True)
def _keep_the_test_process_logging_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kvstored.log.configure", lambda **kwargs: None)


@pytest.fixture
def pinned_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shared-memory gets take the pinned path only (``KVSTORED_ONE_SIDED=0``, inherited by
    child processes): for the tests of PinBlocks, its leases, releases and hooks. One-sided
    reads (no pin) are tested in tests/unit/tiers/test_tiers_slots.py and
    tests/integration/test_one_sided_reads.py."""
    monkeypatch.setenv("KVSTORED_ONE_SIDED", "0")


@pytest.fixture
def workdir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="kvt", dir="/tmp"))
    yield d
    if os.environ.get("KVSTORED_KEEP_WORKDIR") == "1":  # debugging: logs of a failed run
        print(f"workdir kept: {d}")
        return
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def etcd() -> Iterator[EtcdServer]:
    server = EtcdServer(require_etcd(), num_client_ports=2).start()
    try:
        yield server
    finally:
        server.stop()
