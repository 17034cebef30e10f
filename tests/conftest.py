"""Suite-wide fixtures.

CLI commands run in-process by tests (click's CliRunner) call ``kvstored.log.configure``,
which sets a level filter and ``cache_logger_on_first_use``: every module logger used after
that stays bound to it, and later tests' ``structlog.testing.capture_logs`` see nothing. Real
processes (daemons started by the tests) configure their own logging as in production.

``workdir``: a fresh directory under /tmp with a short path (a unix socket path must fit in
108 bytes, which pytest's ``tmp_path`` may not), removed when the test ends.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _keep_the_test_process_logging_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kvstored.log.configure", lambda **kwargs: None)


@pytest.fixture
def workdir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="kvt", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)
