"""Suite-wide fixtures.

CLI commands run in-process by tests (click's CliRunner) call ``kvstored.log.configure``,
which sets a level filter and ``cache_logger_on_first_use``: every module logger used after
that stays bound to it, and later tests' ``structlog.testing.capture_logs`` see nothing. Real
processes (daemons started by the tests) configure their own logging as in production.

Parallel runs (``pytest -n 2 --dist loadgroup``, what .ci/run does): every test is grouped
by its file (so a module's fixtures are set up once, on one worker), and every test marked
``vllm`` goes to one group of its own, so the vLLM engines (CPU-heavy, ~1.5 GiB each) never
run on two workers at once while the rest of the suite runs beside them. Groups are handed
out longest kind first (:func:`group_rank`): the vLLM group (the longest by far) starts at
once on one worker, then the e2e files, the integration files, the unit files last (they
fill the gaps). xdist's own order (most tests first) started the
vLLM group only after some 50 larger groups. (With pytest 9.2 and xdist 3.8 nothing was
grouped at all: xdist's group suffix no longer reaches the node id; :func:`_suffix_group`
puts it there.)

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
from xdist_order import VLLM_GROUP, make_scheduler

# Bytecode: with PYTHONDONTWRITEBYTECODE set (as in CI's environment) every process the suite
# starts (daemons, CLIs, helper scripts, vLLM engines) compiled kvstored from source
# again, ~0.4 s of CPU each on this 2-core machine, and pytest rewrote every test module's
# asserts again in each run. The suite writes bytecode (__pycache__/ is git-ignored).
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
    sys.dont_write_bytecode = False


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    grouping = bool(getattr(config.option, "loadgroup", False))  # an xdist worker, loadgroup
    for item in items:
        group = VLLM_GROUP if item.get_closest_marker("vllm") else item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))
        if grouping:
            _suffix_group(item, group)


def _suffix_group(item: pytest.Item, group: str) -> None:
    """Give the item the ``NODEID@GROUP`` id by which xdist's scheduler groups it.

    xdist (3.8) sets the legacy ``item._nodeid``, which pytest 9.2's structured node ids
    ignore: every test was then a group of its own and ``--dist loadgroup`` grouped nothing
    (pytest-dev/pytest-xdist#1386), so a module's fixtures were set up on both workers and
    vLLM engines ran on both at once. A fixed xdist appends its own suffix after this one;
    the scheduler groups by the last ``@`` either way.
    """
    if "@" in item.nodeid.rsplit("]", 1)[-1]:
        return  # grouped already (an xdist that does it)
    try:
        from _pytest.nodeid import NodeId
    except ImportError:  # a pytest before structured ids: xdist's _nodeid works there
        return
    item._id = NodeId.parse(f"{item.nodeid}@{group}")  # type: ignore[attr-defined]


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup``: xdist's scheduler handing out the longest kind first
    (tests/xdist_order.py)."""
    return make_scheduler(config, log)


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
