"""Suite-wide fixtures.

CLI commands run in-process by tests (click's CliRunner) call ``kvstored.log.configure``,
which sets a level filter and ``cache_logger_on_first_use``: every module logger used after
that stays bound to it, and later tests' ``structlog.testing.capture_logs`` see nothing. Real
processes (daemons started by the tests) configure their own logging as in production.

Parallel runs (``pytest -n 2 --dist loadgroup``, what .ci/run does): every test is grouped
by its file (so a module's fixtures are set up once, on one worker), and every test marked
``vllm`` goes to one group of its own, so the vLLM engines (CPU-heavy, ~1.5 GiB each) never
run on two workers at once while the rest of the suite runs beside them. Groups are handed
out longest kind first (:func:`group_rank`): the vLLM group (the longest by far: about two
thirds of the run) starts at once on one worker, then the e2e files, the integration files,
the unit files last (they fill the gaps). xdist's own order (most tests first) started the
vLLM group only after some 50 larger groups, so it ran alone at the end of the run.

``workdir``: a fresh directory under /tmp with a short path (a unix socket path must fit in
108 bytes, which pytest's ``tmp_path`` may not), removed when the test ends.

``etcd``: a real etcd on two free loopback client ports (tests/etcd_helpers.py), killed and
its data dir removed when the test ends; without /usr/bin/etcd the test fails under CI=true
and skips otherwise. Mark such tests ``@pytest.mark.etcd``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from etcd_helpers import EtcdServer, require_etcd

VLLM_GROUP = "vllm"

# Bytecode: with PYTHONDONTWRITEBYTECODE set (as in CI's environment) every process the suite
# starts (daemons, CLIs, helper scripts, vLLM engines) compiled kvstored from source
# again, ~0.4 s of CPU each on this 2-core machine, and pytest rewrote every test module's
# asserts again in each run. The suite writes bytecode (__pycache__/ is git-ignored).
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
    sys.dont_write_bytecode = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = VLLM_GROUP if item.get_closest_marker("vllm") else item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))


def group_rank(group: str) -> int:
    """Where a loadgroup goes in the queue: 0 (first) for the vLLM group, then the e2e
    files (real processes: the long ones), the integration files, everything else."""
    if group == VLLM_GROUP:
        return 0
    for rank, prefix in enumerate(("tests/e2e/", "tests/integration/"), start=1):
        if group.startswith(prefix):
            return rank
    return 3


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup``: xdist's LoadGroupScheduling, its queue ordered by
    :func:`group_rank` (stable: xdist's order, most tests first, within a rank)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from collections import OrderedDict

    from xdist.scheduler import LoadGroupScheduling

    class LongestKindFirst(LoadGroupScheduling):
        _ordered = False

        def _assign_work_unit(self, node: Any) -> None:
            if not self._ordered:  # the first call: the queue is complete, nothing taken yet
                self._ordered = True
                queue = self.workqueue
                self.workqueue = OrderedDict(
                    (scope, queue[scope]) for scope in sorted(queue, key=group_rank)
                )
            super()._assign_work_unit(node)

    return LongestKindFirst(config, log)


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
